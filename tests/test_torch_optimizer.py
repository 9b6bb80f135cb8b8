"""test_torch_optimizer.py - DistributedOptimizer: synchronous SGD through
fusion buckets equals one process on the whole global batch (SGD with
momentum and Adam, backward_passes_per_step 1 and 2, every compression within
its stated tolerance), on 2 and 4 ranks; misuse raises errors that explain."""
import os

import pytest

from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")
# relative tolerance on every parameter after 5 steps, per compression: float32
# rounding for none and top-k(1.0); the wire format's precision for fp16 / bf16
TOL = {"none": 2e-5, "topk": 2e-5, "fp16": 5e-3, "bf16": 3e-2}


def case(opt, passes, comp="none", fusion=None):
    return ":".join([opt, str(passes), comp, str(TOL[comp])] + ([str(fusion)] if fusion else []))


# one launch per rank count runs every case (`quick`: in make check too)
CASES = {2: [case(o, p) for o in ("sgd", "adam") for p in (1, 2)]
         + [case("sgd", 1, c) for c in ("fp16", "bf16", "topk")]
         + [case("sgd", 1, fusion=1024)],  # 1 KiB buckets: one parameter each, in order
         4: [case(o, p) for o in ("sgd", "adam") for p in (1, 2)]}


@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 4])
def test_exact_against_one_process(n):
    # SGD with momentum and Adam, 1 and 2 backward passes per step; on 2 ranks
    # also every compression within its tolerance and many small buckets
    r = run_python(n, os.path.join(SCRIPTS, "torch_optimizer_exact.py"), args=CASES[n],
                   timeout=120)
    for c in CASES[n]:
        assert r.stdout.count("EXACT %s " % c) == n, r.stdout
    assert r.returncode == 0, r.stdout


@pytest.mark.mpi
def test_misuse_errors():
    r = run_python(2, os.path.join(SCRIPTS, "torch_optimizer_misuse.py"))
    assert "MISUSE OK" in r.stdout, r.stdout


@pytest.mark.mpi
def test_timeline_has_every_phase(tmp_path):
    trace = tmp_path / "trace.json"
    r = run_python(2, os.path.join(SCRIPTS, "torch_timeline_check.py"), args=[str(trace)])
    assert "TIMELINE OK" in r.stdout, r.stdout
