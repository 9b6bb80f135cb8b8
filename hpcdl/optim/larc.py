"""larc.py - LARC: layer-wise adaptive rate control around any optimizer, as
NVIDIA apex's LARC does it. Before the wrapped optimizer steps, each
parameter's gradient is rescaled by its LARS local learning rate:

    local_lr = trust_coefficient * ||w|| / (||g|| + wd * ||w|| + eps)
    g <- (g + wd * w) * factor,   factor = min(local_lr / lr, 1)   (clip=True)
                                  factor = local_lr                (clip=False)

The group's weight decay is folded into the gradient (so it is rescaled too)
and the group's weight_decay is set to 0 while the wrapped optimizer steps,
then restored. Clip mode keeps each tensor's effective rate at
min(lr, local_lr); scale mode multiplies lr by local_lr, as LARS does.
"""
import torch

from ._checks import check_number
from .lars import layer_ratio
from .wrapper import OptimizerWrapper


class LARC(OptimizerWrapper):
    """Wraps optimizer (SGD, Adam, ...) with layer-wise adaptive rate control.

    An OptimizerWrapper: LR schedulers and checkpoints see the wrapped
    optimizer's param_groups and state. Gradients are rescaled in place (as
    in apex). Groups with lars_adaptation=False (see exclude_bias_and_norm) are
    left alone: the wrapped optimizer applies their weight decay itself.
    Differences from apex: a tensor whose ||w|| or ||g|| is 0 gets factor 1
    with its weight decay still applied (apex drops the decay for it).

    With data parallelism the gradients must be averaged first, so wrap LARC
    in the distributed optimizer, not the reverse:
        opt = hpcdl.torch.DistributedOptimizer(LARC(torch.optim.SGD(...)), ...)
    """
    layer_norms = None  # as LARS's: whole-layer norms of ZeRO's pieces

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        if hasattr(optimizer, "synchronize"):
            raise TypeError("LARC(DistributedOptimizer(...)) would rescale gradients "
                            "before they are averaged over ranks; wrap the other way: "
                            "DistributedOptimizer(LARC(optimizer), ...)")
        check_number("trust_coefficient", trust_coefficient, strict=True)
        check_number("eps", eps)
        super().__init__(optimizer)
        self.trust_coefficient, self.clip, self.eps = trust_coefficient, bool(clip), eps

    @torch.no_grad()
    def _rescale(self, group):
        """Folds the group's weight decay into each gradient and scales it."""
        wd = group.get("weight_decay", 0.0)
        lr = group["lr"]
        for p in group["params"]:
            if p.grad is None:
                continue
            norms = self.layer_norms(p) if self.layer_norms else None
            ratio, valid = layer_ratio(p, p.grad, wd, self.trust_coefficient, self.eps, norms)
            if self.clip:  # effective lr = lr * factor = min(lr, local_lr)
                factor = (ratio / lr).clamp(max=1.0) if lr > 0 else torch.ones_like(ratio)
            else:
                factor = ratio
            factor = torch.where(valid, factor, torch.ones_like(factor))
            if wd != 0:
                p.grad.add_(p, alpha=wd)
            p.grad.mul_(factor)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        saved = []
        try:
            for group in self.param_groups:
                if group.get("lars_adaptation", True):
                    saved.append((group, group.get("weight_decay", 0.0)))
                    self._rescale(group)
                    if "weight_decay" in group:
                        group["weight_decay"] = 0.0
            self._opt.step()
        finally:
            for group, wd in saved:
                if "weight_decay" in group:
                    group["weight_decay"] = wd
        return loss

    def zero_grad(self, set_to_none=True):
        self._opt.zero_grad(set_to_none)

    def __repr__(self):
        return "LARC(%r, trust_coefficient=%g, clip=%s)" % (self._opt, self.trust_coefficient,
                                                            self.clip)
