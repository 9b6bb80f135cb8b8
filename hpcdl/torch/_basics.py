"""_basics.py - start-up, topology and reduction ops of the Horovod surface:
init / shutdown / rank / size ..., the build flags Horovod scripts query, and
the op constants with Horovod's values (Average=0, Sum=1, Adasum=2, Min=3,
Max=4, Product=5; an IntEnum, so they also carry a .name) plus the legacy
`average=` argument."""
import enum
import warnings

from .. import comm
from . import _handles, process_sets as _sets


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops, equal to Horovod's integer values."""
    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum,
                                           ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)
_COMM_OPS = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "prod"}


# --------------------------------------------------------------- start-up
def init(comm=None, process_sets=None):
    """Starts hpcdl on comm: None (MPI_COMM_WORLD), an mpi4py communicator, or
    a list of MPI_COMM_WORLD ranks (every world rank calls init with the same
    list; ranks outside it get an error). Calling it again is a no-op.
    process_sets: a list of ProcessSet to register (hvd.add_process_set for
    each, in order); "dynamic" or None: none yet."""
    from .. import comm as hcomm  # here: the parameter comm hides the module's name
    if hcomm.is_initialized():
        if comm is None:
            _add_sets(process_sets)
            return
        shutdown()
    hcomm.init(_as_mpi_comm(comm))
    _handles.clear()
    _sets.setup_after_init()
    _add_sets(process_sets)


def _add_sets(process_sets):
    if process_sets is None or process_sets == "dynamic":
        return
    for ps in process_sets:
        if ps.process_set_id is None:
            _sets.add_process_set(ps)


def _as_mpi_comm(comm_or_ranks):
    return comm.as_mpi_comm(comm_or_ranks, caller="hvd.init")


def shutdown():
    """Collective: frees hpcdl's communicators; pending handles are forgotten."""
    _handles.clear()
    if comm.is_initialized():
        _sets.clear()
    comm.shutdown()


def is_initialized():
    return comm.is_initialized()


# --------------------------------------------------------------- topology
def size():
    return _handles.world().size


def rank():
    return _handles.world().rank


def local_size():
    return _handles.world().local_size


def local_rank():
    return _handles.world().local_rank


def cross_size():
    return _handles.world().cross_size


def cross_rank():
    return _handles.world().cross_rank


def is_homogeneous():
    """True when every node runs the same number of ranks (agreed at init)."""
    return _handles.world().homogeneous


def mpi_threads_supported():
    _handles.world()
    return comm.thread_level() == "multiple"


# ------------------------------------------------------------- build flags
def mpi_built():
    return True


def mpi_enabled():
    return True


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False


def cuda_built():
    from .. import _core  # the only build fact the comm layer does not re-export
    return bool(_core.built_with_cuda())


# -------------------------------------------------------------------- ops
def handle_average_backwards_compatibility(op, average):
    """Horovod's rule: op wins; average=True/False is the deprecated spelling."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only "
                             "one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op`",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def comm_op(op):
    """Horovod op (or an hpcdl op name) -> hpcdl.comm's op name."""
    if op == Adasum:  # callers send Adasum down its own path first (adasum_ops.py)
        raise ValueError("op=Adasum is not an element-wise reduction: it runs through "
                         "hvd.allreduce or DistributedOptimizer(op=hvd.Adasum), not here")
    if isinstance(op, str):
        return op
    if op not in _COMM_OPS:
        raise ValueError("unknown reduction op %r; use hvd.Average, hvd.Sum, hvd.Min, "
                         "hvd.Max or hvd.Product" % (op,))
    return _COMM_OPS[op]
