"""scaling.py - the learning rate for a global batch, from one tuned at a base
batch: the linear scaling rule (Goyal et al. 2017: k times the batch, k times
the rate) or the square-root rule (Krizhevsky 2014; Hoffer et al. 2017)."""
import math

from ._checks import check_count, check_number

RULES = ("linear", "sqrt", "none")


def scale_lr(base_lr, global_batch, base_batch=256, rule="linear"):
    """base_lr * k ("linear"), base_lr * sqrt(k) ("sqrt") or base_lr ("none"),
    with k = global_batch / base_batch. global_batch is the batch summed over
    all ranks (per-rank batch x ranks x accumulation steps).

        scale_lr(0.1, 8192)                  -> 3.2
        scale_lr(0.1, 8192, rule="sqrt")     -> 0.1 * sqrt(32) = 0.566
    """
    check_number("base_lr", base_lr, strict=True)
    check_count("global_batch", global_batch, "a number of samples")
    check_count("base_batch", base_batch, "a number of samples")
    if rule not in RULES:
        raise ValueError("unknown scaling rule %r; choose one of %s" % (rule, ", ".join(RULES)))
    k = global_batch / base_batch
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    return float(base_lr)
