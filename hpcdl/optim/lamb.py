"""lamb.py - LAMB (You et al. 2019, "Large Batch Optimization for Deep
Learning: Training BERT in 76 minutes", Algorithm 2): Adam's moments with
bias correction, decoupled weight decay added to the update, and a
layer-wise trust ratio that makes each tensor move by lr times its own norm.

For each tensor w with gradient g, at step t = 1, 2, ... of that tensor, in
a group with betas (b1, b2), eps and weight decay wd:

    m <- b1 * m + (1 - b1) * g               v <- b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** t)                v_hat = v / (1 - b2 ** t)
    u = m_hat / (sqrt(v_hat) + eps) + wd * w
    ratio = ||w|| / ||u||      (1 when ||w|| or ||u|| is 0, or when the group
                                has lars_adaptation=False)
    w <- w - lr * ratio * u

As in the TensorFlow and NVIDIA implementations, the ratio is not clipped
(the paper's phi is the identity) and a zero norm gives ratio 1, so a
freshly zeroed layer still moves by plain Adam(W). exclude_bias_and_norm()
makes the groups LAMB is used with: biases and norm parameters neither
decayed nor adapted.
"""
import torch

from ._checks import check_number
from .lars import step_each


class LAMB(torch.optim.Optimizer):
    """LAMB (formulas above). Group keys besides the defaults' lr, betas, eps
    and weight_decay: lars_adaptation (default True); False gives that group
    AdamW updates (ratio 1). State per tensor: step (int), exp_avg, exp_avg_sq,
    so state_dict() / load_state_dict() resume exactly.

    The ratio needs the norm of a whole layer's update, which depends on the
    optimizer state: it cannot step on ZeRO's pieces of layers (it refuses).
    """
    # set by hpcdl.torch.zero while a step runs on pieces of layers; LAMB
    # declares it only to be told, and refuses (see step())
    layer_norms = None

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        check_number("lr", lr)
        check_number("eps", eps)
        check_number("weight_decay", weight_decay)
        if len(betas) != 2:
            raise ValueError("betas must be a pair (beta1, beta2), got %r" % (betas,))
        for name, b in zip(("betas[0]", "betas[1]"), betas):
            check_number(name, b, high=1.0)
            if b == 1.0:
                raise ValueError("%s must be below 1 (bias correction divides by "
                                 "1 - beta ** t), got 1" % name)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        lars_adaptation=True)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("lars_adaptation", True)

    @torch.no_grad()
    def step(self, closure=None):
        if self.layer_norms is not None:
            raise RuntimeError("LAMB cannot step on ZeRO shards: its trust ratio needs the "
                               "norm of each whole layer's Adam update; use zero_stage=0 "
                               "(or --zero 0)")
        return step_each(self, closure)

    def update_one(self, p, group):
        g = p.grad
        if g.is_sparse:
            raise RuntimeError("LAMB does not support sparse gradients")
        b1, b2 = group["betas"]
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] = t = int(state["step"]) + 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2 ** t)).sqrt_().add_(group["eps"])
        update = (m / (1 - b1 ** t)).div_(denom)
        if group["weight_decay"] != 0:
            update.add_(p, alpha=group["weight_decay"])
        scale = torch.as_tensor(group["lr"], dtype=p.dtype, device=p.device)
        if group["lars_adaptation"]:
            scale = scale * update_ratio(p, update)
        p.sub_(update.mul_(scale))


def update_ratio(w, u):
    """||w|| / ||u|| as a 0-d tensor on w's device (no host sync); 1 where
    either norm is 0."""
    w_norm, u_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(u)
    valid = (w_norm > 0) & (u_norm > 0)
    return torch.where(valid, w_norm / torch.where(valid, u_norm, torch.ones_like(u_norm)),
                       torch.ones_like(w_norm))
