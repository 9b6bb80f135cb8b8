"""test_cuda_torch.py - hpcdl.torch on CUDA tensors (tests/mpi_scripts/
torch_cuda_check.py on 2 ranks sharing or splitting the GPUs). Needs a GPU and a
core built with nvcc: it skips, saying which is missing, on CPU-only machines
(CI); scripts/gpu-first-run.sh runs it on a GPU machine. The CUDA path's logic
is tested without a GPU by src_c's check-fake (docs/cuda.md)."""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "torch_cuda_check.py")


def _missing():
    import torch
    import hpcdl._core as core
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    if not core.built_with_cuda():
        return "hpcdl's core was built without CUDA (no nvcc at build time)"
    return None


@pytest.mark.mpi
def test_torch_collectives_on_cuda_tensors():
    why = _missing()
    if why:
        pytest.skip(why + ": the GPU checks run on a GPU machine (scripts/gpu-first-run.sh)")
    r = run_python(2, SCRIPT, timeout=300, check=False)
    assert r.returncode == 0 and "FAILED 0" in r.stdout, r.stdout[-6000:]
