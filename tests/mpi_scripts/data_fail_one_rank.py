"""data_fail_one_rank.py - run under mpirun on a shard directory whose second
half is corrupted: with chunk-grouped, unshuffled sampling only the last rank
reads it. That rank's DataError must end the whole job (the others wait in
the epoch's all-reduce, as a trainer does) instead of leaving them hanging."""
import sys

import numpy as np
import torch

from hpcdl import comm
from hpcdl.data import DistributedShardSampler, H5ShardDataset, collate

c = comm.init()
ds = H5ShardDataset(sys.argv[1])
sampler = DistributedShardSampler(ds, shuffle=False, chunk_window=1)
loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2,
                                     collate_fn=collate)
seen = 0
for x, y in loader:
    seen += len(y)
sys.stdout.write("rank %d read %d samples\n" % (c.rank, seen))
c.allreduce(np.array([seen], dtype=np.float32))  # the end-of-epoch collective
sys.stdout.write("rank %d passed the all-reduce\n" % c.rank)
