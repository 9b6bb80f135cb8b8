"""rescale.py - the batch and the learning-rate factor for a new rank count,
from the rule in force: what hvd.elastic.BatchScaling (hpcdl/torch/elastic/
scaling.py) re-derives after an elastic restart on fewer or more ranks. No
MPI, no torch. docs/horovod.md (Elastic training), docs/adascale.md,
docs/goodput.md.

A job's batch is a target global batch G_t split over N ranks of k
accumulated passes (k = backward_passes_per_step, fixed): the local batch is
L = ceil(G_t / (N k)) and the global batch G = N L k (>= G_t, rounded up as
adaptdl does). When N changes:

    keep="global"  (the default, adaptdl's): G_t stays, L follows N;
    keep="local"   (Horovod's reset-callback convention): L stays, G = N L k;
    rule goodput   G_t is re-picked for N from B_noise and the step-time model
                   (goodput.py), among base x 2^i up to the ceiling.

The lr factor follows G: linear G / M0, sqrt sqrt(G / M0); AdaScale (rules
adascale and goodput) leaves the schedule's lr alone (factor 1) and takes the
scale S = G / M0 instead (its gain multiplies the lr at each step).
"""
import math

from . import goodput as gp
from ._checks import check_count

RULES = ("adascale", "goodput", "linear", "sqrt")
KEEPS = ("global", "local")


def check_rule(rule, keep="global"):
    if rule not in RULES:
        raise ValueError("the scaling rule must be one of %s, got %r" % (", ".join(RULES), rule))
    if keep not in KEEPS:
        raise ValueError("keep must be 'global' (the global batch stays when the rank count "
                         "changes) or 'local' (the local batch stays), got %r" % (keep,))


def split(global_batch, ranks, accum=1):
    """(local, global): local = ceil(global_batch / (ranks x accum)) samples per
    rank per pass, and the global batch that gives, ranks x local x accum."""
    check_count("global batch", global_batch, "samples")
    check_count("ranks", ranks)
    check_count("accumulation", accum, "backward passes per step")
    local = -(-global_batch // (ranks * accum))
    return local, ranks * local * accum


def lr_factor(rule, global_batch, base_batch):
    """What the base lr is multiplied by at global_batch: G / M0 (linear),
    sqrt(G / M0) (sqrt), 1 (adascale, goodput: the gain does it per step)."""
    k = global_batch / base_batch
    return {"linear": k, "sqrt": math.sqrt(k)}.get(rule, 1.0)


def candidates(ranks, base_batch, ceiling, accum=1):
    """[(target, (M, L, k))] for any rank count: the targets base_batch x 2^i
    up to ceiling (the base batch always), each split over ranks (M rounded
    up to a multiple of ranks x accum); a target whose M repeats the one
    before is left out."""
    out = []
    for target in gp.doublings(base_batch, ceiling):
        local, m = split(target, ranks, accum)
        if not out or m > out[-1][1][0]:
            out.append((target, (m, local, accum)))
    return out


def pick(b_noise, base_batch, step_time, ranks, ceiling, accum=1):
    """(target, table): the goodput rule's global batch target for ranks (the
    candidate of the largest goodput, goodput.best, with its efficiency taken
    at the rounded M) and every candidate's row."""
    cands = candidates(ranks, base_batch, ceiling, accum)
    rows = gp.table(b_noise, base_batch, step_time, [c for _, c in cands])
    top = gp.best(rows)
    return cands[rows.index(top)][0], rows


def rederive(rule, ranks, base_batch, target, local, accum=1, keep="global", b_noise=None,
             step_time=None, ceiling=None):
    """The batch and lr factor for `ranks` ranks, after a job with target
    global batch `target` and local batch `local` (rank count changed). For
    the goodput rule without a step-time model yet, the target stays. Returns
    dict(target, local_batch, global_batch, lr_factor, scale, table)."""
    check_rule(rule, keep)
    table = None
    if rule == "goodput" and step_time is not None:
        target, table = pick(b_noise, base_batch, step_time, ranks, ceiling or target, accum)
    elif keep == "local" and rule != "goodput":
        target = ranks * local * accum
        if rule == "adascale":  # its scale S = global / base must stay >= 1:
            target = max(target, base_batch)  # fewer ranks take larger local batches
    local, global_batch = split(target, ranks, accum)
    return dict(target=target, local_batch=local, global_batch=global_batch,
                lr_factor=lr_factor(rule, global_batch, base_batch),
                scale=global_batch / base_batch, table=table)
