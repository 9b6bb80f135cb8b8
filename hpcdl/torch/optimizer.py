"""optimizer.py - DataParallelOptimizer, what hvd.DistributedOptimizer
returns by default: gradients averaged over ranks in fusion buckets while
backward still runs, then the wrapped optimizer's step.

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())

DistributedOptimizer is a function, as in Horovod (distributed_optimizer.py):
it returns
  DataParallelOptimizer          (this file) a Reducer (reducer.py: buckets,
                                 gradient hooks, in-order submission, join,
                                 timeline, the comm hook) plus the wrapped
                                 optimizer's step();
  zero.ZeroOptimizer             for zero_stage=1|2 (zero/optimizer.py): the
                                 same Reducer, the optimizer state sharded;
  DistributedAdasumOptimizer     for op=hvd.Adasum (adasum_optimizer.py).

When things happen: during backward each filled bucket is handed to the
Reducer's comm hook (an all-reduce by default); step() (or synchronize())
submits buckets whose parameters got no gradient (as zeros), waits for every
bucket, undoes compression and scaling in place, then calls the wrapped
optimizer's step(). hvd.join() answers the steps of an optimizer on the
global process set with the default comm hook (_join.py).
"""
import contextlib
import warnings

import torch

from ..optim.wrapper import OptimizerWrapper
from .reducer import Reducer, member_comm, param_names, warn_no_gradient
from ._basics import comm_op
from .noise_scale import check_batch, check_loss_scale
from .process_sets import global_process_set

# Horovod's keywords that say how gradients meet, and their defaults
GRADIENT_OPTIONS = {"compression": None, "backward_passes_per_step": 1, "op": "average",
                    "gradient_predivide_factor": 1.0, "groups": None,
                    "sparse_as_dense": False}


class DataParallelOptimizer(OptimizerWrapper):
    """A Reducer (self.reducer) plus the wrapped optimizer's step. A plain
    wrapper: param_groups and state are the wrapped optimizer's own objects,
    so LR schedulers and checkpoints see one optimizer. options: the keys of
    GRADIENT_OPTIONS (Horovod's keywords)."""
    zero_stage = 0
    _noise = None  # the gradient noise scale's Meter (noise_scale.py), when asked for
    _adascale = None  # AdaScale's gain and progress (adascale.py), when asked for

    def __init__(self, optimizer, named_parameters=None, process_set=None, **options):
        unknown = sorted(set(options) - set(GRADIENT_OPTIONS))
        if unknown:
            raise TypeError("%s got unexpected keyword(s) %s" % (type(self).__name__, unknown))
        o = dict(GRADIENT_OPTIONS, **options)
        self.process_set = process_set if process_set is not None else global_process_set
        self.sparse_as_dense = bool(o["sparse_as_dense"])
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        super().__init__(optimizer, params)
        op, predivide = comm_op(o["op"]), float(o["gradient_predivide_factor"])
        if predivide != 1.0 and op != "average":
            raise ValueError("gradient_predivide_factor needs op=Average")
        names = param_names(params, named_parameters)
        self._parameter_names = names  # Horovod's name for {param: name}
        world = self.process_set.process_set_id == 0
        self.reducer = Reducer(params, names, member_comm(self.process_set),
                               compression=o["compression"], op=op, predivide=predivide,
                               passes_per_step=o["backward_passes_per_step"],
                               groups=o["groups"], **self._layout(world))
        self._synchronized = False
        self._skip_sync = False

    def _layout(self, world):
        """How the Reducer keeps its buckets: in node-shared memory and
        answered by hvd.join() on the global process set."""
        return dict(shared=world, join=world)

    def register_comm_hook(self, state, hook):
        """self.reducer.register_comm_hook: hook(state, bucket) -> handle
        decides how each bucket's gradients meet (reducer.py)."""
        self.reducer.register_comm_hook(state, hook)

    # ------------------------------------------------------------- step side
    def synchronize(self):
        """Waits for every bucket's reduction; afterwards each p.grad holds the
        average over ranks. Buckets with parameters that got no gradient this
        step are sent now (their missing gradients count as zero)."""
        if self.reducer.synchronize():
            self._synchronized = True
            self._reduced()
            return
        if not self._synchronized and self.reducer.comm is not None:
            warn_no_gradient()
        self._synchronized = True  # no backward since the last step: nothing to reduce

    def _reduced(self):
        """After a synchronize() that reduced gradients (subclasses)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize again: for
        synchronize(); clip_grad_norm_(...); step() sequences."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure=None):
        if self._skip_sync:
            if not self._synchronized:
                raise RuntimeError("step() inside skip_synchronize() but synchronize() "
                                   "was not called since the last backward: gradients "
                                   "would not be averaged over ranks")
        else:
            if self._synchronized and self.reducer.submitted == 0:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        if self._adascale is not None:  # the lr times the gain for this step; it
            # commits the step to the noise meter itself, before reading the gain
            return self._adascale.step(self.param_groups, lambda: self._step(closure))
        loss = self._step(closure)
        if self._noise is not None:
            self._noise.commit()  # the step counts (one the loss scaler skips never gets here)
        return loss

    def noise_scale(self, batch_size):
        """The gradient noise scale measured so far (built with noise_scale=True;
        docs/noise_scale.md): a NoiseScale with .b_simple (samples), .grad_sqr
        (|G|^2), .grad_var (tr(Sigma) of one sample's gradient) and .steps, the
        same on every rank; None before the first step() and on one rank.
        batch_size: samples per rank per backward pass. Not collective."""
        b = check_batch(batch_size)
        if self._noise is None:
            if self.reducer.comm is None:  # outside the process set
                return None
            raise RuntimeError("noise_scale() needs the optimizer built with "
                               "hvd.DistributedOptimizer(..., noise_scale=True)")
        return self._noise.result(b * self.reducer.passes_per_step)

    @property
    def noise_meter(self):
        """The noise scale's Meter (noise_scale.py: .smoothed, .seconds spent in
        it), or None without noise_scale=True."""
        return self._noise

    @noise_meter.setter
    def noise_meter(self, meter):
        """Set by hvd.DistributedOptimizer(noise_scale=True) (distributed_optimizer.py)."""
        self._noise = meter

    # ------------------------------------------------------------ AdaScale
    def gain(self):
        """AdaScale's gain (built with adascale=...; docs/adascale.md): the
        factor the latest step's lr was multiplied by, from the noise scale's
        estimates so far, in [1, scale]; 1 before the first step. The same on
        every rank; not collective."""
        if self._adascale is None:
            if self.reducer.comm is None:  # outside the process set
                return 1.0
            raise RuntimeError("gain() needs the optimizer built with "
                               "hvd.DistributedOptimizer(..., adascale=True)")
        return self._adascale.gain()

    @property
    def scale_invariant_steps(self):
        """AdaScale's progress: the sum of the steps' gains, in base-batch steps
        (0.0 before the first step, and without adascale=...)."""
        return self._adascale.progress.steps if self._adascale is not None else 0.0

    @property
    def adascale(self):
        """The AdaScale object (adascale.py: .scale, .progress, state_dict() for
        checkpoints), or None without adascale=..."""
        return self._adascale

    @adascale.setter
    def adascale(self, value):
        """Set by hvd.DistributedOptimizer(adascale=...) (distributed_optimizer.py)."""
        self._adascale = value

    def set_loss_scale(self, scale):
        """fp16 loss scaling: the factor this step's loss was multiplied by.
        Only the noise scale reads it (its squared norms are divided by
        scale**2); unscaling the gradients stays the loss scaler's job."""
        scale = check_loss_scale(scale)
        if self._noise is not None:
            self._noise.loss_scale = scale

    def _step(self, closure):
        return self._opt.step(closure)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the averaged gradients by their global norm, as
        torch.nn.utils.clip_grad_norm_ over the whole model: call it after
        synchronize(), then step() inside skip_synchronize()."""
        return torch.nn.utils.clip_grad_norm_(self.local_parameters(), max_norm, norm_type)

    def local_parameters(self):
        """The tensors whose .grad this rank steps from after synchronize().
        For checks on the averaged gradients (loss-scale overflow, unscaling)."""
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none=True):
        """Resets the gradients; refuses between backward and step. With
        set_to_none (the default, as in torch) each .grad becomes None and the
        next backward's gradient is copied into its bucket by the hook: one
        copy instead of zeroing the buckets and accumulating into them (which
        reads and writes every bucket once more)."""
        if self.reducer.in_step:
            raise RuntimeError(
                "zero_grad() was called after backward() but before step() or "
                "synchronize(): the gradients' all-reduce is in flight (or about to be) "
                "and zeroing them now would lose this step. Call zero_grad() before "
                "backward(), or after step().")
        if self.reducer.comm is None:  # outside the process set: a plain optimizer
            return self._opt.zero_grad(set_to_none=set_to_none)
        self.reducer.zero_grad(set_to_none)

    # ------------------------------------- state_dict etc.: OptimizerWrapper's
    def add_param_group(self, param_group):
        if not hasattr(self, "reducer"):  # torch.optim.Optimizer.__init__ building groups
            return super().add_param_group(param_group)
        raise RuntimeError("add_param_group on a DistributedOptimizer is not supported: "
                           "add the group to the wrapped optimizer first, then wrap it")

    def __repr__(self):
        return "DistributedOptimizer(%r, buckets=%d)" % (self._opt, len(self.reducer.buckets))
