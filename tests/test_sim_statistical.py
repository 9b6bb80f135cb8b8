"""test_sim_statistical.py - time to accuracy (hpcdl/sim/statistical.py):
McCandlish's steps to the target, the step time and the best global batch
against values worked out by hand, the fit of the stored MNIST-1D study
against its measured steps to the target, and `hpcdl sim time-to-accuracy`
(rows, JSON, one-line errors). Pure Python, in-process: no MPI."""
import json
import math
import os

import pytest

from hpcdl.bench.large_batch import fit_steps
from hpcdl.cli.main import main
from hpcdl.sim import scaling, statistical as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = {"seed 0": "benchmarks/large-batch-mnist1d-seed0.json",
           "seeds 1-2": "benchmarks/large-batch-mnist1d-seeds12.json"}
FIT = st.Fit(s_min=100.0, b_noise=1000.0)
FREE = scaling.Network(alpha=0.0, beta=0.0)


def study(name):
    with open(os.path.join(ROOT, STUDIES[name])) as f:
        return json.load(f)


# ---------------------------------------------------------------- the formulas
def test_steps_and_epochs_by_hand():
    assert st.steps_to_target(1000, FIT) == pytest.approx(200)       # B = B_noise: 2 S_min
    assert st.steps_to_target(250, FIT) == pytest.approx(500)        # 100 (1 + 4)
    assert st.steps_to_target(1e12, FIT) == pytest.approx(100)       # -> S_min
    # S B / D: 200 steps of 1000 samples over 50,000 samples = 4 epochs
    assert st.epochs_to_target(1000, FIT, 50_000) == pytest.approx(4.0)
    # small batches: epochs -> E_min = S_min B_noise / D = 2
    assert st.epochs_to_target(1, FIT, 50_000) == pytest.approx(100 * 1001 / 50_000)


def test_step_time_by_hand():
    # ring on 4 ranks, 1000 fp32 parameters = 4000 bytes, alpha 1 us, beta 1 ns/B:
    # 2 (N-1) alpha + 2 (N-1)/N M beta = 6 us + 6 us
    net = scaling.Network(alpha=1e-6, beta=1e-9)
    work = st.Work(compute_per_sample_s=1e-4, params=1000, fixed_s=5e-4)
    comm, step = st.step_time(4, 10, work, net)
    assert comm == pytest.approx(12e-6)
    assert step == pytest.approx(1e-3 + 12e-6 + 5e-4)
    work.overlap = 0.5                        # 0.5 ms of compute hides the 12 us
    assert st.step_time(4, 10, work, net)[1] == pytest.approx(1.5e-3)
    row = st.time_to_target(4, 10, FIT, work, net, dataset_size=400)
    assert row["batch"] == 40 and row["steps"] == pytest.approx(100 * (1 + 1000 / 40))
    assert row["time_s"] == pytest.approx(row["steps"] * 1.5e-3)
    assert row["epochs"] == pytest.approx(row["steps"] * 40 / 400)


def test_free_communication_the_smallest_batch_wins():
    # K = 0: T = S_min c (B + B_noise) / N grows with B
    work = st.Work(compute_per_sample_s=1e-3, params=1000)
    best = st.best_batch(8, FIT, work, FREE, [1, 2, 4, 8, 16])
    assert best["local_batch"] == 1 and best["at_floor"] and not best["at_cap"]
    assert best["time_s"] == pytest.approx(100 * 1e-3 * (8 + 1000) / 8)


def test_free_compute_the_largest_batch_wins():
    # c -> 0: T = S_min (1 + B_noise / B) K falls with B: the memory cap binds
    work = st.Work(compute_per_sample_s=1e-12, params=10_000)
    net = scaling.Network(alpha=5e-6, beta=1e-10)
    rows = st.table([8, 64], FIT, work, net, st.local_batch_grid(256))
    assert all(r["local_batch"] == 256 and r["at_cap"] for r in rows)


def test_best_batch_is_the_closed_form():
    # no overlap: B* = sqrt(N K B_noise / c); N 8, K 1 ms, c 10 us: sqrt(8e5) = 894.4
    work = st.Work(compute_per_sample_s=1e-5, params=1000, fixed_s=1e-3)
    assert st.optimal_batch(8, 1e-3, FIT, 1e-5) == pytest.approx(math.sqrt(8e5))
    best = st.best_batch(8, FIT, work, FREE, range(1, 1000))
    assert best["local_batch"] == 112                 # 894.4 / 8 = 111.8
    assert best["continuous_batch"] == pytest.approx(math.sqrt(8e5))
    # a slower link (larger K) wants a larger batch; a slower GPU a smaller one
    slow_link = st.best_batch(8, FIT, st.Work(1e-5, 1000, fixed_s=4e-3), FREE, range(1, 1000))
    slow_gpu = st.best_batch(8, FIT, st.Work(4e-5, 1000, fixed_s=1e-3), FREE, range(1, 1000))
    assert slow_link["local_batch"] == 224 and slow_gpu["local_batch"] == 56


def test_table_speedup_and_comm_from_the_cost_model():
    net = scaling.Network(alpha=5e-6, beta=1 / 12.5e9)
    work = st.Work(compute_per_sample_s=5e-5, params=1_000_000, fixed_s=2e-4)
    rows = st.table([64, 8, 512], FIT, work, net, st.local_batch_grid(256), "ring", 10**6)
    assert [r["gpus"] for r in rows] == [8, 64, 512]
    assert rows[0]["speedup"] == 1.0 and rows[0]["efficiency"] == 1.0
    for r in rows:
        assert r["comm_s"] == pytest.approx(scaling.comm_time("ring", r["gpus"], 4e6, net))
        best = min(st.time_to_target(r["gpus"], b, FIT, work, net)["time_s"]
                   for b in st.local_batch_grid(256))
        assert r["time_s"] == pytest.approx(best)
        assert r["speedup"] == pytest.approx(rows[0]["time_s"] / r["time_s"])
        assert r["efficiency"] == pytest.approx(r["speedup"] * 8 / r["gpus"])


def test_local_batch_grid():
    assert st.local_batch_grid(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert st.local_batch_grid(100, 3) == [3, 4, 8, 16, 32, 64, 100]
    assert st.local_batch_grid(5, 5) == [5]


@pytest.mark.parametrize("call, words", [
    (lambda: st.steps_to_target(0, FIT), "global batch must be a number > 0"),
    (lambda: st.check_fit(st.Fit(-1, 10)), "S_min"),
    (lambda: st.check_fit(st.Fit(10, 0)), "B_noise"),
    (lambda: st.local_batch_grid(4, 8), "1 <= min <= max"),
    (lambda: st.table([8], FIT, st.Work(0, 10), FREE, [1]), "compute per sample"),
    (lambda: st.table([12], FIT, st.Work(1e-3, 10), FREE, [1], "hier"), "whole nodes"),
    (lambda: st.fit_from_study({"rows": []}), "no recipe reached the target"),
    (lambda: st.fit_from_study([]), "no 'rows' list"),
])
def test_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# ---------------------------------------------------------------- the measured study
def test_stored_fits_are_the_printed_ones():
    # benchmarks/large-batch.md prints S_min 145, B_noise 8793 and 55, 30299
    for name, (s_min, b_noise) in (("seed 0", (145, 8793)), ("seeds 1-2", (55, 30299))):
        fit = st.fit_from_study(study(name))
        assert (round(fit.s_min), round(fit.b_noise)) == (s_min, b_noise)
        assert fit.batches == (64, 2048, 8192) and "recipe lamb" in fit.source
    with pytest.raises(ValueError, match="recipe 'goyal' has no fit"):
        st.fit_from_study(study("seed 0"), "goyal")
    assert st.train_samples(study("seed 0")) == 160_000     # mnist1d:200000 less its test fifth


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_prediction_within_20_percent_of_the_measured_steps(name):
    """The issue's check: S(B) from the fit against the steps to the target
    measured at every batch of the sweep (lamb, the one recipe that reached
    the target at all three), then out of sample: fitted on two batches,
    predict the third (worst case 11.6%: seeds 1-2 at 8192)."""
    doc = study(name)
    fit = st.fit_from_study(doc, "lamb")
    points = st.measured_points(doc, "lamb")
    assert len(points) == 3
    for batch, measured in points:
        assert st.steps_to_target(batch, fit) == pytest.approx(measured, rel=0.2)
    for left_out in range(3):
        s_min, b_noise = fit_steps([p for i, p in enumerate(points) if i != left_out])
        batch, measured = points[left_out]
        assert st.steps_to_target(batch, st.Fit(s_min, b_noise)) == pytest.approx(measured,
                                                                                  rel=0.2)


# ---------------------------------------------------------------- the command
BASE = ["sim", "time-to-accuracy", "--compute-ms-per-sample", "0.05", "--model", "1M",
        "--alpha", "5us", "--beta", "12.5GB/s"]


def test_cli_rows_and_json(tmp_path, capsys):
    out = tmp_path / "tta.json"
    args = BASE + ["--from", os.path.join(ROOT, STUDIES["seed 0"]), "--gpus", "8,64,4096",
                   "--max-local-batch", "512", "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "S_min 144.5, B_noise 8793" in text and "measured at batches 64,2048,8192" in text
    doc = json.loads(out.read_text())
    assert [r["gpus"] for r in doc["rows"]] == [8, 64, 4096]
    assert doc["dataset_size"] == 160_000 and doc["local_batches"][-1] == 512
    net = scaling.Network(alpha=5e-6, beta=1 / 12.5e9)
    work = st.Work(5e-5, 1_000_000)
    fit = st.fit_from_study(study("seed 0"))
    want = st.table([8, 64, 4096], fit, work, net, st.local_batch_grid(512), "ring", 160_000)
    for got, row in zip(doc["rows"], want):
        assert got["batch"] == row["batch"] and got["time_s"] == pytest.approx(row["time_s"])
        assert ("%8d %6d %10d" % (row["gpus"], row["local_batch"], row["batch"])) in text
    # flags win over the study's fit
    assert main(BASE + ["--from", os.path.join(ROOT, STUDIES["seed 0"]), "--s-min", "10",
                        "--gpus", "8"]) == 0
    assert "S_min 10, B_noise 8793" in capsys.readouterr().out


def test_cli_profile(tmp_path, capsys):
    prof = {"model": "tiny", "forward_s": 0.001, "backward_s": 0.003, "batch": 40,
            "optimizer_s": 0.0005, "params": 2000, "spread": 0.0,
            "layers": [{"name": "w", "nbytes": 8000, "backward_s": 0.003}]}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    out = tmp_path / "tta.json"
    assert main(["sim", "time-to-accuracy", "--profile", str(path), "--s-min", "100",
                 "--b-noise", "1000", "--alpha", "0", "--beta", "0", "--gpus", "8",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["compute_per_sample_s"] == pytest.approx(0.004 / 40)
    assert doc["fixed_s"] == pytest.approx(0.0005) and doc["params"] == 2000
    # free link: K = the optimizer's 0.5 ms; B* = sqrt(8 x 0.5 ms x 1000 / 0.1 ms) = 200
    assert doc["rows"][0]["continuous_batch"] == pytest.approx(200)
    assert doc["rows"][0]["local_batch"] in (16, 32)
    capsys.readouterr()


@pytest.mark.parametrize("args, words", [
    (["--s-min", "100"], "give --s-min and --b-noise"),
    (["--s-min", "100", "--b-noise", "-5"], "B_noise"),
    (["--from", "/nonexistent/study.json"], "cannot read the study"),
    (["--s-min", "1", "--b-noise", "1", "--gpus", "8,x"], "bad --gpus"),
    (["--s-min", "1", "--b-noise", "1", "--max-local-batch", "0"], "1 <= min <= max"),
    (["--s-min", "1", "--b-noise", "1", "--algorithm", "star"], "unknown algorithm"),
    (["--s-min", "1", "--b-noise", "1", "--profile", "/nonexistent/p.json"],
     "give --profile or --compute-ms-per-sample, not both"),
    (["--s-min", "1", "--b-noise", "1", "--dataset-size", "0"], "dataset size"),
])
def test_cli_bad_input(args, words, capsys):
    assert main(BASE + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_cli_needs_a_compute_time(capsys):
    assert main(["sim", "time-to-accuracy", "--s-min", "1", "--b-noise", "1", "--alpha", "0",
                 "--beta", "0"]) == 2
    assert "give --compute-ms-per-sample" in capsys.readouterr().err
