"""test_sim.py - hpcdl.sim: each collective's formula against values worked
out by hand, limiting cases, the scaling table's shape, the parameter counts
against the models hpcdl builds, fits on exact data, `hpcdl sim scaling`
and `hpcdl bench calibrate` bad input, and the cost model's prediction of
hpcdl's ring all-reduce against a measurement on 2 and 4 ranks."""
import json
import os
import subprocess
import sys
import time

import pytest

from hpcdl import sim
from hpcdl.sim import cost, fit, scaling, units
from mpi_harness import run_mpi

HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl(*args, timeout=60):
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------
# formulas: alpha = 1 s, beta = 0.01 s/B, M = 1000 B unless said otherwise

@pytest.mark.parametrize("func, n, want", [
    (cost.parameter_server, 4, 2 + 2 * 3 * 10),        # 2a + 2(N-1)Mb
    (cost.ring_allreduce, 4, 2 * 3 + 2 * 0.75 * 10),   # 2(N-1)a + 2((N-1)/N)Mb
    (cost.tree_allreduce, 4, 2 * 2 + 2 * 2 * 10),      # log 4 = 2 rounds
    (cost.tree_allreduce, 5, 2 * 3 + 2 * 3 * 10),      # log 5 rounds up to 3
    (cost.broadcast, 8, 3 + 3 * 10),                   # a log N + log N Mb
    (cost.allgather, 8, 3 + 7 * 10),                   # a log N + (N-1)Mb
    (cost.ring_allreduce, 2, 2 + 1 * 10),
])
def test_formula_by_hand(func, n, want):
    assert func(n, 1000, 1.0, 0.01) == pytest.approx(want)


def test_gamma_adds_the_reduction():
    # ring: ((N-1)/N) M gamma; ps: (N-1) M gamma; tree: log N M gamma
    assert cost.ring_allreduce(4, 1000, 1, 0.01, 0.1) == pytest.approx(21 + 75)
    assert cost.parameter_server(4, 1000, 1, 0.01, 0.1) == pytest.approx(62 + 300)
    assert cost.tree_allreduce(4, 1000, 1, 0.01, 0.1) == pytest.approx(44 + 200)


def test_hierarchical_by_hand():
    # 8 ranks, 4 per node: intra 2 (3 a_i + (3/4) M b_i) = 2 (3 + 0.75) = 7.5;
    # inter ring over 2 nodes on M/4 = 250 B: 2 a_e + 2 (1/2) 250 b_e = 20 + 2.5
    t = cost.hierarchical_allreduce(8, 1000, 4, 1.0, 0.001, 10.0, 0.01)
    assert t == pytest.approx(7.5 + 22.5)


def test_hierarchical_limits_are_rings():
    # one rank per node: a ring over the nodes; one node: a ring inside it
    assert cost.hierarchical_allreduce(16, 4096, 1, 9, 9, 2.0, 0.5) == pytest.approx(
        cost.ring_allreduce(16, 4096, 2.0, 0.5))
    assert cost.hierarchical_allreduce(6, 4096, 8, 2.0, 0.5, 9, 9) == pytest.approx(
        cost.ring_allreduce(6, 4096, 2.0, 0.5))


@pytest.mark.parametrize("func", [cost.parameter_server, cost.ring_allreduce,
                                  cost.tree_allreduce, cost.broadcast, cost.allgather])
def test_one_rank_sends_nothing(func):
    assert func(1, 10 ** 9, 1e-6, 1e-9) == 0
    assert cost.hierarchical_allreduce(1, 10 ** 9, 8, 1e-6, 1e-9, 1e-6, 1e-9) == 0


@pytest.mark.parametrize("n, rounds", [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (1024, 10),
                                       (1025, 11)])
def test_log2_rounds_up(n, rounds):
    assert cost.log2_rounds(n) == rounds


def test_ring_is_bandwidth_optimal_for_large_messages():
    n, m, a, b = 64, 100e6, 5e-6, 1e-10
    ring, tree, ps = (f(n, m, a, b) for f in (cost.ring_allreduce, cost.tree_allreduce,
                                              cost.parameter_server))
    assert ring < tree < ps
    # ... and the tree wins for tiny messages (fewer latencies)
    assert cost.tree_allreduce(n, 4, a, b) < cost.ring_allreduce(n, 4, a, b)


@pytest.mark.parametrize("args, words", [
    ((0, 10), "positive integer"), ((-2, 10), "positive integer"), ((2.5, 10), "positive"),
    ((4, -1), ">= 0 bytes")])
def test_formula_bad_input(args, words):
    with pytest.raises(ValueError, match=words):
        cost.ring_allreduce(*args, 1e-6, 1e-9)


def test_hierarchical_needs_whole_nodes():
    with pytest.raises(ValueError, match="12 ranks do not fill nodes of 8"):
        cost.hierarchical_allreduce(12, 100, 8, 1, 1, 1, 1)


# ----------------------------------------------------------------------------
# scaling table

def resnet50(overlap=0.0):
    return scaling.Workload(params=scaling.MODELS["resnet50"], compute_s=0.1,
                            overlap=overlap, name="resnet50")


def test_scaling_table_shape_and_monotonicity():
    gpus = [1, 2, 8, 64, 512, 2048]
    net = scaling.Network(alpha=5e-6, beta=1 / 12.5e9, alpha_intra=2e-6, beta_intra=1 / 150e9)
    rows = scaling.scaling_table(gpus, resnet50(0.3), net)
    assert [(r.algorithm, r.gpus) for r in rows] == [(a, n) for a in scaling.ALGORITHMS
                                                    for n in gpus]
    for a in scaling.ALGORITHMS:
        mine = [r for r in rows if r.algorithm == a]
        assert mine[0].comm_s == 0 and mine[0].efficiency == 1.0       # 1 GPU
        for prev, r in zip(mine, mine[1:]):
            assert r.comm_s >= prev.comm_s and r.step_s >= prev.step_s
            assert r.efficiency <= prev.efficiency
            assert r.samples_per_s == pytest.approx(r.gpus * 32 / r.step_s)
            assert r.efficiency == pytest.approx(0.1 / r.step_s)
    at2048 = {r.algorithm: r for r in rows if r.gpus == 2048}
    assert at2048["hier"].step_s <= at2048["ring"].step_s < at2048["tree"].step_s \
        < at2048["ps"].step_s


def test_overlap_hides_only_behind_compute():
    net = scaling.Network(alpha=0, beta=1e-9)         # ring comm of 102 MB ~ 0.2 s
    comm = scaling.comm_time("ring", 64, resnet50().nbytes, net)
    for overlap in (0.0, 0.5, 1.0):
        r = scaling.predict("ring", 64, resnet50(overlap), net)
        assert r.exposed_s == pytest.approx(max(0.0, comm - overlap * 0.1))
        assert r.step_s == pytest.approx(0.1 + r.exposed_s)
    small = scaling.Network(alpha=0, beta=1e-12)     # comm 0.2 ms: fully hidden
    assert scaling.predict("ring", 64, resnet50(0.5), small).efficiency == 1.0


def test_flat_algorithms_use_the_intra_link_inside_one_node():
    net = scaling.Network(alpha=1.0, beta=0.0, alpha_intra=0.1, beta_intra=0.0, per_node=8)
    assert scaling.comm_time("ring", 8, 100, net) == pytest.approx(2 * 7 * 0.1)
    assert scaling.comm_time("ring", 16, 100, net) == pytest.approx(2 * 15 * 1.0)


def test_model_parameter_counts_match_hpcdl_models():
    from hpcdl import models
    from hpcdl.bench.train import MLP_HIDDEN

    def count(net):
        return sum(p.numel() for p in net.parameters())
    assert scaling.MODELS["resnet50"] == count(models.build("resnet50", (3, 224, 224), 1000))
    assert scaling.MODELS["resnet18"] == count(models.build("resnet18", (3, 224, 224), 1000))
    assert scaling.MODELS["mlp"] == count(models.build("mlp", 1024, 10, hidden=MLP_HIDDEN))


@pytest.mark.parametrize("text, params", [("resnet50", 25_557_032), ("ResNet18", 11_689_512),
                                          ("25.6M", 25_600_000), ("1.5B", 1_500_000_000),
                                          ("1e8", 100_000_000), ("340m", 340_000_000)])
def test_resolve_model(text, params):
    assert scaling.resolve_model(text)[1] == params


@pytest.mark.parametrize("text, words", [("vgg16", "unknown model"), ("0", "must be > 0"),
                                         ("-5M", "unknown model")])
def test_resolve_model_rejects(text, words):
    with pytest.raises(ValueError, match=words):
        scaling.resolve_model(text)


def test_units():
    assert units.parse_time("5us") == pytest.approx(5e-6)
    assert units.parse_time("1.5ms") == pytest.approx(1.5e-3)
    assert units.parse_time("2e-6s") == pytest.approx(2e-6)
    assert units.parse_time("0") == units.parse_beta("0") == 0.0  # 0 in any unit
    assert units.parse_beta("0.1ns") == pytest.approx(1e-10)
    assert units.parse_beta("10GB/s") == pytest.approx(1e-10)
    assert units.parse_beta("800MB/s") == pytest.approx(1 / 800e6)
    # the form hpcdl prints ("beta 0.08 ns/B (12.5 GB/s)") reads back
    assert units.parse_beta(units.format_beta(8e-11).split(" (")[0]) == pytest.approx(8e-11)
    assert units.parse_beta("0.08ns/B") == pytest.approx(8e-11)
    for bad in ("fast", "5 parsecs", "-1us"):
        with pytest.raises(ValueError, match="bad alpha"):
            units.parse_time(bad)
    with pytest.raises(ValueError, match="must be > 0"):
        units.parse_beta("0GB/s")


# ----------------------------------------------------------------------------
# fits recover the coefficients of exact data

def test_fit_alpha_beta_exact():
    sizes = [0, 4, 1024, 1 << 16, 1 << 20, 1 << 24]
    times = [3e-6 + 2e-10 * m for m in sizes]
    f = fit.fit_alpha_beta(sizes, times)
    assert f.coef == pytest.approx((3e-6, 2e-10), rel=1e-9)
    assert f.r2 == pytest.approx(1.0) and max(map(abs, f.rel_errors)) < 1e-9


def test_fit_ring_exact():
    sizes = [4, 4096, 1 << 20, 1 << 24]
    times = [cost.ring_allreduce(4, m, 2e-6, 3e-10) for m in sizes]
    assert fit.fit_ring(4, sizes, times).coef == pytest.approx((2e-6, 3e-10), rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 positive times"):
        fit.fit_alpha_beta([4], [1e-6])


def test_fit_two_regimes_token_bucket():
    # a link shaped by a token bucket (tbf, `hpcdl vcluster --link 1gbit`): the
    # first 128 KB of a message pass at 10 GB/s, the rest at 0.125 GB/s
    burst, fast, slow, alpha = 128e3, 1e-10, 8e-9, 40e-6
    sizes = [0, 4, 64, 1024, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]
    times = [alpha + min(m, burst) * fast + max(m - burst, 0) * slow for m in sizes]
    one = fit.fit_alpha_beta(sizes, times)
    assert one.r2 < 0.9 and abs(one.coef[1] / slow - 1) > 0.5  # one line: beta far off
    two = fit.fit_two_regimes(sizes, times)
    assert two.coef[1] == pytest.approx(slow, rel=0.02)
    assert two.coef[0] == pytest.approx(alpha, rel=0.1)
    assert fit.fit_two_regimes(sizes[:4], times[:4]) is None  # no bandwidth regime


# ----------------------------------------------------------------------------
# hpcdl sim scaling

def test_sim_scaling_cli(tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    r = hpcdl("sim", "scaling", "--model", "resnet50", "--gpus", "8,64,512,2048",
              "--alpha", "5us", "--beta", "12.5GB/s", "--alpha-intra", "2us",
              "--beta-intra", "150GB/s", "--step-compute-ms", "100", "--overlap", "0.5",
              "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    for a in scaling.ALGORITHMS:
        assert "# %s: " % a in r.stdout
    assert "25,557,032 parameters" in r.stdout and "# 2048 GPUs: fastest" in r.stdout
    doc = json.loads(out.read_text())
    net = scaling.Network(5e-6, 1 / 12.5e9, 2e-6, 1 / 150e9)
    want = scaling.scaling_table([8, 64, 512, 2048], resnet50(0.5), net)
    got = [(row["algorithm"], row["gpus"], row["step_s"]) for row in doc["rows"]]
    assert got == [(w.algorithm, w.gpus, pytest.approx(w.step_s)) for w in want]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, words", [
    (["--model", "vgg16"], "unknown model 'vgg16'"),
    (["--gpus", "8,0"], "positive integers (got 0)"),
    (["--gpus", "8,x"], "bad --gpus"),
    (["--step-compute-ms", "0"], "compute time per step must be > 0"),
    (["--overlap", "1.5"], "overlap must be between 0 and 1"),
    (["--alpha", "fast"], "bad --alpha 'fast'"),
    (["--beta", "0GB/s"], "--beta bandwidth must be > 0"),
    (["--gpus", "12", "--gpus-per-node", "8"], "12 GPUs do not fill nodes of 8"),
    (["--algorithms", "ring,nccl"], "unknown algorithm(s) 'nccl'"),
    (["--calibration", "/nonexistent/cal.json"], "cannot read alpha and beta"),
])
def test_sim_scaling_bad_input(args, words):
    base = {"--alpha": "5us", "--beta": "10GB/s", "--step-compute-ms": "50"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = [x for kv in base.items() for x in kv]
    r = hpcdl("sim", "scaling", *argv)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert r.stderr.startswith("hpcdl: error:") and not r.stdout


def test_sim_scaling_reads_a_calibration(tmp_path):
    cal, out = tmp_path / "cal.json", tmp_path / "s.json"
    cal.write_text(json.dumps({"alpha": 2e-6, "beta": 1e-10, "alpha_intra": 1e-6,
                               "beta_intra": 1e-11, "gamma": 5e-11}))
    r = hpcdl("sim", "scaling", "--calibration", str(cal), "--alpha", "3us", "--gpus", "4,16",
              "--step-compute-ms", "20", "--json", str(out))
    assert r.returncode == 0, r.stderr
    net = json.loads(out.read_text())["network"]   # --alpha wins over the file
    assert (net["alpha"], net["beta"], net["alpha_intra"], net["beta_intra"],
            net["gamma"]) == pytest.approx((3e-6, 1e-10, 1e-6, 1e-11, 5e-11))
    cal.write_text(json.dumps({"alpha": 2e-6}))
    r = hpcdl("sim", "scaling", "--calibration", str(cal), "--step-compute-ms", "20")
    assert r.returncode == 2 and "cannot read alpha and beta" in r.stderr, r.stderr


@pytest.mark.parametrize("sub, flag, value, words", [
    ("scaling", "--alpha", "5", "give 5us, 5ms or 5s"),
    ("scaling", "--alpha", "5e-6", "give 5e-6us, 5e-6ms or 5e-6s"),
    ("scaling", "--beta", "12.5", "give a time per byte (12.5ns) or a bandwidth (12.5GB/s)"),
] + [(sub, flag, "4", "") for sub, flag in (
    ("scaling", "--alpha-intra"), ("scaling", "--beta-intra"), ("scaling", "--gamma"),
    ("step", "--alpha"), ("step", "--compress-gamma"), ("step", "--cpu-per-byte"),
    ("pipeline", "--alpha"), ("pipeline", "--beta"))])
def test_a_time_or_bandwidth_without_a_unit_is_refused(sub, flag, value, words):
    """issue 38: `hpcdl sim scaling --alpha 5` was read as 5 seconds (0.1%
    efficiency) without a word. Every time and bandwidth flag of hpcdl sim
    takes units (units.py); a bare number other than 0 is one line asking
    for one."""
    base = {"scaling": ["--step-compute-ms", "50"],
            "step": ["--model", "resnet50", "--gpus", "8", "--step-compute-ms", "50"],
            "pipeline": ["--stages", "4", "--batch", "32", "--activation-elements", "1M",
                         "--step-compute-ms", "100"]}[sub]
    link = {"--alpha": "5us", "--beta": "10GB/s", flag: value}
    r = hpcdl("sim", sub, *base, *[x for kv in link.items() for x in kv])
    assert r.returncode == 2 and not r.stdout, (r.stdout, r.stderr)
    assert r.stderr.startswith("hpcdl: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "bad %s '%s': a number without a unit; %s" % (flag, value, words) in r.stderr, \
        r.stderr
    link[flag] = "0"  # the same in every unit: taken
    r = hpcdl("sim", sub, *base, *[x for kv in link.items() for x in kv])
    assert r.returncode == 0, r.stderr


def test_sim_scaling_needs_a_network():
    r = hpcdl("sim", "scaling", "--step-compute-ms", "50")
    assert r.returncode == 2 and "give --alpha and --beta" in r.stderr


# ----------------------------------------------------------------------------
# hpcdl bench calibrate

def test_calibrate_refuses_one_rank():
    for args in ([], ["-n", "1"]):
        r = hpcdl("bench", "calibrate", *args)
        assert r.returncode == 2, r.stderr
        assert "calibration needs at least 2 ranks" in r.stderr and "-n 2" in r.stderr


def test_calibrate_bad_options():
    for args, words in ((["--predict-from", "/nonexistent.json"], "cannot read alpha and beta"),
                        (["--max-bytes", "4X"], "bad size"), (["--factor", "1"], "--factor")):
        r = hpcdl("bench", "calibrate", "-n", "2", *args)
        assert r.returncode == 2 and words in r.stderr, r.stderr


@pytest.mark.mpi
def test_calibrate_measures_the_cpu_of_the_allreduce(tmp_path):
    # cpu_per_byte: each rank's CPU time per byte all-reduced; cores_per_rank:
    # both ranks on this machine share its cores
    cal = tmp_path / "cal.json"
    r = run_mpi(2, HPCDL + ["bench", "calibrate", "--allreduce", "--max-bytes", "256K",
                            "--time-budget", "0.05", "--json", str(cal)], timeout=90)
    assert r.returncode == 0, r.stdout
    doc = json.loads(cal.read_text())
    assert len(doc["cpu"]["per_rank"]) == 2 and doc["cpu"]["bytes"] == 256 << 10
    assert doc["cpu_per_byte"] > 0 and doc["cores_per_rank"] == (os.cpu_count() or 1) / 2


def test_calibrate_refuses_one_rank_under_mpirun():
    r = run_mpi(1, HPCDL + ["bench", "calibrate"], timeout=60)
    assert r.returncode == 2 and "calibration needs at least 2 ranks" in r.stdout, r.stdout


# Prediction against measurement. Calibrate on 2 ranks (ping-pong alpha, beta
# and gamma), then predict the ring all-reduce at 64 KiB - 4 MiB and time it.
# Sizes below 64 KiB are left out: Open MPI switches from eager to rendezvous
# messages around 4 KiB, which a single alpha does not describe (docs/sim.md).
# Tolerance: 2 ranks (one per core) within 0.5x-3x of the prediction: at 64
# KiB the per-call costs the ring formula leaves out (the agreement check, the
# hand-off to the engine, waits that test then yield) are about as large as
# the formula's whole time (a clean-clone CI run, quiet: 26 us measured, 11-13
# predicted, 2.1-2.35x in all 3 attempts; 1.07-1.44x at 1-4 MiB). 4 ranks
# share 2 cores: the prediction is multiplied by ranks/cores = 2 (each rank
# runs half the time) and the band is 0.5x-4x, since waiting ranks spin and
# every ring step may wait for a context switch, which the model leaves out.
# Other programs on the machine stretch iterations by whole scheduler quanta,
# so the fastest of up to 40 iterations is compared, and an attempt
# (calibration and measurement) out of the band is repeated, 3 attempts in
# all. Each attempt also measures how much CPU time other programs took
# meanwhile (/proc/stat minus this test's own processes): when every failed
# attempt ran on a machine more than a quarter busy with other work, the
# timing comparison is skipped with those numbers (on a quiet machine, as in
# CI, it always counts). Correctness (#wrong = 0) is asserted in every attempt.
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
BANDS = {2: (0.5, 3.0), 4: (0.5, 4.0)}
ATTEMPTS = 3
BUSY_ELSEWHERE = 0.25


def cpu_seconds():
    """(CPU seconds used on the whole machine, by this process and its waited-for
    children), or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _, _, irq, softirq = map(int, f.readline().split()[1:8])
    except (OSError, ValueError):
        return None
    t = os.times()
    return ((user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"),
            t.user + t.system + t.children_user + t.children_system)


def calibrate_and_measure(tmp_path, n, attempt):
    """hpcdl bench calibrate on 2 ranks, then its --predict-from on n ranks;
    returns (calibration, prediction document, output, share of the machine
    that other programs used meanwhile)."""
    cal, out = tmp_path / ("cal%d.json" % attempt), tmp_path / ("out%d.json" % attempt)
    start, t0 = cpu_seconds(), time.monotonic()
    r = run_mpi(2, HPCDL + ["bench", "calibrate", "--max-bytes", "4M", "--time-budget",
                            "0.1", "--json", str(cal)], timeout=90)
    assert r.returncode == 0, r.stdout
    doc = json.loads(cal.read_text())
    assert doc["ranks"] == 2 and doc["alpha"] > 0 and doc["beta"] > 0 and doc["gamma"] >= 0
    assert "intra" in doc["links"] and len(doc["links"]["intra"]["rows"]) == 12  # 0, 4..4M
    # more iterations than the default: the fastest of them is compared
    r = run_mpi(n, HPCDL + ["bench", "calibrate", "--predict-from", str(cal), "--min-bytes",
                            "64K", "--max-bytes", "4M", "--iters", "40", "--time-budget",
                            "0.3", "--json", str(out)], timeout=90)
    assert r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout, r.stdout
    end, wall = cpu_seconds(), time.monotonic() - t0
    busy = 0.0
    if start and end:
        others = (end[0] - start[0]) - (end[1] - start[1])
        busy = max(0.0, others / (wall * (os.cpu_count() or 1)))
    return doc, json.loads(out.read_text()), r.stdout, busy


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_prediction_matches_measurement(tmp_path, n):
    lo, hi = BANDS[n]
    tables, busy = [], []
    for attempt in range(ATTEMPTS):
        cal, got, text, elsewhere = calibrate_and_measure(tmp_path, n, attempt)
        rows = got["allreduce"]["rows"]
        assert [row["bytes"] for row in rows] == SIZES
        assert all(row["wrong"] == 0 for row in rows), text
        assert got["timeshare"] == max(1.0, n / os.cpu_count())
        assert got["alpha"] == cal["alpha"] and got["calibration"].endswith(".json")
        ratios = [row["ratio"] for row in rows]
        tables.append("attempt %d, other programs used %.0f%% of the CPUs:\n%s" % (
            attempt + 1, 100 * elsewhere, text[text.index("# ring all-reduce"):]))
        busy.append(elsewhere)
        if all(lo <= q <= hi for q in ratios):
            print("within %.1fx-%.1fx at %s" % (lo, hi, tables[-1]))
            return
    if min(busy) > BUSY_ELSEWHERE:
        pytest.skip("timing not judged: other programs used %s of the CPUs during the %d "
                    "attempts (> %d%%), and every attempt fell outside %.1fx-%.1fx"
                    % (", ".join("%.0f%%" % (100 * b) for b in busy), ATTEMPTS,
                       100 * BUSY_ELSEWHERE, lo, hi))
    pytest.fail("ring all-reduce on %d ranks: measured/predicted outside %.1fx-%.1fx in %d "
                "attempts:\n%s" % (n, lo, hi, ATTEMPTS, "\n".join(tables)))


@pytest.mark.mpi
def test_tutorial_07_check_catches_a_wrong_sum(tmp_path):
    # a parameter server that subtracts instead of adding: the tutorial's own
    # check (every implementation equals MPI_Allreduce) must end it non-zero
    src = os.path.join(os.path.dirname(__file__), "..", "tutorials", "07_alpha_beta.py")
    with open(src) as f:
        text = f.read()
    assert text.count("x += incoming") == 1
    broken = tmp_path / "07_broken.py"
    broken.write_text(text.replace("x += incoming", "x -= incoming"))
    r = run_mpi(2, [sys.executable, str(broken)], timeout=90)
    assert r.returncode != 0 and "wrong sum" in r.stdout, r.stdout
    assert "all checks passed" not in r.stdout
