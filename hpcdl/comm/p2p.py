"""p2p.py - point-to-point messages between ranks of a Communicator: the
isend / irecv that torch.distributed's send, recv, batch_isend_irecv (and so
pipelining) need.

    link = p2p.PointToPoint(world)       # collective over world's ranks (a Dup)
    req = link.isend(tensor, dest=1, tag=0)
    req = link.irecv(tensor, source=0, tag=0)
    req.poll() -> bool; req.wait()

The C core has no point-to-point, so these go to MPI (MPI_Isend / MPI_Irecv
on the raw bytes of contiguous CPU buffers, any dtype) through mpi4py, on a
duplicate of the Communicator's MPI communicator: they never match the
Communicator's own messages (adasum, object collectives) nor the engine's.

Rule across ranks: a send to rank d with tag t matches a receive on d from
this rank with tag t, in posting order; sizes must agree (a receive of fewer
bytes than sent fails with MPI's truncation error). Waits are not counted by
the stall inspector, which matches collectives across all ranks: a message
concerns two ranks only.
"""
from mpi4py import MPI

from .alltoall import byte_view  # the raw bytes of a contiguous CPU buffer


class Request:
    """One message in flight: poll() -> bool, wait()."""

    def __init__(self, req, buf):
        self._req, self._buf = req, buf  # buf: kept alive until done
        self._done = False

    def poll(self):
        if not self._done:
            self._done = bool(self._req.Test())
        return self._done

    def wait(self):
        if self._done:
            return
        self._req.Wait()
        self._done, self._buf = True, None


class PointToPoint:
    """isend / irecv over a duplicate of communicator's MPI communicator
    (rank numbers: communicator's). Creating it is collective; close() too."""

    def __init__(self, communicator):
        self.rank, self.size = communicator.rank, communicator.size
        self._mpi = communicator.mpi.Dup()

    def _check_peer(self, peer, what):
        if not 0 <= int(peer) < self.size:
            raise ValueError("%s: rank %d is not in 0..%d" % (what, peer, self.size - 1))
        if int(peer) == self.rank:
            raise ValueError("%s: rank %d sending to itself; copy the tensor instead"
                             % (what, peer))
        return int(peer)

    def isend(self, buf, dest, tag=0):
        """Starts sending buf (contiguous CPU numpy array or torch tensor)."""
        dest = self._check_peer(dest, "send")
        data, _ = byte_view(buf)
        return Request(self._mpi.Isend([data, MPI.BYTE], dest, int(tag)), (buf, data))

    def irecv(self, buf, source, tag=0):
        """Starts receiving into buf (contiguous CPU numpy array or torch tensor)."""
        source = self._check_peer(source, "recv")
        data, _ = byte_view(buf)
        return Request(self._mpi.Irecv([data, MPI.BYTE], source, int(tag)), (buf, data))

    def close(self):
        """Collective over the ranks: frees the duplicate communicator."""
        if self._mpi is not None:
            self._mpi.Free()
            self._mpi = None
