"""alltoall.py - the buffer side of Communicator.alltoall: all-to-all with
per-destination counts (MPI_Alltoallv) for CPU buffers of any dtype, numpy
arrays and CPU torch tensors, zero-copy.

    recv, recv_counts = world.alltoall(send, send_counts, unit=1)   # a Communicator
    recv, recv_counts = comm.alltoall(send, send_counts, unit=1)    # on comm.world()

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

INT_MAX = 2**31 - 1  # MPI counts and displacements are C ints


# ------------------------------------------------------------------ buffers
def byte_view(buf):
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
        import torch  # on use: loads torch
        return buf.detach().reshape(-1).view(torch.uint8).numpy(), buf.element_size()
    raise TypeError("alltoall: buffers must be numpy arrays or torch tensors, not %s"
                    % type(buf).__name__)


def empty_like(buf, count):
    if isinstance(buf, np.ndarray):
        return np.empty(count, dtype=buf.dtype)
    import torch  # on use: loads torch
    return torch.empty(count, dtype=buf.dtype)


def _check_counts(send_counts, size, units):
    counts = [int(c) for c in send_counts]
    if len(counts) != size or any(c < 0 for c in counts) or sum(counts) != units:
        raise ValueError("alltoall: send_counts %s must be %d non-negative ints summing "
                         "to the %d units in the send buffer" % (counts, size, units))
    return counts


def prepare(send, send_counts, unit, size):
    """This rank's side, checked: (send as uint8 view, element size, counts).
    TypeError / ValueError on bad arguments (the caller still joins the
    exchange of counts, so the other ranks fail too)."""
    sbytes, itemsize = byte_view(send)
    unit = int(unit)
    if unit < 0:
        raise ValueError("alltoall: unit %d must be >= 0" % unit)
    units = sbytes.size // (itemsize * unit) if unit else 0
    if unit and units * unit * itemsize != sbytes.size:
        raise ValueError("alltoall: send buffer holds %d elements, not a whole "
                         "number of %d-element units" % (sbytes.size // itemsize, unit))
    return sbytes, itemsize, _check_counts(send_counts, size, units if unit else sum(send_counts))


def layout(counts, unit_bytes):
    """(byte counts, byte displacements) for Alltoallv."""
    nbytes = np.asarray(counts, dtype=np.int64) * unit_bytes
    displs = np.concatenate(([0], np.cumsum(nbytes)[:-1])).astype(np.int64)
    return nbytes.astype(np.int32), displs.astype(np.int32)
