"""adascale.py - AdaScale in DistributedOptimizer(..., adascale=True | S): every
step's learning rate multiplied by the AdaScale gain, and the progress in
scale-invariant iterations (the gain and its formulas: hpcdl/optim/adascale.py;
docs/adascale.md).

The gain is computed from the gradient noise scale's smoothed estimates
(noise_scale.py's Meter, on the Reducer's statistics seam, so it works at
ZeRO stages 0-2 and with backward_passes_per_step). In the Meter's units the
small batch is one rank's step (b samples x k passes) and the big one the N
ranks' average: the base batch is the big one over S, so a base-batch
gradient's variance is the small one's times S / N.

When things happen, in step() after synchronize(): the step is committed to
the Meter and its statistics round (the 16-byte all-reduce queued behind the
buckets, already on its way) is waited for, so the gain includes this step's
gradient, as in the paper; then each group's lr is multiplied by the gain for
the wrapped optimizer's step and put back (the schedule's value stays in
param_groups), and the progress advances by the gain. A step the fp16 loss
scaler skips never calls step(): no gain, no progress. Every rank computes
the same gain from the same all-reduced numbers.
"""
from ..optim.adascale import Progress, check_scale, gain_from_noise


def check_option(adascale):
    """DistributedOptimizer's adascale argument -> (on, scale or None). True:
    the scale is ranks x backward passes (the base batch is one rank's pass,
    fairscale's default); a number >= 1 is the scale (global batch over the
    base batch)."""
    if adascale is None or adascale is False:
        return False, None
    if adascale is True:
        return True, None
    try:
        return True, check_scale(adascale)
    except ValueError:
        raise ValueError("adascale must be True (scale = ranks x backward_passes_per_step), "
                         "False, or the scale: the global batch over the base batch the lr "
                         "was tuned for, a number >= 1; got %r" % (adascale,)) from None


def attach(opt, scale):
    """An AdaScale on opt (a DataParallelOptimizer whose noise_meter is set);
    scale None: ranks x passes. ValueError on one rank with scale > 1 (no
    second batch size, so no estimate to take the gain from)."""
    ranks = opt.reducer.comm.size
    if scale is None:
        scale = float(ranks * opt.reducer.passes_per_step)
    if ranks < 2 and scale > 1:
        raise ValueError("adascale with scale %g needs 2 or more ranks: the gain comes from "
                         "comparing each rank's gradient with their average" % scale)
    return AdaScale(opt.noise_meter, scale, ranks)


class AdaScale:
    """The gain and the progress of one optimizer."""

    def __init__(self, meter, scale, ranks):
        self.meter, self.ranks = meter, ranks
        self.progress = Progress(scale)

    @property
    def scale(self):
        return self.progress.scale

    def gain(self):
        """The gain from the estimates so far (the one the latest step used);
        1 before the first estimate."""
        if self.meter is None or self.ranks < 2:
            return 1.0
        ns = self.meter.result(1)  # small batch = 1 unit: grad_var is its variance
        if ns is None:
            return 1.0
        return gain_from_noise(ns.grad_var, ns.grad_sqr, self.scale, batch=self.ranks)

    def step(self, param_groups, take_step):
        """take_step() with every group's lr multiplied by the gain; returns its result."""
        if self.meter is not None:
            self.meter.commit()  # this step counts: its round is settled by gain()
        r = self.gain()
        saved = [g["lr"] for g in param_groups]
        try:
            for g in param_groups:
                g["lr"] = g["lr"] * r
            out = take_step()
        finally:
            for g, lr in zip(param_groups, saved):
                g["lr"] = lr
        self.progress.advance(r)
        return out

    def state_dict(self):
        """The progress and the noise scale's smoothed estimates: with them a
        resumed run takes the gains an uninterrupted one would."""
        return dict(progress=self.progress.state_dict(),
                    noise=self.meter.smoothed.state_dict() if self.meter is not None else None)

    def load_state_dict(self, state):
        self.progress.load_state_dict(state["progress"])
        if self.meter is not None and state.get("noise") is not None:
            self.meter.settle()
            self.meter.smoothed.load_state_dict(state["noise"])
