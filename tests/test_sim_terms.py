"""test_sim_terms.py - hpcdl.sim's step model term by term (terms.py,
stragglers.py) against closed-form math worked out by hand, the course
formula kept exact with every term off, `hpcdl sim step` and its bad input.
Profiles and published records: test_sim_records.py."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from hpcdl.sim import calibrate, cost, cpu, scaling, stragglers, terms, units

HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl(*args, timeout=120):
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------
# stragglers: E[max of N standard normals]

def test_expected_max_closed_forms():
    # e_1 = 0, e_2 = 1/sqrt(pi), e_3 = 3/(2 sqrt(pi)) (order statistics of normals)
    assert stragglers.expected_max_std_normal(1) == 0.0
    assert stragglers.expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi),
                                                                  rel=1e-6)
    assert stragglers.expected_max_std_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi),
                                                                  rel=1e-6)


def test_expected_max_against_sampling():
    rng = np.random.default_rng(7)
    for n in (8, 256):
        sample = rng.standard_normal((4000, n)).max(axis=1).mean()
        assert stragglers.expected_max_std_normal(n) == pytest.approx(sample, abs=0.03)
    e = [stragglers.expected_max_std_normal(n) for n in (2, 8, 64, 512, 4096)]
    assert e == sorted(e) and e[-1] < math.sqrt(2 * math.log(4096))   # grows, slowly


def test_slowdown_rejects_negative_spread():
    assert stragglers.slowdown(2, 0.1) == pytest.approx(1 + 0.1 / math.sqrt(math.pi))
    with pytest.raises(ValueError, match="spread"):
        stragglers.slowdown(4, -0.1)


# ----------------------------------------------------------------------------
# the course formula is what is left with every term off

@pytest.mark.parametrize("algorithm", ["ring", "hier"])
@pytest.mark.parametrize("overlap", [0.0, 0.3])
def test_terms_off_is_the_course_formula(algorithm, overlap):
    params = 25_557_032
    step = terms.Step(terms.synthetic_layers(4 * params, 0.08), 0.02, overlap=overlap)
    net = scaling.Network(5e-6, 1e-9, 2e-6, 1 / 150e9, per_node=8)
    fab = terms.Fabric(5e-6, 1e-9, 2e-6, 1 / 150e9, per_node=8, algorithm=algorithm)
    work = scaling.Workload(params, 0.1, overlap=overlap)
    for n in (1, 2, 8, 16, 64):
        want = scaling.predict(algorithm, n, work, net)
        got = terms.step_time(n, step, fab)
        assert got[0] == pytest.approx(want.step_s, rel=1e-12)
        assert got[1] == pytest.approx(want.exposed_s, rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------
# buckets, by hand: 2 ranks on one node, ring cost = 2a + M b with a = 0

def two_layers(per_bucket_s):
    """Two layers of 100 B, 1 s of backward each; a bucket of 100 B costs
    per_bucket_s on 2 ranks (ring: 2 (N-1)/N M b = 100 b)."""
    step = terms.Step([terms.Layer(100, 1.0), terms.Layer(100, 1.0)], forward_s=0.5,
                      fusion_bytes=0)
    fab = terms.Fabric(0.0, per_bucket_s / 100, 0.0, per_bucket_s / 100, per_node=8,
                       algorithm="ring")
    return step, fab


def test_last_bucket_is_never_hidden():
    # bucket 1 ready at 1 s, sent 1-2; bucket 2 ready at 2 s, sent 2-3;
    # backward ends at 2 s: 1 s exposed (the last bucket), step 0.5 + 2 + 1
    step, fab = two_layers(1.0)
    s, exposed, comm, buckets = terms.step_time(2, step, fab, ["buckets"])
    assert (s, exposed, comm, buckets) == pytest.approx((3.5, 1.0, 2.0, 2))
    # without buckets: one 200 B message after backward, 2 s exposed
    assert terms.step_time(2, step, fab)[0] == pytest.approx(4.5)


def test_buckets_queue_on_one_link():
    # each bucket 3 s: 1-4 and 4-7 (the second waits for the link): 5 s exposed
    step, fab = two_layers(3.0)
    assert terms.step_time(2, step, fab, ["buckets"])[1] == pytest.approx(5.0)


def test_plan_buckets_like_the_optimizer():
    layers = [terms.Layer(b, 0.0) for b in (400, 700, 300, 600, 900, 100)]
    # first bucket <= 500 B, then <= 1000 B; a layer never splits
    assert terms.plan_buckets(layers, 1000, 500) == [(400, 0), (1000, 2), (600, 3),
                                                     (1000, 5)]
    assert len(terms.plan_buckets(layers, 0, 500)) == 6                  # per layer
    equal = terms.synthetic_layers(102.2e6, 1.0, 50)                    # floats add up
    assert len(terms.plan_buckets(equal, 102.2e6, 102.2e6)) == 1


# ----------------------------------------------------------------------------
# shared links, compression, stragglers, overheads

def resnet_step(**kw):
    return terms.Step(terms.synthetic_layers(102.2e6, 0.1), 0.05, fusion_bytes=0, **kw)


def test_shared_nic_divides_the_inter_node_bandwidth():
    # 16 GPUs, 8 per node, 1 NIC: the 8 inter-node rings share it, beta x 8
    fab = terms.Fabric(1e-6, 1e-9, 1e-6, 1e-11, per_node=8, nics_per_node=1)
    want = cost.hierarchical_allreduce(16, 1e6, 8, 1e-6, 1e-11, 1e-6, 8e-9)
    assert terms.allreduce_s(16, 1e6, fab, shared=True) == pytest.approx(want)
    assert terms.allreduce_s(16, 1e6, fab, shared=False) == pytest.approx(
        cost.hierarchical_allreduce(16, 1e6, 8, 1e-6, 1e-11, 1e-6, 1e-9))
    ring = terms.Fabric(1e-6, 1e-9, 1e-6, 1e-11, per_node=8, nics_per_node=1,
                        algorithm="ring")   # a flat ring: one inter-node edge per node
    assert terms.allreduce_s(16, 1e6, ring, True) == terms.allreduce_s(16, 1e6, ring, False)


def test_compression_halves_the_bytes_and_costs_its_encoding():
    fab = terms.Fabric(0.0, 1e-9, 0.0, 1e-9, per_node=8, algorithm="ring")
    step = terms.Step([terms.Layer(1e6, 1.0)], 0.0, wire_bytes=2, compress_gamma=1e-10)
    full = terms.step_time(4, step, fab, [])[2]
    half = terms.step_time(4, step, fab, ["compression"])[2]
    assert full == pytest.approx(2 * 0.75 * 1e6 * 1e-9)
    assert half == pytest.approx(full / 2 + 1e6 * 1e-10)


def test_stragglers_stretch_compute_by_the_expected_max():
    fab = terms.Fabric(0.0, 0.0, 0.0, 0.0, per_node=8)
    step = resnet_step(cv=0.05)
    s = terms.step_time(8, step, fab, ["stragglers"])[0]
    assert s == pytest.approx(0.15 * (1 + 0.05 * stragglers.expected_max_std_normal(8)))
    assert terms.step_time(1, step, fab, ["stragglers"])[0] == pytest.approx(0.15)


def test_overheads_add_fixed_costs_and_a_latency_per_bucket():
    step, fab = two_layers(1.0)
    step.optimizer_s, step.data_s, step.bucket_latency_s = 0.25, 0.125, 0.5
    # buckets now take 1.5 s: 1-2.5, 2.5-4; exposed 2; + 0.375 fixed
    s = terms.step_time(2, step, fab, ["buckets", "overheads"])[0]
    assert s == pytest.approx(0.5 + 2 + 2 + 0.375)
    assert terms.step_time(1, step, fab, ["buckets", "overheads"])[0] == pytest.approx(2.875)


# ----------------------------------------------------------------------------
# the host's cores (cpu.py): timeshare and the CPU that communication needs.
# two_layers(1.0): buckets of 100 B take 1 s; c = 0.005 s/B makes a bucket use
# u = c 100 / 1 = 0.5 cores while it runs.

def with_cores(cores, threads=1, c=0.005):
    step, fab = two_layers(1.0)
    step.threads, fab.cores, fab.cpu_per_byte = threads, cores, c
    return step, fab


def test_time_at_follows_the_slowed_clock():
    busy = [(1.0, 2.0, 0.5), (3.0, 4.0, 0.0)]
    assert [cpu.time_at(w, busy) for w in (0.5, 1.25, 1.5, 2.0, 2.5, 2.75)] == \
        pytest.approx([0.5, 1.5, 2.0, 2.5, 3.0, 4.25])   # stopped 3-4 s
    assert cpu.time_at(3.0, []) == 3.0


def test_cpu_slows_backward_while_a_bucket_runs():
    # 1 core, 1 thread: no spare core, backward runs at 1 - 0.5 = 0.5 during
    # bucket 1 (1-2 s): 1.5 s done at 2 s, backward ends 2.5, bucket 2 2.5-3.5
    step, fab = with_cores(1.0)
    assert terms.step_time(2, step, fab, ["buckets"])[0] == pytest.approx(3.5)
    s, exposed, _, _ = terms.step_time(2, step, fab, ["buckets", "cpu"])
    assert (s, exposed) == pytest.approx((0.5 + 2.5 + 1.0, 1.0))
    # 2 cores, 1 thread: the spare core carries the 0.5 cores: nothing changes
    step, fab = with_cores(2.0)
    assert terms.step_time(2, step, fab, ["buckets", "cpu"])[0] == pytest.approx(3.5)
    # 2 cores, 2 threads: 0.5 of backward's 2 cores: rate 0.75, ends 2.25
    step, fab = with_cores(2.0, threads=2)
    assert terms.step_time(2, step, fab, ["buckets", "cpu"])[0] == pytest.approx(3.75)
    # one GPU: no communication, no slowdown
    assert terms.step_time(1, step, fab, ["buckets", "cpu"])[0] == pytest.approx(2.5)


def test_timeshare_and_cpu_term_by_term():
    # half a core per rank, 1 thread: compute x 2 (forward 1, layers 2 s each);
    # timeshare alone: bucket 1 2-3, bucket 2 4-5: step 1 + 4 + 1 = 6;
    # cpu: the 0.5 cores are all backward had: it stops 2-3, ends 5, bucket 2
    # 5-6: step 7
    step, fab = with_cores(0.5)
    b = terms.breakdown(2, step, fab, ["buckets", "timeshare", "cpu"])
    assert b.step_s == pytest.approx(7.0)
    assert (b.terms["timeshare"], b.terms["cpu"]) == pytest.approx((2.5, 1.0))
    # without a host's cores both terms are left out, not reported as 0
    step, fab = with_cores(None)
    b = terms.breakdown(2, step, fab, terms.TERMS)
    assert "cpu" not in b.terms and "timeshare" not in b.terms


def test_cpu_with_the_course_overlap():
    # one 100 B message (1 s) hidden behind 2 s of compute at overlap 0.5:
    # compute at rate 0.5 for that 1 s adds 0.5 s
    fab = with_cores(1.0)[1]
    step = terms.Step([terms.Layer(100, 1.0)], forward_s=1.0, overlap=0.5, threads=1)
    assert terms.step_time(2, step, fab, [])[0] == pytest.approx(2.0)
    assert terms.step_time(2, step, fab, ["cpu"])[0] == pytest.approx(2.5)


def test_allreduce_term_prices_buckets_by_the_measured_table():
    assert [cpu.interpolate([(1000, 1.0), (4000, 4.0)], b) for b in (500, 2000, 8000)] == \
        pytest.approx([1.0, 2.0, 8.0])          # floor, log-log, proportional beyond
    # measured: a 100 B bucket takes 2 s on 2 ranks (the formula says 1 s):
    # buckets 1-3 and 3-5, step 0.5 + 2 + 3 = 5.5, so the term adds 2 s
    step, fab = two_layers(1.0)
    fab.measured = {2: [(100, 2.0), (1000, 20.0)]}
    b = terms.breakdown(2, step, fab, ["buckets", "allreduce"])
    assert (b.step_s, b.terms["allreduce"]) == pytest.approx((5.5, 2.0))
    assert "allreduce" not in terms.breakdown(4, step, fab, terms.TERMS).terms  # not measured


def test_cores_per_rank_counts_ranks_per_machine():
    # two vcluster hosts on one 2-core machine (one boot id), a 4-core one apart
    assert calibrate.cores_per_rank([("m1", 2), ("m1", 2), ("m2", 4)]) == 1.0
    assert calibrate.cores_per_rank([("m1", 2)] * 3) == pytest.approx(2 / 3)


def test_breakdown_adds_up_and_efficiency_uses_the_base():
    fab = terms.Fabric(5e-6, 8 / 50e9, 5e-6, 1 / 20e9, per_node=8, nics_per_node=1)
    step = resnet_step(cv=0.02, optimizer_s=0.003, bucket_latency_s=50e-6, wire_bytes=2,
                       compress_gamma=1e-12)
    b = terms.breakdown(256, step, fab, base_gpus=8)
    assert sum(b.terms.values()) == pytest.approx(b.step_s)
    base = terms.step_time(8, step, fab, terms.TERMS)[0]
    assert b.efficiency == pytest.approx(base / b.step_s)
    assert sum(b.points.values()) == pytest.approx(100 * (1 - b.efficiency))
    assert terms.breakdown(8, step, fab, base_gpus=8).efficiency == pytest.approx(1.0)


@pytest.mark.parametrize("change, words", [
    ({"gpus": [12]}, "12 GPUs do not fill nodes of 8"),
    ({"beta": -1e-9}, "--beta must be >= 0"),
    ({"nics_per_node": 0}, "--nics-per-node must be > 0"),
    ({"cv": -0.1}, "--spread must be >= 0"),
    ({"batch_per_gpu": 0}, "--batch-per-gpu must be > 0"),
])
def test_validate_names_the_input(change, words):
    step, fab, gpus = resnet_step(), terms.Fabric(1e-6, 1e-9, 1e-6, 1e-9, 8), [8, 16]
    for key, value in change.items():
        if key == "gpus":
            gpus = value
        elif hasattr(fab, key):
            setattr(fab, key, value)
        else:
            setattr(step, key, value)
    with pytest.raises(ValueError, match=words):
        terms.validate(gpus, step, fab)


def test_rates_in_bits():
    assert units.parse_beta("50Gb/s") == pytest.approx(8 / 50e9)
    assert units.parse_beta("50Gbit/s") == pytest.approx(8 / 50e9)
    assert units.parse_beta("12.5GB/s") == pytest.approx(1 / 12.5e9)


# ----------------------------------------------------------------------------
# hpcdl sim step

STEP = ["sim", "step", "--model", "resnet50", "--alpha", "5us", "--beta", "50Gb/s",
        "--beta-intra", "20GB/s", "--nics-per-node", "1", "--step-compute-ms", "200"]


def test_sim_step_cli_matches_the_library(tmp_path):
    out = tmp_path / "step.json"
    r = hpcdl(*STEP, "--gpus", "8,256", "--base-gpus", "8", "--spread", "0.02",
              "--fusion-mb", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "stragglers" in r.stdout and "efficiency points" in r.stdout
    rows = json.loads(out.read_text())["rows"]
    fab = terms.Fabric(5e-6, 8 / 50e9, 5e-6, 1 / 20e9, 8, 1)
    bwd = 0.2 * 2 / 3
    step = terms.Step(terms.synthetic_layers(4 * 25_557_032, bwd), 0.2 - bwd, fusion_bytes=0,
                      cv=0.02)
    want = terms.breakdown(256, step, fab, base_gpus=8)
    assert rows[1]["step_s"] == pytest.approx(want.step_s)
    assert rows[1]["efficiency"] == pytest.approx(want.efficiency)


@pytest.mark.parametrize("args, words", [
    (["--gpus", "12"], "12 GPUs do not fill nodes of 8"),
    (["--beta=-1GB/s"], "bad --beta '-1GB/s'"),
    (["--beta", "0Gb/s"], "--beta bandwidth must be > 0"),
    (["--spread", "-0.5"], "--spread must be >= 0"),
    (["--nics-per-node", "0"], "--nics-per-node must be > 0"),
    (["--terms", "buckets,magic"], "unknown term(s) 'magic'"),
    (["--step-compute-ms", "0"], "--step-compute-ms must be > 0"),
    (["--profile", "/nonexistent.json"], "cannot read the profile /nonexistent.json"),
    (["--cores-per-rank", "0"], "--cores-per-rank must be > 0"),
    (["--cpu-per-byte=-1ns"], "bad --cpu-per-byte '-1ns'"),
    (["--compute-from-measured"], "--compute-from-measured needs --measured"),
])
def test_sim_step_bad_input(args, words):
    r = hpcdl(*(STEP + args))
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert r.stderr.startswith("hpcdl: error:") and not r.stdout


def test_sim_step_reads_a_calibration(tmp_path):
    cal, out = tmp_path / "cal.json", tmp_path / "s.json"
    cal.write_text(json.dumps({"alpha": 2e-6, "beta": 1e-10, "alpha_intra": 1e-6,
                               "beta_intra": 1e-11, "gamma": 0.0}))
    r = hpcdl("sim", "step", "--calibration", str(cal), "--gpus", "16",
              "--step-compute-ms", "100", "--terms", "buckets", "--json", str(out))
    assert r.returncode == 0, r.stderr
    fab = terms.Fabric(2e-6, 1e-10, 1e-6, 1e-11, per_node=8)
    step = terms.Step(terms.synthetic_layers(4 * 25_557_032, 0.1 * 2 / 3), 0.1 / 3)
    want = terms.breakdown(16, step, fab, ["buckets"])
    assert json.loads(out.read_text())["rows"][0]["step_s"] == pytest.approx(want.step_s)


def test_sim_step_cpu_terms_from_a_calibration_and_a_measured_run(tmp_path):
    # the calibration's cpu_per_byte and cores_per_rank switch the host terms
    # on; --compute-from-measured scales compute to the run's no-comm step
    cal, bench, out = tmp_path / "cal.json", tmp_path / "bench.json", tmp_path / "s.json"
    cal.write_text(json.dumps({"alpha": 0.0, "beta": 1e-8, "gamma": 0.0,
                               "cpu_per_byte": 4e-9, "cores_per_rank": 2 / 3}))
    bench.write_text(json.dumps({"ranks": 3, "model": "mlp", "batch_per_rank": 8, "rows": [
        {"impl": "hpcdl", "samples_per_s": 24 / 0.9}, {"impl": "no-comm",
                                                       "samples_per_s": 24 / 0.6}]}))
    r = hpcdl("sim", "step", "--model", "mlp", "--calibration", str(cal), "--gpus", "3",
              "--gpus-per-node", "1", "--algorithm", "ring", "--step-compute-ms", "300",
              "--measured", str(bench), "--compute-from-measured", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "0.667 core(s) per rank" in r.stdout and "scaled x2" in r.stdout
    doc = json.loads(out.read_text())
    fab = terms.Fabric(0.0, 1e-8, 0.0, 1e-8, per_node=1, algorithm="ring", cores=2 / 3,
                       cpu_per_byte=4e-9)
    bwd = 0.6 * 2 / 3                       # 300 ms scaled x2 to the 600 ms no-comm step
    step = terms.Step(terms.synthetic_layers(4 * 12_609_546, bwd), 0.6 - bwd)
    want = terms.breakdown(3, step, fab)
    assert doc["rows"][0]["step_s"] == pytest.approx(want.step_s)
    assert doc["rows"][0]["terms"]["cpu"] == pytest.approx(want.terms["cpu"]) and \
        want.terms["cpu"] > 0
    assert doc["measured"]["measured_s"] == pytest.approx(0.9)


def test_cli_term_names_are_the_models():
    from hpcdl.cli import sim_terms
    assert sim_terms.TERM_NAMES == terms.TERMS


def test_bench_train_rejects_a_negative_fusion_size():
    r = hpcdl("bench", "train", "--fusion-mb", "-1")
    assert r.returncode == 2 and "--fusion-mb must be >= 0" in r.stderr, r.stderr
