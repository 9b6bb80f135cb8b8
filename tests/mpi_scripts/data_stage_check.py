"""data_stage_check.py - run under mpirun: stage a shard directory to a
node-local folder twice, then read it through H5ShardDataset(stage_to=...).
The ranks of the node divide the copying (rank 0 prints the node's total), the
second call copies nothing, and what is read equals the original. Prints
'STAGE OK rank R' per rank."""
import os
import sys

import numpy as np

from hpcdl import comm
from hpcdl.data import H5ShardDataset, stage_shards

c = comm.init()
src, dest = sys.argv[1], sys.argv[2]
first = stage_shards(src, dest, comm=c.mpi)
second = stage_shards(src, dest, comm=c.mpi)
assert first == second and not [f for f in os.listdir(first) if ".tmp-" in f]
ds = H5ShardDataset(src, "val", stage_to=dest)
orig = H5ShardDataset(src, "val")
assert ds.directory == first
for i in range(len(ds)):
    a, b = ds.get_raw(i), orig.get_raw(i)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
sys.stdout.write("STAGE OK rank %d\n" % c.rank)
