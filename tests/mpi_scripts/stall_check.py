"""stall_check.py - run under mpirun with 2+ ranks: rank 1 falls behind.

argv[1] = "late": rank 1 submits its all-reduce 3 s late (the inspector,
    with HPCDL_STALL_CHECK_TIME_SECONDS=1, must warn naming rank 1 and the
    tensor), then everything completes: prints 'STALL DONE'.
argv[1] = "never": rank 1 never submits (with
    HPCDL_STALL_SHUTDOWN_TIME_SECONDS set the job must end, non-zero).
argv[1] = "die": rank 1 exits abruptly while rank 0 waits in a collective.
argv[1] = "blocking": like "never", but rank 0 waits in a blocking
    all-reduce (the caller's thread, not the engine) that rank 1 never calls.
argv[1] = "object": like "blocking", with a pickled-object all-gather
    (mpi4py's, under Communicator.allgather_object: what a ZeRO optimizer's
    state_dict() called on rank 0 only waits in).
argv[1] = "idle": rank 1 sleeps 3 s before a blocking all-reduce, then 3 s
    before an async one; rank 0 waits in each and prints the CPU time its
    process used per second of waiting ('IDLE blocking 0.03', 'IDLE async ...'):
    a wait that long must back off instead of spinning.
argv[2] = "shared" (optional): the all-reduced buffer lives in node shared
    memory (Communicator.shared_buffer), as DistributedOptimizer's buckets do,
    so the work-stealing path (src_c/shared.c) is the one that waits.
"""
import os
import sys
import time

import numpy as np

from hpcdl import comm

mode = sys.argv[1]
c = comm.init()
if len(sys.argv) > 2 and sys.argv[2] == "shared":
    x = np.frombuffer(c.shared_buffer(1000 * 4), dtype=np.float32, count=1000)
    x[:] = np.arange(1000) + c.rank
else:
    x = np.arange(1000, dtype=np.float32) + c.rank
c.allreduce(x)  # everyone healthy first
if mode == "blocking":
    if c.rank == 1:
        time.sleep(120)
    c.allreduce(x)  # never completes: rank 1 is not there
if mode == "object":
    if c.rank == 1:
        time.sleep(120)
    c.allgather_object({"rank": c.rank})  # never completes either
if mode == "idle":
    for kind in ("blocking", "async"):
        if c.rank == 1:
            time.sleep(3)
        wall, cpu = time.time(), time.process_time()
        if kind == "blocking":
            c.allreduce(x)
        else:
            c.allreduce_async(x, name="grad.idle").wait()
        if c.rank == 0:
            print("IDLE %s %.3f" % (kind, (time.process_time() - cpu) / (time.time() - wall)),
                  flush=True)
    comm.print0("STALL DONE")
    sys.exit(0)
if c.rank == 1:
    if mode == "never":
        time.sleep(120)
    if mode == "die":
        time.sleep(0.5)
        os._exit(9)
    time.sleep(3)
h = c.allreduce_async(x, name="grad.late")
h.wait()
expect = 2 * (np.arange(1000) * 2 + 1)  # (i + 0) + (i + 1), twice
assert c.size != 2 or np.array_equal(x, expect), x[:4]
comm.print0("STALL DONE", x[:2])
