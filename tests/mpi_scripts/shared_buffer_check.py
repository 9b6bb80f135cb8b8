"""shared_buffer_check.py - run under mpirun: in-place all-reduces of buffers
in the node's shared memory (Communicator.shared_buffer, src_c/shared.c)
against mpi4py's MPI_Allreduce of the same rank- and position-dependent data,
blocking and async, every op, several dtypes and sizes (0 < n, n < ranks,
odd lengths, 4 MiB+). Also: the timeline names the zero-copy path; a buffer
shared on one rank but not on another fails on every rank (agreement check)
instead of corrupting; out-of-place calls and slices of a shared buffer take
the ordinary path and stay correct; several buffers in flight over many
generations, submitted in different orders, with an ordinary all-reduce
queued behind them; float results bitwise equal on every rank. Prints 'CHECKS n FAILED k' on rank 0."""
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

# back to back on the same buffer, new input copied in right after each
# result: no rank may return before every piece is stored in its buffer
for n in (1024, 4096, 16384, 300000):
    buf = shared(n, np.float32)
    x = values(n, np.float32, 5)
    want = reference(x, "sum")
    wrong = 0
    for it in range(25):
        np.copyto(buf, x)
        if it % 2:
            c.allreduce_async(buf, op="sum", name="again").wait()
        else:
            c.allreduce(buf, op="sum")
        wrong += int(np.count_nonzero(buf != want))
    check(wrong == 0, "back to back n=%d: %d wrong elements over 25 calls" % (n, wrong))

# several buffers in flight over many generations, with an ordinary
# all-reduce queued behind them; on one node (work stealing, no per-call
# agreement) odd ranks may even submit the shared ones in another order
bufs = [shared(n, np.float32) for n in (5000, 300000, 17)]
plain = np.empty(1000, dtype=np.float64)
for rep in range(12):
    xs = [values(b.size, np.float32, rep + k) for k, b in enumerate(bufs)]
    for b, x in zip(bufs, xs):
        b[:] = x
    plain[:] = values(plain.size, np.float64, rep)
    order = [2, 0, 1] if R % 2 and c.cross_size == 1 else [0, 1, 2]
    handles = [c.allreduce_async(bufs[k], op="sum", name="multi.%d" % k) for k in order]
    handles.append(c.allreduce_async(plain, op="max", name="plain"))
    for h in handles:
        h.wait()
    for k, (b, x) in enumerate(zip(bufs, xs)):
        check(np.array_equal(b, reference(x, "sum")), "in flight rep %d buffer %d" % (rep, k))
    check(np.array_equal(plain, reference(values(plain.size, np.float64, rep), "max")),
          "plain all-reduce behind shared ones, rep %d" % rep)

# float sums come out bitwise the same on every rank (one rank computes each piece)
x = (np.arange(300000, dtype=np.float32) * 0.37 + R * 0.011).astype(np.float32)
big = shared(x.size, np.float32)
big[:] = x
c.allreduce(big, op="sum")
check(all(np.array_equal(big, o) for o in c.mpi.allgather(big.copy())), "bitwise equal")

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
# (last: after a mismatch the buffer's state is undefined)
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
