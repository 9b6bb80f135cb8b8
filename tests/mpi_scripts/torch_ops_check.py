"""torch_ops_check.py - run under mpirun: hpcdl.torch's collectives against
single-process math on rank- and position-dependent data.
argv: PART = allreduce | gather | alltoall (one part per launch keeps each
launch well under the harness's 60 s). Prints 'CHECKS n FAILED k'."""
import time

import numpy as np
import torch

from hpcdl.comm import MismatchError
from torch_common import N, R, check, close, hvd, run, section, values

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8]
SHAPES = [(), (0,), (1,), (max(N - 1, 1),), (5, 7), (1031,)]
OPS = {hvd.Sum: "sum", hvd.Average: "average", hvd.Min: "min", hvd.Max: "max",
       hvd.Product: "prod"}


# ------------------------------------------------------------------ reference
def scaled(x, factor):
    """What hpcdl does to scale: floats multiply, integers truncate back."""
    if x.dtype.is_floating_point or x.is_complex():
        return x * factor
    return (x.to(torch.float64) * factor).trunc().to(x.dtype)


def reduce_ref(op, xs):
    s = torch.stack([x.to(torch.complex128 if x.is_complex() else torch.float64) for x in xs])
    if op == hvd.Sum:
        return s.sum(0)
    if op == hvd.Average:
        out = s.sum(0) / len(xs)
        return out if xs[0].dtype.is_floating_point or xs[0].is_complex() else out.trunc()
    return {hvd.Min: lambda: s.min(0).values, hvd.Max: lambda: s.max(0).values,
            hvd.Product: lambda: s.prod(0)}[op]()


def expected(op, shape, dtype, pre=1.0, post=1.0, kind=None):
    kind = kind or ("prod" if op == hvd.Product else "nonneg" if dtype == torch.uint8
                    else "sum")
    xs = [scaled(data(k, shape, dtype, kind), pre) for k in range(N)]
    return scaled(reduce_ref(op, xs).to(dtype), post)


def data(rank, shape, dtype, kind="sum"):
    if dtype.is_complex:
        return torch.complex(values(rank, shape, kind), values(rank + 1, shape, kind)).to(dtype)
    return values(rank, shape, kind, dtype)


# ------------------------------------------------------------------ allreduce
def allreduce_ops():
    for dtype in FLOATS + INTS + [torch.complex64]:
        ops = [hvd.Sum, hvd.Average] if dtype.is_complex else list(OPS)
        for op in ops:
            for shape in SHAPES:
                kind = "prod" if op == hvd.Product else "nonneg" if dtype == torch.uint8 else "sum"
                x = data(R, shape, dtype, kind)
                what = "allreduce %s %s %s" % (OPS[op], dtype, shape)
                before = x.clone()
                close(hvd.allreduce(x, op=op), expected(op, shape, dtype), what)
                close(x, before, what + " leaves its input alone")
                y = x.clone()
                close(hvd.allreduce_(y, op=op), expected(op, shape, dtype), what + " in place")
                close(y, expected(op, shape, dtype), what + " in place (tensor)")


def allreduce_scaling_and_variants():
    for dtype in (torch.float32, torch.float16, torch.int64, torch.int8):
        for op in (hvd.Sum, hvd.Average, hvd.Max, hvd.Product):
            pre, post = (0.5, 3.0) if dtype.is_floating_point else (3.0, 2.0)
            kind = "prod" if op == hvd.Product else "sum"
            x = data(R, (4, 9), dtype, kind)
            want = expected(op, (4, 9), dtype, pre, post)
            what = "allreduce %s %s pre %g post %g" % (OPS[op], dtype, pre, post)
            close(hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post), want, what)
            h = hvd.allreduce_async(x, op=op, prescale_factor=pre, postscale_factor=post)
            close(hvd.synchronize(h), want, what + " async")
            y = x.clone()
            h = hvd.allreduce_async_(y, name="y", op=op, prescale_factor=pre,
                                     postscale_factor=post)
            while not hvd.poll(h):
                time.sleep(0.001)
            out = hvd.synchronize(h)
            check(out is y, what + " async_ returns its tensor")
            close(y, want, what + " async_")
    # a non-contiguous tensor, in place and not
    x = data(R, (6, 5), torch.float32).t()
    want = expected(hvd.Sum, (6, 5), torch.float32).t()
    close(hvd.allreduce(x, op=hvd.Sum), want.contiguous(), "allreduce transposed")
    hvd.allreduce_(x, op=hvd.Sum)
    close(x, want, "allreduce_ transposed")
    # legacy average= and the default op (Average)
    x = data(R, (7,), torch.float64)
    close(hvd.allreduce(x), expected(hvd.Average, (7,), torch.float64), "default op")
    close(hvd.allreduce(x, average=False), expected(hvd.Sum, (7,), torch.float64),
          "average=False")
    close(hvd.allreduce(x, average=True), expected(hvd.Average, (7,), torch.float64),
          "average=True")
    for bad, exc in (({"op": hvd.Sum, "average": True}, ValueError),):
        try:
            hvd.allreduce(x, **bad)
            check(False, "allreduce %s did not raise" % bad)
        except exc:
            pass


def grouped_and_compressed():
    specs = [((3, 4), torch.float32), ((0,), torch.float32), ((5,), torch.int64),
             ((2, 2), torch.float16), ((1031,), torch.float32), ((3,), torch.int8)]
    xs = [data(R, s, d) for s, d in specs]
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        wants = [expected(op, s, d, 1.0, 2.0) for s, d in specs]
        outs = hvd.grouped_allreduce(xs, op=op, postscale_factor=2.0)
        for (s, d), got, want in zip(specs, outs, wants):
            close(got, want, "grouped_allreduce %s %s %s" % (OPS[op], d, s))
        ys = [x.clone() for x in xs]
        h = hvd.grouped_allreduce_async_(ys, op=op, postscale_factor=2.0)
        outs = hvd.synchronize(h)
        for (s, d), got, y, want in zip(specs, outs, ys, wants):
            check(got is y, "grouped_allreduce_async_ returns the same tensors")
            close(y, want, "grouped_allreduce_async_ %s %s %s" % (OPS[op], d, s))
        outs = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=op, postscale_factor=2.0))
        for (s, d), got, want in zip(specs, outs, wants):
            close(got, want, "grouped_allreduce_async %s %s %s" % (OPS[op], d, s))
    check(hvd.grouped_allreduce([]) == [], "grouped_allreduce of no tensors")
    # compression: values are exact in fp16 and bf16, so the result is exact
    x = data(R, (33,), torch.float32)
    for comp in (hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.bf16):
        close(hvd.allreduce(x, op=hvd.Sum, compression=comp),
              expected(hvd.Sum, (33,), torch.float32), "allreduce compression %s" % comp)
    check(hvd.allreduce(x.to(torch.int64), compression=hvd.Compression.fp16).dtype
          == torch.int64, "fp16 compression leaves integer tensors alone")


def topk_allreduce():
    """Dense top-k tensors all-reduced: the sum of every rank's sent tensor."""
    mine = hvd.Compression.topk(0.25)
    sims = [hvd.Compression.topk(0.25) for _ in range(N)]  # every rank's, replayed here
    for step in range(3):
        grads = [data(k + 7 * step, (4, 5), torch.float32) * 0.5 for k in range(N)]
        want = sum(s.compress(g, name="w")[0] for s, g in zip(sims, grads))
        got = hvd.allreduce(grads[R], name="w", op=hvd.Sum, compression=mine)
        close(got, want, "topk allreduce step %d" % step)
        close(mine.residual("w"), sims[R].residual("w"), "topk residual step %d" % step)


# --------------------------------------------------------- gather / broadcast
def allgather_checks():
    for dtype in (torch.float32, torch.int64, torch.float16, torch.bool, torch.uint8,
                  torch.complex64):
        rows = [k % 3 for k in range(N)]  # rank 0 sends no rows
        mk = lambda k: data(k, (rows[k], 3, 2), torch.float64).to(dtype) if not dtype.is_complex \
            else data(k, (rows[k], 3, 2), dtype)
        want = torch.cat([mk(k) for k in range(N)])
        close(hvd.allgather(mk(R)), want, "allgather %s uneven rows" % dtype)
        close(hvd.synchronize(hvd.allgather_async(mk(R), name="g")), want,
              "allgather_async %s" % dtype)
    close(hvd.allgather(torch.tensor(float(R))), torch.arange(N, dtype=torch.float32),
          "allgather of 0-d tensors")
    x = data(R, (3, 4), torch.float32).t()  # not contiguous
    close(hvd.allgather(x), torch.cat([data(k, (3, 4), torch.float32).t() for k in range(N)]),
          "allgather transposed")
    for bad, what in ((torch.zeros(2, 3 + (R == N - 1)), "trailing dims"),
                      (torch.zeros(2, 3, dtype=torch.float64 if R == 0 else torch.float32),
                       "dtypes"),
                      (torch.zeros(2, 3) if R else torch.zeros(2), "number of dims")):
        try:
            hvd.allgather(bad)
            check(False, "allgather with different %s did not raise" % what)
        except MismatchError as e:
            check("allgather" in str(e), "allgather mismatch message: %s" % e)


def broadcast_checks():
    for root in range(N):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.int8):
            x = data(R, (5, 3), torch.float64).to(dtype)
            want = data(root, (5, 3), torch.float64).to(dtype)
            before = x.clone()
            close(hvd.broadcast(x, root), want, "broadcast root %d %s" % (root, dtype))
            close(x, before, "broadcast leaves its input alone")
            close(hvd.synchronize(hvd.broadcast_async(x, root)), want, "broadcast_async")
            y = x.clone()
            check(hvd.broadcast_(y, root) is y, "broadcast_ returns its tensor")
            close(y, want, "broadcast_ root %d %s" % (root, dtype))
            y = x.clone()
            hvd.synchronize(hvd.broadcast_async_(y, root, name="b"))
            close(y, want, "broadcast_async_ root %d %s" % (root, dtype))
        z = data(R, (4, 6), torch.float32).t()  # in place into a non-contiguous view
        hvd.broadcast_(z, root)
        close(z, data(root, (4, 6), torch.float32).t(), "broadcast_ transposed")


def reducescatter_checks():
    for rows in (2 * N, 2 * N + 1, 1, 0):
        for op in (hvd.Sum, hvd.Average, hvd.Max):
            for dtype in (torch.float32, torch.int64):
                pre, post = (0.5, 3.0) if dtype.is_floating_point else (1.0, 2.0)
                x = data(R, (rows, 3), dtype)
                full = expected(op, (rows, 3), dtype, pre, post)
                q, extra = divmod(rows, N)
                start = R * q + min(R, extra)
                want = full[start:start + q + (1 if R < extra else 0)]
                what = "reducescatter %d rows %s %s" % (rows, OPS[op], dtype)
                close(hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post),
                      want, what)
                h = hvd.reducescatter_async(x, op=op, prescale_factor=pre,
                                            postscale_factor=post)
                close(hvd.synchronize(h), want, what + " async")
    x = data(R, (2 * N, 2), torch.float32)
    full = expected(hvd.Average, (2 * N, 2), torch.float32)
    close(hvd.reducescatter(x), full[2 * R:2 * R + 2], "reducescatter default op is Average")


def grouped_gather_checks():
    rows = [k % 3 for k in range(N)]
    xs = [data(R, (rows[R], 2), torch.float32), data(R + 1, (R + 1,), torch.int64),
          data(R + 2, (rows[R], 3, 2), torch.float64).to(torch.bfloat16)]
    want = [torch.cat([data(k, (rows[k], 2), torch.float32) for k in range(N)]),
            torch.cat([data(k + 1, (k + 1,), torch.int64) for k in range(N)]),
            torch.cat([data(k + 2, (rows[k], 3, 2), torch.float64).to(torch.bfloat16)
                       for k in range(N)])]
    got = hvd.grouped_allgather(xs, name="gg")
    check(len(got) == 3, "grouped_allgather returns one tensor per input")
    for i, (g, w) in enumerate(zip(got, want)):
        close(g, w, "grouped_allgather tensor %d" % i)
    h = hvd.grouped_allgather_async(xs)
    for i, (g, w) in enumerate(zip(hvd.synchronize(h), want)):
        close(g, w, "grouped_allgather_async tensor %d" % i)
    for op in (hvd.Sum, hvd.Average):
        shapes = [(2 * N + 1, 3), (N,), (1, 4)]
        ts = [data(R + i, s, torch.float32) for i, s in enumerate(shapes)]
        wants = []
        for i, s in enumerate(shapes):
            full = sum(data(k + i, s, torch.float64) for k in range(N)) * 0.5 * 3.0
            full = full / N if op == hvd.Average else full
            q, extra = divmod(s[0], N)
            start = R * q + min(R, extra)
            wants.append(full[start:start + q + (1 if R < extra else 0)].float())
        got = hvd.grouped_reducescatter(ts, op=op, prescale_factor=0.5, postscale_factor=3.0)
        for i, (g, w) in enumerate(zip(got, wants)):
            close(g, w, "grouped_reducescatter %s tensor %d" % (OPS[op], i))
        h = hvd.grouped_reducescatter_async(ts, op=op, prescale_factor=0.5,
                                            postscale_factor=3.0)
        check(isinstance(h, int), "grouped_reducescatter_async returns an integer handle")
        for i, (g, w) in enumerate(zip(hvd.synchronize(h), wants)):
            close(g, w, "grouped_reducescatter_async %s tensor %d" % (OPS[op], i))
    try:
        hvd.grouped_allgather(torch.zeros(3))
        check(False, "grouped_allgather of a tensor (not a list) did not raise")
    except TypeError as e:
        check("list of tensors" in str(e), "grouped_allgather type error: %s" % e)
    # one host, or virtual nodes (HPCDL_LOCAL_SIZE must divide the ranks): uniform
    check(hvd.is_homogeneous() is True, "is_homogeneous on uniform nodes")


def mixed_async_in_flight():
    """Many kinds of operations in flight at once, synchronized in reverse order."""
    started = []
    for i in range(6):
        x = data(R + i, (40, 3), torch.float32)
        started.append((hvd.allreduce_async(x, op=hvd.Sum),
                        expected(hvd.Sum, (40, 3), torch.float32) if i == 0 else None, i))
        started.append((hvd.allgather_async(data(R, (R + 1, 2), torch.float32)),
                        torch.cat([data(k, (k + 1, 2), torch.float32) for k in range(N)]), i))
        started.append((hvd.broadcast_async(x, i % N), data(i % N + i, (40, 3), torch.float32), i))
        started.append((hvd.reducescatter_async(data(R, (N, 5), torch.float32), op=hvd.Sum),
                        expected(hvd.Sum, (N, 5), torch.float32)[R:R + 1], i))
    for h, want, i in reversed(started):
        got = hvd.synchronize(h)
        if want is not None:
            close(got, want, "async in flight #%d" % i)


def join_and_barrier():
    if R == N - 1:
        time.sleep(0.5)
    last = hvd.join()
    check(last == N - 1, "join returns the last rank to join: got %s" % last)
    hvd.barrier()
    try:
        hvd.synchronize(123456789)
        check(False, "synchronize of an unknown handle did not raise")
    except ValueError:
        check(True, "")
    check(hvd.local_size() * hvd.cross_size() == N, "local_size * cross_size == size")
    check(hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_enabled(), "build flags")


# ------------------------------------------------------------------- alltoall
def a2a_data(src, dst, rows, dtype=torch.float64):
    """Rows that src sends to dst: each element says where it came from."""
    i = torch.arange(rows * 6, dtype=torch.float64).view(rows, 2, 3)
    return (src * 1000 + dst * 100 + i).to(dtype)


def alltoall_checks():
    split = lambda src, dst: (src + 2 * dst) % 3  # uneven, zeros included
    for dtype in (torch.float64, torch.float32, torch.int16, torch.bool):
        send = torch.cat([a2a_data(R, j, split(R, j), dtype) for j in range(N)])
        want = torch.cat([a2a_data(k, R, split(k, R), dtype) for k in range(N)])
        splits = [split(R, j) for j in range(N)]
        out, received = hvd.alltoall(send, splits=splits)
        close(out, want, "alltoall uneven %s" % dtype)
        close(received, torch.tensor([split(k, R) for k in range(N)], dtype=torch.int32),
              "alltoall received splits")
        out, received = hvd.synchronize(hvd.alltoall_async(send, splits=splits, name="a"))
        close(out, want, "alltoall_async uneven %s" % dtype)
    send = torch.cat([a2a_data(R, j, 2) for j in range(N)])
    out = hvd.alltoall(send)
    check(isinstance(out, torch.Tensor), "alltoall without splits returns only the tensor")
    close(out, torch.cat([a2a_data(k, R, 2) for k in range(N)]), "alltoall even split")
    out, received = hvd.alltoall(send, splits=torch.full((N,), 2, dtype=torch.int64))
    close(received, torch.full((N,), 2, dtype=torch.int64), "received splits like splits")
    empty = torch.zeros(0, 4)
    out, received = hvd.alltoall(empty, splits=[0] * N)
    close(out, empty, "alltoall of nothing")
    # wrong splits on one rank: that rank gets ValueError, the others MismatchError
    bad = [2] * N if R != N - 1 else [2] * (N - 1) + [1]
    try:
        hvd.alltoall(send, splits=bad)
        check(False, "alltoall with bad splits did not raise")
    except (ValueError, MismatchError) as e:
        check(isinstance(e, ValueError if R == N - 1 else MismatchError),
              "alltoall bad splits: %r" % e)
    # the comm layer's helper on numpy arrays, counts in 3-element units
    from hpcdl import comm
    mine = np.concatenate([a2a_data(R, j, split(R, j)).numpy().reshape(-1) for j in range(N)])
    recv, counts = comm.alltoall(mine.astype(np.int32), [2 * split(R, j) for j in range(N)],
                                 unit=3)
    want = np.concatenate([a2a_data(k, R, split(k, R)).numpy().reshape(-1) for k in range(N)])
    check(recv.dtype == np.int32 and np.array_equal(recv, want.astype(np.int32))
          and counts == [2 * split(k, R) for k in range(N)], "comm.alltoall on numpy")
    try:
        hvd.alltoall(torch.zeros(N + 1, 2))
        check(False, "alltoall of indivisible rows did not raise")
    except (ValueError, MismatchError) as e:
        check(isinstance(e, ValueError), "indivisible rows: %r" % e)


if __name__ == "__main__":
    parts = []
    if section("allreduce"):
        parts += [allreduce_ops, allreduce_scaling_and_variants, grouped_and_compressed,
                  topk_allreduce]
    if section("gather"):
        parts += [allgather_checks, broadcast_checks, reducescatter_checks,
                  grouped_gather_checks, mixed_async_in_flight,
                  join_and_barrier]
    if section("alltoall"):
        parts += [alltoall_checks]
    run(*parts)
