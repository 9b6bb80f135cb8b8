"""alltoall_ops.py - Horovod's alltoall: rank i sends splits[j] rows (along
dim 0) of its tensor to rank j and receives the rows every rank sends it,
in rank order. splits=None splits dim 0 evenly (it must divide).

    out = hvd.alltoall(t)                          # splits=None: the tensor only
    out, received = hvd.alltoall(t, splits=[..])   # splits given: also the rows
                                                   # received from each rank
    out, received = hvd.synchronize(hvd.alltoall_async(t, splits))  # always both

Ranks may differ in dim 0 only. The data goes through hpcdl.comm.alltoall
(CPU memory; CUDA tensors are staged through the host). The gradient is the
all-to-all of the gradient back along the received splits.
"""
import math

import torch

from .. import comm as hcomm
from . import _handles
from ._shapes import check_rows, descriptor, start_round
from ._wire import from_wire, to_wire
from .allreduce_ops import auto_name
from .process_sets import comm_of, global_process_set


def _send_splits(splits, rows, size):
    """splits as a list of ints: given, or an even split of rows."""
    if splits is None:
        if rows % size:
            raise ValueError("alltoall: %d rows do not split evenly over %d ranks; pass "
                             "splits=" % (rows, size))
        return [rows // size] * size
    out = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(out) != size or min(out) < 0 or sum(out) != rows:
        raise ValueError("alltoall: splits %s must be %d non-negative ints summing to the "
                         "tensor's %d rows" % (out, size, rows))
    return out


def _start_alltoall(tensor, splits, name, process_set=None):
    """Handle whose result is (output, received_splits)."""
    w = comm_of(process_set, "alltoall")
    _handles.claim(name, w, "alltoall")
    t = tensor.detach() if isinstance(tensor, torch.Tensor) else None
    h, rows = start_round(w, descriptor("alltoall", None if t is None else [t],
                                        varying_rows=True), name)
    h.wait()  # one descriptor round: shapes agree, and no rank has joined (_join.py)
    if t is None:
        raise TypeError("alltoall: expected a torch tensor, got %s" % type(tensor).__name__)
    check_rows(rows, "alltoall", name, varying_rows=True)
    if t.dim() == 0:
        raise ValueError("alltoall: tensors need at least one dimension")
    try:
        counts, err = _send_splits(splits, t.shape[0], w.size), None
    except (TypeError, ValueError) as e:
        counts, err = None, e          # still take part, so the others raise too
    send = to_wire(t).contiguous().cpu()
    unit = math.prod(send.shape[1:])   # elements per row
    try:
        recv, received = hcomm.alltoall(send, counts, unit=unit, comm=w)
    except (TypeError, ValueError):
        if err is not None:
            raise err from None
        raise
    out = from_wire(recv.view((sum(received),) + tuple(send.shape[1:])), t.dtype)
    out = out.to(t.device)
    like = splits if isinstance(splits, torch.Tensor) else torch.empty(0, dtype=torch.int32)
    received = torch.tensor(received, dtype=like.dtype, device=like.device)
    return _handles.register([_handles.Done()], lambda: (out, received), name, w)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = _handles.synchronize(_start_alltoall(tensor, splits, name,
                                                             process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received_grad):
        back, _ = _handles.synchronize(_start_alltoall(grad.contiguous(), ctx.received,
                                                       auto_name(None, "alltoall.grad"),
                                                       ctx.process_set))
        return back, None, None, None


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an all-to-all; synchronize returns (output, received_splits)."""
    return _start_alltoall(tensor, splits, auto_name(name, "alltoall"), process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank sent to this one, in rank order; with splits given,
    also received_splits (rows from each rank). Differentiable."""
    out, received = _Alltoall.apply(tensor, splits, auto_name(name, "alltoall"), process_set)
    return out if splits is None else (out, received)
