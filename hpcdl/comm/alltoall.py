"""alltoall.py - all-to-all with per-destination counts (MPI_Alltoallv) for
CPU buffers of any dtype: numpy arrays and CPU torch tensors, zero-copy.

    recv, recv_counts = comm.alltoall(send, send_counts, unit=1)   # on comm.world()

The C core has no all-to-all yet, so this one collective goes to MPI through
mpi4py, on the raw bytes of the buffers. Counts are in units of `unit`
elements (hpcdl.torch passes rows of a tensor), so received counts survive
even when a unit is empty.

Rule across ranks: every rank calls it. Rank i sends send_counts[j] units to
rank j; rank j receives them as recv_counts[i], in rank order. The counts go
first (MPI_Alltoall), then one small agreement (MPI_Allreduce of an ok flag):
a rank with bad arguments, or a transfer past MPI's 2 GiB int counts, makes
every rank raise instead of leaving the others waiting.
"""
import numpy as np

from .communicator import MismatchError

INT_MAX = 2**31 - 1  # MPI counts and displacements are C ints


# ------------------------------------------------------------------ buffers
def _byte_view(buf):
    """(uint8 numpy view of buf's memory, element size) for a contiguous CPU buffer."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise TypeError("alltoall: send buffer is not C-contiguous; pass "
                            "np.ascontiguousarray(x)")
        return buf.reshape(-1).view(np.uint8), buf.itemsize
    if type(buf).__module__.startswith("torch") and hasattr(buf, "data_ptr"):
        if buf.device.type != "cpu":
            raise ValueError("alltoall: buffer is on %s; hpcdl's all-to-all takes CPU "
                             "buffers (copy with .cpu() first)" % buf.device)
        if not buf.is_contiguous():
            raise TypeError("alltoall: send buffer is not contiguous; pass t.contiguous()")
        import torch
        return buf.detach().reshape(-1).view(torch.uint8).numpy(), buf.element_size()
    raise TypeError("alltoall: buffers must be numpy arrays or torch tensors, not %s"
                    % type(buf).__name__)


def _empty_like(buf, count):
    if isinstance(buf, np.ndarray):
        return np.empty(count, dtype=buf.dtype)
    import torch
    return torch.empty(count, dtype=buf.dtype)


def _check_counts(send_counts, size, units):
    counts = [int(c) for c in send_counts]
    if len(counts) != size or any(c < 0 for c in counts) or sum(counts) != units:
        raise ValueError("alltoall: send_counts %s must be %d non-negative ints summing "
                         "to the %d units in the send buffer" % (counts, size, units))
    return counts


def _world():
    from . import world
    return world()


# --------------------------------------------------------------- collective
def alltoall(send, send_counts, unit=1, comm=None):
    """send: contiguous CPU buffer of sum(send_counts) * unit elements; comm:
    an hpcdl Communicator (default: the world). Returns (recv, recv_counts): a
    new 1-D buffer of send's kind and dtype, and the units from each rank."""
    from mpi4py import MPI
    world = comm if comm is not None else _world()
    size, err = world.size, None
    try:
        sbytes, itemsize = _byte_view(send)
        unit = int(unit)
        if unit < 0:
            raise ValueError("alltoall: unit %d must be >= 0" % unit)
        units = sbytes.size // (itemsize * unit) if unit else 0
        if unit and units * unit * itemsize != sbytes.size:
            raise ValueError("alltoall: send buffer holds %d elements, not a whole "
                             "number of %d-element units" % (sbytes.size // itemsize, unit))
        counts = _check_counts(send_counts, size, units if unit else sum(send_counts))
    except (TypeError, ValueError) as e:
        err, counts, itemsize = e, [0] * size, 1
    recv_counts = np.empty(size, dtype=np.int64)
    world.mpi.Alltoall(np.asarray(counts, dtype=np.int64), recv_counts)
    unit_bytes = unit * itemsize if err is None else 0
    ok = err is None and max(sum(counts), int(recv_counts.sum())) * unit_bytes <= INT_MAX
    flags = np.array([1 if ok else 0], dtype=np.int32)
    world.mpi.Allreduce(MPI.IN_PLACE, flags, op=MPI.MIN)
    if err is not None:
        raise err
    if not flags[0]:
        raise MismatchError("alltoall: a rank passed invalid arguments or more than 2 GiB "
                            "(see the error on that rank)" if ok else
                            "alltoall: this rank would move more than 2 GiB; split the call")
    recv_counts = [int(c) for c in recv_counts]
    recv = _empty_like(send, sum(recv_counts) * unit)
    rbytes = _byte_view(recv)[0]
    world.mpi.Alltoallv([sbytes, _layout(counts, unit_bytes), MPI.BYTE],
                        [rbytes, _layout(recv_counts, unit_bytes), MPI.BYTE])
    return recv, recv_counts


def _layout(counts, unit_bytes):
    """(byte counts, byte displacements) for Alltoallv."""
    nbytes = np.asarray(counts, dtype=np.int64) * unit_bytes
    displs = np.concatenate(([0], np.cumsum(nbytes)[:-1])).astype(np.int64)
    return nbytes.astype(np.int32), displs.astype(np.int32)
