"""adasum_optimizer.py - DistributedOptimizer(op=hvd.Adasum): Horovod's
delta optimizer. Each rank steps the wrapped optimizer on its own gradients;
the change of each parameter (delta = new - old) is combined over ranks with
Adasum (comm/adasum.py, each parameter on its own), and every rank sets
parameter = old + combined delta. Optimizer state (momentum, Adam moments)
stays each rank's own, as in Horovod.

Horovod combines each parameter's delta from its backward hook; here all of
them go in one exchange in step(), in the optimizer's parameter order (the
same on every rank): the same numbers for optimizers that update each
parameter on its own (SGD, Adam, LARS), without overlap with backward."""
import contextlib

import torch

from ..optim.wrapper import OptimizerWrapper
from . import adasum_ops, _handles
from .compression import Compression, compress
from .reducer import member_comm, param_names


class DistributedAdasumOptimizer(OptimizerWrapper):
    """hvd.DistributedOptimizer(..., op=hvd.Adasum) returns one."""

    def __init__(self, optimizer, named_parameters=None, compression=None, process_set=None):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        super().__init__(optimizer, params)
        self._names = param_names(params, named_parameters)
        self._compression = compression if compression is not None else Compression.none
        self._on = member_comm(process_set)
        self._parameter_names = self._names

    def synchronize(self):
        """Nothing to wait for: the deltas are combined inside step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using "
                             "Adasum optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        params = [p for g in self.param_groups for p in g["params"]
                  if p.requires_grad and p.grad is not None]
        if self._on is None:  # outside the process set: a plain local step
            self._opt.step()
            return loss
        start = [p.detach().clone() for p in params]
        self._opt.step()
        deltas, ctxs = [], []
        for p, s in zip(params, start):
            sent, ctx = compress(self._compression, p.detach() - s, self._names.get(p))
            deltas.append(sent)
            ctxs.append(ctx)
        h = adasum_ops.start(deltas, False, "adasum.deltas", 1.0, 1.0, self._on, grouped=True)
        for p, s, d, ctx in zip(params, start, _handles.synchronize(h), ctxs):
            p.data.copy_(s + self._compression.decompress(d, ctx).to(p.dtype))
        return loss
