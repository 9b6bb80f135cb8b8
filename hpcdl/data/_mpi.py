"""_mpi.py - the few MPI facts hpcdl.data needs: which communicator this job
has (if any), and agreement on errors, so that a failure on one rank becomes
the same error on every rank instead of a hang in the next collective.

hpcdl.data works without MPI: a plain process is a job of one rank, and no
MPI starts unless the process was launched as a job. It takes mpi4py
communicators (a user's, or the job's: hpcdl.comm's world when it is up), so
this module is hpcdl.data's one door to MPI (tests/test_architecture.py
allows it by name). The rule for "did any rank fail" is hpcdl's one rule
(utils/agree.py), shared with hpcdl.comm.
"""
import sys

from .. import comm as hcomm  # importing it starts no MPI; init() does
from ..utils.agree import raise_on_every_rank
from ..utils.launch import inside_parallel_job
from .manifest import DataError


def job_comm():
    """The job's mpi4py communicator: hpcdl.comm's world once initialised,
    MPI.COMM_WORLD when MPI is up or this process was started by mpirun/srun,
    else None (a plain process)."""
    if hcomm.is_initialized():
        return hcomm.world().mpi
    if "mpi4py.MPI" in sys.modules:  # imported (so MPI may be up) by someone else
        from mpi4py import MPI  # on use: loads MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD
    if inside_parallel_job():
        from mpi4py import MPI  # initialises MPI
        return MPI.COMM_WORLD
    return None


def rank_and_size(comm):
    return (comm.rank, comm.size) if comm is not None else (0, 1)


def node_comm(comm):
    """Ranks of comm that share this node's memory (and its /dev/shm, $TMPDIR)."""
    from mpi4py import MPI  # on use: loads MPI
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)


def agree(comm, error):
    """Collective over comm: every rank passes its error (an exception or
    None); if any rank had one, every rank raises DataError with the first
    failing rank's message. Without MPI, re-raises the error."""
    if comm is None or comm.size == 1:
        if error is not None:
            raise error
        return
    raise_on_every_rank(comm.allgather, comm.rank, error, DataError)


def on_root(comm, fn):
    """Collective: fn() runs on rank 0 only; its DataError or OSError is raised
    on every rank, its result is returned on every rank."""
    rank = comm.rank if comm is not None else 0
    result, error = None, None
    if rank == 0:
        try:
            result = fn()
        except (DataError, OSError) as e:
            error = e
    agree(comm, error)
    if comm is not None and comm.size > 1:
        result = comm.bcast(result, root=0)
    return result
