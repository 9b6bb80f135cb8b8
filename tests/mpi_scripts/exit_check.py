"""exit_check.py - how a job ends when a script ends without hvd.shutdown().

argv[1] = "sets": registers process sets (argv[2:]: comma-separated ranks,
    e.g. 0,2), runs a collective on each and on the world, and returns
    without hvd.shutdown(). hpcdl's shutdown at exit must stop every set's
    engine and stall inspector threads before mpi4py's MPI_Finalize (with
    HPCDL_STALL_CHECK_TIME_SECONDS=0.2 a heartbeat every 50 ms makes a
    late thread meet the finalized MPI almost every run). Prints 'EXIT OK'.
argv[1] = "finalize": like "sets", ending with the script's own MPI.Finalize()
    (mpi4py): hpcdl must shut down before it.
argv[1] = "early": rank argv[2] skips the second all-reduce and returns
    normally (its hpcdl shuts down at exit); the others wait in it. The job
    must end within seconds, naming that rank, not at the stall shutdown time.
argv[1] = "early_async": the same with the all-reduce queued on the engine.
argv[1] = "early_barrier": the same with hvd.barrier() (MPI_Barrier, counted by
    the stall inspector like the core's blocking collectives).
"""
import sys
import time

import torch

import hpcdl.torch as hvd

mode = sys.argv[1]
hvd.init()
x = torch.arange(8, dtype=torch.float32) + hvd.rank()
hvd.allreduce(x, op=hvd.Sum, name="first")
if mode in ("sets", "finalize"):
    for spec in sys.argv[2:]:
        ps = hvd.add_process_set([int(r) for r in spec.split(",")])
        if ps.included():
            y = hvd.allreduce(x, op=hvd.Sum, process_set=ps)
            want = torch.arange(8, dtype=torch.float32) * len(ps.ranks) + sum(ps.ranks)
            assert torch.equal(y, want), (ps, y)
    hvd.allreduce(x, op=hvd.Sum, name="last")
    print("EXIT OK rank %d" % hvd.rank(), flush=True)
    if mode == "finalize":
        from mpi4py import MPI
        MPI.Finalize()
elif mode in ("early", "early_async", "early_barrier"):
    leaver = int(sys.argv[2])
    if hvd.rank() == leaver:
        print("rank %d leaves early" % leaver, flush=True)
        sys.exit(0)
    time.sleep(0.2)
    if mode == "early":
        hvd.allreduce(x, name="grad.skipped")
    elif mode == "early_barrier":
        hvd.barrier()
    else:
        hvd.synchronize(hvd.allreduce_async(x, name="grad.skipped"))
    print("NOT REACHED rank %d" % hvd.rank(), flush=True)
