"""hpcdl.torch.zero - sharded data parallelism (ZeRO, Rajbhandari et al. 2020):
stages 1 and 2 as ZeroOptimizer on DistributedOptimizer's Reducer
(`hvd.DistributedOptimizer(opt, zero_stage=1|2)` returns one), stage 3 as a
model wrapper (`hvd.shard_model(model)`).
What each stage keeps where: docs/zero.md."""
from .sharding import Sharding
from .optimizer import ZeroOptimizer
from .stage3 import ShardedModel, shard_model, shards_of

STAGES = (0, 1, 2)


def check_stage(stage):
    """zero_stage as an int, or a ValueError that says what is supported.
    Raised on every rank alike: every rank passes the same argument."""
    ok = isinstance(stage, int) and not isinstance(stage, bool)
    if ok and stage in STAGES:
        return stage
    if ok and stage == 3:
        raise ValueError("zero_stage=3 shards the model, not the optimizer: call "
                         "shards = hvd.shard_model(model), then give model.parameters() to "
                         "a plain torch optimizer (no DistributedOptimizer; docs/zero.md)")
    raise ValueError("zero_stage must be 0 (unsharded), 1 (optimizer state sharded) or 2 "
                     "(optimizer state and gradients sharded), got %r; stage 3: "
                     "hvd.shard_model(model)" % (stage,))


__all__ = ["Sharding", "ZeroOptimizer", "ShardedModel", "check_stage", "shard_model", "shards_of", "STAGES"]
