"""Tutorial 02 - ring all-reduce by hand: reduce-scatter, then all-gather.

Run it with 4 ranks:

    hpcdl run -n 4 -- python tutorials/02_ring_allreduce.py

The ring (Patarasuk & Yuan 2009; hpcdl's C version is src_c/ring.c): N ranks
stand in a ring, rank r sends to r+1 and receives from r-1. The buffer is cut
into N blocks of nearly equal size (block k = [n*k//N, n*(k+1)//N), so any
length n works, even n < N, where some blocks are empty).

    reduce-scatter, steps s = 0 .. N-2:
        send block (r - s - 1), receive block (r - s - 2) and add it to this
        rank's own copy. After N-1 steps rank r holds the full sum of block r.
    all-gather, steps s = 0 .. N-2:
        send block (r - s), receive block (r - s - 1) and keep it as it is.

        step 0 of reduce-scatter, N = 4 (a, b, c, d = blocks 0..3):
          r0 --d--> r1 --a--> r2 --b--> r3 --c--> r0

Each rank sends 2(N-1) blocks of n/N elements: 2(N-1)/N of the buffer
whatever N is (the bandwidth optimum); time ~ 2(N-1)*alpha + 2(N-1)/N * n*beta.

What it does, each step ending in a check:
  1. runs ring_allreduce() once on a short buffer and prints which block each
     rank sent at each step (the table above, as it really ran);
  2. checks ring_allreduce() against MPI's Allreduce and hpcdl's
     comm.allreduce for lengths 0, 1, N-1, N+1, 1031 and 100003, on data that
     depends on rank and position (a misplaced block shows);
  3. times the hand-written ring, hpcdl's ring and MPI_Allreduce for a few
     sizes (nccl-tests-style table; ranks sharing cores make timings noisy);
  4. sums every rank's mismatches with MPI and exits non-zero if any.

Exercise (for the student):
  a. Before running, write down part 1's table for N = 4 from the rules
     above (the block each rank sends at each step), then compare. Which
     block does rank 2 send in all-gather step 0, and why is it complete?
  b. Break the ring: in all_gather(), send your own block r at every step
     instead of block (r - s). Run it: why does it stop with MPI_ERR_TRUNCATE
     at n = 1 (compare the sizes of the two blocks that meet in one
     Sendrecv)? Make every length in part 2 a multiple of N (with 4 ranks,
     part 3's sizes already are): now the check reports wrong sums. Then
     make rank_data() return np.ones(n, dtype): the check passes although
     the ring is still wrong. Why must test data for a collective depend on
     rank and position?
  c. Use the alpha-beta model: take alpha from the smallest size in part 3's
     table and beta from the largest, and predict the time of a 16 MiB
     all-reduce on this many ranks (add 16 << 20 to SIZES to check). Why is
     the hand ring slower than hpcdl's for small buffers?
  d. hpcdl's C ring pipelines: each block travels in chunks, and chunk k is
     added while chunk k+1 is on the wire. Rewrite reduce_scatter() with
     Isend/Irecv on chunks of 64 KiB and compare part 3's times.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

from hpcdl import comm

SIZES = [4 << 10, 256 << 10, 4 << 20]  # bytes timed in part 3 (float32)
REPEATS = 5                            # timed runs per size; the median is reported


# ----------------------------------------------------------------------------
# the ring, by hand
def block(buf, k, N):
    """Block k (taken mod N) of buf: a view, so writing to it writes buf."""
    k %= N
    n = len(buf)
    return buf[n * k // N:n * (k + 1) // N]


def reduce_scatter(buf, mpi, log=None):
    """Step s: send block (r - s - 1) to the right, receive block (r - s - 2)
    from the left and add it. Afterwards block r of buf is the full sum."""
    N, r = mpi.Get_size(), mpi.Get_rank()
    right, left = (r + 1) % N, (r - 1) % N
    for s in range(N - 1):
        send, mine = block(buf, r - s - 1, N), block(buf, r - s - 2, N)
        incoming = np.empty_like(mine)
        mpi.Sendrecv(send, dest=right, sendtag=s, recvbuf=incoming, source=left, recvtag=s)
        mine += incoming
        if log is not None:
            log.append(("reduce-scatter", s, (r - s - 1) % N))


def all_gather(buf, mpi, log=None):
    """Step s: send block (r - s) to the right, receive block (r - s - 1)
    from the left straight into place."""
    N, r = mpi.Get_size(), mpi.Get_rank()
    right, left = (r + 1) % N, (r - 1) % N
    for s in range(N - 1):
        send, into = block(buf, r - s, N), block(buf, r - s - 1, N)
        mpi.Sendrecv(send, dest=right, sendtag=N + s, recvbuf=into, source=left,
                     recvtag=N + s)
        if log is not None:
            log.append(("all-gather", s, (r - s) % N))


def ring_allreduce(x, mpi, log=None):
    """The sum of x over all ranks, as a new array (x is left alone)."""
    buf = np.array(x, copy=True)
    reduce_scatter(buf, mpi, log)
    all_gather(buf, mpi, log)
    return buf


# ----------------------------------------------------------------------------
# test data and timing helpers
def rank_data(n, rank, dtype=np.float64):
    """Small integers that depend on rank and position: sums are exact."""
    return ((np.arange(n) * 7 + rank * 13 + 5) % 101 - 50).astype(dtype)


def median_time(fn, mpi):
    """Median over REPEATS of the slowest rank's time for one call of fn."""
    times = []
    for _ in range(REPEATS):
        mpi.Barrier()
        t0 = MPI.Wtime()
        fn()
        times.append(mpi.allreduce(MPI.Wtime() - t0, op=MPI.MAX))
    return sorted(times)[len(times) // 2]


c = comm.init()
mpi = c.mpi  # the mpi4py communicator hpcdl runs on
rank, size = c.rank, c.size
wrong = 0  # mismatches found on this rank

# 1. the schedule, as it ran: which block each rank sent at each step
log = []
ring_allreduce(rank_data(2 * size, rank), mpi, log)
logs = mpi.gather(log, root=0)
if rank == 0 and size > 1:
    sys.stdout.write("1. block sent by each rank (columns r0..r%d), N = %d\n" % (size - 1, size))
    for i, (phase, s, _) in enumerate(logs[0]):
        sent = "  ".join("%2d" % logs[r][i][2] for r in range(size))
        sys.stdout.write("   %-14s step %d:  %s\n" % (phase, s, sent))
    sys.stdout.write("   after reduce-scatter rank r holds the full sum of block r\n")

# 2. correctness against MPI's Allreduce and hpcdl's all-reduce
for n in (0, 1, size - 1, size + 1, 1031, 100003):
    x = rank_data(n, rank)
    mine = ring_allreduce(x, mpi)
    ref = np.empty_like(x)
    mpi.Allreduce(x, ref, op=MPI.SUM)
    theirs = c.allreduce(x, np.empty_like(x), op="sum", algorithm="ring")
    bad = int(np.count_nonzero(mine != ref)) + int(np.count_nonzero(theirs != ref))
    wrong += bad
    if bad:
        sys.stdout.write("[rank %d] FAIL n=%d: %d elements differ from MPI_Allreduce\n"
                         % (rank, n, bad))
comm.print0("2. ring_allreduce %s MPI_Allreduce and hpcdl's ring for n in 0, 1, N-1, N+1, "
            "1031, 100003 (float64)" % ("==" if mpi.allreduce(wrong) == 0 else "DIFFERS from"))

# 3. timings: the hand ring, hpcdl's ring (C, pipelined) and MPI's own
cores = os.cpu_count() or 1
comm.print0("3. %d ranks, float32 sum, median of %d, times in ms; busbw = bytes/time * "
            "2(N-1)/N%s" % (size, REPEATS, "" if size <= cores else
                            " (%d ranks share %d cores: noisy)" % (size, cores)))
comm.print0("#%11s %10s %10s %10s %10s %16s" % ("size(B)", "count", "by hand", "hpcdl",
                                               "MPI", "hand busbw GB/s"))
for nbytes in SIZES:
    x = rank_data(nbytes // 4, rank, np.float32)
    out = np.empty_like(x)
    t_hand = median_time(lambda: ring_allreduce(x, mpi), mpi)
    t_hpcdl = median_time(lambda: c.allreduce(x, out, op="sum", algorithm="ring"), mpi)
    t_mpi = median_time(lambda: mpi.Allreduce(x, out, op=MPI.SUM), mpi)
    busbw = nbytes / t_hand * 2 * (size - 1) / size / 1e9
    comm.print0("%12d %10d %10.3f %10.3f %10.3f %16.3f" % (
        nbytes, x.size, t_hand * 1e3, t_hpcdl * 1e3, t_mpi * 1e3, busbw))
    wrong += int(np.count_nonzero(ring_allreduce(x, mpi) != out))  # same sum (integers)

# 4. the verdict, summed with MPI itself so one rank's failure fails all
total = mpi.allreduce(wrong, op=MPI.SUM)
if total:
    comm.print0("tutorial 02: %d mismatching elements over all ranks: FAILED" % total)
    sys.exit(1)
comm.print0("tutorial 02: all checks passed on %d ranks" % size)
