"""torch_backend_check.py - run under mpirun: torch.distributed on backend
"hpcdl" against single-process math, on rank- and position-dependent data.
argv: PART = coll | groups | p2p | errors | all (p2p: also recv from any source
and monitored_barrier). No MASTER_ADDR/PORT: MPI is the
rendezvous. Prints 'CHECKS n FAILED k'."""
import os

for var in ("MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(var, None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hpcdl.comm import MismatchError  # noqa: E402
from torch_common import N, R, check, close, run, section, values  # noqa: E402

dist.init_process_group("hpcdl")
OP = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8]
SHAPES = [(), (0,), (1,), (max(N - 1, 1),), (5, 7), (1031,)]
TORCH_OPS = {OP.SUM: "sum", OP.AVG: "avg", OP.MIN: "min", OP.MAX: "max", OP.PRODUCT: "prod"}


def data(rank, shape, dtype, op=None):
    kind = "prod" if op == OP.PRODUCT else "nonneg" if dtype in (torch.uint8, torch.bool) \
        else "sum"
    v = values(rank, shape, kind)
    if dtype == torch.bool:
        return (v.to(torch.int64) % 3 == 0)
    if dtype.is_complex:
        return torch.complex(v, -2 * v).to(dtype)
    return v.to(dtype)


def reduce_ref(op, xs):
    wide = torch.complex128 if xs[0].is_complex() else torch.float64
    s = torch.stack([x.to(wide) for x in xs])
    if op == OP.SUM:
        out = s.sum(0)
    elif op == OP.AVG:
        out = s.sum(0) / len(xs)
    elif op == OP.PRODUCT:
        out = s.prod(0)
    else:
        out = (s.min(0) if op == OP.MIN else s.max(0)).values
    return out.to(xs[0].dtype)


# ------------------------------------------------------------------ all-reduce
def all_reduce():
    for dtype in FLOATS + INTS + [torch.complex64]:
        for op, name in TORCH_OPS.items():
            if op == OP.AVG and not (dtype.is_floating_point or dtype.is_complex):
                continue
            if dtype.is_complex and op not in (OP.SUM, OP.AVG):
                continue
            for shape in SHAPES:
                t = data(R, shape, dtype, op)
                dist.all_reduce(t, op=op)
                want = reduce_ref(op, [data(r, shape, dtype, op) for r in range(N)])
                close(t, want, "all_reduce %s %s %s" % (name, dtype, shape))
    # a non-contiguous tensor (staged through a copy) and an async one's future
    base = data(R, (6, 4), torch.float32)
    t = base.t()
    dist.all_reduce(t)
    close(t, sum(data(r, (6, 4), torch.float32) for r in range(N)).t(), "all_reduce transposed")
    t = data(R, (300,), torch.float64)
    fut = dist.all_reduce(t, async_op=True).get_future()
    got = fut.then(lambda f: f.value()[0] * 2).wait()
    close(got, 2 * sum(data(r, (300,), torch.float64) for r in range(N)), "all_reduce future")
    bitwise()


BITWISE = {OP.BAND: torch.bitwise_and, OP.BOR: torch.bitwise_or, OP.BXOR: torch.bitwise_xor}


def bitwise_ref(op, shape, dtype):
    out = data(0, shape, dtype)
    for r in range(1, N):
        out = BITWISE[op](out, data(r, shape, dtype))
    return out


def bitwise():
    """BAND / BOR / BXOR: all-gathered and folded (not in the core)."""
    for dtype in (torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool):
        for op in BITWISE:
            for shape in ((0,), (5, 7), (1031,)):
                t = data(R, shape, dtype)
                dist.all_reduce(t, op=op)
                close(t, bitwise_ref(op, shape, dtype), "all_reduce %s %s %s" % (op, dtype, shape))
    for root in range(N):
        t = data(R, (6,), torch.int64)
        dist.reduce(t, dst=root, op=OP.BOR)
        want = bitwise_ref(OP.BOR, (6,), torch.int64) if R == root else data(R, (6,), torch.int64)
        close(t, want, "reduce BOR root %d" % root)
    for call, bad, want in (
            (lambda: dist.all_reduce(torch.ones(3), op=OP.BAND), TypeError, "integer or bool"),
            (lambda: dist.reduce_scatter_tensor(torch.ones(1, dtype=torch.int32),
                                                torch.ones(N, dtype=torch.int32), op=OP.BXOR),
             ValueError, "BAND/BOR/BXOR in all_reduce and reduce only"),
            (lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)),
             ValueError, "PREMUL_SUM is not in hpcdl's core")):
        try:
            call()
            check(False, "did not raise %s (%s)" % (bad.__name__, want))
        except bad as e:
            check(want in str(e), "message %r lacks %r" % (str(e), want))


def reduce():
    for root in range(N):
        for dtype in (torch.float32, torch.int64, torch.uint8):
            for shape in ((0,), (5, 7), (1031,)):
                t = data(R, shape, dtype)
                dist.reduce(t, dst=root, op=OP.MAX)
                want = reduce_ref(OP.MAX, [data(r, shape, dtype) for r in range(N)])
                close(t, want if R == root else data(R, shape, dtype),
                      "reduce root %d %s %s" % (root, dtype, shape))


# --------------------------------------------------------------- data movement
MOVE_DTYPES = FLOATS + [torch.int32, torch.int64, torch.int16, torch.uint8, torch.bool,
                        torch.complex64]


def broadcast():
    for root in range(N):
        for dtype in MOVE_DTYPES:
            for shape in SHAPES:
                t = data(R, shape, dtype)
                dist.broadcast(t, src=root)
                close(t, data(root, shape, dtype), "broadcast root %d %s %s"
                      % (root, dtype, shape))


def all_gather():
    for dtype in MOVE_DTYPES:
        for shape in SHAPES:
            outs = [torch.full(shape, 3).to(dtype) for _ in range(N)]
            dist.all_gather(outs, data(R, shape, dtype))
            for r in range(N):
                close(outs[r], data(r, shape, dtype), "all_gather %s %s from %d"
                      % (dtype, shape, r))
            n = data(R, shape, dtype).numel()
            out = torch.empty(N * n, dtype=dtype)
            dist.all_gather_into_tensor(out, data(R, shape, dtype).reshape(-1))
            want = torch.cat([data(r, shape, dtype).reshape(-1) for r in range(N)])
            close(out, want, "all_gather_into_tensor %s %s" % (dtype, shape))
    # in place: the input is this rank's block of the output (FSDP's pattern)
    out = torch.zeros(N * 7)
    mine = out[R * 7:(R + 1) * 7]
    mine.copy_(data(R, (7,), torch.float32))
    dist.all_gather_into_tensor(out, mine)
    close(out, torch.cat([data(r, (7,), torch.float32) for r in range(N)]),
          "all_gather_into_tensor in place")


def reduce_scatter():
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
        for per in (0, 1, 3, 1031):
            full = [data(r, (N * per,), dtype) for r in range(N)]
            out = torch.empty(per, dtype=dtype)
            dist.reduce_scatter_tensor(out, full[R].clone())
            want = reduce_ref(OP.SUM, full)[R * per:(R + 1) * per]
            close(out, want, "reduce_scatter_tensor %s per=%d" % (dtype, per))
        # the list form with blocks of different sizes (rank i's block: i + 1 rows)
        ins = [data(R + 10 * i, (i + 1, 3), dtype) for i in range(N)]
        out = torch.empty(R + 1, 3, dtype=dtype)
        dist.reduce_scatter(out, ins, op=OP.MIN)
        want = reduce_ref(OP.MIN, [data(r + 10 * R, (R + 1, 3), dtype) for r in range(N)])
        close(out, want, "reduce_scatter list %s" % dtype)


def barrier_and_coalesced():
    for _ in range(3):
        dist.barrier()
    ts = [data(R, (k,), torch.float32) for k in (0, 5, 1031)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for k, t in zip((0, 5, 1031), ts):
        close(t, sum(data(r, (k,), torch.float32) for r in range(N)), "async all_reduce %d" % k)
    # functional collectives' coalesced forms (DTensor / FSDP use these ops)
    import torch.distributed._functional_collectives as funcol
    world = dist.group.WORLD
    ins = [data(R, (3,), torch.float32), data(R + 5, (2, 4), torch.int64)]
    outs = funcol.all_gather_into_tensor_coalesced(ins, world)
    for i, (got, x) in enumerate(zip(outs, ins)):
        want = torch.cat([data(r + 5 * i, x.shape, x.dtype) for r in range(N)])
        close(torch.as_tensor(got).clone(), want, "all_gather_into_tensor_coalesced %d" % i)
    ins = [data(R, (N * 3,), torch.float32), data(R + 5, (N * 2, 4), torch.float64)]
    outs = funcol.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], world)
    for i, (got, x) in enumerate(zip(outs, ins)):
        full = sum(data(r + 5 * i, x.shape, x.dtype) for r in range(N))
        block = x.shape[0] // N
        close(torch.as_tensor(got).clone(), full[R * block:(R + 1) * block],
              "reduce_scatter_tensor_coalesced %d" % i)


# ------------------------------------------- the all-to-all family (MPI Alltoallv)
def gather_scatter():
    for root in range(N):
        for dtype in (torch.float32, torch.int64, torch.bool):
            t = data(R, (4, 3), dtype)
            outs = [torch.zeros(4, 3, dtype=dtype) for _ in range(N)] if R == root else None
            dist.gather(t, outs, dst=root)
            if R == root:
                for r in range(N):
                    close(outs[r], data(r, (4, 3), dtype), "gather root %d from %d" % (root, r))
            out = torch.zeros(5, dtype=dtype)
            ins = [data(root + 7 * r, (5,), dtype) for r in range(N)] if R == root else None
            dist.scatter(out, ins, src=root)
            close(out, data(root + 7 * R, (5,), dtype), "scatter root %d %s" % (root, dtype))


def all_to_all():
    # rank i sends (i + j + 1) rows of 2 to rank j
    ins = [data(100 * R + j, (R + j + 1, 2), torch.float32) for j in range(N)]
    outs = [torch.empty(j + R + 1, 2) for j in range(N)]
    dist.all_to_all(outs, ins)
    for j in range(N):
        close(outs[j], data(100 * j + R, (j + R + 1, 2), torch.float32), "all_to_all from %d" % j)
    in_splits = [R + j + 1 for j in range(N)]
    out_splits = [j + R + 1 for j in range(N)]
    inp = torch.cat(ins)
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    close(out, torch.cat(outs), "all_to_all_single uneven")
    inp = data(R, (N * 3,), torch.int64)
    out = torch.empty(N * 3, dtype=torch.int64)
    dist.all_to_all_single(out, inp)
    want = torch.cat([data(j, (N * 3,), torch.int64)[R * 3:(R + 1) * 3] for j in range(N)])
    close(out, want, "all_to_all_single even")


# --------------------------------------------------------------- sub-groups
def groups():
    members = list(range(1, N)) if N > 2 else [0, 1]
    g = dist.new_group(members)
    if R in members:
        t = data(R, (9,), torch.float32)
        dist.all_reduce(t, group=g)
        close(t, sum(data(r, (9,), torch.float32) for r in members), "sub-group all_reduce")
        check(dist.get_rank(g) == members.index(R), "sub-group rank")
        b = data(R, (4,), torch.int64)
        dist.broadcast(b, src=members[-1], group=g)
        close(b, data(members[-1], (4,), torch.int64), "sub-group broadcast (global src)")
    else:
        check(g == dist.GroupMember.NON_GROUP_MEMBER, "outside the sub-group: non-member")
    t = data(R, (3,), torch.float32)
    dist.all_reduce(t)  # the world still works after
    close(t, sum(data(r, (3,), torch.float32) for r in range(N)), "world after new_group")


# ------------------------------------------------------------------- errors
def errors():
    # ranks disagree on the count: hpcdl's agreement check, MismatchError on every rank
    try:
        dist.all_reduce(torch.ones(4 + R))
        check(False, "mismatched all_reduce did not raise")
    except MismatchError as e:
        check("count" in str(e), "mismatch message names the count: %s" % e)
    # one rank's own check fails (output too small): it raises its ValueError, the
    # others MismatchError instead of waiting for it
    out = torch.empty(N * 3 - (1 if R == N - 1 else 0))
    try:
        dist.all_gather_into_tensor(out, torch.ones(3))
        check(False, "all_gather_into_tensor with a wrong output did not raise")
    except ValueError as e:
        check(R == N - 1 and "output has" in str(e), "rank %d raised ValueError: %s" % (R, e))
    except MismatchError as e:
        check(R != N - 1 and "rank %d" % (N - 1) in str(e), "rank %d: %s" % (R, e))
    t = data(R, (5,), torch.float32)
    dist.all_reduce(t)  # the group goes on after the refused calls
    close(t, sum(data(r, (5,), torch.float32) for r in range(N)), "all_reduce after mismatch")
    check(dist.get_backend() == "hpcdl", "get_backend: %s" % dist.get_backend())


# ----------------------------------------------------------- point-to-point
def point_to_point():
    nxt, prv = (R + 1) % N, (R - 1) % N
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        for shape in ((0,), (1,), (5, 7), (1031,), (300000,)):
            # blocking, ordered so that nobody waits in a send for a receiver
            got = torch.zeros(shape).to(dtype)
            if R % 2 == 0:
                dist.send(data(R, shape, dtype), nxt)
                dist.recv(got, prv)
            else:
                dist.recv(got, prv)
                dist.send(data(R, shape, dtype), nxt)
            close(got, data(prv, shape, dtype), "send/recv ring %s %s" % (dtype, shape))
    # batch_isend_irecv both ways at once, with tags; one target not contiguous
    out_a, out_b = torch.zeros(64), torch.zeros(8, 6).t()
    ops = [dist.P2POp(dist.isend, data(R, (64,), torch.float32), nxt, tag=1),
           dist.P2POp(dist.isend, data(R + 50, (6, 8), torch.float32), prv, tag=2),
           dist.P2POp(dist.irecv, out_a, prv, tag=1),
           dist.P2POp(dist.irecv, out_b, nxt, tag=2)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    close(out_a, data(prv, (64,), torch.float32), "batch_isend_irecv forward")
    close(out_b, data(nxt + 50, (6, 8), torch.float32), "batch_isend_irecv backward, strided")
    # isend's future (what pipelining schedules may chain on)
    got = torch.zeros(10)
    fs = dist.isend(data(R, (10,), torch.float32), nxt).get_future()
    dist.irecv(got, prv).wait()
    fs.wait()
    close(got, data(prv, (10,), torch.float32), "isend future, irecv wait")


def any_source():
    """dist.recv without src: rank 0 takes one message from every other rank,
    in whatever order they come, and learns each sender."""
    if R == 0:
        seen = []
        for _ in range(N - 1):
            got = torch.zeros(7, dtype=torch.int64)
            src = dist.recv(got, tag=9)
            seen.append(src)
            close(got, data(src, (7,), torch.int64), "recv any source: from %d" % src)
        check(sorted(seen) == list(range(1, N)), "recv any source: senders %s" % seen)
        work = dist.irecv(torch.zeros(2), tag=10)  # irecv without src: the Work names it
        check(work.wait() and work._source_rank() == N - 1, "irecv any source: sender")
    else:
        dist.send(data(R, (7,), torch.int64), 0, tag=9)
        if R == N - 1:
            dist.send(torch.ones(2), 0, tag=10)


def monitored():
    """hpcdl.torch.distributed.monitored_barrier: everyone -> passes; the last
    rank held back (it waits for rank 0's word, so it surely misses it) ->
    rank 0 and the ranks that came raise BarrierTimeout naming it; the held
    rank, arriving alone later, names rank 0."""
    from hpcdl.comm.p2p import BarrierTimeout
    from mpi4py import MPI
    from hpcdl.torch.distributed import monitored_barrier
    monitored_barrier(timeout=60)
    held = [N - 1]
    want = "rank %d of %d did not reach the barrier within" % (N - 1, N)
    if R in held:
        MPI.COMM_WORLD.recv(source=0, tag=77)
        try:
            monitored_barrier(timeout=0.2)
            check(False, "a rank alone in monitored_barrier passed")
        except BarrierTimeout as e:
            check("no answer from rank 0 within 0.2 s" in str(e), "held rank: %s" % e)
    else:
        try:
            monitored_barrier(timeout=0.5 if R == 0 else 60, wait_all_ranks=True)
            check(False, "monitored_barrier without ranks %s passed" % held)
        except BarrierTimeout as e:
            check(want in str(e), "rank %d: %r lacks %r" % (R, str(e), want))
        if R == 0:
            for r in held:
                MPI.COMM_WORLD.send("go", dest=r, tag=77)
    dist.barrier()
    monitored_barrier(timeout=60)  # all in step again
    try:
        monitored_barrier(timeout=0)
        check(False, "timeout 0 accepted")
    except ValueError as e:
        check("timeout must be > 0" in str(e), "timeout 0: %s" % e)


def main_parts():
    parts = []
    if section("coll"):
        parts += [all_reduce, reduce, broadcast, all_gather, reduce_scatter,
                  barrier_and_coalesced, gather_scatter, all_to_all]
    if section("groups"):
        parts.append(groups)
    if section("p2p"):
        parts += [point_to_point, any_source, monitored]
    if section("errors"):
        parts.append(errors)
    return parts


if __name__ == "__main__":
    parts = main_parts()
    parts.append(dist.destroy_process_group)
    run(*parts)
