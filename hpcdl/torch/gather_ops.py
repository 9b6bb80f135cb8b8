"""gather_ops.py - Horovod's allgather, broadcast and reducescatter over
hpcdl.comm, with their _async / in-place (_) variants and gradients.

    allgather:     concatenation over ranks along dim 0 (dim 0 may differ per rank)
    broadcast:     root_rank's tensor on every rank
    reducescatter: rank r gets rows [r] of (op over ranks of tensor); with
                   n rows and N ranks, the first n % N ranks get one extra row
    grouped_allgather / grouped_reducescatter: the same for each tensor of a
                   list, queued together under one handle (Horovod >= 0.26)

Gradients follow Horovod (>= 0.22), which treats the loss as the average of
the ranks' losses for allgather and broadcast: the gradient of allgather is
this rank's rows of the Average-all-reduced gradient; of broadcast, the
Average-all-reduced gradient on root_rank and zeros elsewhere; of
reducescatter, the all-gathered gradient times the scale factors, and times
the set's size for Sum (Horovod's rule: the gradient of the average of the
ranks' losses).

Every call takes process_set= (process_sets.py): it runs on that set's
Communicator; root_rank stays a global rank, as in Horovod. All-reduce-like
calls (broadcast, reducescatter) check that shapes agree, and allgather
learns every rank's rows, in a descriptor round queued ahead of the data
(_shapes.start_check, start_round): none of the _async calls waits for the
other ranks. With a rank that called hvd.join(), all three raise (_join.py).
"""
import math

import torch

from . import _handles
from ._basics import Adasum, Average, Sum, comm_op
from ._shapes import DIMS, check_rows, descriptor, start_check, start_round
from ._wire import (deliver, from_wire, on_host, owned_host_wire, scale_, to_wire,
                    wire_shape)
from .allreduce_ops import allreduce, auto_name, grouped_allreduce
from .compression import Compression, compress
from .process_sets import comm_of, global_process_set, set_root


# ------------------------------------------------------------------ starts
def _start_allgather(tensor, name, process_set=None, part=False):
    """(handle, offset()): offset() is where this rank's rows start in the
    result, known once the handle is done. Nothing here waits for the other
    ranks: the counts come from the descriptor round, and the data is queued
    after it (_handles.Later). part: one tensor of a grouped call."""
    on = comm_of(process_set, "allgather")
    _handles.claim(name, on, "allgather", flush_first=not part)
    try:
        t = tensor.detach()
        t = t.reshape(1) if t.dim() == 0 else t
        send = to_wire(t).contiguous() if t.device.type == "cpu" else owned_host_wire(t)
        row = math.prod(wire_shape(t)[1:])
    except (AttributeError, TypeError) as e:  # take part in the round, so the others raise
        h, _ = start_round(on, descriptor("allgather", None), name)
        h.wait()
        if isinstance(e, AttributeError):
            raise TypeError("allgather: expected a torch tensor, got %s"
                            % type(tensor).__name__) from None
        raise
    round_h, rows = start_round(on, descriptor("allgather", [t], row_elems=row,
                                               varying_rows=True), name)
    out = []

    def check():
        check_rows(rows, "allgather", name, varying_rows=True)

    def launch():
        try:
            check()
        except RuntimeError:
            return None  # the same rows everywhere: no rank sends, check() raises
        firsts = rows[:, DIMS].tolist()
        out.append(torch.empty((sum(firsts),) + tuple(send.shape[1:]), dtype=send.dtype,
                               device=send.device))
        return _handles.start("allgather", send, out[0], counts=[n * row for n in firsts],
                              name=name, on=on)
    data = _handles.Later(on, round_h, launch)
    h = _handles.register([round_h, data], lambda: from_wire(out[0], t.dtype).to(t.device),
                          name, on, check)
    return h, lambda: int(rows[:on.rank, DIMS].sum())


def _start_broadcast(tensor, root_rank, inplace, name, process_set=None):
    on = comm_of(process_set, "broadcast")
    root = set_root(process_set, root_rank, "broadcast")
    _handles.claim(name, on, "broadcast")
    t = tensor.detach()
    buf = t if (inplace and on_host(t)) else owned_host_wire(t)
    shape_h, check = start_check(on, [t], "broadcast", name, root=root,
                                 items=[(buf.numel(), buf.dtype)])
    h = _handles.start("broadcast", buf, root=root, name=name, on=on)
    return _handles.register([shape_h, h], lambda: deliver(tensor, t, buf, inplace), name,
                             on, check)


def _start_reducescatter(tensor, name, op, prescale, postscale, process_set=None):
    if op == Adasum:  # Horovod's answer too: a RuntimeError on every rank, nothing sent
        raise RuntimeError("reducescatter: op=Adasum is not supported (as in Horovod); "
                           "use hvd.Average or hvd.Sum")
    code, w = comm_op(op), comm_of(process_set, "reducescatter")
    _handles.claim(name, w, "reducescatter")
    t0 = tensor.detach()
    t = t0.reshape(1) if t0.dim() == 0 else t0
    q, extra = divmod(t.shape[0], w.size)
    rows = [q + (1 if r < extra else 0) for r in range(w.size)]
    send = t if (on_host(t) and prescale == 1.0) else owned_host_wire(t)
    if send is not t:
        scale_(send, prescale, gpu=t.is_cuda)
    row = math.prod(wire_shape(t)[1:])
    out = torch.empty((rows[w.rank],) + tuple(send.shape[1:]), dtype=send.dtype,
                      device=send.device)
    shape_h, check_shapes = start_check(w, [t0], "reducescatter", name, op=code,
                                        items=[(send.numel(), send.dtype)], row_elems=row)
    h = _handles.start("reduce_scatter", send, out, counts=[n * row for n in rows],
                       op=code, name=name, on=w)

    def check():  # a scalar runs as one row, so that no rank waits, then fails everywhere
        check_shapes()
        if t0.dim() == 0:
            raise ValueError("reducescatter: the tensor needs at least one dimension (a "
                             "scalar cannot be scattered over ranks)")

    def finish():
        scale_(out, postscale, gpu=t.is_cuda)
        return from_wire(out, t.dtype).to(t.device)
    return _handles.register([shape_h, h], finish, name, w, check)


# ---------------------------------------------------------------- autograd
class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.shape, ctx.process_set = tensor.shape, process_set
        handle, offset = _start_allgather(tensor, name, process_set)
        out = _handles.synchronize(handle)
        ctx.offset = offset()
        return out

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        rows = ctx.shape[0] if len(ctx.shape) else 1
        return reduced.narrow(0, ctx.offset, rows).reshape(ctx.shape), None, None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _handles.synchronize(_start_broadcast(tensor, root_rank, False, name,
                                                     process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        if _handles.world().rank != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def _scatter_grad_scale(op, pre, post, on):
    """Horovod's factor on reducescatter's gradient: Sum -> times the set size."""
    return pre * post * (on.size if op == Sum else 1)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.shape, ctx.args = tensor.shape, (op, prescale, postscale, process_set)
        return _handles.synchronize(_start_reducescatter(tensor, name, op, prescale,
                                                         postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        gathered = allgather(grad.contiguous(), process_set=process_set)
        scale = _scatter_grad_scale(op, pre, post, comm_of(process_set))
        return (gathered * scale).reshape(ctx.shape), None, None, None, None, None


# ------------------------------------------------------------------ public
def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an all-gather along dim 0; returns a handle."""
    return _start_allgather(tensor, auto_name(name, "allgather"), process_set)[0]


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dim 0, in rank order. Ranks may
    differ in dim 0 only. Differentiable."""
    return _Allgather.apply(tensor, auto_name(name, "allgather"), process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of root_rank's tensor into a new tensor; returns a handle."""
    return _start_broadcast(tensor, root_rank, False, auto_name(name, "broadcast"),
                            process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast of root_rank's tensor; returns a handle."""
    return _start_broadcast(tensor, root_rank, True, auto_name(name, "broadcast"),
                            process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's tensor. Differentiable."""
    return _Broadcast.apply(tensor, root_rank, auto_name(name, "broadcast"), process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites tensor with root_rank's and returns it."""
    return _handles.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reduce-scatter along dim 0; returns a handle."""
    return _start_reducescatter(tensor, auto_name(name, "reducescatter"), op,
                                prescale_factor, postscale_factor, process_set)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's rows of (op over ranks of tensor). Every rank passes the same
    shape. Differentiable."""
    sent, ctx = compress(compression, tensor, name)
    out = _Reducescatter.apply(sent, auto_name(name, "reducescatter"), op,
                               prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


# ------------------------------------------------------------------ grouped
class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        on = comm_of(process_set, "grouped_allgather")
        _handles.claim(name, on, "allgather")
        starts = [_start_allgather(t, "%s.%d" % (name, i), process_set, part=True)
                  for i, t in enumerate(tensors)]
        ctx.shapes, ctx.process_set = [t.shape for t in tensors], process_set
        outs = _handles.synchronize(_handles.combine([h for h, _ in starts], name, on))
        ctx.offsets = [o() for _, o in starts]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                    process_set=ctx.process_set)
        return (None, None, *[r.narrow(0, off, shape[0] if len(shape) else 1).reshape(shape)
                              for r, off, shape in zip(reduced, ctx.offsets, ctx.shapes)])


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_handles.synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        scale = _scatter_grad_scale(op, pre, post, comm_of(process_set))
        gathered = _handles.synchronize(grouped_allgather_async(
            [g.contiguous() for g in grads], process_set=process_set))
        return (None, None, None, None, None,
                *[(g * scale).reshape(shape) for g, shape in zip(gathered, ctx.shapes)])


def _group(tensors, name, kind):
    if isinstance(tensors, torch.Tensor) or not all(isinstance(t, torch.Tensor)
                                                    for t in tensors):
        raise TypeError("%s takes a list of tensors" % kind)
    return list(tensors), auto_name(name, kind)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an all-gather of each tensor, all queued at once; the handle's
    result is the list of gathered tensors."""
    tensors, name = _group(tensors, name, "grouped_allgather")
    on = comm_of(process_set, "grouped_allgather")
    _handles.claim(name, on, "allgather")
    starts = [_start_allgather(t, "%s.%d" % (name, i), process_set, part=True)[0]
              for i, t in enumerate(tensors)]
    return _handles.combine(starts, name, on)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """[allgather(t) for t in tensors], all queued at once. Differentiable."""
    tensors, name = _group(tensors, name, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reduce-scatter of each tensor, all queued at once; the
    handle's result is the list of this rank's pieces."""
    tensors, name = _group(tensors, name, "grouped_reducescatter")
    on = comm_of(process_set, "grouped_reducescatter")
    _handles.claim(name, on, "reducescatter")
    starts = [_start_reducescatter(t, "%s.%d" % (name, i), op, prescale_factor,
                                   postscale_factor, process_set)
              for i, t in enumerate(tensors)]
    return _handles.combine(starts, name, on)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """[reducescatter(t, ...) for t in tensors] with the same arguments, all
    queued at once. Differentiable."""
    tensors, name = _group(tensors, name, "grouped_reducescatter")
    sent = [compress(compression, t, "%s.%d" % (name, i)) for i, t in enumerate(tensors)]
    outs = _GroupedReducescatter.apply(name, op, prescale_factor, postscale_factor,
                                       process_set, *[t for t, _ in sent])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, sent)]
