"""shards.py - `hpcdl train --data DIR`: a shard directory written by
`hpcdl data shard` as the trainer's data source.

The "train" split feeds training, the "val" split testing (shard with
--val-fraction > 0). Each step's rows of sample indices (data.epoch_shard) go
to a DataLoader as its batch sampler, so N ranks still read exactly the
global batches one process would, while --workers processes per rank read
and decode them ahead of the training loop. Samples are standardised per
feature with the training split's mean and std (computed by rank 0 in one
pass over the shards and broadcast), as the built-in digits set is.
"""
import numpy as np
import torch

from .. import comm
from .errors import ConfigError
from ..data import DataError, H5ShardDataset
from ..data import collate


class ShardSource:
    """Train and val splits of a shard directory (the interface of data.Dataset)."""

    def __init__(self, directory, workers=2, stage_to=None):
        try:
            self.train = H5ShardDataset(directory, "train", stage_to=stage_to)
            self.test = H5ShardDataset(directory, "val", stage_to=stage_to)
        except (DataError, KeyError, ValueError) as e:
            raise ConfigError("--data %s: %s (make shards with `hpcdl data shard SOURCE --out "
                              "DIR --val-fraction 0.2`)" % (directory, e))
        if self.train.sample_shape is None:
            raise ConfigError("--data %s holds images of mixed sizes; shard them decoded to "
                              "one size for training" % directory)
        self.workers = workers
        self.num_classes = self.train.num_classes
        self.sample_shape = shape = tuple(self.train.sample_shape)
        self.image_shape = shape if len(shape) == 3 else None
        self.num_features = int(np.prod(shape))
        stats = self.train.feature_stats() if comm.rank() == 0 else None
        mean, std = comm.bcast_object(stats, root=0)
        self._mean = torch.from_numpy(mean.astype(np.float32))
        self._std = torch.from_numpy(std.astype(np.float32))

    @property
    def n_train(self):
        return len(self.train)

    @property
    def n_test(self):
        return len(self.test)

    def _loader(self, ds, batches):
        return torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=self.workers,
                                           collate_fn=collate)

    def _standardised(self, loader):
        for x, y in loader:
            yield (x - self._mean) / self._std, y

    def train_batches(self, rows):
        return self._standardised(self._loader(self.train, rows.tolist()))

    def test_batches(self, idx, batch=512):
        parts = [idx[i:i + batch].tolist() for i in range(0, len(idx), batch)]
        return self._standardised(self._loader(self.test, parts))


def load_shards(directory, workers=2, stage_to=None):
    return ShardSource(directory, workers, stage_to)
