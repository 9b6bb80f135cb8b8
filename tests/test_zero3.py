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
script: tests/mpi_scripts/zero3_exact.py). Refusals (tied weights across
units, sparse gradients, non-CPU parameters) are in test_zero.py's misuse
launch."""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "zero3_exact.py")
CASES = ["adam:1", "sgd:2:units", "adamw:1:noprefetch"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_stage3_matches_one_process(n):
    r = run_python(n, SCRIPT, timeout=150, args=["1e-6", *CASES])
    assert r.stdout.count("ZERO3 OK") == n * len(CASES), r.stdout
