"""coll_common.py - shared by collectives_check.py and small_check.py (run
under mpirun over hpcdl.comm): rank- and position-dependent integer data that
is exact in every dtype whatever the order of a reduction, a checker that
counts failures on every rank, and one verdict line. The verdict is summed
with mpi4py's own MPI_Allreduce, so a broken core cannot hide its failures:
rank 0 prints 'CHECKS n FAILED k' and every rank exits non-zero if k > 0.
Nothing here starts MPI: a script may set the environment first."""
import sys

import numpy as np
from mpi4py import MPI

_state = {"rank": None, "checks": 0, "failures": 0}


def check(ok, what):
    _state["checks"] += 1
    if not ok:
        _state["failures"] += 1
        if _state["failures"] <= 10:
            print("[rank %s] FAIL %s" % (MPI.COMM_WORLD.rank, what), flush=True)


def values(rank, n, op):
    """Small integers; for prod +-1 and +-2, so products stay exact too."""
    i = np.arange(n, dtype=np.int64)
    if op == "prod":
        return (1 + (i + 3 * rank) % 2) * np.where((i + rank) % 3 == 0, -1, 1)
    return (i * 7 + rank * 13 + 5) % 17 - 8


def verdict():
    """Every rank: the failures of all ranks summed by MPI itself; exits."""
    bad = MPI.COMM_WORLD.allreduce(_state["failures"], op=MPI.SUM)
    if MPI.COMM_WORLD.rank == 0:
        print("CHECKS %d FAILED %d" % (_state["checks"], bad), flush=True)
    sys.exit(1 if bad else 0)
