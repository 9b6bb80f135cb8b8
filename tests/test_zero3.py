"""test_zero3.py - ZeRO stage 3 (hvd.shard_model): parameters sharded over
the ranks, gathered per unit around its forward and backward, gradients
reduce-scattered into the owner's pieces. On 2 and 3 ranks (uneven sizes:
blocks cut layers, a 0-d parameter is smaller than the rank count), SGD with
nesterov, Adam, AdamW, two parameter groups, a StepLR schedule,
backward_passes_per_step 2, a layer called twice per forward, per-layer and
grouped units, with and without prefetch: after 6 steps the parameters equal
one process's on the whole global batch (within 1e-6 relative); each rank
holds about 1/N of the parameter and optimizer-state bytes, and at most three
units gathered at once. All cases of one rank count run in one launch (the
scripts: tests/mpi_scripts/zero3_exact.py, run by zero3_checkpoint.py). Refusals (tied weights across
units, sparse gradients, non-CPU parameters) are in test_zero.py's misuse
launch. Sharded checkpoints (one file per rank + manifest): saved on 3 ranks,
loaded on 3 (bit-identical next step) and on 2 (resharded; 3 more steps ==
one process), refusals of another model / optimizer grouping / a missing
rank file with the files untouched. Two launches in all (3 ranks, then 2)."""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "zero3_checkpoint.py")
CASES = ["adam:1", "sgd:2:units", "adamw:1:noprefetch"]


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
