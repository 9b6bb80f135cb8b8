"""errors_check.py - run under mpirun: each misuse must raise on every rank
within seconds (never hang, never return wrong data). Prints 'ERRORS OK'."""
import sys
import time

import numpy as np

from hpcdl import comm

c = comm.init()
R, N = c.rank, c.size
results = []


def expect(exc_types, fn, must_contain=None):
    t0 = time.time()
    try:
        fn()
    except exc_types as e:
        msg = str(e)
        ok = must_contain is None or all(s in msg for s in must_contain)
        results.append((ok, "%s: %s" % (type(e).__name__, msg)))
        return
    results.append((False, "no exception from %s" % fn))


# count differs: MismatchError on every rank naming rank 1's count
n = 63 if R == 1 else 64
expect(comm.MismatchError, lambda: c.allreduce(np.zeros(n, np.float32)),
       ["count", "rank 1=63", "rank 0=64"])
# dtype differs
dt = np.float64 if R == 0 else np.float32
expect(comm.MismatchError, lambda: c.allreduce(np.zeros(8, dt)), ["dtype", "float64"])
# op differs
expect(comm.MismatchError, lambda: c.allreduce(np.zeros(8, np.float32),
                                               op="max" if R == 0 else "sum"), ["op"])
# non-contiguous buffer on one rank: TypeError there, MismatchError elsewhere
x = np.zeros((8, 8), np.float32)
buf = x[:, 0] if R == 1 else x[:, :1].copy().ravel()
expect(TypeError if R == 1 else comm.MismatchError, lambda: c.allreduce(buf),
       ["contiguous"] if R == 1 else ["bad buffer"])
# unsupported dtype on every rank: TypeError everywhere
expect(TypeError, lambda: c.allreduce(np.zeros(4, np.uint8)), ["uint8"])
# async mismatch surfaces at wait()
expect(comm.MismatchError, lambda: c.allreduce_async(np.zeros(10 + R, np.float32)).wait(),
       ["count"])
# async broadcast with a bad buffer on one rank: every rank fails
bbuf = np.zeros(8, np.uint8 if R == 0 else np.float32)
expect(TypeError if R == 0 else comm.MismatchError,
       lambda: c.broadcast_async(bbuf).wait(), ["uint8"] if R == 0 else ["bad buffer"])
# allgather where one rank passes a non-contiguous buffer
g = np.zeros((6, 2), np.float32)
gbuf = g[:, 0] if R == N - 1 else g[:, 0].copy()
expect(TypeError if R == N - 1 else comm.MismatchError, lambda: c.allgather(gbuf),
       ["contiguous"] if R == N - 1 else ["invalid buffer"])
# after all that, a correct call still works
y = np.full(5, R + 1, np.float32)
c.allreduce(y)
results.append((float(y[0]) == N * (N + 1) / 2, "healthy after errors: %s" % y[0]))

bad = [m for ok, m in results if not ok]
for m in bad:
    print("[rank %d] FAIL %s" % (R, m), flush=True)
total = c.mpi.allreduce(len(bad))
if R == 0:
    print("ERRORS OK" if total == 0 else "ERRORS FAILED %d" % total, flush=True)
sys.exit(1 if total else 0)
