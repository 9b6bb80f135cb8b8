"""test_train_ddp.py - `hpcdl train --mode ddp-gloo|ddp-hpcdl` (train/ddp_mode.py):
the combinations it refuses (one line, before any rank starts), and on 2 real
ranks the same short LAMB-recipe training with the gradients met by hpcdl's
all-reduce, by torch DDP over gloo and by DDP over the hpcdl backend (fp32,
and fp16 with loss scaling): the same parameters bit for bit (2 ranks: a
sum of two has one order), and within 1e-6 relative of one process
stepping on the whole global batch; a ddp-gloo checkpoint resumed by
ddp-hpcdl ends with the uninterrupted run's parameters."""
import json
import os
import subprocess
import sys

import pytest
import torch

from mpi_harness import REPO, mpi_env, run_python
from hpcdl.train.config import ConfigError, TrainConfig

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "ddp_check.py")


@pytest.mark.parametrize("values, words", [
    (dict(zero=1), "--zero 1 needs --mode allreduce"),
    (dict(compression="fp16"), "--compression fp16 is not supported with --mode ddp-gloo"),
    (dict(lr_scaling="adascale"), "--lr-scaling adascale is not supported with --mode "
                                  "ddp-gloo"),
    (dict(global_batch="auto"), "--global-batch auto is not supported with --mode ddp-gloo"),
    (dict(global_batch=30), "global batch 30 does not divide evenly by 4 ranks"),
])
def test_what_ddp_cannot_honour_is_one_line(values, words):
    with pytest.raises(ConfigError, match=words) as e:
        TrainConfig(mode="ddp-gloo", **values).check(4)
    assert "\n" not in str(e.value)


def test_the_modes_are_accepted():
    for mode in ("ddp-gloo", "ddp-hpcdl"):
        TrainConfig(mode=mode, precision="fp16").check(2)


def test_cli_refuses_before_launching():
    p = subprocess.run([sys.executable, "-m", "hpcdl", "train", "-n", "2", "--mode", "ddp-gloo",
                        "--compression", "bf16"], capture_output=True, text=True, cwd=REPO,
                       env=mpi_env(), timeout=60)  # not "inside" a job an earlier test began
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "hpcdl: error: --compression bf16 is not supported with --mode ddp-gloo (DDP "
        "all-reduces whole gradients); use --compression none or --mode allreduce"]


def _result(out):
    return json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])


@pytest.mark.mpi
def test_ddp_follows_hpcdl_and_one_process(tmp_path):
    r = run_python(2, SCRIPT, args=[str(tmp_path / "two")], timeout=300)
    two = _result(r.stdout)
    one = _result(run_python(1, SCRIPT, args=[str(tmp_path / "one"), "allreduce-fp32"],
                             timeout=180).stdout)["allreduce-fp32"]
    # a checkpoint of ddp-gloo after epoch 1 resumed by ddp-hpcdl: the 2-epoch run's weights
    # (the sha alone could not tell a resume from a silent fresh start: the modes
    # agree bit for bit on 2 ranks, so the run must also say it resumed)
    resume = two.pop("resume")
    assert resume["resumed"] == resume["whole"]
    assert r.stdout.count("hpcdl train: resumed from %s at epoch 2 step 0"
                          % (tmp_path / "two" / "ck" / "checkpoint.pt")) == 1, r.stdout
    assert [r["mode"] for r in two.values()] == ["allreduce", "ddp-gloo", "ddp-hpcdl",
                                                 "allreduce", "ddp-gloo"]
    assert [two[k]["ddp"] for k in ("ddp-gloo-fp32", "ddp-hpcdl-fp32")] == ["gloo", "hpcdl"]
    assert all(r["steps"] == 2 * (1437 // 64) for r in two.values())
    # 2 ranks: hpcdl's (a + b) / 2 and DDP's a / 2 + b / 2 are the same floats
    assert two["ddp-gloo-fp32"]["sha"] == two["allreduce-fp32"]["sha"]
    assert two["ddp-hpcdl-fp32"]["sha"] == two["allreduce-fp32"]["sha"]
    assert two["ddp-gloo-fp16"]["sha"] == two["allreduce-fp16"]["sha"]
    assert two["allreduce-fp16"]["sha"] != two["allreduce-fp32"]["sha"]  # fp16 did run
    # one process on the whole batch of 64: the same steps up to float rounding
    ref = torch.load(one["model"], weights_only=True)
    got = torch.load(two["ddp-gloo-fp32"]["model"], weights_only=True)
    assert ref.keys() == got.keys()
    for k in ref:
        err = (got[k] - ref[k]).abs().max().item()
        assert err <= 1e-6 * ref[k].abs().max().item(), (k, err)
    # the study in the same job: hpcdl bench large-batch --modes allreduce,ddp-gloo
    lb = json.loads((tmp_path / "two" / "lb.json").read_text())
    assert [(r["recipe"], r["mode"], r["batch"]) for r in lb["rows"]] == [
        ("goyal", "allreduce", 64), ("goyal", "ddp-gloo", 64)]
    hpcdl_run, ddp_run = lb["runs"]
    strip = lambda run: [{k: v for k, v in e.items() if k not in (  # noqa: E731
        "samples_per_s", "epoch_time_s", "b_simple")} for e in run["epochs"]]
    assert strip(hpcdl_run) == strip(ddp_run)  # the same numbers, only the times differ
    assert ddp_run["epochs"][-1]["b_simple"] is None  # DDP measures no noise scale
    (c,) = lb["mode_comparison"]
    assert (c["first"], c["other"], c["batch"]) == ("allreduce", "ddp-gloo", 64)
    assert c["train_speedup"] == pytest.approx(c["train_s"][1] / c["train_s"][0])
