"""hpcdl.data - HDF5 shards and the distributed input pipeline.

    hpcdl data shard digits --out shards/digits --shards 4 --val-fraction 0.2
    hpcdl data inspect shards/digits ; hpcdl data verify shards/digits

    from hpcdl.data import H5ShardDataset, DistributedShardSampler, collate
    ds = H5ShardDataset("shards/digits", split="train")      # stage_to="/dev/shm" optional
    sampler = DistributedShardSampler(ds, shuffle=True, seed=0)   # ranks from MPI
    loader = torch.utils.data.DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2,
                                         collate_fn=collate)
    for epoch in range(E):
        sampler.set_epoch(epoch)
        for x, y in loader: ...     # x float32 (B, *ds.sample_shape), y int64 (B,)

Modules: manifest (format, DataError), sources (what can be sharded), writer,
dataset (H5ShardDataset), sampler (DistributedShardSampler), cache (chunk
cache), stage (node-local copies), verify (checks and the inspect summary).
The dataset and sampler load torch on first use, so the writer and the CLI
start without it.
"""
from .manifest import DataError, Manifest
from .stage import stage_shards

__all__ = ["H5ShardDataset", "DistributedShardSampler", "collate", "SampleBatch",
           "DataError", "Manifest", "stage_shards"]


def __getattr__(name):  # torch is imported only when these are asked for
    if name in ("H5ShardDataset", "SampleBatch", "collate"):
        from . import dataset  # on use: loads torch and tqdm
        return getattr(dataset, name)
    if name == "DistributedShardSampler":
        from .sampler import DistributedShardSampler  # on use: loads torch and tqdm
        return DistributedShardSampler
    raise AttributeError("module 'hpcdl.data' has no attribute %r" % name)
