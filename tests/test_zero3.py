"""test_zero3.py - ZeRO stage 3 (hvd.shard_model): parameters sharded over
the ranks, gathered per unit around its forward and backward, gradients
reduce-scattered into the owner's pieces. On 2 and 3 ranks (uneven sizes:
blocks cut layers, a 0-d parameter is smaller than the rank count), SGD with
nesterov, Adam, AdamW, LARS, LARC, two parameter groups, a StepLR schedule,
global-norm clipping across shards (shards.clip_grad_norm_),
backward_passes_per_step 2, a layer called twice per forward, per-layer and
grouped units, with and without prefetch (a few cases on 4 ranks too): after
6 steps the parameters equal one process's on the whole global batch (within 1e-6 relative); each rank
holds about 1/N of the parameter and optimizer-state bytes, and at most three
units gathered at once. All cases of one rank count run in one launch (the
scripts: tests/mpi_scripts/zero3_exact.py, run by zero3_checkpoint.py).
Refusals (tied weights across
units, sparse gradients, non-CPU parameters) are in test_zero.py's misuse
launch. Sharded checkpoints (one file per rank + manifest): saved on 3 ranks,
loaded on 3 (bit-identical next step) and on 2 (resharded; 3 more steps ==
one process), refusals of another model / optimizer grouping / a missing
rank file with the files untouched. Two launches in all (3 ranks, then 2).
`hpcdl train --zero 3` (fp16 loss scaling, Adam): resumed on the same 2
ranks it ends with the uninterrupted run's params_sha256 (resuming on
another rank count is the checkpoint test's resharding; by hand, 2 -> 3
ranks ended 1.4e-4 relative from the 2-rank run: fp16 forward on other batch
slices)."""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "zero3_checkpoint.py")
CASES = ["adam:1", "sgd:2:units", "adamw:1:noprefetch", "lars:1", "larc:1", "adam:1:clip",
         "adam:1:fp16", "sgd:1:bf16"]
EXACT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "zero3_exact.py")


@pytest.mark.mpi
def test_stage3_exact_and_sharded_checkpoint_3_then_2_ranks(tmp_path):
    # 3 ranks: the cases, then save; 2 ranks: the cases, then load what 3 saved
    r = run_python(3, SCRIPT, timeout=180, args=["save", str(tmp_path / "ckpt"), *CASES])
    assert r.stdout.count("ZERO3 OK") == 3 * len(CASES), r.stdout
    assert r.stdout.count("CKPT OK") == 3, r.stdout
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "manifest.json"] + ["rank-%05d-of-00003.pt" % i for i in range(3)]
    r = run_python(2, SCRIPT, timeout=180, args=["load", str(tmp_path / "ckpt"), *CASES])
    assert r.stdout.count("ZERO3 OK") == 2 * len(CASES), r.stdout
    assert r.stdout.count("CKPT OK") == 2, r.stdout


# ------------------------------------------------------------ hpcdl train --zero 3
@pytest.mark.mpi
def test_train_zero3_resume_matches_uninterrupted(tmp_path):
    import torch
    from mpi_harness import run_mpi
    from test_train_resume import TRAIN, _summary
    base = TRAIN + ["--global-batch", "48", "--optimizer", "adam", "--base-lr", "0.01",
                    "--schedule", "constant", "--hidden", "32", "--precision", "fp16",
                    "--zero", "3"]
    full, ckpt, out = (tmp_path / d for d in ("full", "ckpt", "out"))
    run_mpi(2, base + ["--epochs", "1", "--checkpoint-dir", str(ckpt)], timeout=180,
            check=True)
    shard_dirs = [d for d in os.listdir(ckpt) if d.startswith("zero3-")]
    assert len(shard_dirs) == 1 and sorted(os.listdir(ckpt / shard_dirs[0])) == [
        "manifest.json", "rank-00000-of-00002.pt", "rank-00001-of-00002.pt"]
    r = run_mpi(2, base + ["--epochs", "2", "--out", str(out), "--checkpoint-dir", str(ckpt),
                           "--resume"], timeout=180, check=True)
    assert "resumed from" in r.stdout and "ZeRO stage 3" in r.stdout, r.stdout
    run_mpi(2, base + ["--epochs", "2", "--out", str(full)], timeout=180, check=True)
    resumed, uninterrupted = _summary(out), _summary(full)
    assert resumed["params_sha256"] == uninterrupted["params_sha256"], r.stdout
    assert resumed["zero_stage"] == 3 and resumed["steps"] == 2 * (1437 // 48)
    n_params = 64 * 32 + 32 + 32 * 10 + 10  # digits: 64 inputs, 10 classes
    assert resumed["parameter_bytes"] <= 4 * n_params / 2 + 16, resumed
    assert resumed["optimizer_state_bytes"] <= 8 * n_params / 2 + 32, resumed  # Adam: 2/elem
    # model.pt is the whole model (unsharded at the end), loadable without hpcdl
    assert torch.load(out / "model.pt", weights_only=True)["net.0.weight"].shape == (32, 64)


@pytest.mark.mpi
def test_train_zero3_lars_bf16_matches_unsharded(tmp_path):
    # LARS's groups come from the whole model (a piece is 1-D: by its own shape
    # every weight would be exempt; that ended 2.49 relative away) and its norms
    # from every rank's pieces; the gradients travel in bf16 at both stages. The
    # same parameters as --zero 0, up to bf16 sums rounded in other places (seen:
    # 6.7e-5; 4.3e-7 in fp32; a run without compression is 1.8e-2 away)
    import torch
    from mpi_harness import run_mpi
    from test_train_resume import TRAIN
    base = TRAIN + ["--global-batch", "48", "--optimizer", "lars", "--base-lr", "2",
                    "--schedule", "constant", "--hidden", "32", "--epochs", "2",
                    "--compression", "bf16"]
    for z in ("0", "3"):
        run_mpi(2, base + ["--zero", z, "--out", str(tmp_path / z)], timeout=180, check=True)
    want, got = (torch.load(tmp_path / z / "model.pt", weights_only=True) for z in "03")
    worst = max(((got[k] - v).abs().max() / v.abs().max()).item() for k, v in want.items())
    assert worst < 1e-3, worst


def test_train_config_refuses_what_stage3_cannot_do():
    from hpcdl.train.config import ConfigError, TrainConfig
    with pytest.raises(ConfigError, match="--zero 3 compresses with fp16 or bf16 only"):
        TrainConfig(zero=3, compression="topk:0.1").check(2)
    TrainConfig(zero=3, compression="bf16").check(2)  # the reduce-scatter in 16 bits


def _local_comm(monkeypatch, module):
    """One process standing in for rank 0 of the ranks (no MPI)."""
    monkeypatch.setattr(module.comm, "rank", lambda: 0)
    monkeypatch.setattr(module.comm, "bcast_object", lambda obj, root=0: obj)

    def raise_if_any(error, exc_type=RuntimeError):
        if error:
            raise exc_type(error)
    monkeypatch.setattr(module.comm, "raise_if_any", raise_if_any)


def test_save_dirs_keep_only_what_checkpoint_pt_names(tmp_path, monkeypatch):
    # after checkpoint.pt names the new directory, every other save directory
    # (older saves, a save cut short, an earlier run's, another stage's or
    # --zero 0's) goes; other names stay. A failed write (a full disk) is one
    # ConfigError and leaves no partial directory; a missing directory on
    # resume is named.
    from hpcdl.checkpoint import root
    from hpcdl.train import checkpoint
    from hpcdl.train.config import ConfigError, TrainConfig
    _local_comm(monkeypatch, root)
    old = ["zero2-100-7", "zero3-200-8", "zero1-300-9", "state-400-10"]
    for name in old + ["zero2-keepme", "notes"]:
        (tmp_path / name).mkdir()
    dirs = checkpoint.SaveDirs(TrainConfig(checkpoint_dir=str(tmp_path)), "zero2")
    new = dirs.save(lambda path: os.makedirs(path))
    dirs.written()
    assert sorted(os.listdir(tmp_path)) == sorted([new, "zero2-keepme", "notes"])

    def full_disk(path):
        os.makedirs(path)
        raise OSError(28, "No space left on device")
    with pytest.raises(ConfigError, match="could not write the sharded checkpoint .*No space"):
        dirs.save(full_disk)
    assert sorted(os.listdir(tmp_path)) == sorted([new, "zero2-keepme", "notes"])
    resume = TrainConfig(checkpoint_dir=str(tmp_path / "elsewhere"),
                         resume=str(tmp_path / "checkpoint.pt"))
    assert checkpoint.SaveDirs(resume, "zero2").path_of(new) == str(tmp_path / new)
    with pytest.raises(ConfigError, match="names the save directory .*zero2-1-1, which does "
                                          "not exist: .* copy or move both"):
        checkpoint.SaveDirs(resume, "zero2").path_of("zero2-1-1")


@pytest.mark.parametrize("saved", [{"model": {}}, {"state": {"dir": "state-1-1"}},
                                   {"zero12": {"dir": "zero2-1-1", "stage": 2}},
                                   {"zero3": {"dir": "zero3-1-1"}}])
def test_train_resumes_any_stages_checkpoint(saved):
    # no stage table: checkpoint.pt of any --zero stage passes the checks of a
    # run at any stage (the pieces are re-sharded by name on load:
    # test_checkpoint_matrix.py); the directory of pieces is found by one helper
    from hpcdl.checkpoint import root
    meta = {"model": "mlp", "mode": "allreduce", "hidden": [32], "data": "digits",
            "global_batch": 64, "optimizer": "sgd", "seed": 0, "epochs": 2,
            "auto_batch": False, "adascale": False, "shapes": {"w": [2, 2]}}
    state = dict(saved, format=root.FORMAT, goodput=None, meta=dict(meta, zero=0))
    if "model" in saved:
        state["adascale"] = None
    for stage in (0, 1, 2, 3):
        assert root._mismatch("p", state, dict(meta, zero=stage)) is None
    pieces = (saved.get("zero12") or saved.get("zero3") or {}).get("dir")
    assert root.pieces_dir(state) == pieces


@pytest.mark.parametrize("stage", [1, 3])
def test_train_zero_refuses_gpus_before_any_collective(stage, monkeypatch):
    # one process, no MPI: a GPU picked for the rank is a ConfigError in the set-up
    import torch
    from hpcdl.train import allreduce, zero
    from hpcdl.train.config import ConfigError, TrainConfig
    monkeypatch.setattr(allreduce, "pick_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(allreduce.comm, "rank", lambda: 0)
    monkeypatch.setattr(allreduce.comm, "size", lambda: 1)
    with pytest.raises(ConfigError, match="--zero %d trains on the CPU only" % stage):
        (zero.Zero3 if stage == 3 else zero.Zero)(TrainConfig(zero=stage))


@pytest.mark.mpi
def test_stage3_exact_on_4_ranks():
    # 4 ranks: blocks of 1-2 elements of the small layers, ranks owning nothing of
    # the 0-d scalar's unit; clipping across shards with 2 passes
    cases = ["adam:1", "sgd:2:units:clip", "lars:1"]
    r = run_python(4, EXACT, timeout=180, args=["1e-6", *cases])
    assert r.stdout.count("ZERO3 OK") == 4 * len(cases), r.stdout
