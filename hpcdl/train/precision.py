"""precision.py - mixed precision for the trainer: the forward pass under
torch.autocast (bf16 or fp16), and for fp16 a dynamic loss scaler whose
skip-or-step decision is agreed by every rank.

fp16 has 5 exponent bits: small gradients underflow to zero. The loss is
multiplied by a scale S before backward (so are the gradients), the averaged
gradients are divided by S before the step. If any gradient is inf/NaN on any
rank, every rank skips the step and halves S; after `growth_interval` clean
steps S doubles (the scheme of Micikevicius et al. 2018, as torch's GradScaler).
"""
import contextlib

import torch


def autocast(precision, device):
    """The context the forward pass runs in: nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


class LossScaler:
    """Dynamic loss scale, the same on every rank (the decisions are agreed)."""

    def __init__(self, init_scale=2.0 ** 16, growth_interval=2000, agree=None):
        self.scale = float(init_scale)
        self.growth_interval = int(growth_interval)
        self.clean_steps = 0    # steps since the last overflow or growth
        self.skipped = 0        # steps skipped over the whole run
        self._agree = agree     # any_rank(flag) -> bool: True if any rank's flag is set

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale_and_check(self, params):
        """Divides the (already averaged) gradients by the scale; True when
        every gradient on every rank is finite, so the step may be taken."""
        grads = [p.grad for p in params if p.grad is not None]
        overflow = any(not torch.isfinite(g).all() for g in grads)
        if self._agree is not None:
            overflow = self._agree(overflow)
        if overflow:
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped += 1
            return False
        inv = 1.0 / self.scale
        for g in grads:
            g.mul_(inv)
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0
        return True

    def state_dict(self):
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state):
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped = int(state["skipped"])
