"""allreduce_ops.py - Horovod's all-reduce grid over hpcdl.comm:
allreduce / allreduce_ / allreduce_async / allreduce_async_ and the grouped_*
versions (one fused all-reduce per wire dtype for a list of tensors).

    out = (op over ranks of tensor * prescale_factor) * postscale_factor

op is hvd.Average (the default), Sum, Min, Max, Product or Adasum
(adasum_ops.py); `average=` is the
deprecated spelling. name= labels the operation in hpcdl's timeline (Horovod
matches tensors across ranks by name; hpcdl matches them by call order, so
every rank makes the same calls in the same order). allreduce and
grouped_allreduce are differentiable: as in Horovod, the gradient is
all-reduced with the same op and scale factors.
"""
import itertools
import math

import torch

from . import _handles, adasum_ops
from ._basics import Adasum, comm_op, handle_average_backwards_compatibility
from ._shapes import start_check
from .process_sets import comm_of, global_process_set
from ._wire import (deliver, from_wire, is_direct, owned_wire, scale_, to_wire, wire_dtype,
                    wire_shape)
from .compression import Compression, compress

_auto_names = itertools.count()


def auto_name(name, kind):
    return name if name is not None else "%s.noname.%d" % (kind, next(_auto_names))


# ------------------------------------------------------------------ starts
def _start(tensor, inplace, name, op, prescale, postscale, process_set=None):
    """Queues one all-reduce (after its shape descriptor); the handle's
    result is the output tensor (tensor itself when inplace)."""
    if op == Adasum:
        return adasum_ops.start([tensor], inplace, name, prescale, postscale,
                                comm_of(process_set, "allreduce"), grouped=False)
    code = comm_op(op)
    on = comm_of(process_set, "allreduce")
    _handles.claim(name, on, "allreduce")
    t = tensor.detach()  # same memory; the in-place work is not an autograd op
    if is_direct(t) and (inplace or prescale == 1.0):
        send = t                            # the core uses tensor's own memory
    else:
        send = owned_wire(t)                # our contiguous copy, in a core dtype
    scale_(send, prescale)                  # touches t only when inplace
    if send is not t:
        recv = send                         # reduce our copy in place
    elif inplace:
        recv = t
    else:
        recv = torch.empty_like(t, memory_format=torch.contiguous_format)
    shape_h, check = start_check(on, [t], "allreduce", name, op=code,
                                 items=[(send.numel(), send.dtype)])
    h = on.allreduce_async(send, None if recv is send else recv, op=code, name=name)

    def finish():
        scale_(recv, postscale)
        return deliver(tensor, t, recv, inplace)
    return _handles.register([shape_h, h], finish, name, on, check)


def _start_grouped(tensors, inplace, name, op, prescale, postscale, process_set=None):
    """Queues one all-reduce per wire dtype over the concatenated tensors."""
    if op == Adasum:
        return adasum_ops.start(list(tensors), inplace, name, prescale, postscale,
                                comm_of(process_set, "grouped_allreduce"), grouped=True)
    code = comm_op(op)
    on = comm_of(process_set, "grouped_allreduce")
    _handles.claim(name, on, "allreduce")
    groups = {}  # wire dtype -> positions, in first-seen order (the same on every rank)
    for i, t in enumerate(tensors):
        groups.setdefault(wire_dtype(t.dtype), []).append(i)
    plans = [(idx, torch.cat([to_wire(tensors[i].detach()).reshape(-1) for i in idx]))
             for idx in groups.values()]
    shape_h, check = start_check(on, [t.detach() for t in tensors], "allreduce", name,
                                 op=code, items=[(f.numel(), f.dtype) for _, f in plans])
    handles = [shape_h]
    for dtype, (idx, flat) in zip(groups, plans):
        scale_(flat, prescale)
        label = "%s.%s" % (name, str(dtype).replace("torch.", ""))
        handles.append(on.allreduce_async(flat, op=code, name=label))

    def finish():
        outs = [None] * len(tensors)
        for idx, flat in plans:
            scale_(flat, postscale)
            offset = 0
            for i in idx:
                t, shape = tensors[i], wire_shape(tensors[i])
                n = math.prod(shape)
                piece = from_wire(flat[offset:offset + n].view(shape), t.dtype)
                offset += n
                if inplace:
                    t.detach().copy_(piece)
                    outs[i] = t
                else:
                    outs[i] = piece
        return outs
    return _handles.register(handles, finish, name, on, check)


# ---------------------------------------------------------------- autograd
class _Allreduce(torch.autograd.Function):
    """y = op over ranks of x (scaled); dy is all-reduced the same way (Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return _handles.synchronize(_start(tensor, False, name, op, prescale, postscale,
                                           process_set))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        return (allreduce(grad, op=op, prescale_factor=pre, postscale_factor=post,
                          process_set=process_set), None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_handles.synchronize(
            _start_grouped(tensors, False, name, op, prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        reduced = grouped_allreduce(list(grads), op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=process_set)
        return (None, None, None, None, None, *reduced)


# ------------------------------------------------------------------ public
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an all-reduce into a new tensor; returns a handle for poll/synchronize."""
    op = handle_average_backwards_compatibility(op, average)
    return _start(tensor, False, auto_name(name, "allreduce"), op, prescale_factor,
                  postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place all-reduce of tensor; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _start(tensor, True, auto_name(name, "allreduce"), op, prescale_factor,
                  postscale_factor, process_set)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: op over ranks of tensor (default Average). Differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    sent, ctx = compress(compression, tensor, name)
    out = _Allreduce.apply(sent, auto_name(name, "allreduce"), op, prescale_factor,
                           postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """All-reduces tensor in place and returns it."""
    return _handles.synchronize(allreduce_async_(tensor, average, name, op,
                                                 prescale_factor, postscale_factor,
                                                 process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts one fused all-reduce of a list; synchronize returns a list of new tensors."""
    op = handle_average_backwards_compatibility(op, average)
    return _start_grouped(list(tensors), False, auto_name(name, "grouped_allreduce"), op,
                          prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    """Starts one fused in-place all-reduce of a list of tensors."""
    op = handle_average_backwards_compatibility(op, average)
    return _start_grouped(list(tensors), True, auto_name(name, "grouped_allreduce"), op,
                          prescale_factor, postscale_factor, process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """A list of new tensors, each reduced like allreduce, in one fused operation."""
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    base = auto_name(name, "grouped_allreduce")
    packed = [compress(compression, t, None if name is None else "%s.%d" % (name, i))
              for i, t in enumerate(tensors)]
    outs = _GroupedAllreduce.apply(base, op, prescale_factor, postscale_factor, process_set,
                                   *[p[0] for p in packed])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, packed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """All-reduces every tensor of the list in place; returns the list."""
    return _handles.synchronize(grouped_allreduce_async_(tensors, average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set))
