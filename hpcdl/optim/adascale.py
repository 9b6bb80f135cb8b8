"""adascale.py - AdaScale SGD (Johnson, Agarwal, Sherwood and Tandon, ICML 2020):
the learning-rate gain for a batch S times the base batch, and training
progress counted in scale-invariant iterations. No MPI here;
hpcdl/torch/adascale.py applies it in DistributedOptimizer(adascale=...) from
the gradient noise scale's statistics (noise_scale.py). docs/adascale.md.

With G the true gradient and Sigma the covariance of one sample's gradient,
a gradient averaged over a batch of B0 samples (the base batch, where the
lr schedule was tuned) has variance var = tr(Sigma) / B0 and squared mean
sqr = |G|^2. At S times that batch the variance is var / S, and the step that
makes the same expected progress as S base steps (to first order) is r times
the base step with

    r = (var + sqr) / (var / S + sqr)          = (1 + B_simple/B0) / (1 + B_simple/(S B0))

where B_simple = tr(Sigma)/|G|^2. r is 1 at S = 1 and lies in [1, S]: near S
when the gradient is mostly noise (var >> sqr, a larger batch is worth S base
steps), near 1 when it is mostly signal (var << sqr, it is worth one). The
lr of every step is the schedule's lr times r, and one step advances training
by r scale-invariant iterations (base steps): progress += r. The schedule
written for the base batch is read at the progress, and training ends when
the progress reaches the base schedule's steps.

Edge cases, all giving r in [1, S]: S = 1 -> exactly 1; no estimate yet -> 1
(the step is taken at the schedule's lr, as the base batch would; the caller
passes var = sqr = None); the smoothed estimates can be negative early on
(one step's estimates are unbiased but noisy): var < 0 counts as 0 (r = 1),
sqr <= 0 with var > 0 as all noise (r = S).
"""
import math
import numbers

from ._checks import check_number


def check_scale(scale):
    """scale as a float >= 1 (the batch over the base batch), or a ValueError."""
    ok = isinstance(scale, numbers.Real) and not isinstance(scale, bool) and math.isfinite(scale)
    if not ok or scale < 1:
        raise ValueError("AdaScale's scale is the global batch over the base batch (the batch "
                         "the lr schedule was tuned for), a number >= 1; got %r" % (scale,))
    return float(scale)


# ---------------------------------------------------------------- the gain
def gain(var, sqr, scale):
    """The AdaScale gain r = (var + sqr) / (var / scale + sqr), in [1, scale].
    var: the variance of a base-batch gradient (tr(Sigma) / B0), sqr: |G|^2,
    both smoothed estimates; None for either (no estimate yet) gives 1."""
    scale = check_scale(scale)
    if scale == 1.0 or var is None or sqr is None:
        return 1.0
    var, sqr = max(float(var), 0.0), max(float(sqr), 0.0)
    if not (math.isfinite(var) and math.isfinite(sqr)) or var + sqr == 0.0:
        return 1.0
    r = (var + sqr) / (var / scale + sqr)
    return min(max(r, 1.0), scale)


def gain_from_noise(grad_var, grad_sqr, scale, batch):
    """The gain from the gradient noise scale's estimates (noise_scale.py's
    NoiseScale: grad_var = tr(Sigma) of one sample, grad_sqr = |G|^2) for a
    global batch `batch` that is `scale` times the base batch."""
    check_number("batch", batch, strict=True)
    if grad_var is None or grad_sqr is None:
        return gain(None, None, scale)
    base = batch / check_scale(scale)
    return gain(grad_var / base, grad_sqr, scale)


# ---------------------------------------------------------------- progress
class Progress:
    """Scale-invariant iterations: each step adds its gain (base steps it is
    worth). Plain floats; state_dict() for checkpoints."""

    def __init__(self, scale):
        self.scale = check_scale(scale)
        self.steps = 0.0      # scale-invariant iterations so far (sum of the gains)
        self.iterations = 0   # real steps taken
        self.last_gain = 1.0  # the gain of the latest step (1 before the first)

    def advance(self, r):
        """One step taken with gain r."""
        check_number("gain", r, low=1.0)
        self.steps += r
        self.iterations += 1
        self.last_gain = float(r)

    def mean_gain(self):
        """Scale-invariant iterations per real step so far (1 before the first)."""
        return self.steps / self.iterations if self.iterations else 1.0

    def state_dict(self):
        return dict(scale=self.scale, steps=self.steps, iterations=self.iterations,
                    last_gain=self.last_gain)

    def load_state_dict(self, state):
        """The saved progress; the scale stays this object's (the run's)."""
        self.steps, self.iterations = float(state["steps"]), int(state["iterations"])
        self.last_gain = float(state["last_gain"])


# ---------------------------------------------------------------- the schedule
class ScaleInvariantScheduler:
    """A torch LR scheduler written for the base batch (stepped once per base
    step), advanced by scale-invariant progress instead of real steps: each
    step() steps it until its step count equals floor(progress()). Since every
    gain is >= 1 it moves at least one base step per real step; a base
    schedule of T steps is spent when progress() reaches T.

        sched = ScaleInvariantScheduler(warmup_schedule(opt, base_steps_per_epoch,
                                                        epochs=90, decay="cosine"),
                                        lambda: opt.scale_invariant_steps)
        ... opt.step(); sched.step()

    state_dict() is the wrapped scheduler's (the progress is the optimizer's)."""

    def __init__(self, scheduler, progress):
        if not callable(progress):
            raise TypeError("ScaleInvariantScheduler(scheduler, progress): progress is a "
                            "function returning the scale-invariant steps so far, e.g. "
                            "lambda: opt.scale_invariant_steps")
        self.scheduler, self.progress = scheduler, progress

    @property
    def optimizer(self):
        return self.scheduler.optimizer

    @property
    def last_epoch(self):
        """The base steps the wrapped scheduler has taken."""
        return self.scheduler.last_epoch

    def step(self):
        target = math.floor(self.progress())
        while self.scheduler.last_epoch < target:
            self.scheduler.step()

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state):
        self.scheduler.load_state_dict(state)
