"""hpcdl.torch.zero - sharded data parallelism (ZeRO, Rajbhandari et al. 2020):
stages 1 and 2 as ZeroOptimizer on DistributedOptimizer's Reducer
(`hvd.DistributedOptimizer(opt, zero_stage=1|2)` returns one), stage 3 as a
model wrapper (`hvd.shard_model(model)`).
What each stage keeps where: docs/zero.md.

The package itself imports none of its modules: importing one of them
(hpcdl.torch.zero.layout, say) runs this file first, and were it to load
optimizer.py, which stands on hpcdl.torch.optimizer, every module that only
wants the bucket layout would import the optimizer too (a circle with
torch/noise_scale.py). Import the classes from their modules:
zero.optimizer.ZeroOptimizer, zero.sharding.Sharding, zero.stage3's
ShardedModel, shard_model and shards_of."""

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


__all__ = ["check_stage", "STAGES"]
