"""adasum_ops.py - op=hvd.Adasum for allreduce and grouped_allreduce (their
_async and in-place forms), over hpcdl.comm's Adasum (comm/adasum.py).

Adasum is computed at submission, blocking, on MPI point-to-point (the C
core and its engine have no Adasum); the handle it returns is already done,
so poll() is True at once. Floating tensors only (Horovod's rule); each
tensor of a group is combined on its own; prescale before, postscale after,
no averaging (Adasum's combination is already scale-aware)."""
import torch

from . import _handles
from ._shapes import check_rows, descriptor, start_round
from ._wire import deliver


def start(tensors, inplace, name, prescale, postscale, on, grouped):
    """The integer handle of a finished Adasum over tensors (a list) on
    Communicator on; its result is one tensor, or a list when grouped."""
    _handles.claim(name, on, "allreduce")
    h, rows = start_round(on, descriptor("adasum", [t.detach() for t in tensors]), name)
    h.wait()  # no rank has joined (join cannot answer Adasum: _join.py)
    check_rows(rows, "adasum", name)
    bad = [str(t.dtype) for t in tensors if not t.is_floating_point()]
    problem = "allreduce op=Adasum needs floating tensors, got %s" % bad[0] if bad else None
    on.raise_if_any(problem and ValueError(problem), ValueError)
    work = [t.detach().to("cpu", torch.float64).reshape(-1) * prescale for t in tensors]
    combined = on.adasum([w.numpy() for w in work])
    outs = []
    for t, c in zip(tensors, combined):
        r = torch.from_numpy(c).mul_(postscale).view(t.shape).to(t.device, t.dtype)
        outs.append(deliver(t, t.detach(), r, inplace))
    result = outs if grouped else outs[0]
    return _handles.register([_handles.Done()], lambda: result, name, on)
