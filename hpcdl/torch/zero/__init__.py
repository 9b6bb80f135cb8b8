"""hpcdl.torch.zero - sharded data parallelism (ZeRO, Rajbhandari et al. 2020)
inside DistributedOptimizer: `DistributedOptimizer(opt, zero_stage=1|2)`.
What each stage keeps where: docs/zero.md."""
from .sharding import Sharding

STAGES = (0, 1, 2)


def check_stage(stage):
    """zero_stage as an int, or a ValueError that says what is supported.
    Raised on every rank alike: every rank passes the same argument."""
    ok = isinstance(stage, int) and not isinstance(stage, bool)
    if ok and stage in STAGES:
        return stage
    if ok and stage == 3:
        raise ValueError("zero_stage=3 (sharded parameters) is not implemented yet; use "
                         "zero_stage=0, 1 or 2 (docs/zero.md)")
    raise ValueError("zero_stage must be 0 (unsharded), 1 (optimizer state sharded) or 2 "
                     "(optimizer state and gradients sharded), got %r" % (stage,))


__all__ = ["Sharding", "check_stage", "STAGES"]
