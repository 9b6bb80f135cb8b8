"""sampler.py - DistributedShardSampler: which samples each rank reads, per epoch.

Plain mode (chunk_window=0) has torch's DistributedSampler semantics exactly
(and yields the same indices): every rank draws the same permutation of
range(len) seeded by seed + epoch (call set_epoch(e) before each epoch), pads
it by repeating its head up to a multiple of num_replicas (or, drop_last,
cuts the tail), and takes every num_replicas-th index from position rank.
So within an epoch the ranks' indices are disjoint (apart from the padding
repeats), their union is the data set, and every rank gets the same count,
hence the same number of batches: synchronous SGD never waits for a rank
that ran out.

Chunk-grouped mode (chunk_window=W > 0) needs a dataset with chunk_spans()
(H5ShardDataset). Same rules for padding, disjointness and equal counts, but
the order is built from whole chunks so that a rank touches few chunks:
  1. the chunks (chunk_rows consecutive samples of one shard) are permuted
     with the same seed + epoch on every rank and laid end to end;
  2. that sequence is padded or cut as above and cut into num_replicas
     contiguous parts: rank r reads part r, about len/(num_replicas*chunk_rows)
     chunks, plus at most two it shares with a neighbour;
  3. within its part, each rank shuffles windows of W chunks' samples.
What that does to randomness: a batch is drawn from the samples of about W
chunks instead of the whole split, and samples of one chunk always travel
together (in a new window, a new epoch). The writer shuffles each split once
before cutting it into chunks, so a chunk is a random subset of the split,
not a run of one class; the order of chunks, the split between ranks and the
order inside windows change every epoch. Larger W mixes more and reads more
chunks at once (the chunk cache should hold W chunks per worker).
"""
import math

import numpy as np
import torch

from . import _mpi


class DistributedShardSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, chunk_window=0):
        if num_replicas is None or rank is None:
            job_rank, job_size = _mpi.rank_and_size(_mpi.job_comm())
            num_replicas = job_size if num_replicas is None else num_replicas
            rank = job_rank if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError("rank %d is not in 0..num_replicas-1 (num_replicas %d)"
                             % (rank, num_replicas))
        if len(dataset) == 0:
            raise ValueError("the dataset is empty: nothing to sample")
        if chunk_window and not hasattr(dataset, "chunk_spans"):
            raise TypeError("chunk_window needs a dataset with chunk_spans() "
                            "(H5ShardDataset); %s has none" % type(dataset).__name__)
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.chunk_window, self.epoch = int(chunk_window), 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Call before each epoch: the permutation depends on seed + epoch."""
        self.epoch = epoch

    def __iter__(self):
        if self.chunk_window:
            return iter(self._grouped().tolist())
        return iter(self._plain())

    def _plain(self):
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g).numpy()
        else:
            indices = np.arange(n)
        return self._fit(indices)[self.rank:self.total_size:self.num_replicas].tolist()

    def _fit(self, indices):
        """Padded by repeating the head, or cut, to total_size (as DistributedSampler)."""
        return np.resize(np.asarray(indices, dtype=np.int64), self.total_size)

    def _grouped(self):
        spans = self.dataset.chunk_spans()
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            spans = spans[torch.randperm(len(spans), generator=g).numpy()]
        seq = np.concatenate([np.arange(a, b) for a, b in spans])
        seq = self._fit(seq)
        mine = seq[self.rank * self.num_samples:(self.rank + 1) * self.num_samples]
        if not self.shuffle:
            return mine
        rng = np.random.default_rng([self.seed, self.epoch, self.rank])
        window = self.chunk_window * self.dataset.chunk_rows
        for lo in range(0, len(mine), window):
            mine[lo:lo + window] = rng.permutation(mine[lo:lo + window])
        return mine
