"""distributed_optimizer.py - hvd.DistributedOptimizer, a function as in
Horovod: it picks the optimizer class for the arguments (op=Adasum, the ZeRO
stage) and returns it built. The classes: optimizer.py's
DataParallelOptimizer, zero/optimizer.py's ZeroOptimizer,
adasum_optimizer.py's DistributedAdasumOptimizer."""
import warnings

from . import adascale as _adascale, noise_scale as _noise
from ._basics import Adasum, comm_op
from .adasum_optimizer import DistributedAdasumOptimizer
from .optimizer import DataParallelOptimizer
from .zero import check_stage
from .zero.optimizer import ZeroOptimizer


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,  # noqa: N802
                         backward_passes_per_step=1, op="average", gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         zero_stage=0, noise_scale=False, adascale=False):
    """Wraps optimizer so that step() applies gradients averaged over the
    ranks of process_set (all by default; on a rank outside it, its own).
    Horovod's arguments; zero_stage=1|2 shards the optimizer state (and at 2
    the gradients) over the ranks (docs/zero.md). Sparse gradients
    (nn.Embedding(sparse=True)) travel dense in the buckets and are handed
    back to the wrapped optimizer sparse, whether or not sparse_as_dense is
    set (the same numbers as Horovod's all-gather of indices and values).
    The returned optimizer's `reducer` takes a comm hook and statistics hooks
    (reducer.py). noise_scale=True (or the smoothing beta, in (0, 1)) measures
    the gradient noise scale every step: opt.noise_scale(batch_size=b)
    (noise_scale.py, docs/noise_scale.md). adascale=True (or the scale S: the
    global batch over the base batch; True: ranks x backward_passes_per_step)
    multiplies each step's lr by the AdaScale gain and counts the progress in
    opt.scale_invariant_steps; it measures the noise scale (adascale.py,
    docs/adascale.md)."""
    beta = _noise.check_option(noise_scale)
    ada_on, ada_scale = _adascale.check_option(adascale)
    if ada_on and beta is None:
        beta = _noise.check_option(True)
    if num_groups and groups is None:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning)
        groups = int(num_groups)
    options = dict(compression=compression, backward_passes_per_step=backward_passes_per_step,
                   op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                   sparse_as_dense=sparse_as_dense)
    if beta is not None:
        try:
            _noise.check_compatible("adasum" if op == Adasum else comm_op(op), compression)
        except ValueError as e:  # adascale measures the noise scale: say which was asked for
            raise ValueError("adascale: %s" % e if ada_on else str(e)) from None
    if op == Adasum:  # Horovod's delta optimizer
        return DistributedAdasumOptimizer(optimizer, named_parameters, compression, process_set)
    stage = check_stage(zero_stage)
    if stage:
        opt = ZeroOptimizer(optimizer, named_parameters, stage, process_set, **options)
    else:
        opt = DataParallelOptimizer(optimizer, named_parameters, process_set, **options)
    if beta is not None and opt.reducer.comm is not None:  # on the Reducer's stats seam
        opt.noise_meter = _noise.attach(opt.reducer, beta, blocks=stage == 2)
        if ada_on:
            opt.adascale = _adascale.attach(opt, ada_scale)
    return opt
