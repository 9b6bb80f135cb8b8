"""shared_buffer_check.py - run under mpirun: in-place all-reduces of buffers
in the node's shared memory (Communicator.shared_buffer, src_c/shared.c)
against mpi4py's MPI_Allreduce of the same rank- and position-dependent data,
blocking and async, every op, several dtypes and sizes (0 < n, n < ranks,
odd lengths, 4 MiB+). Also: the timeline names the zero-copy path; a buffer
shared on one rank but not on another fails on every rank (agreement check)
instead of corrupting; out-of-place calls and slices of a shared buffer take
the ordinary path and stay correct. Prints 'CHECKS n FAILED k' on rank 0."""
import sys

import numpy as np
from mpi4py import MPI

from hpcdl import comm
from hpcdl._core import MismatchError

c = comm.init()
R, N = c.rank, c.size
OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "average": MPI.SUM}
DTYPES = [np.float32, np.float64, np.int32]
results = []  # (ok, what) per check, reported at the end


def check(ok, what):
    results.append((bool(ok), what))


def values(n, dtype, salt):
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + R * 13 + salt) % 17 - 8).astype(dtype)


def reference(x, op):
    out = np.empty_like(x)
    c.mpi.Allreduce(x, out, op=OPS[op])
    return out / N if op == "average" else out


def shared(n, dtype):
    view = c.shared_buffer(n * np.dtype(dtype).itemsize)
    assert view is not None, "a node with >= 2 ranks must give a shared buffer"
    return np.frombuffer(view, dtype=dtype, count=n)


sizes = [1, N - 1, 1031, (4 << 20) // 4 + 3]
for dtype in DTYPES:
    for n in [s for s in sizes if s > 0]:
        buf = shared(n, dtype)
        check(not buf.any(), "fresh buffer is zero")
        for k, op in enumerate(OPS):
            if op == "average" and dtype == np.int32:
                continue
            x = values(n, dtype, k)
            buf[:] = x
            if k % 2:
                c.allreduce_async(buf, op=op, name="shared.%d" % k).wait()
            else:
                c.allreduce(buf, op=op)
            want = reference(x, op)
            ok = np.allclose(buf, want, rtol=1e-6) if op == "average" else np.array_equal(buf, want)
            check(ok, "%s n=%d op=%s" % (np.dtype(dtype).name, n, op))

# the timeline says which path ran
buf = shared(4096, np.float32)
buf[:] = values(4096, np.float32, 1)
c.timeline()
c.allreduce_async(buf, op="sum", name="probe").wait()
rec = [r for r in c.timeline() if r["name"] == "probe"]
check(len(rec) == 1 and rec[0]["algorithm"] == "hier-shared", "timeline algorithm %s" % rec)
check(len(rec) == 1 and rec[0]["t_start"] <= rec[0]["t_agreed"] <= rec[0]["t_end"],
      "t_agreed within the record")

# a slice of a shared buffer and an out-of-place call take the ordinary path
x = values(4096, np.float32, 3)
buf[:] = x
c.allreduce(buf[1:], op="sum")
check(np.array_equal(buf[1:], reference(x[1:], "sum")) and buf[0] == x[0], "slice")
out = np.empty_like(buf)
buf[:] = x
c.allreduce(buf, out, op="max")
check(np.array_equal(out, reference(x, "max")) and np.array_equal(buf, x), "out of place")

# shared on rank 0 only: every rank raises instead of mixing the two paths
plain = np.ones(4096, dtype=np.float32)
mine = buf if R == 0 else plain
try:
    c.allreduce(mine, op="sum")
    check(False, "shared on one rank only: no error")
except MismatchError as e:
    check("shared buffer" in str(e), "mismatch names the shared buffer: %s" % e)

failures = [what for ok, what in results if not ok]
for what in failures[:10]:
    sys.stdout.write("[rank %d] FAIL %s\n" % (R, what))
c.mpi.Barrier()
total = c.mpi.reduce(len(failures), root=0)
checks = c.mpi.reduce(len(results), root=0)
if R == 0:
    sys.stdout.write("CHECKS %d FAILED %d\n" % (checks, total))
sys.exit(1 if failures else 0)
