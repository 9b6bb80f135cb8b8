"""schedules.py - learning-rate schedules for large batches, stepped once per
optimizer step: gradual linear warmup (Goyal et al. 2017) followed by
constant, step (x gamma at milestone epochs), polynomial (You et al. 2017:
power 2, down to 0 at the end of training) or cosine decay.

With W = warmup steps, T = total steps, s = the 0-based step, target = the
group's lr when the scheduler was made, start = warmup_start:

    s < W :  lr = start + (target - start) * (s + 1) / W   (reaches target at
                                                             the last warmup step)
    s >= W:  p = (s - W) / (T - W), capped at 1
             constant  lr = target
             step      lr = target * gamma ** (milestones passed: s >= m * steps_per_epoch)
             poly      lr = target * (1 - p) ** power       (0 at s = T)
             cosine    lr = target * (1 + cos(pi * p)) / 2  (0 at s = T)
"""
import math
import numbers

from torch.optim.lr_scheduler import LRScheduler

from ._checks import check_count, check_number

DECAYS = ("constant", "step", "poly", "cosine")


def make_plan(steps_per_epoch, epochs, warmup_epochs=0, decay="constant", milestones=(),
              gamma=0.1, power=2.0):
    """Checks the arguments; returns the schedule in steps as a plain dict
    (it travels in the scheduler's state_dict)."""
    check_count("steps_per_epoch", steps_per_epoch, "optimizer steps per epoch")
    check_number("epochs", epochs, strict=True)
    check_number("warmup_epochs", warmup_epochs, high=epochs)
    if decay not in DECAYS:
        raise ValueError("unknown decay %r; choose one of %s" % (decay, ", ".join(DECAYS)))
    milestones = list(milestones)
    if decay == "step":
        if not milestones:
            raise ValueError("decay='step' needs milestones (epochs where lr is multiplied "
                             "by gamma), e.g. milestones=(30, 60, 80)")
        for m in milestones:
            check_number("each milestone", m, low=warmup_epochs, high=epochs)
        if any(b <= a for a, b in zip(milestones, milestones[1:])):
            raise ValueError("milestones must be increasing, got %r" % (milestones,))
        check_number("gamma", gamma, strict=True, high=1.0)
    elif milestones:
        raise ValueError("milestones apply only to decay='step' (decay is %r)" % decay)
    if decay == "poly":
        check_number("power", power, strict=True)
    total = round(epochs * steps_per_epoch)
    return dict(warmup_steps=round(warmup_epochs * steps_per_epoch), total_steps=total,
                decay=decay, milestone_steps=[round(m * steps_per_epoch) for m in milestones],
                gamma=gamma, power=power)


def factor_at(step, plan, start_factor=0.0):
    """lr / target at 0-based step; start_factor = warmup_start / target."""
    W, T = plan["warmup_steps"], plan["total_steps"]
    if step < W:
        return start_factor + (1.0 - start_factor) * (step + 1) / W
    decay = plan["decay"]
    if decay == "constant":
        return 1.0
    if decay == "step":
        return plan["gamma"] ** sum(step >= m for m in plan["milestone_steps"])
    p = min(1.0, (step - W) / (T - W)) if T > W else 1.0
    if decay == "poly":
        return (1.0 - p) ** plan["power"]
    return 0.5 * (1.0 + math.cos(math.pi * p))


def lr_at(step, lr, steps_per_epoch, epochs, warmup_epochs=0, warmup_start=None,
          decay="constant", milestones=(), gamma=0.1, power=2.0):
    """The learning rate at 0-based optimizer step `step` for target lr `lr`
    (formulas in the module docstring); for plots and checks."""
    if not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError("step must be an integer >= 0, got %r" % (step,))
    check_number("lr", lr)
    plan = make_plan(steps_per_epoch, epochs, warmup_epochs, decay, milestones, gamma, power)
    return lr * factor_at(step, plan, _start_factor(warmup_start, warmup_epochs, [lr]))


def _start_factor(warmup_start, warmup_epochs, lrs):
    """warmup_start as a fraction of the largest group lr (None: 0)."""
    if warmup_start is None:
        return 0.0
    if not warmup_epochs:
        raise ValueError("warmup_start=%r was given but warmup_epochs is 0: set "
                         "warmup_epochs, or drop warmup_start" % (warmup_start,))
    top = max(lrs)
    check_number("warmup_start", warmup_start)
    if warmup_start > top:
        raise ValueError("warmup_start=%g is above the lr it warms up to (%g): warmup rises "
                         "from warmup_start to the optimizer's lr; give a smaller start or "
                         "no warmup" % (warmup_start, top))
    return warmup_start / top if top > 0 else 0.0


class WarmupSchedule(LRScheduler):
    """Warmup then decay, as a torch LR scheduler: call step() once after
    every optimizer.step() (not once per epoch).

    warmup_start is the lr the warmup starts from (default 0): Goyal et al.
    start at the lr tuned for the small batch, i.e. scale_lr's base_lr, and
    reach the scaled lr after 5 epochs. With param groups of different lrs,
    each group starts at the same fraction warmup_start / (largest lr) of its
    own lr. state_dict() holds the step and the plan; load_state_dict() also
    puts the restored step's lr into the optimizer, so a resumed run follows
    the same schedule whichever of optimizer or scheduler is loaded first.
    """

    def __init__(self, optimizer, steps_per_epoch, epochs, warmup_epochs=0, warmup_start=None,
                 decay="constant", milestones=(), gamma=0.1, power=2.0, last_epoch=-1):
        self.plan = make_plan(steps_per_epoch, epochs, warmup_epochs, decay, milestones,
                              gamma, power)
        lrs = [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups]
        self.start_factor = _start_factor(warmup_start, warmup_epochs, lrs)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        f = factor_at(self.last_epoch, self.plan, self.start_factor)
        return [base * f for base in self.base_lrs]

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]


def warmup_schedule(optimizer, steps_per_epoch, epochs, warmup_epochs=0, warmup_start=None,
                    decay="constant", milestones=(), gamma=0.1, power=2.0):
    """WarmupSchedule(optimizer, ...): linear warmup over warmup_epochs, then
    decay ("constant", "step" at milestones x gamma, "poly" with power,
    "cosine"), stepped once per optimizer step. Example (Goyal et al.):

        opt = LARS(exclude_bias_and_norm(model), lr=scale_lr(0.1, 8192), ...)
        sched = warmup_schedule(opt, steps_per_epoch, 90, warmup_epochs=5,
                                warmup_start=0.1, decay="step", milestones=(30, 60, 80))
    """
    return WarmupSchedule(optimizer, steps_per_epoch, epochs, warmup_epochs, warmup_start,
                          decay, milestones, gamma, power)
