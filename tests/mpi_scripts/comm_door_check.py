"""comm_door_check.py - the object collectives, agreements and clock that
everything above hpcdl.comm uses instead of mpi4py: results compared with what
each rank must hold, data depending on rank (a value from the wrong rank shows).
Prints DOOR OK on every rank that found everything right."""
import sys

import numpy as np

from hpcdl import comm

w = comm.init()
R, N = w.rank, w.size
bad = []


def check(ok, what):
    if not ok:
        bad.append(what)


# object collectives: module functions and methods agree
want = [("r%d" % r, list(range(r))) for r in range(N)]
check(comm.allgather_object(("r%d" % R, list(range(R)))) == want, "allgather_object")
check(w.allgather_object(R * 10) == [r * 10 for r in range(N)], "Communicator.allgather_object")
root = N - 1
got = comm.bcast_object({"from": R} if R == root else None, root=root)
check(got == {"from": root}, "bcast_object from the last rank: %s" % got)
got = comm.gather_object(R * R, root=root)
check(got == ([r * r for r in range(N)] if R == root else None), "gather_object: %s" % got)

# any_rank: only the last rank sets a flag; the largest value wins
check(comm.any_rank(R == N - 1) == 1, "any_rank(one rank True)")
check(comm.any_rank(False) == 0, "any_rank(all False)")
check(comm.any_rank(R + 3) == N + 2, "any_rank(largest)")

# raise_if_any: rank 1 fails with an exception -> it re-raises its own, the
# others raise exc_type naming rank 1; a message is raised alike everywhere
try:
    comm.raise_if_any(KeyError("disk full") if R == 1 else None, RuntimeError)
    check(False, "raise_if_any did not raise")
except KeyError as e:
    check(R == 1 and "disk full" in str(e), "rank 1's own error: %r" % e)
except RuntimeError as e:
    check(R != 1 and str(e) == "rank 1 failed: 'disk full'", "others: %r" % e)
try:
    comm.raise_if_any("checkpoint unreadable" if R == 0 else None, ValueError)
    check(False, "raise_if_any(message) did not raise")
except ValueError as e:
    check(str(e) == "checkpoint unreadable", "message on every rank: %r" % e)
comm.raise_if_any(None)  # nobody failed: returns on every rank

# wtime: MPI_Wtime, the engine's clock, moves forward
t0 = comm.wtime()
check(w.wtime() >= t0 > 0, "wtime")

# alltoall is a Communicator method; the module function calls it on the world
send = np.arange(N, dtype=np.int64) + 100 * R        # element j goes to rank j
recv, counts = w.alltoall(send, [1] * N)
check(recv.tolist() == [R + 100 * r for r in range(N)] and counts == [1] * N, "alltoall")
recv2, _ = comm.alltoall(send, [1] * N)
check(recv2.tolist() == recv.tolist(), "comm.alltoall")

sys.stdout.write("rank %d %s\n" % (R, "DOOR OK" if not bad else "FAILED %s" % bad))
