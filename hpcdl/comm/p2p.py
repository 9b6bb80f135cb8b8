"""p2p.py - point-to-point messages between ranks of a Communicator: the
isend / irecv that torch.distributed's send, recv, batch_isend_irecv (and so
pipelining) need.

    link = p2p.PointToPoint(world)       # collective over world's ranks (a Dup)
    req = link.isend(tensor, dest=1, tag=0)
    req = link.irecv(tensor, source=0, tag=0)   # source=None: any rank
    req.poll() -> bool; req.wait(); req.source  # the sender's rank, once done
    link.monitored_barrier(timeout_s=30)       # BarrierTimeout names who is missing

The C core has no point-to-point, so these go to MPI (MPI_Isend / MPI_Irecv
on the raw bytes of contiguous CPU buffers, any dtype) through mpi4py, on a
duplicate of the Communicator's MPI communicator: they never match the
Communicator's own messages (adasum, object collectives) nor the engine's.

Rule across ranks: a send to rank d with tag t matches a receive on d from
this rank with tag t, in posting order; sizes must agree (a receive of fewer
bytes than sent fails with MPI's truncation error). Waits are not counted by
the stall inspector, which matches collectives across all ranks: a message
concerns two ranks only.

monitored_barrier (torch's gloo-only dist.monitored_barrier): every other
rank sends rank 0 a token and waits for its verdict; rank 0 waits for the
tokens up to the timeout, then tells the ranks that came whether everyone
did. Ranks that did not come are named in a BarrierTimeout on rank 0 and on
every rank that came; a rank whose verdict does not come in time (rank 0
itself is stuck) raises one naming rank 0. It runs on a second duplicate
communicator, one tag per barrier, so a late token never counts for a later
barrier (rank 0 keeps its receive posted until close(), so the late token
is taken and not left unmatched).
"""
import time

from mpi4py import MPI

from ..utils.backoff import Backoff
from .alltoall import byte_view  # the raw bytes of a contiguous CPU buffer


class BarrierTimeout(RuntimeError):
    """monitored_barrier: ranks did not arrive in time (named in the message)."""


class Request:
    """One message in flight: poll() -> bool, wait(); source: the sender's
    rank once done (a receive; for a send, None)."""

    def __init__(self, req, buf, receive=False):
        self._req, self._buf = req, buf  # buf: kept alive until done
        self._status = MPI.Status() if receive else None
        self._done = False

    @property
    def receive(self):
        return self._status is not None

    def poll(self):
        if not self._done:
            self._done = bool(self._req.Test(self._status))
        return self._done

    def wait(self):
        if self._done:
            return
        self._req.Wait(self._status)
        self._done, self._buf = True, None

    @property
    def source(self):
        if self._status is None:
            return None
        self.wait()
        return self._status.Get_source()

    def cancel(self):
        """Withdraws a receive that has not matched (MPI_Cancel)."""
        if not self.poll():
            self._req.Cancel()
            self._req.Wait()
            self._done = True


class PointToPoint:
    """isend / irecv over a duplicate of communicator's MPI communicator
    (rank numbers: communicator's). Creating it is collective; close() too."""

    def __init__(self, communicator):
        self.rank, self.size = communicator.rank, communicator.size
        self._mpi = communicator.mpi.Dup()
        self._ctl = communicator.mpi.Dup()  # monitored_barrier's messages
        self._barriers = 0
        self._stale = []  # Requests of timed-out barriers: late tokens, verdicts sent

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
        """Starts receiving into buf (contiguous CPU numpy array or torch
        tensor); source None: from whichever rank sends first (MPI_ANY_SOURCE;
        the request's .source says which)."""
        source = MPI.ANY_SOURCE if source is None else self._check_peer(source, "recv")
        data, _ = byte_view(buf)
        return Request(self._mpi.Irecv([data, MPI.BYTE], source, int(tag)), (buf, data),
                       receive=True)

    def monitored_barrier(self, timeout_s, wait_all_ranks=False):
        """A barrier that gives up after timeout_s seconds and names the ranks
        that did not arrive (BarrierTimeout): all of them with wait_all_ranks,
        else the lowest one (torch's fail-fast default)."""
        if not timeout_s > 0:
            raise ValueError("monitored_barrier: timeout must be > 0 seconds, not %r"
                             % (timeout_s,))
        self._barriers += 1
        tag = self._barriers % 32768  # MPI guarantees tags up to 32767
        deadline = time.monotonic() + timeout_s
        if self.size == 1:
            return
        if self.rank != 0:
            return self._barrier_member(tag, deadline, timeout_s)
        tokens = {r: self._ctl_recv(bytearray(1), r, tag) for r in range(1, self.size)}
        _poll_until(lambda: all(q.poll() for q in tokens.values()), deadline)
        missing = [r for r, q in tokens.items() if not q.poll()]
        self._tidy()  # a late token still lands in its receive (cancelled at close)
        self._stale += [tokens[r] for r in missing]
        named = missing if wait_all_ranks else missing[:1]
        verdict = bytearray(len(named).to_bytes(4, "little") + b"".join(
            r.to_bytes(4, "little") for r in named)).ljust(4 * self.size, b"\0")
        self._stale += [Request(self._ctl.Isend([verdict, MPI.BYTE], r, tag), verdict)
                        for r in range(1, self.size) if r not in missing]
        if named:
            raise BarrierTimeout(_missing_text(named, timeout_s, self.size, wait_all_ranks))

    def _tidy(self):
        """Forgets the earlier barriers' messages that are done: verdicts sent
        and tokens received after their barrier timed out (each barrier has its
        own tag, so a late one never counts for a later barrier)."""
        self._stale = [q for q in self._stale if not q.poll()]

    def _ctl_recv(self, buf, source, tag):
        return Request(self._ctl.Irecv([buf, MPI.BYTE], source, tag), buf, receive=True)

    def _barrier_member(self, tag, deadline, timeout_s):
        self._tidy()
        token = bytearray(1)
        self._stale.append(Request(self._ctl.Isend([token, MPI.BYTE], 0, tag), token))
        verdict = bytearray(4 * self.size)
        answer = self._ctl_recv(verdict, 0, tag)
        _poll_until(answer.poll, deadline)
        if not answer.poll():
            answer.cancel()
            raise BarrierTimeout(
                "[rank %d] monitored_barrier: no answer from rank 0 within %g s (rank 0 has "
                "not reached the barrier, or is still waiting there for other ranks)"
                % (self.rank, timeout_s))
        count = int.from_bytes(verdict[:4], "little")
        named = [int.from_bytes(verdict[4 + 4 * i:8 + 4 * i], "little") for i in range(count)]
        if named:
            raise BarrierTimeout("[rank %d] %s" % (self.rank, _missing_text(
                named, timeout_s, self.size, None)))

    def close(self):
        """Collective over the ranks: frees the duplicate communicators."""
        if self._mpi is not None:
            for q in self._stale:
                if q.receive:
                    q.cancel()  # a token that never came (a no-op once it came)
            self._mpi.Free()
            self._ctl.Free()
            self._mpi = self._ctl = None


def _poll_until(done, deadline):
    """Polls done() (sleeping 0.1-20 ms between tries) until it is True or the deadline."""
    Backoff(spins=0, first_s=1e-4, max_s=0.02).poll_until(done, deadline)


def _missing_text(named, timeout_s, size, wait_all_ranks):
    which = "rank %d" % named[0] if len(named) == 1 else "ranks %s" % named
    more = " (the first one missing; wait_all_ranks=True names all)" \
        if wait_all_ranks is False else ""
    return ("monitored_barrier: %s of %d did not reach the barrier within %g s%s"
            % (which, size, timeout_s, more))
