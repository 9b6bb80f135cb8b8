"""Tutorial 01 - point-to-point messages and collectives, with mpi4py and hpcdl.

Run it with 4 ranks:

    hpcdl run -n 4 -- python tutorials/01_collectives.py

What it shows, each step ending in a check:
  1. point-to-point: a token passed around a ring of ranks (mpi4py send/recv);
  2. MPI's own all-reduce (mpi4py Allreduce on a numpy buffer);
  3. hpcdl's all-reduce on the same data with each algorithm: "ring",
     "hier" (shared memory inside the node) and "mpi" - they must agree;
  4. all-gather with a different count on every rank, and broadcast.

Exercise (for the student): change step 3 to use op="max" and predict, before
running, what every rank prints. Then make rank 1 pass a buffer one element
shorter than the others and read the error hpcdl raises on every rank.
"""
import numpy as np
from mpi4py import MPI

from hpcdl import comm

c = comm.init()
rank, size = c.rank, c.size
mpi = c.mpi  # the mpi4py communicator hpcdl runs on

# 1. point-to-point: rank 0 starts a token, every rank adds its rank and passes it on
if size > 1:
    if rank == 0:
        mpi.send(0, dest=1)
        token = mpi.recv(source=size - 1)
    else:
        token = mpi.recv(source=rank - 1) + rank
        mpi.send(token, dest=(rank + 1) % size)
    if rank == 0:
        assert token == sum(range(size)), token
        comm.print0("1. token after one lap of the ring: %d (= 0 + 1 + ... + %d)" % (token, size - 1))

# 2. MPI's all-reduce: data depends on rank and position, so a misplaced block shows
x = (np.arange(12, dtype=np.float32) * 10 + rank)
ref = np.empty_like(x)
mpi.Allreduce(x, ref, op=MPI.SUM)
comm.print0("2. MPI_Allreduce: ", ref[:4], "...")

# 3. hpcdl's algorithms give the same answer
for algo in ("ring", "hier", "mpi"):
    out = c.allreduce(x, np.empty_like(x), op="sum", algorithm=algo)
    assert np.array_equal(out, ref), (algo, out, ref)
comm.print0("3. hpcdl ring / hier / mpi all equal MPI's result; auto picks %r for 64 MiB"
            % c.choose_algorithm(64 << 20))

# 4. all-gather with rank-dependent counts, then broadcast from the last rank
mine = np.full(rank + 1, rank, dtype=np.int64)          # rank r sends r+1 copies of r
everyone = c.allgather(mine)
assert np.array_equal(everyone, np.concatenate([np.full(r + 1, r) for r in range(size)]))
msg = np.array([rank * 1.5] * 3)
c.broadcast(msg, root=size - 1)
assert np.all(msg == (size - 1) * 1.5)
comm.print0("4. allgather:", everyone, " broadcast from rank %d:" % (size - 1), msg)
comm.print0("tutorial 01: all checks passed on %d ranks" % size)
