"""test_goodput_train.py - `hpcdl train --global-batch auto` (docs/goodput.md):
its flags' checks (one line each, before any rank starts), and on 2 real ranks
(digits) a run that re-picks the batch, logs the goodput table it compared,
and resumes exactly from a checkpoint taken after the change (the same
params_sha256 as the uninterrupted run)."""
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpi_harness import REPO, run_python
from hpcdl.train.config import ConfigError, TrainConfig, load_file, resolve

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "goodput_check.py")


def test_auto_starts_at_the_base_batch_with_adascale():
    cfg = TrainConfig(global_batch="auto", base_batch=64)
    assert (cfg.auto_batch, cfg.global_batch, cfg.lr_scaling) == (True, 64, "adascale")
    cfg.check(2)
    assert not TrainConfig(global_batch=64).auto_batch


def test_auto_from_a_config_file_and_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("global-batch: auto\nbase-batch: 32\nmax-global-batch: 256\n")
    cfg = resolve(load_file(str(f)), {})
    assert (cfg.auto_batch, cfg.global_batch, cfg.max_global_batch) == (True, 32, 256)


@pytest.mark.parametrize("values, size, words", [
    (dict(global_batch="auto", lr_scaling="linear"), 2, "--lr-scaling adascale"),
    (dict(global_batch="auto", base_batch=64, max_global_batch=32), 2, "below --base-batch"),
    (dict(global_batch=64, max_global_batch=256), 2, "--max-global-batch is the ceiling"),
    (dict(global_batch=64, repick_steps=-5), 2, "--repick-steps -5: give 0"),
    (dict(global_batch="auto", repick_steps=-1), 2, "--repick-steps -1: give 0"),
    (dict(global_batch="auto"), 1, "run on 2 or more"),
    (dict(global_batch="auto", mode="ps-bsp", lr_scaling="adascale"), 3, "--mode ps-bsp"),
])
def test_bad_combinations_fail_in_one_line(values, size, words):
    with pytest.raises(ConfigError, match=words) as e:
        TrainConfig(**values).check(size)
    assert "\n" not in str(e.value)


def test_cli_refuses_before_launching():
    p = subprocess.run([sys.executable, "-m", "hpcdl", "train", "-n", "2", "--global-batch",
                        "auto", "--lr-scaling", "sqrt"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert p.returncode == 2 and "--lr-scaling adascale" in p.stderr
    p = subprocess.run([sys.executable, "-m", "hpcdl", "train", "--global-batch", "big"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and "give an integer like 128, or auto" in p.stderr


def test_the_step_time_probe_reads_a_shard_directory(tmp_path, monkeypatch):
    """--data DIR (train/shards.py) holds no x_train in memory: the probe
    reads its samples through the source's train_batches (it failed with
    AttributeError at the first re-pick before), and leaves the run's random
    state as it was (the shard DataLoader draws its seed from it)."""
    from data_helpers import make_npz, write
    from hpcdl.train import shards
    from hpcdl.train.goodput import AutoBatch
    make_npz(tmp_path / "s.npz", n=40, shape=(6,), classes=3)
    write(str(tmp_path / "s.npz"), tmp_path / "sh", shards=2, val_fraction=0.25)
    monkeypatch.setattr(shards, "comm", SimpleNamespace(rank=lambda: 0,  # one process
                                                        bcast_object=lambda o, root: o))
    ds = shards.load_shards(str(tmp_path / "sh"), workers=0)
    auto = AutoBatch.__new__(AutoBatch)  # no ranks: samples and probe need none
    auto.cfg, auto.ds = TrainConfig(global_batch="auto", base_batch=8, hidden=(4,)), ds
    auto.strategy = SimpleNamespace(device=torch.device("cpu"))
    rng = torch.get_rng_state()
    x, y = auto.samples(16)
    assert auto.probe(8, x, y) > 0
    assert torch.equal(torch.get_rng_state(), rng)
    (x0, y0), = ds.train_batches(np.arange(16).reshape(1, 16))
    assert torch.equal(x, x0) and torch.equal(y, y0) and len(y) == 16


@pytest.mark.mpi
def test_auto_changes_the_batch_and_resumes_exactly(tmp_path):
    out = run_python(2, SCRIPT, args=[str(tmp_path)], timeout=240).stdout
    res = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])
    # the batch is re-picked at epoch 1's end (or the table says why not: then the
    # base batch won on predicted goodput, which it cannot on this comm-bound MLP)
    table = {r["global_batch"]: r["goodput"] for r in res["goodput"]}
    assert sorted(table) == [32, 64, 128]
    assert res["next"][0] == max(table, key=table.get)
    assert res["batches"][0] == 32 and res["batches"][1] == res["next"][0] != 32, res
    assert set(res["model"]) == {"a", "c", "comm"} and min(res["model"].values()) >= 0
    # every epoch ran at the batch chosen at the end of the one before
    assert res["batches"][1:] == res["next"][:-1]
    assert len(res["batches"]) >= 3, res  # the kept checkpoint is mid-run: B trains
    assert res["a"] == res["b"], out  # params_sha256, steps, final batch
    # --repick-steps 10: the model is measured at step 10 of epoch 1, the batch
    # changes within an epoch (logged with its table), and a run resumed 3
    # steps after that change ends as the uninterrupted one
    assert set(res["c_model"]) == {"a", "c", "comm"}, res
    within = [ch for epoch in res["within"] for ch in epoch]
    assert within and within[0]["step"] % 10 == 0 and within[0]["global_batch"] == 32, res
    for ch in within:
        assert ch["next_global_batch"] != ch["global_batch"], res
        assert sorted(r["global_batch"] for r in ch["goodput"]) == [32, 64, 128], res
    assert res["c"] == res["d"], out
    assert re.search(r"resumed from \S+ at epoch 1 step 3 of batch \d+ \(after the epoch's "
                     r"first \d+ samples at other batches\)", out), out
