"""norms.py - norms of whole layers and of the whole gradient when every rank
holds only pieces of them (ZeRO stages 1 and 2).

A norm is a root of a sum of squares, and a sum splits over pieces: each rank
sums the squares of its pieces in float64, one all-reduce adds the ranks' sums,
and the root is taken after. Every element is owned by exactly one rank, so
nothing is counted twice.
"""
import math

import torch


def layer_norm_users(optimizer):
    """The optimizers in a wrapper chain (LARC(SGD), LARS, ...) that take
    per-layer norms through a `layer_norms` attribute (hpcdl.optim's LARS, LARC)."""
    found, o = [], optimizer
    while o is not None:
        if hasattr(o, "layer_norms"):
            found.append(o)
        o = getattr(o, "optimizer", None)  # OptimizerWrapper's wrapped optimizer
    return found


def _sq(t):
    return t.detach().double().square().sum() if t.numel() else torch.zeros((), dtype=torch.float64)


def layer_norms(sharding, on):
    """{piece tensor: (||w||, ||g||) of its whole parameter} after one
    all-reduce of every parameter's two partial sums of squares."""
    params = [p for s in sharding.shards for p in s.bucket.params]
    index = {p: i for i, p in enumerate(params)}
    sums = torch.zeros(len(params), 2, dtype=torch.float64)
    pieces = list(sharding.piece_of.items())
    for t, (p, _) in pieces:
        sums[index[p], 0] = _sq(t)
        sums[index[p], 1] = _sq(t.grad) if t.grad is not None else 0.0
    on.allreduce(sums, op="sum")
    roots = sums.sqrt()
    return {t: (roots[index[p], 0].to(t.dtype), roots[index[p], 1].to(t.dtype))
            for t, (p, _) in pieces}


def piece_norms(pieces, on):
    """Stage 3: {piece: (||w||, ||g||) of its whole parameter}, where every
    rank holds one piece (maybe empty) of every parameter, in the same order;
    one all-reduce."""
    sums = torch.zeros(len(pieces), 2, dtype=torch.float64)
    for i, t in enumerate(pieces):
        sums[i, 0] = _sq(t)
        sums[i, 1] = _sq(t.grad) if t.grad is not None else 0.0
    on.allreduce(sums, op="sum")
    roots = sums.sqrt()
    return {t: (roots[i, 0].to(t.dtype), roots[i, 1].to(t.dtype)) for i, t in enumerate(pieces)}


def clip_pieces_(grads, max_norm, norm_type, on):
    """torch.nn.utils.clip_grad_norm_ over the union of every rank's grads
    (disjoint pieces): scales them in place, returns the total norm (a tensor)."""
    norm_type = float(norm_type)
    if math.isinf(norm_type):
        local = max((g.detach().abs().max().double() for g in grads if g.numel()),
                    default=torch.zeros((), dtype=torch.float64))
        total = torch.tensor([float(local)], dtype=torch.float64)
        on.allreduce(total, op="max")
        total = total[0]
    else:
        local = sum((g.detach().double().abs().pow(norm_type).sum() for g in grads),
                    torch.zeros((), dtype=torch.float64))
        total = torch.tensor([float(local)], dtype=torch.float64)
        on.allreduce(total, op="sum")
        total = total[0] ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's own formula
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total.float()
