"""noise_scale.py - the gradient noise scale B_simple = tr(Sigma) / |G|^2
(McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
section 2.2 and appendix A.1): the estimator, its smoothing over steps, and an
offline estimate at fixed weights. No MPI here; hpcdl/torch/noise_scale.py
feeds it from DistributedOptimizer's buckets during training.

G is the true gradient (the mean over the data of the per-sample gradients),
Sigma their covariance: tr(Sigma) is the variance of ONE sample's gradient. A
batch gradient G_B (the mean over B samples drawn at random) has

    E |G_B|^2 = |G|^2 + tr(Sigma) / B

so the squared norms of two batch gradients of sizes B_small < B_big give
unbiased estimates of both (appendix A.1):

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

In data parallelism each of N ranks holds a small-batch gradient (B_small = b
samples x backward passes) and the all-reduce makes the big one (B_big = N
B_small); averaging |G_small|^2 over the ranks lowers the variance without
changing the expectation. With B_big = N B_small the estimates become

    |G|^2     ~ (N |G_big|^2 - mean |G_small|^2) / (N - 1)
    tr(Sigma) ~ B_small N (mean |G_small|^2 - |G_big|^2) / (N - 1)

One step's estimates are noisy (either may be negative), so each is smoothed
separately by an exponential moving average over steps and the ratio is taken
of the averages, as the paper does (and gpt-neox, adaptdl, fairscale's
AdaScale). The averages are bias-corrected as Adam's moments are (divided by
1 - beta^steps), so the first step's value is the raw estimate rather than a
value pulled towards zero. Sampling without replacement from n samples (an
epoch's shuffle) shrinks tr(Sigma)/B by (n - B)/(n - 1): negligible for
n >> B.
"""
import math
from dataclasses import dataclass

import torch

DEFAULT_BETA = 0.99  # EMA decay per step: a memory of ~100 steps (gpt-neox's default)


# ---------------------------------------------------------------- one step's estimates
def estimates(small_sqr, big_sqr, b_small, b_big):
    """(|G|^2, tr(Sigma)) from one pair of squared norms: small_sqr = |G_small|^2
    (or its mean over several small batches of b_small samples each), big_sqr
    = |G_big|^2 of a batch of b_big samples. Unbiased; either may be negative."""
    if not b_big > b_small > 0:
        raise ValueError("the noise scale needs 0 < B_small < B_big (got B_small %r, "
                         "B_big %r): with one rank there is no second batch size"
                         % (b_small, b_big))
    grad_sqr = (b_big * big_sqr - b_small * small_sqr) / (b_big - b_small)
    grad_var = (small_sqr - big_sqr) / (1.0 / b_small - 1.0 / b_big)
    return grad_sqr, grad_var


@dataclass(frozen=True)
class NoiseScale:
    """A gradient noise scale estimate.

    b_simple  tr(Sigma) / |G|^2, in samples: the batch size around which
              larger batches stop buying proportionally fewer steps
    grad_sqr  |G|^2, the squared norm of the true gradient
    grad_var  tr(Sigma), the variance of one sample's gradient
    steps     how many steps (or offline batches) it rests on
    """
    b_simple: float
    grad_sqr: float
    grad_var: float
    steps: int


def ratio(grad_var, grad_sqr):
    """B_simple from the two (smoothed) estimates: inf when |G|^2 <= 0 (the
    gradient is all noise as far as the samples tell)."""
    return grad_var / grad_sqr if grad_sqr > 0 else math.inf


# ---------------------------------------------------------------- smoothing over steps
class Smoothed:
    """Bias-corrected exponential moving averages of the two estimates.

    Each step adds (|G|^2, tr(Sigma) / B_small): the second in units of
    B_small so that result(b_small) can scale it by the batch the caller
    names (the estimator is linear in B_small for a fixed rank count).
    Plain floats; state_dict() for checkpoints."""

    def __init__(self, beta=DEFAULT_BETA):
        beta = float(beta)
        if not 0.0 <= beta < 1.0:
            raise ValueError("the noise scale's smoothing beta must be in [0, 1), got %r"
                             % beta)
        self.beta = beta
        self.sqr = 0.0      # biased EMA of |G|^2
        self.var = 0.0      # biased EMA of tr(Sigma) / B_small
        self.weight = 0.0   # 1 - beta^steps: the bias correction
        self.steps = 0

    def add(self, small_sqr, big_sqr, ranks):
        """One step: small_sqr = mean over the ranks of |G_small|^2, big_sqr =
        |G_big|^2 of their average, ranks = N >= 2. Non-finite values (an
        fp16 overflow) are not added; returns whether the step counted."""
        if not (math.isfinite(small_sqr) and math.isfinite(big_sqr)):
            return False
        grad_sqr, var_per = estimates(small_sqr, big_sqr, 1.0, float(ranks))
        b = self.beta
        self.sqr = b * self.sqr + (1.0 - b) * grad_sqr
        self.var = b * self.var + (1.0 - b) * var_per
        self.weight = b * self.weight + (1.0 - b)
        self.steps += 1
        return True

    def result(self, b_small):
        """NoiseScale for small batches of b_small samples (per rank per step:
        batch x backward passes); None before the first step."""
        if self.steps == 0:
            return None
        grad_sqr = self.sqr / self.weight
        grad_var = self.var / self.weight * b_small
        return NoiseScale(ratio(grad_var, grad_sqr), grad_sqr, grad_var, self.steps)

    def state_dict(self):
        return dict(beta=self.beta, sqr=self.sqr, var=self.var, weight=self.weight,
                    steps=self.steps)

    def load_state_dict(self, state):
        self.beta, self.sqr, self.var = float(state["beta"]), float(state["sqr"]), \
            float(state["var"])
        self.weight, self.steps = float(state["weight"]), int(state["steps"])


# ---------------------------------------------------------------- squared norms
def squared_norm(t):
    """sum(t**2) of a tensor as a Python float, accurately enough for the
    difference of two norms: float32 dot products over 64K-element chunks
    added in float64 (one dot over millions of elements in float32 is off by
    ~1e-4 relative; pow(2).sum() needs a temporary of t's size). On a GPU one
    float64 norm kernel (the result is a 0-d tensor there: no sync)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        return torch.linalg.vector_norm(flat, dtype=torch.float64).square()
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()  # fp16 / bf16 buckets: one float32 copy
    total, chunk = 0.0, 1 << 16
    for i in range(0, flat.numel(), chunk):
        c = flat[i:i + chunk]
        total += float(torch.dot(c, c))
    return total


# ---------------------------------------------------------------- offline estimate
def offline_noise_scale(model, loss_fn, batches):
    """B_simple at the model's current weights, from K >= 2 small batches of
    equal size b (an iterable of (inputs, targets)): each batch's gradient
    G_i, their mean as the big batch of K b samples, and the estimator above
    with mean |G_i|^2 as |G_small|^2 (this is the sample variance of the G_i:
    tr(Sigma) = b / (K - 1) sum |G_i - mean G|^2). No smoothing: the weights
    do not move. loss_fn(outputs, targets) must be the MEAN loss over the
    batch. The weights, .grad and buffers (batch-norm statistics) are left as
    they were; the model's train/eval mode is the caller's choice."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = list(model.buffers())  # batch norm's running statistics move in forward
    saved = [t.detach().clone() for t in buffers]
    total, small, k, b = None, 0.0, 0, None
    try:
        for x, y in batches:
            if b is None:
                b = len(y)
            elif len(y) != b:
                raise ValueError("offline_noise_scale needs batches of one size: got %d "
                                 "after %d" % (len(y), b))
            grads = torch.autograd.grad(loss_fn(model(x), y), params, allow_unused=True)
            flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                              .double() for g, p in zip(grads, params)])
            small += float(flat.dot(flat))
            total = flat if total is None else total + flat
            k += 1
    finally:
        with torch.no_grad():
            for t, v in zip(buffers, saved):
                t.copy_(v)
    if k < 2:
        raise ValueError("offline_noise_scale needs at least 2 batches, got %d" % k)
    big = total / k
    grad_sqr, grad_var = estimates(small / k, float(big.dot(big)), b, k * b)
    return NoiseScale(ratio(grad_var, grad_sqr), grad_sqr, grad_var, k)
