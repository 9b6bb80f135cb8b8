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


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("passes", [1, 2])
def test_exact_against_one_process(n, opt, passes):
    r = run_python(n, os.path.join(SCRIPTS, "torch_optimizer_exact.py"),
                   args=[opt, str(passes), "none", str(TOL["none"])])
    assert r.stdout.count("EXACT") == n, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("comp", ["fp16", "bf16", "topk"])
def test_compression_within_tolerance(comp):
    r = run_python(2, os.path.join(SCRIPTS, "torch_optimizer_exact.py"),
                   args=["sgd", "1", comp, str(TOL[comp])])
    assert r.stdout.count("EXACT") == 2, r.stdout


@pytest.mark.mpi
def test_small_fusion_threshold_many_buckets():
    # 1 KiB buckets: every parameter in its own bucket, submitted in order
    r = run_python(2, os.path.join(SCRIPTS, "torch_optimizer_exact.py"),
                   args=["sgd", "1", "none", str(TOL["none"])],
                   env={"HPCDL_FUSION_THRESHOLD": "1024"})
    assert r.stdout.count("EXACT") == 2, r.stdout


@pytest.mark.mpi
def test_misuse_errors():
    r = run_python(2, os.path.join(SCRIPTS, "torch_optimizer_misuse.py"))
    assert "MISUSE OK" in r.stdout, r.stdout


@pytest.mark.mpi
def test_timeline_has_every_phase(tmp_path):
    trace = tmp_path / "trace.json"
    r = run_python(2, os.path.join(SCRIPTS, "torch_timeline_check.py"), args=[str(trace)])
    assert "TIMELINE OK" in r.stdout, r.stdout
