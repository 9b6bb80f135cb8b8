"""hpcdl.optim - large-batch optimisation: LARS, LARC and LAMB layer-wise
learning rates, the linear / square-root learning-rate scaling rules, and warmup +
decay schedules stepped per optimizer step, and the gradient noise scale's
estimator (noise_scale.py; docs/noise_scale.md). docs/optim.md has the formulas.

    from hpcdl import optim
    lr = optim.scale_lr(0.1, global_batch=8192)                  # 3.2
    opt = optim.LARS(optim.exclude_bias_and_norm(model), lr=lr, weight_decay=5e-5)
    sched = optim.warmup_schedule(opt, steps_per_epoch, epochs=90, warmup_epochs=5,
                                  decay="poly")
    ... opt.step(); sched.step()                                 # every step
"""
from .groups import exclude_bias_and_norm
from .lamb import LAMB
from .larc import LARC
from .noise_scale import NoiseScale, offline_noise_scale
from .lars import LARS
from .scaling import scale_lr
from .schedules import WarmupSchedule, lr_at, warmup_schedule

__all__ = ["LARS", "LARC", "LAMB", "exclude_bias_and_norm", "scale_lr", "warmup_schedule",
           "WarmupSchedule", "lr_at", "NoiseScale", "offline_noise_scale"]
