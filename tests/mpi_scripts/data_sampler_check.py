"""data_sampler_check.py - run under mpirun with a shard directory: each rank
builds DistributedShardSampler with the ranks from MPI (no arguments), the
index lists of all ranks are gathered with MPI's allgather and checked against
the rules (equal counts, disjoint, union = the data set) and against the same
sampler computed in one process for every rank; then every rank reads its
part through a DataLoader with 2 workers and checks the values it got.
Prints 'SAMPLER OK rank R cases C' per rank."""
import sys

import numpy as np
import torch

from hpcdl import comm
from hpcdl.data import DistributedShardSampler, H5ShardDataset, collate

c = comm.init()
mpi, R, N = c.mpi, c.rank, c.size
ds = H5ShardDataset(sys.argv[1])
cases = 0


def check(data, **kw):
    """Gathers this epoch's lists of every rank and checks them."""
    global cases
    s = DistributedShardSampler(data, **kw)
    assert (s.num_replicas, s.rank) == (N, R)
    s.set_epoch(3)
    mine = list(s)
    every = mpi.allgather(mine)
    n, flat = len(data), [i for part in every for i in part]
    assert len({len(p) for p in every}) == 1, [len(p) for p in every]
    if kw.get("drop_last"):
        assert len(set(flat)) == len(flat) == n - n % N
    else:
        assert set(flat) == set(range(n)) and len(flat) == n + (-n) % N
    for r in range(N):  # the same sampler, one process, rank r
        one = DistributedShardSampler(data, num_replicas=N, rank=r, **kw)
        one.set_epoch(3)
        assert list(one) == every[r]
    cases += 1
    return mine


for n in (1, N - 1, N, 37, 103):
    for drop_last in (False, True):
        if n > 0:
            check(list(range(n)), drop_last=drop_last, seed=11)
for window in (0, 2):
    for drop_last in (False, True):
        check(ds, drop_last=drop_last, chunk_window=window)

# the DataLoader delivers exactly the sampler's samples, in its order
sampler = DistributedShardSampler(ds, seed=5, chunk_window=1)
loader = torch.utils.data.DataLoader(ds, batch_size=7, sampler=sampler, num_workers=2,
                                     collate_fn=collate)
source = ds.read_field("source_index")
for epoch in (0, 1):
    sampler.set_epoch(epoch)
    order = list(sampler)
    got = [(x, y) for x, y in loader]
    x = torch.cat([g[0] for g in got]).numpy()
    want = np.stack([ds.get_raw(i)[0] for i in order]).astype(np.float32)
    assert np.array_equal(x, want) and len(got) == -(-len(order) // 7)
    reads = mpi.allgather(source[order].tolist())  # which source samples each rank read
    flat = [i for r in reads for i in r]
    assert set(flat) == set(source.tolist()) and len(flat) == len(ds) + (-len(ds)) % N
    assert len({len(r) for r in reads}) == 1  # same batch count on every rank
sys.stdout.write("SAMPLER OK rank %d cases %d\n" % (R, cases))
