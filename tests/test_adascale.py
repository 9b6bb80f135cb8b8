"""test_adascale.py - AdaScale (hpcdl/optim/adascale.py, hpcdl/torch/adascale.py,
hpcdl train --lr-scaling adascale; docs/adascale.md): the gain against its formula
on hand-worked statistics, the progress and the scale-invariant scheduler, the
config's one-line errors (unit); DistributedOptimizer(adascale=...) against
one-process math, with backward passes against the same total batch without,
at ZeRO 1 and 2, resumed bitwise (2 ranks, one launch); hpcdl train on 2 ranks
learns, logs the gain, ends at the base schedule's steps and resumes exactly."""
import json
import math
import os
import signal
import sys

import pytest
import torch

from hpcdl.optim import lr_at, warmup_schedule
from hpcdl.optim.adascale import (Progress, ScaleInvariantScheduler, check_scale, gain,
                                  gain_from_noise)
from hpcdl.train.config import TrainConfig
from hpcdl.train.errors import ConfigError


# ---------------------------------------------------------------- the gain, by hand
def test_gain_hand_worked():
    # var = tr(Sigma)/B0 = 3, |G|^2 = 1, S = 4: (3 + 1) / (3/4 + 1) = 4 / 1.75
    assert gain(3.0, 1.0, 4) == pytest.approx(16 / 7, rel=1e-15)
    # all signal: 1; all noise: S; S = 1: exactly 1 whatever the statistics
    assert gain(0.0, 2.0, 8) == 1.0
    assert gain(5.0, 0.0, 8) == 8.0
    assert gain(3.0, 1.0, 1) == 1.0 and gain(0.7, 0.3, 1.0) == 1.0
    # the B_simple form: r = (1 + Bs/B0) / (1 + Bs/(S B0)); Bs = 96, B0 = 32, S = 8
    assert gain(96 / 32, 1.0, 8) == pytest.approx((1 + 3) / (1 + 96 / 256), rel=1e-15)


def test_gain_edge_cases():
    assert gain(None, None, 16) == 1.0              # no estimate yet
    assert gain(-2.0, 1.0, 16) == 1.0               # a negative variance counts as 0
    assert gain(2.0, -1.0, 16) == 16.0              # |G|^2 <= 0 with noise: all noise
    assert gain(-1.0, -1.0, 16) == 1.0 and gain(0.0, 0.0, 16) == 1.0
    for var, sqr in ((1e-30, 1e30), (1e30, 1e-30), (2.0, 3.0), (7.0, 1e-3)):
        assert 1.0 <= gain(var, sqr, 32) <= 32.0


def test_gain_from_noise_hand_worked():
    # tr(Sigma) of one sample 64, |G|^2 1, global batch 256 = 8 x base 32:
    # var of a base batch = 64/32 = 2, r = (2 + 1) / (2/8 + 1) = 2.4
    assert gain_from_noise(64.0, 1.0, 8, batch=256) == pytest.approx(2.4, rel=1e-15)
    # in units of one rank's step (hpcdl/torch/adascale.py): N = 4 ranks, S = 8:
    # a base batch is half a rank's, its variance twice the rank's 0.5
    assert gain_from_noise(0.5, 1.0, 8, batch=4) == pytest.approx((1 + 1) / (1 / 8 + 1))
    assert gain_from_noise(None, None, 8, batch=4) == 1.0


@pytest.mark.parametrize("bad", [0.5, 0, -2, float("nan"), float("inf"), True, "4"])
def test_bad_scale(bad):
    with pytest.raises(ValueError, match="a number >= 1"):
        check_scale(bad)


# ---------------------------------------------------------------- progress and schedule
def test_progress_sums_gains_and_round_trips():
    p = Progress(8)
    assert p.mean_gain() == 1.0 and p.last_gain == 1.0
    for r in (1.0, 2.5, 4.25):
        p.advance(r)
    assert p.steps == 7.75 and p.iterations == 3 and p.last_gain == 4.25
    assert p.mean_gain() == pytest.approx(7.75 / 3)
    q = Progress(16)
    q.load_state_dict(p.state_dict())
    assert (q.steps, q.iterations, q.last_gain, q.scale) == (7.75, 3, 4.25, 16.0)
    with pytest.raises(ValueError, match="gain must be a number >= 1"):
        p.advance(0.5)


def test_scale_invariant_scheduler_reads_the_base_schedule_at_the_progress():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=0.4)
    progress = [0.0]
    sched = ScaleInvariantScheduler(warmup_schedule(opt, steps_per_epoch=10, epochs=3,
                                                    warmup_epochs=1, decay="cosine"),
                                    lambda: progress[0])
    want = dict(steps_per_epoch=10, epochs=3, warmup_epochs=1, decay="cosine")
    for r in (1.0, 3.5, 1.25, 7.0, 30.0):  # the last runs past the 30 base steps
        progress[0] += r
        opt.step()
        sched.step()
        base = math.floor(progress[0])
        assert sched.last_epoch == base
        assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(base, 0.4, **want))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine spent
    with pytest.raises(TypeError, match="progress is a function"):
        ScaleInvariantScheduler(sched.scheduler, 3.0)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("fields,size,message", [
    (dict(mode="ps-bsp"), 3, "does not work with --mode ps-bsp"),
    (dict(zero=3), 2, "does not work with --zero 3"),
    (dict(compression="topk:0.1"), 2, "does not work with --compression topk:0.1"),
    (dict(), 1, "does not work with 1 rank"),
    (dict(global_batch=64, base_batch=128), 2, "needs --global-batch (64) >= --base-batch"),
    # auto brings adascale itself: the line names auto, not a flag the user never gave
    (dict(global_batch="auto"), 1, "--global-batch auto (its lr is AdaScale's) does not work "
                               "with 1 rank"),
])
def test_config_refuses(fields, size, message):
    cfg = TrainConfig(**dict(dict(lr_scaling="adascale", global_batch=256, base_batch=32),
                             **fields))
    with pytest.raises(ConfigError) as e:
        cfg.check(size)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


# ---------------------------------------------------------------- 2 ranks
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "adascale_check.py")


@pytest.mark.mpi
def test_optimizer_against_one_process():
    """formula, passes (2 backward passes against one of twice the batch), zero
    (stages 1 and 2), resume (bitwise), bad (one-line errors): one launch."""
    from mpi_harness import run_python
    r = run_python(2, SCRIPT, timeout=240)
    assert r.stdout.count(" ok (rank") == 5 * 2, r.stdout


TRAIN = [sys.executable, "-m", "hpcdl", "train"]
ADASCALE = ["--epochs", "3", "--global-batch", "128", "--base-batch", "32", "--base-lr",
            "0.05", "--lr-scaling", "adascale", "--schedule", "cosine", "--hidden", "64,32",
            "--precision", "fp16"]


@pytest.mark.mpi
def test_train_adascale_learns_logs_the_gain_and_resumes_exactly(tmp_path):
    """digits, 2 ranks, 4x the base batch with fp16 loss scaling: every epoch's
    record has the gain in [1, 4] and the progress; training ends once the
    progress reaches the base schedule's 3 x (1437 // 32) steps, in more passes
    than 3; a run stopped by SIGUSR1 and resumed ends with the same parameters."""
    from mpi_harness import run_mpi
    from test_train_resume import _start_then_signal
    full = tmp_path / "full"
    r = run_mpi(2, TRAIN + ADASCALE + ["--out", str(full)], timeout=180, check=True)
    assert "AdaScale: the schedule of batch 32 (132 steps in 3 epochs)" in r.stdout, r.stdout
    recs = [json.loads(l) for l in (full / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((full / "summary.json").read_text())
    assert all(1.0 <= rec["gain"] <= 4.0 for rec in recs), recs
    assert any(rec["gain"] > 1.2 for rec in recs), recs  # the batch is worth more than one
    progress = [rec["scale_invariant_steps"] for rec in recs]
    assert progress == sorted(progress) and progress[-2] < 132 <= progress[-1], progress
    assert len(recs) > 3 and summary["base_steps"] == 132
    assert summary["scale_invariant_steps"] == progress[-1]
    assert summary["test_accuracy"] > 0.85, summary
    assert 1.0 < summary["mean_gain"] <= 4.0
    assert summary["mean_gain"] == pytest.approx(progress[-1] / summary["steps"])

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    code, text = _start_then_signal(out, ckpt, signal.SIGUSR1, 1, recipe=ADASCALE)
    assert code == 0 and "stopped by SIGUSR1 at epoch" in text, text
    r = run_mpi(2, TRAIN + ADASCALE + ["--out", str(out), "--checkpoint-dir", str(ckpt),
                                       "--resume"], timeout=180, check=True)
    assert "resumed from" in r.stdout, r.stdout
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["params_sha256"] == summary["params_sha256"], r.stdout
    assert resumed["steps"] == summary["steps"]
    assert resumed["scale_invariant_steps"] == summary["scale_invariant_steps"]
