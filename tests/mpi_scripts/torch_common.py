"""torch_common.py - shared by the torch_*_check.py scripts (run under
mpirun): rank- and position-dependent test data, a checker that counts
failures on every rank, and one verdict line. The verdict is summed with
mpi4py's own MPI_Allreduce, so a broken hpcdl cannot hide its failures:
rank 0 prints 'CHECKS n FAILED k' and every rank exits non-zero if k > 0."""
import sys
import traceback

import torch
from mpi4py import MPI

import hpcdl.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
PART = sys.argv[1] if len(sys.argv) > 1 else "all"
_state = {"checks": 0, "failures": 0}


def check(ok, what):
    _state["checks"] += 1
    if not ok:
        _state["failures"] += 1
        if _state["failures"] <= 12:
            print("[rank %d] FAIL %s" % (R, what), flush=True)


def close(got, want, what, rtol=None, atol=None):
    """check() that got equals want (dtype, shape and values; tolerance by dtype)."""
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        desc = (got.dtype, tuple(got.shape)) if isinstance(got, torch.Tensor) else type(got)
        return check(False, "%s: got %s, want %s %s" % (what, desc, want.dtype,
                                                          tuple(want.shape)))
    if want.dtype.is_floating_point or want.is_complex():
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5,
               torch.complex64: 1e-5}.get(
            want.dtype, 1e-10)
        ok = torch.allclose(got, want, rtol=rtol or tol, atol=atol or tol)
    else:
        ok = torch.equal(got, want)
    diff = ""
    if not ok and got.numel():
        gap = got.to(torch.complex128) - want.to(torch.complex128)
        diff = ": max |diff| %g\n  got  %s\n  want %s" % (gap.abs().max().item(), got, want)
    check(ok, what + diff)


def values(rank, shape, kind="sum", dtype=torch.float64):
    """Small integers that depend on rank and position (exact in every dtype);
    kind 'prod': +-1 and +-2, so products stay exact; 'nonneg': 0..7."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64)
    if kind == "prod":
        v = (1 + (i + 3 * rank) % 2) * torch.where((i + rank) % 3 == 0, -1, 1)
    elif kind == "nonneg":
        v = (i * 5 + rank * 3 + 1) % 8
    else:
        v = (i * 7 + rank * 13 + 5) % 17 - 8
    return v.view(shape).to(dtype)


def section(name):
    """True when this part runs (argv[1] is the part or 'all')."""
    return PART in ("all", name)


def run(*parts):
    """Runs each function (an exception counts as a failure), then the verdict."""
    for fn in parts:
        try:
            fn()
        except Exception:  # noqa: BLE001 - report, keep going, fail the verdict
            check(False, "%s raised:\n%s" % (fn.__name__, traceback.format_exc()))
    finish()


def finish():
    total = MPI.COMM_WORLD.allreduce(_state["failures"], op=MPI.SUM)
    checks = MPI.COMM_WORLD.allreduce(_state["checks"], op=MPI.SUM)
    if R == 0:
        print("CHECKS %d FAILED %d (%d ranks, part %s)" % (checks, total, N, PART), flush=True)
    hvd.shutdown()
    sys.exit(1 if total else 0)
