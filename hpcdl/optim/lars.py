"""lars.py - LARS, layer-wise adaptive rate scaling (You, Gitman, Ginsburg
2017, "Large Batch Training of Convolutional Networks"): SGD with momentum
where each parameter tensor w gets its own local learning rate from the ratio
of its norm to its gradient's norm, so that no layer's update is large
relative to its weights when the global learning rate is scaled up.

For each tensor w with gradient g, in a group with weight decay wd:

    local_lr = trust_coefficient * ||w|| / (||g|| + wd * ||w|| + eps)
               (1 when ||w|| or ||g|| is 0, or when the group has
                lars_adaptation=False)
    v <- momentum * v + lr * local_lr * (g + wd * w)          (v starts at 0)
    w <- w - v                                                (nesterov=False)
    w <- w - (momentum * v + lr * local_lr * (g + wd * w))    (nesterov=True,
                                                               with the new v)
"""
import torch

from ._checks import check_number


def layer_ratio(w, g, weight_decay, trust_coefficient, eps, norms=None):
    """(ratio, valid) for one tensor as 0-d tensors on w's device (no host
    sync): ratio = trust * ||w|| / (||g|| + wd * ||w|| + eps); valid is False
    when ||w|| or ||g|| is 0, where callers use 1 instead (a freshly zeroed
    layer or a gradient-free step must still move by plain SGD). norms:
    (||w||, ||g||) of the whole layer when w is only a piece of it (ZeRO)."""
    if norms is None:
        norms = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
    w_norm, g_norm = norms
    ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    return ratio, (w_norm > 0) & (g_norm > 0)


def trust_ratio(w, g, weight_decay, trust_coefficient, eps, norms=None):
    """LARS's local_lr of one tensor: the ratio, or 1 where it is not valid."""
    ratio, valid = layer_ratio(w, g, weight_decay, trust_coefficient, eps, norms)
    return torch.where(valid, ratio, torch.ones_like(ratio))


def step_each(optimizer, closure):
    """optimizer.step() of a per-tensor rule: the closure's loss (with grad
    enabled), then optimizer.update_one(p, group) for every p with a gradient."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                optimizer.update_one(p, group)
    return loss


class LARS(torch.optim.Optimizer):
    """SGD with momentum and LARS layer-wise learning rates (formulas above).

    Group keys besides the defaults' lr, momentum, weight_decay,
    trust_coefficient, eps and nesterov: lars_adaptation (default True);
    False gives that group plain SGD-with-momentum updates (local_lr = 1).
    hpcdl.optim.exclude_bias_and_norm(model) builds such groups for biases
    and normalisation layers. Momentum buffers live in state[p]
    ["momentum_buffer"], so state_dict() / load_state_dict() resume exactly,
    and torch LR schedulers drive group["lr"] as for torch.optim.SGD.
    """
    # p -> (||w||, ||g||) of p's whole layer, set by hpcdl.torch.zero while a
    # step runs on pieces of layers split across ranks; None: p is the layer
    layer_norms = None

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001,
                 eps=1e-8, nesterov=False):
        check_number("lr", lr)
        check_number("momentum", momentum)
        check_number("weight_decay", weight_decay)
        check_number("trust_coefficient", trust_coefficient, strict=True)
        check_number("eps", eps)
        if nesterov and momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0 (got momentum=0)")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov,
                        lars_adaptation=True)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:  # groups saved before a key existed
            group.setdefault("lars_adaptation", True)
            group.setdefault("nesterov", False)

    @torch.no_grad()
    def step(self, closure=None):
        return step_each(self, closure)

    def update_one(self, p, group):
        g, wd, momentum = p.grad, group["weight_decay"], group["momentum"]
        if g.is_sparse:
            raise RuntimeError("LARS does not support sparse gradients")
        if group["lars_adaptation"]:
            norms = self.layer_norms(p) if self.layer_norms else None
            scale = group["lr"] * trust_ratio(p, g, wd, group["trust_coefficient"],
                                              group["eps"], norms)
        else:
            scale = torch.as_tensor(group["lr"], dtype=p.dtype, device=p.device)
        update = g.add(p, alpha=wd) if wd != 0 else g.clone()
        update.mul_(scale)                      # lr * local_lr * (g + wd * w)
        if momentum == 0:
            p.sub_(update)
            return
        state = self.state[p]
        v = state.get("momentum_buffer")
        if v is None:
            v = state["momentum_buffer"] = torch.zeros_like(p)
        v.mul_(momentum).add_(update)
        if group["nesterov"]:
            p.sub_(update.add_(v, alpha=momentum))
        else:
            p.sub_(v)
