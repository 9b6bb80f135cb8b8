"""rules.py - the update a server applies to its shard: SGD with momentum m
and weight decay wd, in torch.optim.SGD's arithmetic (dampening 0, no
Nesterov). One step on the mean gradient g_t of the W workers:

    b_{t+1} = m * b_t + (g_t + wd * p_t)        (b_1 = g_0 + wd * p_0)
    p_{t+1} = p_t - lr * b_{t+1}

BSP calls step() with g_t, the mean of the W pushes of step t: the same
operations as torch.optim.SGD, so a BSP run follows synchronous all-reduce SGD.

ASP and SSP apply each push when it arrives, as a 1/W share of a step. Split
the step into a part that needs no gradient and W parts that each need one
push g_i (g_t = sum_i g_i / W):

    at the first push of every W:  b <- m * b + wd * p;  p <- p - lr * b
    at every push:                  b <- b + g_i / W;     p <- p - lr * g_i / W

After W pushes b and p are exactly b_{t+1} and p_{t+1} above (in exact
arithmetic; floats round in a different order), so momentum and weight decay
act once per W pushes, as in synchronous training, however the pushes of
different workers interleave. With s = 0 the SSP pushes of step t are the W
pushes between two steps' pulls, so SSP(0) reaches BSP's parameters.
"""
import torch


class ShardSGD:
    """Updates shard (a float32 numpy array, in place) by the rule above."""

    def __init__(self, shard, num_workers, momentum=0.0, weight_decay=0.0):
        self.param = torch.from_numpy(shard)  # shares the shard's memory
        self.num_workers = num_workers
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.buf = torch.zeros_like(self.param)  # momentum buffer b
        self.updates = 0  # steps (BSP) or pushes (ASP / SSP) applied

    def step(self, grad, lr):
        """One whole step on the mean gradient grad (numpy, shard-sized)."""
        g, m, wd = torch.from_numpy(grad), self.momentum, self.weight_decay
        if wd != 0:
            g = g.add(self.param, alpha=wd)
        if m != 0:
            if self.updates == 0:
                self.buf.copy_(g)  # torch's first step: b_1 = g_0 (+ wd p_0)
            else:
                self.buf.mul_(m).add_(g)
            g = self.buf
        self.param.add_(g, alpha=-lr)
        self.updates += 1

    def push(self, grad, lr):
        """One worker's gradient grad as a 1/W share of a step."""
        g, m, wd = torch.from_numpy(grad), self.momentum, self.weight_decay
        share = 1.0 / self.num_workers
        if self.updates % self.num_workers == 0:  # a new step starts with this push
            if m != 0:
                self.buf.mul_(m)
                if wd != 0:
                    self.buf.add_(self.param, alpha=wd)
                self.param.add_(self.buf, alpha=-lr)
            elif wd != 0:
                self.param.mul_(1.0 - lr * wd)
        if m != 0:
            self.buf.add_(g, alpha=share)
        self.param.add_(g, alpha=-lr * share)
        self.updates += 1
