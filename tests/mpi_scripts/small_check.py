"""small_check.py - run under mpirun with one rank per (virtual) node: auto
all-reduces of at most HPCDL_SMALL_BYTES ride inside the agreement check's
exchange across nodes (src_c/small.c). Checks every dtype and op at sizes 0,
1, odd, the threshold and one element past it, with rank- and
position-dependent data, against MPI_Allreduce (mpi4py; the core's MPI path
for the 16-bit floats mpi4py lacks) and float64 math; the results bitwise
equal on every rank; the timeline naming the path; and mismatches on it
raising MismatchError on every rank. Prints 'CHECKS n FAILED k' on rank 0.
argv: "data" (the above) or "threshold" (rank 1 has another HPCDL_SMALL_BYTES)."""
import os
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "data"
LIMIT = int(os.environ.get("HPCDL_SMALL_BYTES", 8192))  # small.c's default
if MODE == "threshold" and os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK")) == "1":
    os.environ["HPCDL_SMALL_BYTES"] = str(LIMIT // 2)  # read by the core at first use

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hpcdl import comm  # noqa: E402
from coll_common import check, values, verdict  # noqa: E402

c = comm.init()
R, N = c.rank, c.size
TYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
         "int32": np.int32, "int64": np.int64, "bfloat16": None}
MPI_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def expected(n, op, dtype):
    vals = np.stack([values(r, n, op).astype(np.float64) for r in range(N)])
    if op == "average":
        s = vals.sum(0) / N
        return np.trunc(s) if dtype.startswith("int") else s
    return {"sum": vals.sum(0), "min": vals.min(0), "max": vals.max(0),
            "prod": vals.prod(0)}[op]


def buffer(dtype, n, op):
    v = values(R, n, op)
    if dtype == "bfloat16":
        return torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
    return v.astype(TYPES[dtype])


def as_f64(x):
    return x.double().numpy() if torch.is_tensor(x) else np.asarray(x, np.float64)


def mpi_reference(dtype, n, op):
    """MPI's own all-reduce of the same data (average: its sum, divided here)."""
    mop = "sum" if op == "average" else op
    x = buffer(dtype, n, op)
    if TYPES[dtype] is None or dtype == "float16":  # mpi4py has no 16-bit floats
        return as_f64(c.allreduce(x, op=op, algorithm="mpi"))
    out = np.empty_like(x)
    c.mpi.Allreduce(x, out, op=MPI_OPS[mop])
    out = out.astype(np.float64)
    if op == "average":
        out = np.trunc(out / N) if dtype.startswith("int") else out / N
    return out


def check_data():
    for dtype, npt in TYPES.items():
        esz = 2 if npt is None else np.dtype(npt).itemsize
        for n in (0, 1, 7, LIMIT // esz, LIMIT // esz + 1):
            for op in ("sum", "average", "min", "max", "prod"):
                x = buffer(dtype, n, op)
                out = c.allreduce(x, op=op) if n % 2 else c.allreduce(x, x.copy() if
                                                                        npt else x.clone(), op=op)
                got, ref = as_f64(out), mpi_reference(dtype, n, op)
                tol = 1e-2 if esz == 2 else 1e-6
                ok = np.allclose(got, ref, rtol=tol, atol=tol) and \
                    np.allclose(got, expected(n, op, dtype), rtol=tol, atol=tol)
                check(ok, "allreduce %s %s n=%d" % (dtype, op, n))


def check_bitwise_and_path():
    # non-integer floats: the rank-order reduction gives the same bits everywhere
    x = (np.arange(1001, dtype=np.float32) * 0.37 + R * 0.011).astype(np.float32)
    c.allreduce(x)
    check(all(np.array_equal(x, o) for o in c.mpi.allgather(x)), "bitwise equal")
    c.timeline()
    for n, inline in ((LIMIT // 4, True), (LIMIT // 4 + 1, False)):
        c.allreduce_async(np.ones(n, np.float32), name="probe").wait()
        rec = [r for r in c.timeline() if r["name"] == "probe"]
        check(len(rec) == 1 and (rec[0]["algorithm"] == "inline") == inline,
              "timeline %d: %s" % (n, rec))


def expect_mismatch(fn, words):
    try:
        fn()
    except comm.MismatchError as e:
        check(all(w in str(e) for w in words), "message %r lacks %s" % (str(e), words))
        return
    check(False, "no MismatchError (%s)" % words)


def check_mismatches():
    n = LIMIT // 4
    expect_mismatch(lambda: c.allreduce(np.zeros(n - 1 if R == 1 else n, np.float32)),
                    ["count", "rank 1=%d" % (n - 1), "rank 0=%d" % n])
    # one rank past the threshold (the MPI path), the others inline
    expect_mismatch(lambda: c.allreduce(np.zeros(n + 1 if R == N - 1 else n, np.float32)),
                    ["count", "rank %d=%d" % (N - 1, n + 1)])
    expect_mismatch(lambda: c.allreduce(np.zeros(5, np.float64 if R == 0 else np.float32)),
                    ["dtype", "float64"])
    expect_mismatch(lambda: c.allreduce_async(np.zeros(9, np.float32),
                                              op="max" if R == 1 else "sum").wait(), ["op"])
    # another collective on rank 0
    b = np.zeros(6, np.float32)
    expect_mismatch(lambda: c.broadcast(b, root=0) if R == 0 else c.allreduce(b),
                    ["collective", "rank 0=broadcast", "rank 1=allreduce"])


if MODE == "threshold":
    expect_mismatch(lambda: c.allreduce(np.zeros(LIMIT // 4, np.float32)),
                    ["inline bytes", "rank 1=0", "rank 0=%d" % LIMIT])
else:
    check_data()
    check_bitwise_and_path()
    check_mismatches()
y = np.full(5, R + 1, np.float32)  # healthy after the errors
c.allreduce(y)
check(float(y[0]) == N * (N + 1) / 2, "healthy after errors: %s" % y[0])
verdict()
