"""sampler.py - ElasticSampler: a DistributedSampler that remembers how far
the epoch got, so that after a restart on a different number of ranks the
samples not yet seen this epoch are split over the new ranks (Horovod's
hvd.elastic.ElasticSampler semantics).

The epoch's order is one seeded shuffle of every index, the same on every
rank; `processed_num` counts the samples of that order already consumed by
all ranks together (record_batch adds batch_size x ranks). The remaining
indices are padded to a multiple of the rank count and dealt round robin, as
torch's DistributedSampler deals a whole epoch."""
import math
import random

import torch.utils.data

from .. import mpi_ops


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (call it at the END of an epoch, for the next
        one, so that a restart inside an epoch does not repeat samples)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """This step consumed batch_size samples on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state):
        self.epoch, self.processed_num = state["epoch"], state["processed_num"]
        self.reset()

    def reset(self):
        """Re-deals the epoch's unseen indices over the ranks there are now."""
        self.num_replicas, self.rank = mpi_ops.size(), mpi_ops.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = list(self.remaining_indices)
        while idx and len(idx) < self.total_size:  # pad by wrapping, as torch does
            idx += idx[:self.total_size - len(idx)]
        return iter(idx[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
