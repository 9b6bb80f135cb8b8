"""ulfm_lost_rank.py - run under Open MPI 5's `mpiexec --with-ft ulfm` (4 ranks): one
rank SIGKILLs itself inside a loop of all-reduces; the survivors must each get one
RanksLostError naming it, shrink to the others, and all-reduce correctly again.

    python ulfm_lost_rank.py VICTIMS STEP MODE ALGO KILLFILE [shrink|exit|twice]

VICTIMS: one rank, or several (1,3) that die at the same point. exit: the survivors
print 'LEFT world W: lost [...]' after the error and end their script without a
shrink (hpcdl's shutdown at exit must then free the lost core locally, not hang).
twice: after the shrink and its checked steps, the last survivor dies too; the
others shrink again ('SURVIVED-2 world W: ...', lost in the shrunken numbering).

MODE: blocking | async (every size of a step queued on the engine, then waited:
the one the victim queued before it died may complete, correct; every handle after
the first failed one must fail the same way) | shared (in-place all-reduce
of node shared buffers: the shared-memory wait must notice the dead local peer) |
object (the victim dies before an allgather_object, which must raise it too) |
others (before an all-gather; all-gather, broadcast and reduce-scatter are checked
against MPI's before the kill and after the shrink).
ALGO: auto | ring | hier | mpi (others: ring or mpi). The victim writes time.time() to KILLFILE just
before it dies. Data depend on rank and position: x[i] = (i % 97 + 1) * (w + 1) +
step, w the rank's world rank; every result is checked against MPI_Allreduce on
the same communicator and against the sum over the ranks alive (exact in
float32). Each survivor prints one line:
  'SURVIVED world W: lost [3] at step S; errors E; shrink T s; kill->next allreduce K s'
"""
import signal
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcdl import comm

victims, kill_step, mode, algo, killfile = ([int(v) for v in sys.argv[1].split(",")],
                                            int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                            sys.argv[5])
after = sys.argv[6] if len(sys.argv) > 6 else "shrink"
SIZES = [1, 3, 1000, 65537, 300001]  # < ranks, odd, not a multiple of 4, 1.2 MiB
STEPS_AFTER = 4

c = comm.init()
world_rank = MPI.COMM_WORLD.Get_rank()
alive = list(range(c.size))  # world ranks of the ranks alive
shared = {}  # size -> this communicator's shared buffer (mode shared)


def data(w, n, step):
    return ((np.arange(n) % 97 + 1) * (w + 1) + step).astype(np.float32)


def expected(n, step):
    return sum(data(w, n, step) for w in alive).astype(np.float32)


def buffer_for(n, step):
    x = data(world_rank, n, step)
    if mode != "shared":
        return x
    if n not in shared:
        mem = c.shared_buffer(n * 4)
        shared[n] = np.frombuffer(mem, dtype=np.float32)
    shared[n][:] = x
    return shared[n]


def check(out, n, step):
    ref = np.empty(n, dtype=np.float32)
    c.mpi.Allreduce(data(world_rank, n, step), ref)  # MPI's own answer
    if not (np.array_equal(out, ref) and np.array_equal(out, expected(n, step))):
        bad = int(np.argmax(out != expected(n, step)))
        sys.exit("rank %d: wrong all-reduce of %d at step %d: element %d is %s, MPI says %s, "
                 "the sum says %s" % (world_rank, n, step, bad, out[bad], ref[bad],
                                      expected(n, step)[bad]))


def check_others(n, step):
    """all-gather, broadcast (from the last rank) and reduce-scatter of n elements,
    each against MPI's own on the same communicator."""
    x = data(world_rank, n, step)
    gathered = c.allgather(x, counts=[n] * c.size, algorithm=algo)  # the core's own
    ref = np.empty(n * c.size, dtype=np.float32)
    c.mpi.Allgather(x, ref)
    b = x.copy()
    c.broadcast(b, root=c.size - 1, algorithm=algo)
    ref_b = x.copy()
    c.mpi.Bcast(ref_b, root=c.size - 1)
    counts = [n // c.size + (1 if r < n % c.size else 0) for r in range(c.size)]
    scattered = c.reduce_scatter(x, algorithm=algo)
    ref_s = np.empty(counts[c.rank], dtype=np.float32)
    c.mpi.Reduce_scatter(x, ref_s, recvcounts=counts)
    for what, out, want in (("allgather", gathered, ref), ("broadcast", b, ref_b),
                            ("reduce_scatter", scattered, ref_s)):
        if not np.array_equal(out, want):
            sys.exit("rank %d: wrong %s of %d at step %d" % (world_rank, what, n, step))


def one_step(step):
    """All sizes of one step; the victim dies before the second one at kill_step."""
    if mode == "async":
        handles = []
        for k, n in enumerate(SIZES):
            if step == kill_step and k == 1 and world_rank in victims:
                die()
            x = buffer_for(n, step)
            handles.append((n, c.allreduce_async(x, algorithm=algo, name="grad.bucket.%d" % k)))
        errors, results = [], []
        for n, h in handles:  # every handle is waited, even after the first error
            try:
                out = h.wait()
                if errors:
                    sys.exit("rank %d: handle %s succeeded after a failed one"
                             % (world_rank, h.name))
                results.append((out, n))
            except comm.RanksLostError as e:
                errors.append(e)
        if errors:  # the handles the victim joined before it died are whole
            for out, n in results:
                if not np.array_equal(out, expected(n, step)):
                    sys.exit("rank %d: wrong all-reduce of %d before the loss" % (world_rank, n))
            raise LostAll(errors)
        for out, n in results:  # MPI's answer only once the step is whole
            check(out, n, step)
        return
    for k, n in enumerate(SIZES):
        if step == kill_step and k == 1 and world_rank in victims:
            die()
        if mode == "object" and k == 1:  # an mpi4py collective through hpcdl.comm
            got = c.allgather_object((world_rank, step))
            if got != [(w, step) for w in alive]:
                sys.exit("rank %d: allgather_object gave %s" % (world_rank, got))
        if mode == "others" and k == 1:  # the core's other collectives
            check_others(n, step)
        x = buffer_for(n, step)
        algorithm = "auto" if mode == "shared" else algo
        check(c.allreduce(x, algorithm=algorithm), n, step)


class LostAll(Exception):
    def __init__(self, errors):
        super().__init__(str(errors[0]))
        self.errors = errors


def die():
    tmp = "%s.%d.tmp" % (killfile, world_rank)  # victims die at once: one file each
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.rename(tmp, killfile)
    os.kill(os.getpid(), signal.SIGKILL)


def until_lost(step):
    """Steps from step on until the victims die; (the step, the survivor's errors)."""
    while True:
        try:
            one_step(step)
        except (comm.RanksLostError, LostAll) as e:
            return step, getattr(e, "errors", [e])
        step += 1
        if step > kill_step + 50:
            sys.exit("rank %d: no RanksLostError 50 steps after the kill" % world_rank)


def check_errors(errors):
    """The world ranks the errors name (their .ranks are ranks of c; alive maps
    them to world ranks), checked against the victims."""
    lost = sorted({alive[r] for e in errors for r in e.ranks})
    msgs = {str(e).split(" on rank")[0] for e in errors}
    print("rank %d: %d error(s): %s" % (world_rank, len(errors), " | ".join(sorted(msgs))[:600]),
          flush=True)
    # a survivor names the lost ranks MPI has told it of: each victim's loss may reach it
    # after the first error, but the ranks named are victims, and at least one
    if not lost or not set(lost) <= set(victims) or (len(victims) == 1 and lost != victims):
        sys.exit("rank %d: the errors name ranks %s, not %s: %s" % (world_rank, lost, victims,
                                                                     errors[0]))
    if mode == "async" and len(errors) < len(SIZES) - 1:  # the victim queued at most the first
        sys.exit("rank %d: only %d of %d handles failed" % (world_rank, len(errors), len(SIZES)))
    return lost


def recover(step, errors, label):
    """Shrink, check, STEPS_AFTER more steps; prints the survivor's line."""
    global c, alive, shared
    want_lost = [alive.index(v) for v in victims]  # in the numbering of c before the shrink
    c = comm.shrink()
    alive = [w for w in alive if w not in victims]
    shared = {}
    if c.size != len(alive) or c.lost != want_lost:
        sys.exit("rank %d: shrink gave %d ranks, lost %s" % (world_rank, c.size, c.lost))
    for s in range(STEPS_AFTER):
        n = SIZES[-1]
        check(c.allreduce(buffer_for(n, step + 1 + s), algorithm="auto" if mode == "shared"
                          else algo), n, step + 1 + s)
        if s == 0:
            t_next = time.time()
        one_step(step + 1 + s)
    with open(killfile) as f:
        t_kill = float(f.read())
    print("%s world %d: lost %s at step %d; errors %d; shrink %.3f s; kill->next "
          "allreduce %.3f s" % (label, world_rank, c.lost, step, len(errors), c.shrink_s,
                               t_next - t_kill), flush=True)
    return step + STEPS_AFTER


step, errors = until_lost(0)
lost = check_errors(errors)
if after == "exit":  # no shrink: the survivors end their script; exit must not hang
    print("LEFT world %d: lost %s" % (world_rank, lost), flush=True)
    sys.exit(0)
step = recover(step, errors, "SURVIVED")
if after == "twice":  # a second loss on the shrunken communicator: its last rank
    victims, kill_step = [alive[-1]], step + 2
    step, errors = until_lost(step + 1)
    check_errors(errors)
    recover(step, errors, "SURVIVED-2")
