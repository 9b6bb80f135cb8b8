"""hpcdl.comm - hpcdl's collectives over MPI and the process topology.

    from hpcdl import comm
    comm.init()                      # MPI (thread-multiple) + hpcdl's C core
    comm.rank(), comm.size()         # from MPI, never from env vars alone
    comm.local_rank(), comm.local_size(), comm.cross_rank(), comm.cross_size()
    comm.allreduce(x)                # in place; algorithm="auto"|"ring"|"hier"|"mpi"
    h = comm.allreduce_async(x); h.wait()
    comm.print0("only rank 0 prints this")

Topology: local = ranks sharing memory with this one (a node), or virtual
nodes of HPCDL_LOCAL_SIZE ranks; cross = ranks with the same local rank.
"""
import atexit
import os
import sys
import traceback

from ..utils import mpi_info
mpi_info.check_same_mpi()  # a core and an mpi4py on two MPIs: one error line, not a crash
from .communicator import Communicator, CoreError, Handle, MismatchError
from .alltoall import alltoall  # all-to-all with per-rank counts (mpi4py; no C core yet)
from ..utils.log import get_logger, print0, warn

__all__ = ["init", "is_initialized", "shutdown", "world", "rank", "size", "local_rank",
           "local_size", "cross_rank", "cross_size", "thread_level", "allreduce",
           "allreduce_async", "reduce_scatter", "allgather", "broadcast", "barrier",
           "Communicator", "Handle", "MismatchError", "CoreError", "print0", "warn",
           "get_logger"]

_world = None
_thread_level = None
_THREAD_NAMES = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}


def init(comm=None, local_size=None):
    """Initialises MPI if needed (asking for MPI_THREAD_MULTIPLE) and hpcdl's
    core on comm (default MPI.COMM_WORLD). Safe to call again. Returns the
    Communicator. Works whether or not mpi4py already initialised MPI."""
    global _world, _thread_level
    if _world is not None and comm is None:
        return _world
    from ..utils import horovod_env, rankenv  # HOROVOD_* settings; torchrun's names
    horovod_env.apply(say=warn if env_rank() == 0 else None)
    import mpi4py
    if "mpi4py.MPI" not in __import__("sys").modules:
        mpi4py.rc.thread_level = "multiple"  # the engine thread calls MPI too
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    _thread_level = _THREAD_NAMES.get(
        {MPI.THREAD_SINGLE: 0, MPI.THREAD_FUNNELED: 1, MPI.THREAD_SERIALIZED: 2,
         MPI.THREAD_MULTIPLE: 3}.get(provided, 0))
    _world = Communicator(comm if comm is not None else MPI.COMM_WORLD, local_size)
    disagree = comm is None and local_size is None and rankenv.disagreement(
        os.environ, _world.rank, _world.size, _world.local_rank, _world.local_size)
    if disagree:
        warn(disagree)
    if _world.size > 1 and os.environ.get("HPCDL_ABORT_ON_EXCEPTION", "1") != "0":
        sys.excepthook = _abort_on_exception
    atexit.register(_shutdown_at_exit)
    if provided != MPI.THREAD_MULTIPLE and _world.rank == 0:
        warn("MPI granted thread level %r, not 'multiple': async collectives take turns "
             "with the caller's thread and overlap less" % _thread_level)
    return _world


def _abort_on_exception(exc_type, exc, tb):
    """An uncaught exception on one rank ends the whole job (MPI_Abort): the
    other ranks would otherwise wait for it forever in their next collective.
    HPCDL_ABORT_ON_EXCEPTION=0 keeps Python's default."""
    traceback.print_exception(exc_type, exc, tb)
    if issubclass(exc_type, KeyboardInterrupt):
        return
    sys.stderr.write("[rank %d] error: uncaught %s; ending the job on every rank "
                     "(MPI_Abort)\n" % (_world.rank if _world else -1, exc_type.__name__))
    sys.stderr.flush()
    from mpi4py import MPI
    MPI.COMM_WORLD.Abort(1)


def _shutdown_at_exit():
    # collective, like MPI_Finalize that follows it: stops the engine and the
    # stall inspector's heartbeat before MPI goes away
    try:
        shutdown()
    except Exception as e:  # exit must go on
        warn("shutdown at exit failed: %s" % e)


def is_initialized():
    return _world is not None


def shutdown():
    """Collective: frees hpcdl's communicators and shared memory (MPI stays up)."""
    global _world
    if _world is not None:
        _world.close()
        _world = None


def world():
    """The Communicator made by init(); init() is called if needed."""
    return _world if _world is not None else init()


def thread_level():
    """The MPI thread level granted: 'single' | 'funneled' | 'serialized' | 'multiple'."""
    world()
    return _thread_level


def rank():
    return world().rank


def size():
    return world().size


def local_rank():
    return world().local_rank


def local_size():
    return world().local_size


def cross_rank():
    return world().cross_rank


def cross_size():
    return world().cross_size


def allreduce(send, recv=None, op="sum", algorithm="auto"):
    return world().allreduce(send, recv, op, algorithm)


def allreduce_async(send, recv=None, op="sum", algorithm="auto", name="allreduce"):
    return world().allreduce_async(send, recv, op, algorithm, name)


def reduce_scatter(send, recv=None, counts=None, op="sum", algorithm="auto"):
    return world().reduce_scatter(send, recv, counts, op, algorithm)


def allgather(send, recv=None, counts=None, algorithm="auto"):
    return world().allgather(send, recv, counts, algorithm)


def broadcast(buf, root=0, algorithm="auto"):
    return world().broadcast(buf, root, algorithm)


def barrier():
    world().barrier()


def env_rank():
    """Best guess at this process's rank before MPI is up (launcher env vars);
    only for choosing who prints, never for topology."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0
