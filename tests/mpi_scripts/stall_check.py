"""stall_check.py - run under mpirun with 2+ ranks: rank 1 falls behind.

argv[1] = "late": rank 1 submits its all-reduce 3 s late (the inspector,
    with HPCDL_STALL_CHECK_TIME_SECONDS=1, must warn naming rank 1 and the
    tensor), then everything completes: prints 'STALL DONE'.
argv[1] = "never": rank 1 never submits (with
    HPCDL_STALL_SHUTDOWN_TIME_SECONDS set the job must end, non-zero).
argv[1] = "die": rank 1 exits abruptly while rank 0 waits in a collective.
"""
import os
import sys
import time

import numpy as np

from hpcdl import comm

mode = sys.argv[1]
c = comm.init()
x = np.arange(1000, dtype=np.float32) + c.rank
c.allreduce(x)  # everyone healthy first
if c.rank == 1:
    if mode == "never":
        time.sleep(120)
    if mode == "die":
        time.sleep(0.5)
        os._exit(9)
    time.sleep(3)
h = c.allreduce_async(x, name="grad.late")
h.wait()
comm.print0("STALL DONE", x[:2])
