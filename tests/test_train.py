"""test_train.py - the built-in trainer: per-epoch data shards, the MLP, config
checks, the -n relaunch, and synchronous SGD on 2 ranks against 1 process."""
import json
import re
import sys

import numpy as np
import pytest

from hpcdl.cli import main as cli_main
from hpcdl.train import data
from hpcdl.train.config import ConfigError, TrainConfig
from mpi_harness import run_mpi

TRAIN = [sys.executable, "-m", "hpcdl", "train"]


# ---------------------------------------------------------------- data shards
@pytest.mark.parametrize("n,global_batch,size", [
    (1437, 128, 4), (1437, 128, 1), (1024, 64, 2), (100, 6, 3), (37, 36, 4), (10, 10, 5)])
def test_shards_are_disjoint_equal_and_cover_the_epoch(n, global_batch, size):
    shards = [data.epoch_shard(n, global_batch, r, size, seed=7, epoch=3) for r in range(size)]
    steps = n // global_batch
    for s in shards:  # same number of steps and samples on every rank
        assert s.shape == (steps, global_batch // size)
    flat = np.concatenate([s.ravel() for s in shards])
    assert len(set(flat.tolist())) == len(flat)                 # disjoint
    assert len(flat) == steps * global_batch > n - global_batch  # only the tail sits out
    assert flat.min() >= 0 and flat.max() < n
    if n % global_batch == 0:
        assert sorted(flat.tolist()) == list(range(n))          # union is the data set


def test_ranks_together_read_what_one_process_reads():
    # step s on 4 ranks = rank 0's slice, then rank 1's, ... of one process's batch s
    one = data.epoch_shard(1437, 128, 0, 1, seed=1, epoch=5)
    four = [data.epoch_shard(1437, 128, r, 4, seed=1, epoch=5) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate(four, axis=1), one)


def test_each_epoch_has_a_fresh_permutation_the_same_on_every_call():
    a1, a1_again = (data.epoch_shard(500, 50, 1, 2, seed=0, epoch=1) for _ in range(2))
    a2 = data.epoch_shard(500, 50, 1, 2, seed=0, epoch=2)
    b1 = data.epoch_shard(500, 50, 1, 2, seed=9, epoch=1)
    np.testing.assert_array_equal(a1, a1_again)
    assert not np.array_equal(a1, a2) and not np.array_equal(a1, b1)


def test_shard_rejects_a_batch_that_does_not_divide():
    with pytest.raises(ValueError, match="global batch 10 .* 4 ranks"):
        data.epoch_shard(100, 10, 0, 4, seed=0, epoch=1)


@pytest.mark.parametrize("n,size", [(360, 4), (7, 3), (2, 4), (0, 2)])
def test_eval_shards_partition_the_test_set(n, size):
    parts = [data.eval_shard(n, r, size) for r in range(size)]
    assert np.concatenate(parts).tolist() == list(range(n))


def test_digits_split_is_seeded_and_standardised():
    a, b, c = data.load("digits", seed=0), data.load("digits", seed=0), data.load("digits", 1)
    assert a.x_train.shape == (1437, 64) and a.x_test.shape == (360, 64)
    assert a.num_features == 64 and a.num_classes == 10
    assert a.y_train.dtype.is_floating_point is False
    assert (a.x_train == b.x_train).all() and not (a.y_test == c.y_test).all()
    assert a.x_train.mean(0).abs().max() < 1e-5


# ---------------------------------------------------------------- model, config
@pytest.mark.parametrize("hidden", [(), (32,), (256, 128)])
def test_mlp_forward_shape(hidden):
    import torch
    from hpcdl import models
    net = models.build("mlp", in_features=64, num_classes=10, hidden=hidden)
    assert net(torch.randn(5, 64)).shape == (5, 10)
    assert sum(isinstance(m, torch.nn.Linear) for m in net.modules()) == len(hidden) + 1


@pytest.mark.parametrize("changes,message", [
    (dict(epochs=0), "--epochs is 0"),
    (dict(epochs=-3), "--epochs is -3"),
    (dict(global_batch=30), "global batch 30 does not divide evenly by 4 ranks"),
    (dict(model="resnet"), "unknown model 'resnet'; use --model with one of: mlp, cnn1d, "
                           "resnet18"),
    (dict(data="mnist"), "--data mnist: no such directory (and not a built-in source)"),
    (dict(data="synthetic:3x32"), "write synthetic data as synthetic:CxHxW:CLASSES:SAMPLES"),
    (dict(data="synthetic:64:10:100", model="resnet18"), "resnet18 takes images"),
    (dict(optimizer="adagrad"), "unknown optimizer 'adagrad'; use --optimizer with one of"),
    (dict(schedule="linear"), "unknown schedule 'linear'"),
    (dict(precision="fp8"), "unknown precision 'fp8'"),
    (dict(compression="int8"), "unknown --compression 'int8'"),
    (dict(compression="topk:2"), "0 < RATIO <= 1"),
    (dict(warmup_epochs=40), "--warmup-epochs 40 must be between 0 and --epochs 30"),
    (dict(resume="/nonexistent/ck.pt"), "--resume /nonexistent/ck.pt: no such checkpoint"),
    (dict(resume="auto"), "--resume without a path needs --checkpoint-dir"),
    (dict(mode="ps-ssp", staleness=-1), "--staleness -1 is impossible"),
    (dict(mode="ps-bsp", ps_ranks=4), "--ps-ranks 4 with 4 ranks"),
    (dict(mode="ps-bsp", global_batch=64, ps_ranks=1), "global batch 64 does not divide "
                                                        "evenly by 3 workers"),
])
def test_config_check_says_what_to_change(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**changes).check(size=4)


# ---------------------------------------------------------------- the command
@pytest.mark.parametrize("args,message", [
    (["--epochs", "0"], "--epochs is 0"),
    (["--global-batch", "30"], "global batch 30 does not divide evenly by 4 ranks"),
    (["--model", "resnet"], "unknown model"),
    (["--data", "mnist"], "--data mnist: no such directory"),
    (["-n", "0"], "-n must be at least 1"),
    # the recipe's options (tests/test_recipes.py)
    (["--recipe", "fast"], "unknown recipe 'fast'; use --recipe with one of: plain, goyal, "
                           "lars, lamb"),
    # a warmup the user names is refused; the recipe's own bends (test_recipes)
    (["--recipe", "goyal", "--epochs", "3", "--warmup-epochs", "5"],
     "--warmup-epochs 5 must be between 0 and --epochs 3"),
    (["--label-smoothing", "1.5"], "--label-smoothing 1.5 must be in [0, 1)"),
    (["--target-accuracy", "1.01"], "--target-accuracy 1.01 must be in (0, 1]"),
    (["--target-accuracy", "0"], "--target-accuracy 0 must be in (0, 1]"),
    (["--stop-at-target"], "--stop-at-target needs --target-accuracy A"),
    (["--optimizer", "lamb", "--zero", "1"], "--optimizer lamb needs --zero 0"),
    (["--mode", "ps-bsp", "--label-smoothing", "0.1"], "--label-smoothing is not supported "
                                                       "with --mode ps-bsp"),
    (["--weight-decay", "-0.1"], "--weight-decay -0.1 is negative"),
])
def test_bad_options_fail_before_launching(args, message, capsys, monkeypatch):
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    assert cli_main.main(["train", "-n", "4"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_dash_n_relaunches_the_same_options_without_n(monkeypatch):
    calls = []
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda n, cmd, hosts=None, **launcher:
                        calls.append((n, cmd, hosts)) or 0)
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    argv = ["--epochs", "7", "--global-batch", "96", "--hidden", "64,32", "--seed", "5"]
    assert cli_main.main(["train", "-n", "3"] + argv) == 0
    (n, cmd, hosts), = calls
    assert (n, hosts) == (3, None) and cmd[:4] == TRAIN and "-n" not in cmd
    again = cli_main.build_parser().parse_args(cmd[3:])
    mine = cli_main.build_parser().parse_args(["train"] + argv)
    assert vars(again) == vars(mine)


# ---------------------------------------------------------------- on ranks
def _train(n, out, *args):
    cmd = TRAIN + ["--epochs", "3", "--global-batch", "64", "--out", str(out)] + list(args)
    r = run_mpi(n, cmd, timeout=120, check=True)
    epochs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return r.stdout, epochs, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same training on 1 rank, on 2 ranks, and on 2 ranks again."""
    base = tmp_path_factory.mktemp("train")
    return {name: _train(n, base / name) for name, n in
            (("one", 1), ("two", 2), ("two_again", 2))}


@pytest.mark.mpi
def test_two_ranks_print_epochs_and_a_summary(runs):
    out, epochs, _ = runs["two"]
    assert len(re.findall(r"epoch +\d+/3 +loss", out)) == 3, out
    acc = re.search(r"test accuracy +([0-9.]+)", out)
    assert acc and float(acc.group(1)) > 0.85, out
    assert re.search(r"ranks +2\b", out) and re.search(r"global batch +64\b", out), out
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert epochs[-1]["step"] == 3 * (1437 // 64)


@pytest.mark.mpi
def test_two_ranks_follow_one_process_exactly(runs):
    # same global batch and seed: averaging two 32-sample gradients is the
    # 64-sample gradient, so only float rounding may differ
    for one, two in zip(runs["one"][1], runs["two"][1]):
        for key in ("loss", "test_loss"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key
        for key in ("accuracy", "test_accuracy"):
            assert abs(two[key] - one[key]) <= 1.5 / 360, key


@pytest.mark.mpi
def test_same_seed_same_ranks_same_numbers(runs):
    timing = ("samples_per_s", "epoch_time_s")
    strip = [{k: v for k, v in e.items() if k not in timing} for e in runs["two"][1]]
    again = [{k: v for k, v in e.items() if k not in timing} for e in runs["two_again"][1]]
    assert strip == again


@pytest.mark.mpi
def test_stop_at_target_ends_at_the_epoch_it_is_reached(runs, tmp_path):
    """--stop-at-target: the same run as 'two' up to the first epoch at or above
    the target (the middle of its test accuracies), and no further."""
    accs = [e["test_accuracy"] for e in runs["two"][1]]
    target = sorted(accs)[1]
    first = next(i for i, a in enumerate(accs) if a >= target) + 1
    _, epochs, _ = _train(2, tmp_path, "--target-accuracy", str(target), "--stop-at-target")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [e["epoch"] for e in epochs] == list(range(1, first + 1)), (accs, epochs)
    assert summary["epochs_to_target"] == first and summary["test_accuracy"] == accs[first - 1]


def test_a_resume_keeps_the_target_record_only_if_it_reaches_the_new_target():
    """A checkpoint's target record (reached 0.9 at epoch 2) under a resume
    with --target-accuracy 0.95 is dropped: kept, --stop-at-target stopped the
    resumed run at once and the summary said 0.95 was reached at epoch 2 with
    test accuracy 0.90."""
    from hpcdl.train.trainer import kept_target
    hit = dict(train_time=1.5, eval_time=0.1, steps=22, epochs=2, test_accuracy=0.9)
    assert kept_target(hit, 0.95) is None
    assert kept_target(hit, 0.9) is hit and kept_target(hit, 0.8) is hit
    assert kept_target(hit, None) is hit and kept_target(None, 0.9) is None


@pytest.mark.mpi
def test_ps_bsp_trains_exactly_like_allreduce(runs, tmp_path):
    # 3 ranks = 1 server + 2 workers reading the slices 2 all-reduce ranks read:
    # the same arithmetic in the same order, so bit-identical parameters
    _train(3, tmp_path, "--mode", "ps-bsp")
    ps = json.loads((tmp_path / "summary.json").read_text())
    two = json.loads((runs["two"][2] / "summary.json").read_text())
    assert ps["params_sha256"] == two["params_sha256"]
    assert (ps["mode"], ps["ranks"], ps["steps"]) == ("ps-bsp", 3, two["steps"])


@pytest.mark.mpi
def test_ps_ssp_keeps_its_bound_and_learns(tmp_path):
    out = _train(4, tmp_path, "--mode", "ps-ssp", "--staleness", "2", "--ps-ranks", "2",
                 "--global-batch", "60")[0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["max_staleness"] <= 2 and summary["test_accuracy"] > 0.85, out


@pytest.mark.mpi
def test_trains_from_hdf5_shards_the_same_with_or_without_workers(tmp_path):
    shards = tmp_path / "shards"
    r = run_mpi(1, [sys.executable, "-m", "hpcdl", "data", "shard", "digits", "--out",
                    str(shards), "--shards", "3", "--val-fraction", "0.2"], timeout=120)
    assert r.returncode == 0, r.stdout
    digests = []
    for workers in ("0", "2"):
        out = tmp_path / ("w" + workers)
        _train(2, out, "--data", str(shards), "--workers", workers)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["test_accuracy"] > 0.85, summary
        digests.append(summary["params_sha256"])
    assert digests[0] == digests[1]  # worker processes change who reads, not what


def test_an_auto_batch_too_large_for_the_data_names_base_batch():
    # --recipe lamb --global-batch auto on digits: auto starts at the recipe's
    # base batch 2048, above the 1437 training samples; the line names the flag
    # that sets it, not --global-batch, which the user gave as auto
    from hpcdl.train import trainer
    cfg = TrainConfig(global_batch="auto", base_batch=2048, lr_scaling="adascale")
    with pytest.raises(ConfigError) as e:
        trainer.load_data(cfg)
    assert "smaller --base-batch (where --global-batch auto starts)" in str(e.value), e.value
