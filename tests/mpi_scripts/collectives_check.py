"""collectives_check.py - run under mpirun: hpcdl's collectives against MPI's
own (mpi4py) and against float64 math, with rank- and position-dependent
data, for numpy arrays and torch tensors. Prints 'CHECKS n FAILED k' on rank
0 and exits non-zero on any failure.
argv: PARTS [MAX_BYTES]. PARTS is a comma-separated list, all run in this one
launch: a numpy dtype name (all-reduce of that dtype over every op and small
size; float32 through every algorithm, the others through auto: the dtype x
op x algorithm matrix itself runs in src_c/tests/test_collectives.c, here the
binding is checked against MPI), "big:ALGO" (float32 all-reduce of MAX_BYTES
with one algorithm, sum and max), or "other" (torch tensors, reduce_scatter,
allgather, broadcast, async). "all" = every dtype and other."""
import sys

import numpy as np
import torch
from mpi4py import MPI

from hpcdl import comm
from coll_common import check, values, verdict

PARTS = (sys.argv[1] if len(sys.argv) > 1 else "float32").split(",")
MAX_BYTES = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
c = comm.init()
R, N = c.rank, c.size
NP_TYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
            "int32": np.int32, "int64": np.int64}
TORCH_TYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


_cache = {}


def expected(n, op, dtype):
    key = (n, op, dtype.startswith("int"))
    if key not in _cache:
        _cache.clear()  # one size at a time: 64 MiB of float64 per entry
        _cache[key] = _expected(n, op, dtype)
    return _cache[key]


def _expected(n, op, dtype):
    vals = np.stack([values(r, n, op).astype(np.float64) for r in range(N)])
    out = {"sum": vals.sum(0), "average": vals.sum(0) / N, "min": vals.min(0),
           "max": vals.max(0), "prod": vals.prod(0)}[op]
    if op == "average" and dtype.startswith("int"):
        out = np.trunc(vals.sum(0) / N)
    return out


MPI_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}
sizes = sorted({0, 1, N - 1, 1031, (1 << 20) + 3})


def check_allreduce(dtype, sizes, algos, ops=("sum", "average", "min", "max", "prod")):
    npt = NP_TYPES[dtype]
    for n in sizes:
        for op in ops:
            ref = expected(n, op, dtype)
            mpi_ref = None
            if op in MPI_OPS and dtype != "float16":  # MPI's own collective
                mpi_ref = np.empty(n, npt)
                c.mpi.Allreduce(values(R, n, op).astype(npt), mpi_ref, op=MPI_OPS[op])
            for algo in algos:
                x = values(R, n, op).astype(npt)
                if (n + len(algo)) % 2:  # alternate in place / out of place
                    out = c.allreduce(x, op=op, algorithm=algo)
                else:
                    out = c.allreduce(x, np.empty_like(x), op=op, algorithm=algo)
                tol = 1e-2 if dtype == "float16" else 1e-6
                ok = np.allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)
                if mpi_ref is not None:
                    ok = ok and np.allclose(out, mpi_ref, rtol=tol, atol=tol)
                check(ok, "allreduce %s %s %s n=%d" % (algo, dtype, op, n))

def check_other():
    check_torch()
    check_gather_scatter()
    check_async()


def check_torch():
    """torch tensors, including bfloat16 (which numpy lacks)."""
    for dtype, tt in TORCH_TYPES.items():
        for n in sizes:
            for algo in ("ring", "hier", "mpi"):
                x = torch.from_numpy(values(R, n, "sum").astype(np.float32)).to(tt)
                c.allreduce(x, op="sum", algorithm=algo)
                check(np.array_equal(x.double().numpy(), expected(n, "sum", "f")),
                      "torch allreduce %s %s n=%d" % (algo, dtype, n))


def check_gather_scatter():
    """reduce_scatter, allgather (per-rank counts) and broadcast against mpi4py."""
    for algo in ("ring", "mpi", "auto"):
        counts = [5 + 3 * r for r in range(N)]
        x = values(R, sum(counts), "sum").astype(np.float32)
        mine = c.reduce_scatter(x, counts=counts, algorithm=algo)
        ref = np.empty(counts[R], np.float32)
        c.mpi.Reduce_scatter(x, ref, recvcounts=counts, op=MPI.SUM)
        check(np.array_equal(mine, ref), "reduce_scatter %s" % algo)
        part = np.arange(R + 2, dtype=np.int64) * 10 + R  # R+2 elements on rank R
        got = c.allgather(part, algorithm=algo)
        check(np.array_equal(got, np.concatenate(c.mpi.allgather(part))), "allgather %s" % algo)
        b = values(R, 100003, "sum").astype(np.float64)
        c.broadcast(b, root=N - 1, algorithm=algo)
        check(np.array_equal(b, values(N - 1, 100003, "sum")), "broadcast %s" % algo)


def check_async():
    """Many handles in flight, waited out of order; timeline in submission order."""
    hs, bufs = [], []
    for k in range(40):
        x = torch.from_numpy(values(R, 1000 + 997 * k, "sum").astype(np.float32))
        bufs.append(x)
        hs.append(c.allreduce_async(x, op="sum", name="t%d" % k))
    for k in reversed(range(40)):
        hs[k].wait()
        check(np.array_equal(bufs[k].numpy(), expected(1000 + 997 * k, "sum", "f")),
              "async %d" % k)
    names = [rec["name"] for rec in c.timeline()]
    check(names == ["t%d" % k for k in range(40)], "timeline order %s" % names[:5])
    # the other collectives through the engine, all in flight together
    counts = [7 + 5 * r for r in range(N)]
    x = values(R, sum(counts), "sum").astype(np.float64)
    h_rs = c.reduce_scatter_async(x, counts=counts, name="rs")
    part = np.arange(R + 3, dtype=np.int32) * 100 + R
    h_ag = c.allgather_async(part, name="ag")
    b = values(R, 5003, "sum").astype(np.float32)
    h_bc = c.broadcast_async(b, root=N - 1, name="bc")
    mine = h_rs.wait()
    off = sum(counts[:R])
    check(np.array_equal(mine, expected(sum(counts), "sum", "f")[off:off + counts[R]]),
          "reduce_scatter_async")
    check(np.array_equal(h_ag.wait(), np.concatenate(c.mpi.allgather(part))), "allgather_async")
    check(np.array_equal(h_bc.wait(), values(N - 1, 5003, "sum")), "broadcast_async")
    check([r["name"] for r in c.timeline()] == ["rs", "ag", "bc"], "timeline of other ops")


ALGOS = ("ring", "hier", "mpi", "auto")
if PARTS == ["all"]:
    PARTS = list(NP_TYPES) + ["other"]
for part in PARTS:
    if part == "other":
        check_other()
    elif part.startswith("big:"):
        # sum and max at full size (every op runs at 1 Mi + 3 here and at 64 MiB in
        # src_c/tests)
        check_allreduce("float32", [MAX_BYTES // 4], [part[4:]], ops=("sum", "max"))
    else:
        check_allreduce(part, sizes, ALGOS if part == "float32" else ("auto",))

verdict()
