"""hpcdl.comm - hpcdl's collectives over MPI and the process topology.

    from hpcdl import comm
    comm.init()                      # MPI (thread-multiple) + hpcdl's C core
    comm.rank(), comm.size()         # from MPI, never from env vars alone
    comm.local_rank(), comm.local_size(), comm.cross_rank(), comm.cross_size()
    comm.allreduce(x)                # in place; algorithm="auto"|"ring"|"hier"|"mpi"
    h = comm.allreduce_async(x); h.wait()
    comm.allgather_object(obj), comm.bcast_object(obj), comm.gather_object(obj)
    comm.any_rank(flag)              # the largest flag over ranks: truthy if any set it
    comm.raise_if_any(error, exc)    # one rank failed -> every rank raises
    comm.wtime()                     # MPI_Wtime, the clock the C engine stamps with
    comm.print0("only rank 0 prints this")
    try: ...                         # a lost rank under ULFM (docs/fault-tolerance.md):
    except comm.RanksLostError:      #   every survivor raises it, then
        comm.shrink()                #   goes on over the survivors

The one door to MPI for everything above it: buffer collectives go to the C
core, object collectives (pickled Python values, mpi4py's lowercase names)
to mpi4py; callers never reach for the mpi4py communicator themselves.

Topology: local = ranks sharing memory with this one (a node), or virtual
nodes of HPCDL_LOCAL_SIZE ranks; cross = ranks with the same local rank.

Importing hpcdl.comm does not start MPI: init() does (or the first use of
Communicator, Handle or wtime, which load the C core, and the core loads
mpi4py.MPI); CoreError and MismatchError are plain Python (errors.py). Before the core loads, its MPI is
checked against mpi4py's: a core and an mpi4py on two MPIs give one error
line, not a crash.
"""
import atexit
import os
import sys

import mpi4py

from ..utils import causes, horovod_env, log, mpi_info, rankenv, settings
from ..utils.launch import env_rank  # noqa: F401 - the launcher's rank, before MPI is up
from ..utils.log import get_logger, print0, warn
from . import fault
from .errors import CoreError, MismatchError, RanksLostError

__all__ = ["init", "is_initialized", "shutdown", "world", "rank", "size", "local_rank",
           "local_size", "cross_rank", "cross_size", "thread_level", "allreduce",
           "allreduce_async", "reduce_scatter", "allgather", "broadcast", "barrier",
           "alltoall", "allgather_object", "bcast_object", "gather_object", "any_rank",
           "raise_if_any", "wtime", "as_mpi_comm", "Communicator", "Handle", "MismatchError",
           "CoreError", "RanksLostError", "shrink", "print0", "warn", "get_logger"]

_world = None
_lost_seen = False  # shrink() ran: a rank was lost in this job
FINALIZE_AFTER_LOSS_S = 10.0  # then MPI_Finalize gets this long (src_c/fault.c)
_thread_level = None
_THREAD_NAMES = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}
_LAZY = ("Communicator", "Handle", "wtime")  # communicator.py's
_core_module = None


def _mpi():
    """mpi4py.MPI: importing it starts MPI (mpi4py's rc.initialize), asking for
    MPI_THREAD_MULTIPLE unless the caller imported it first (the engine thread
    calls MPI too)."""
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI  # on use: loads MPI
    return MPI


def _communicator():
    """hpcdl.comm.communicator (the C core behind it), loaded on first use
    after checking that the core and mpi4py are built on one MPI."""
    global _core_module
    if _core_module is None:
        mpi_info.check_same_mpi(_mpi())
        # communicator.py's `from . import alltoall` means the submodule, but
        # the package's alltoall is the function below once this file has run:
        # out of the way while it loads, then back
        function = globals().pop("alltoall")
        try:
            from . import communicator
        finally:
            globals()["alltoall"] = function
        _core_module = communicator
    return _core_module


def __getattr__(name):
    """Communicator, Handle, wtime: on first use."""
    if name in _LAZY:
        return getattr(_communicator(), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def init(comm=None, local_size=None):
    """Initialises MPI if needed (asking for MPI_THREAD_MULTIPLE) and hpcdl's
    core on comm (default MPI.COMM_WORLD). Safe to call again. Returns the
    Communicator. Works whether or not mpi4py already initialised MPI."""
    global _world, _thread_level
    if _world is not None and comm is None:
        return _world
    horovod_env.apply(say=warn if env_rank() == 0 else None)
    bad = settings.check_environment()  # before the core reads any of them
    if bad:
        raise settings.SettingError("\n".join(bad))
    MPI = _mpi()
    Communicator = _communicator().Communicator
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    _thread_level = _THREAD_NAMES.get(
        {MPI.THREAD_SINGLE: 0, MPI.THREAD_FUNNELED: 1, MPI.THREAD_SERIALIZED: 2,
         MPI.THREAD_MULTIPLE: 3}.get(provided, 0))
    _world = Communicator(comm if comm is not None else MPI.COMM_WORLD, local_size)
    log.set_rank(_world.rank)  # one rank-0 printer: the logger now knows this rank
    disagree = comm is None and local_size is None and rankenv.disagreement(
        os.environ, _world.rank, _world.size, _world.local_rank, _world.local_size)
    if disagree:
        warn(disagree)
    if _world.size > 1 and settings.get("HPCDL_ABORT_ON_EXCEPTION"):
        sys.excepthook = _abort_on_exception
    atexit.register(_shutdown_at_exit)
    _shutdown_before_finalize(MPI)
    if fault.in_force() and _world.rank == 0:  # the job asked for ULFM: say if it has it
        print0(fault.path_line(_world.size))
    if provided != MPI.THREAD_MULTIPLE and _world.rank == 0:
        warn("MPI granted thread level %r, not MPI_THREAD_MULTIPLE: async collectives take "
             "turns with the caller's thread and overlap less. Fix: let hpcdl start MPI (no "
             "mpi4py.rc.thread_level or MPI_Init below 'multiple' before comm.init()), or use "
             "an MPI built with it (Open MPI: --enable-mpi-thread-multiple; MPICH: "
             "--enable-threads=multiple)" % _thread_level)
    return _world


def _abort_on_exception(exc_type, exc, tb):
    """An uncaught exception on one rank ends the whole job (MPI_Abort): the
    other ranks would otherwise wait for it forever in their next collective.
    HPCDL_ABORT_ON_EXCEPTION=0 keeps Python's default. An error of hpcdl's own
    goes to the launcher as one cause line when it asked (utils/causes.py)."""
    causes.report(exc_type, exc, tb, _world.rank if _world else -1)
    if issubclass(exc_type, KeyboardInterrupt):
        return
    sys.stderr.write("[rank %d] error: uncaught %s; ending the job on every rank "
                     "(MPI_Abort)\n" % (_world.rank if _world else -1, exc_type.__name__))
    sys.stderr.flush()
    _mpi().COMM_WORLD.Abort(1)


def _shutdown_at_exit():
    # collective, like MPI_Finalize that follows it: stops the engine and the
    # stall inspector's heartbeat before MPI goes away (a world that lost a
    # rank and was not shrunk: locally, src_c/fault.c)
    global _lost_seen
    _lost_seen = _lost_seen or (_world is not None and _world.is_lost())
    try:
        shutdown()
    except Exception as e:  # exit must go on
        warn("shutdown at exit failed: %s" % e)
    if _lost_seen:  # Open MPI 5's MPI_Finalize may wait for the dead rank (fault.c)
        sys.stdout.flush()
        sys.stderr.flush()
        _communicator()._core.exit_watchdog(FINALIZE_AFTER_LOSS_S)


def _shutdown_before_finalize(MPI):
    """A script's own MPI.Finalize() (mpi4py) shuts hpcdl down first, as the
    shutdown at exit does before mpi4py's: the engine and stall inspector
    threads, and process sets' communicators, must not outlive MPI."""
    if getattr(MPI.Finalize, "_hpcdl", False):
        return
    finalize = MPI.Finalize

    def shutdown_then_finalize():
        _shutdown_at_exit()
        return finalize()
    shutdown_then_finalize._hpcdl = True
    MPI.Finalize = shutdown_then_finalize


def is_initialized():
    return _world is not None


def shutdown():
    """Collective: frees hpcdl's communicators and shared memory (MPI stays up)."""
    global _world
    if _world is not None:
        _world.close()
        _world = None
        log.set_rank(None)


def shrink():
    """Collective over the surviving ranks after a RanksLostError (ULFM):
    the world becomes Communicator.shrink() of the old one (the survivors,
    in their old order, renumbered from 0); returns it. Its .lost lists the
    ranks lost and .shrink_s the seconds the shrink took."""
    global _world, _lost_seen
    _world = world().shrink()
    _lost_seen = True
    log.set_rank(_world.rank)
    return _world


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


def alltoall(send, send_counts, unit=1, comm=None):
    """Communicator.alltoall on comm (default: the world)."""
    return (comm if comm is not None else world()).alltoall(send, send_counts, unit)


# ------------------------------------------- objects, agreement and the clock
def allgather_object(obj):
    return world().allgather_object(obj)


def bcast_object(obj, root=0):
    return world().bcast_object(obj, root)


def gather_object(obj, root=0):
    return world().gather_object(obj, root)


def any_rank(flag):
    return world().any_rank(flag)


def raise_if_any(error, exc_type=RuntimeError):
    return world().raise_if_any(error, exc_type)


def as_mpi_comm(comm_or_ranks, caller="init"):
    """None, an mpi4py communicator, or a list of MPI_COMM_WORLD ranks (every
    world rank passes the same list) -> an mpi4py communicator for init(), or
    None. ValueError on a world rank outside the list; caller names the call
    in the message."""
    if comm_or_ranks is None:
        return None
    MPI = _mpi()  # communicator set-up only; collectives go through a Communicator
    if isinstance(comm_or_ranks, (list, tuple, range)):
        ranks = [int(r) for r in comm_or_ranks]
        sub = MPI.COMM_WORLD.Create(MPI.COMM_WORLD.Get_group().Incl(ranks))
        if sub == MPI.COMM_NULL:
            raise ValueError("%s(comm=%s): world rank %d is not in the list"
                             % (caller, ranks, MPI.COMM_WORLD.Get_rank()))
        return sub
    if not isinstance(comm_or_ranks, MPI.Comm):
        raise TypeError("%s(comm=...) takes an mpi4py communicator or a list of "
                        "ranks, not %s" % (caller, type(comm_or_ranks).__name__))
    return comm_or_ranks
