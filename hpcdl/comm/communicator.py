"""communicator.py - Communicator: an mpi4py communicator plus hpcdl's C core.

Buffers follow MPI's (send, recv) convention: recv=None means in place.
Every call is collective; every rank must make the same calls in the same
order. A buffer that fails validation on one rank (wrong dtype, not
contiguous, wrong device) raises TypeError / ValueError there, and, while the
agreement check is on, makes the same call fail with MismatchError on every
other rank instead of leaving them waiting.

Names follow mpi4py's case rule by what travels: allreduce / allgather /
broadcast / alltoall move buffers (numpy arrays, tensors) without copies;
allgather_object / bcast_object / gather_object move Python objects
(pickled). any_rank and raise_if_any are the agreements every layer needs
("did any rank ask to stop / overflow / fail?"); wtime is MPI_Wtime.

A lost rank (MPI's fault tolerance, ULFM: Open MPI 5 under `hpcdl run
--fault-tolerant`) makes the running collective, and every later one, raise
RanksLostError on every survivor; shrink() then gives a Communicator over the
survivors with its core built anew in these processes (docs/fault-tolerance.md).
"""
import contextlib

import numpy as np
from mpi4py import MPI

from . import adasum as _adasum
from . import alltoall as _a2a, buffers, fault
from ._types import ALGORITHMS, DTYPES, OPS, algo_code, op_code
from .. import _core
from ..utils import settings
from ..utils.agree import raise_on_every_rank

from numpy import ndarray as _ndarray

# fields of each collective's agreement-check signature (src_c/agree.c)
SIG_FIELDS = {"allgather": 4, "allreduce": 6}

MismatchError = _core.MismatchError  # hpcdl/comm/errors.py's, the core's too
CoreError = _core.CoreError
RanksLostError = _core.RanksLostError
# MPI's error classes of a lost peer (ULFM); absent from MPIs without it
_LOST_CLASSES = {c for c in (getattr(MPI, n, None) for n in (
    "ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED"))
    if isinstance(c, int) and c != getattr(MPI, "UNDEFINED", -32766)}
wtime = MPI.Wtime  # seconds; the clock the C engine stamps its timeline with


class Handle:
    """An asynchronous all-reduce in flight: poll() -> bool, wait() -> result."""

    def __init__(self, ctx, handle, keep, result, name):
        self._ctx, self._h, self._keep, self._result = ctx, handle, keep, result
        self.name = name
        self._done = False

    def poll(self):
        """True once the operation has finished (then wait() returns at once)."""
        return self._done or self._ctx.poll(self._h)

    def wait(self):
        """Blocks until done (GIL released); returns the result buffer."""
        if not self._done:
            self._done = True
            try:
                self._ctx.wait(self._h)
            finally:
                self._keep = None  # buffers may be freed now
        return self._result


def _split_where(args):
    """A prepared all-reduce ends with its buffers' Where: (device, stream) for the core."""
    if args and isinstance(args[-1], buffers.Where):
        return args[:-1], (args[-1].device, args[-1].stream)
    return args, ()


class Communicator:
    """hpcdl collectives over an mpi4py communicator.

    local_size: ranks per (virtual) node; None reads HPCDL_LOCAL_SIZE, 0 or
    unset splits by shared memory (the real node).
    """

    def __init__(self, mpi_comm, local_size=None):
        if local_size is None:
            local_size = settings.get("HPCDL_LOCAL_SIZE")
        self.mpi = mpi_comm
        self.lost = []  # after shrink(): the ranks of the communicator before it that were lost
        self._children = []  # made by split(), not yet freed
        self._ctx = _core.Context(mpi_comm, local_size)
        (self.rank, self.size, self.local_rank, self.local_size,
         self.cross_rank, self.cross_size) = self._ctx.topology()
        # every node runs the same number of ranks (Horovod's is_homogeneous)
        self.homogeneous = len(set(mpi_comm.allgather(self.local_size))) == 1
        self.check = settings.get("HPCDL_CHECK")
        self._ctx.set_check(self.check)
        chunk = settings.get("HPCDL_CHUNK_BYTES")
        if chunk:
            self._ctx.set_chunk_bytes(chunk)
        self._cuda = _core.built_with_cuda()
        self._ulfm = _core.built_with_ulfm() and fault.in_force()  # ULFM in force

    # ------------------------------------------------------------------ utils
    @contextlib.contextmanager
    def _validating(self, call, nsig=5):
        """Local argument checks; on failure the other ranks are told (through
        the agreement check) so that they fail too instead of waiting."""
        try:
            yield
        except (TypeError, ValueError):
            if self.check:
                try:
                    self._ctx.report_invalid(call, nsig)
                except _core.MismatchError:
                    pass
            raise

    def _describe(self, buf, what, device_ok=False):
        # only all-reduce has a device path in the core so far
        return buffers.describe(buf, what, cuda_ok=self._cuda and device_ok)

    def set_check(self, enabled):
        """Turn the cross-rank agreement check on or off (HPCDL_CHECK=0 at start)."""
        self.check = bool(enabled)
        self._ctx.set_check(self.check)

    def choose_algorithm(self, nbytes):
        """The algorithm 'auto' picks for an all-reduce of nbytes."""
        return self._ctx.choose_algo(int(nbytes))

    def barrier(self):
        with self._tracked("barrier"):  # a rank that never comes is named
            self.mpi.Barrier()

    def close(self):
        """Collective: frees communicators, shared memory and the engine; first
        those split() made from this one and not yet freed (each over its own
        ranks, in the order they were made, which is the same on every rank):
        their engine and stall threads must stop before MPI_Finalize, which
        follows the shutdown at exit."""
        for child in list(self._children):
            child.free()
        self._ctx.close()

    # ------------------------------------------------------ sub-communicators
    def split(self, ranks):
        """Collective over every rank of this communicator, all passing the
        same ranks (of this communicator): a new Communicator over those
        ranks, in ascending order, with its own core context and engine (so
        ring, hierarchical and shared-memory algorithms run inside it, and
        the agreement check covers its ranks only). Returns None on the ranks
        outside. ValueError on every rank for an empty list, a repeated rank,
        a rank out of range, or ranks that passed different lists.
        Free it with free() (collective over its own ranks)."""
        try:
            mine, err = sorted(int(r) for r in ranks), None
        except (TypeError, ValueError) as e:
            mine, err = None, e
        every = self.allgather_object(mine)
        if err is not None:
            raise ValueError("split: ranks must be a list of ints, got %r" % (ranks,))
        if any(r != every[0] for r in every):
            raise ValueError("split: ranks passed different lists: %s" % ", ".join(
                "rank %d: %s" % (i, r) for i, r in enumerate(every)))
        if not mine or len(set(mine)) != len(mine) or mine[0] < 0 or mine[-1] >= self.size:
            raise ValueError("split: ranks %s must be a non-empty list of distinct ranks in "
                             "0..%d" % (mine, self.size - 1))
        sub = self.mpi.Create(self.mpi.Get_group().Incl(mine))
        if sub == MPI.COMM_NULL:
            return None
        virtual = settings.get("HPCDL_LOCAL_SIZE")
        child = Communicator(sub, 0 if virtual and len(mine) % virtual else None)
        child._split_from = self  # free() gives the MPI communicator back
        self._children.append(child)  # close() frees it if the user does not
        return child

    def free(self):
        """Collective over this communicator's ranks: close(), and for one made
        by split(), free its MPI communicator."""
        self.close()
        parent = getattr(self, "_split_from", None)
        if parent is not None:
            self.mpi.Free()
            self._split_from = None
            if self in parent._children:
                parent._children.remove(self)

    # ------------------------------------------------------- a lost rank (ULFM)
    def shrink(self):
        """Collective over the surviving ranks, after a RanksLostError (ULFM
        only): revoke this communicator (so every survivor leaves whatever it
        waits in), shrink it to the survivors (MPI_Comm_shrink) and agree that
        every survivor holds the same result (MPI_Comm_agree). Returns a new
        Communicator over the survivors, ranked in their old order, whose core
        (teams, shared-memory segments, engine, stall inspector) is built anew
        in these processes; its .lost lists the ranks of this one that were
        lost and .shrink_s the seconds it took. This communicator (and those
        split() from it) is abandoned without communication: its MPI objects
        are left to MPI_Finalize. Shared buffers (shared_buffer) of this one
        stay readable but are no longer shared: make new ones."""
        if not self._ulfm:
            raise CoreError("shrink() needs MPI's fault tolerance (ULFM: Open MPI 5 with its "
                            "ftmpi extension, the job started by hpcdl run --fault-tolerant); "
                            "here a lost rank ends the job (docs/fault-tolerance.md)")
        t0 = MPI.Wtime()
        for c in [*self._children, self]:
            try:
                c._ctx.revoke("shrink")
            except CoreError:
                pass  # closed already
        try:
            self.mpi.Revoke()
        except MPI.Exception:
            pass  # revoked already (a peer got there first)
        survivors = self.mpi.Shrink()
        if not survivors.Agree(1):
            raise RanksLostError("shrink: the survivors did not agree (another rank failed "
                                 "during the shrink?); call shrink() again", ranks=[])
        old_ranks = MPI.Group.Translate_ranks(survivors.Get_group(), list(range(
            survivors.Get_size())), self.mpi.Get_group())
        for c in [*self._children, self]:
            c._ctx.abandon()
        self._children = []
        virtual = settings.get("HPCDL_LOCAL_SIZE")
        new = Communicator(survivors, 0 if virtual and survivors.Get_size() % virtual else None)
        new.lost = sorted(set(range(self.size)) - set(old_ranks))
        new.shrink_s = MPI.Wtime() - t0
        return new

    def is_lost(self):
        """True once a rank of this communicator was lost (a RanksLostError was
        raised, ULFM) or shrink() revoked it; then close() frees it locally."""
        return self._ctx.is_lost()

    def _lost_object_call(self, what, exc):
        """RanksLostError for an mpi4py call that failed with a ULFM class:
        the core's context is revoked too, so the engine's work fails the
        same way."""
        ranks, t0 = [], MPI.Wtime()
        while not ranks and MPI.Wtime() - t0 < 2:  # the runtime's notice: milliseconds
            try:
                failed = self.mpi.Get_failed()
                ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())),
                                                  self.mpi.Get_group())
            except (MPI.Exception, AttributeError, NotImplementedError):
                break
            MPI.COMM_SELF.Iprobe()  # MPI's progress delivers it
        self._ctx.revoke("a peer was lost during %s" % what)
        who = ("rank %d" % ranks[0] if len(ranks) == 1 else
               "ranks %s" % ", ".join(map(str, ranks)) if ranks else "a peer rank")
        return RanksLostError("%s lost during %s on rank %d (MPI: %s). Hint: the other ranks "
                              "got the same error; they can go on without the lost ranks "
                              "(Communicator.shrink(), docs/fault-tolerance.md)."
                              % (who, what, self.rank, exc), ranks=ranks)

    # ------------------------------------------------------------ collectives
    # Each collective has a _prep_* that validates and returns the core's
    # arguments plus the result; the blocking and the _async form share it.

    def _run(self, call, what, prep, async_name=None):
        """Blocking (async_name None) or queued run of one prepared collective."""
        if async_name is None:
            with self._validating(what, SIG_FIELDS.get(what, 5)):
                args, result, keep = prep()
            args, where = _split_where(args)
            with buffers.device_guard(where[0] if where else -1):
                getattr(self._ctx, call)(*args, *where)
            return result
        try:
            args, result, keep = prep()
        except (TypeError, ValueError):
            if self.check:  # the engine joins the agreement check as invalid
                try:
                    self._ctx.wait(self._ctx.async_invalid(what, async_name))
                except _core.MismatchError:
                    pass
            raise
        args, where = _split_where(args)
        with buffers.device_guard(where[0] if where else -1):
            h = getattr(self._ctx, call + "_async")(*args, async_name, *where)
        return Handle(self._ctx, h, keep, result, async_name)

    def allreduce(self, send, recv=None, op="sum", algorithm="auto"):
        """recv[i] = op over ranks of send[i]; in place when recv is None. Returns recv."""
        if type(send) is _ndarray and (recv is None or type(recv) is _ndarray):
            # numpy fast path: the binding reads dtype, size and layout itself
            o, a = OPS.get(op), ALGORITHMS.get(algorithm)
            if o is not None and a is not None:
                try:
                    return self._ctx.allreduce_array(send, recv, o, a)
                except (TypeError, ValueError):
                    pass  # raised before any MPI call: the full path explains it
        return self._run("allreduce", "allreduce",
                         lambda: self._prep_allreduce(send, recv, op, algorithm))

    def allreduce_async(self, send, recv=None, op="sum", algorithm="auto", name="allreduce"):
        """Queues an all-reduce on the engine thread; returns a Handle."""
        return self._run("allreduce", "allreduce",
                         lambda: self._prep_allreduce(send, recv, op, algorithm), name)

    def _prep_allreduce(self, send, recv, op, algorithm):
        o, a = op_code(op), algo_code(algorithm)
        s = self._describe(send, "send buffer", device_ok=True)
        r = s if recv is None else self._describe(recv, "recv buffer", device_ok=True)
        if s.count != r.count or s.dtype != r.dtype:
            raise ValueError("allreduce: send has %d %s elements but recv has %d %s"
                             % (s.count, s.dtype, r.count, r.dtype))
        w = buffers.where(s, r)  # the core never guesses host or device
        return (s.ptr, r.ptr, s.count, DTYPES[s.dtype], o, a, w), r.obj, (s.obj, r.obj)

    def reduce_scatter(self, send, recv=None, counts=None, op="sum", algorithm="auto"):
        """Rank r receives block r of the reduced send buffer (blocks of counts[i]
        elements, default an even split). Returns recv (allocated if None)."""
        return self._run("reduce_scatter", "reduce_scatter",
                         lambda: self._prep_reduce_scatter(send, recv, counts, op, algorithm))

    def reduce_scatter_async(self, send, recv=None, counts=None, op="sum", algorithm="auto",
                             name="reduce_scatter"):
        return self._run("reduce_scatter", "reduce_scatter",
                         lambda: self._prep_reduce_scatter(send, recv, counts, op, algorithm),
                         name)

    def _prep_reduce_scatter(self, send, recv, counts, op, algorithm):
        o, a = op_code(op), self._gather_algo(algorithm)
        s = self._describe(send, "send buffer")
        counts = self._counts(counts, s.count, "reduce_scatter")
        if recv is None:
            recv = buffers.empty_like(s.obj, counts[self.rank])
        r = self._describe(recv, "recv buffer")
        if r.count != counts[self.rank] or r.dtype != s.dtype:
            raise ValueError("reduce_scatter: recv buffer has %d %s elements, need %d %s"
                             % (r.count, r.dtype, counts[self.rank], s.dtype))
        return (s.ptr, r.ptr, counts, DTYPES[s.dtype], o, a), r.obj, (s.obj, r.obj)

    def allgather(self, send, recv=None, counts=None, algorithm="auto"):
        """Concatenates every rank's send buffer in rank order; ranks may send
        different counts (gathered first when counts is None). Returns recv."""
        counts = self._gather_counts(send, counts)
        return self._run("allgatherv", "allgather",
                         lambda: self._prep_allgather(send, recv, counts, algorithm))

    def allgather_async(self, send, recv=None, counts=None, algorithm="auto",
                        name="allgather"):
        counts = self._gather_counts(send, counts)
        return self._run("allgatherv", "allgather",
                         lambda: self._prep_allgather(send, recv, counts, algorithm), name)

    def _gather_counts(self, send, counts):
        """counts as given, or every rank's element count. The exchange doubles as
        the validity check: a rank with a bad buffer sends None and every rank
        fails instead of waiting."""
        if counts is not None:
            return counts
        try:
            mine, err = self._describe(send, "send buffer").count, None
        except (TypeError, ValueError) as e:
            mine, err = None, e
        counts = self.allgather_object(mine)
        if err is not None:
            raise err
        bad = [i for i, c in enumerate(counts) if c is None]
        if bad:
            raise MismatchError("allgather: rank(s) %s passed an invalid buffer (see their "
                                "error)" % bad)
        return counts

    def _prep_allgather(self, send, recv, counts, algorithm):
        a = self._gather_algo(algorithm)
        s = self._describe(send, "send buffer")
        counts = [int(c) for c in counts]
        if len(counts) != self.size or counts[self.rank] != s.count:
            raise ValueError("allgather: counts %s do not match this rank's %d elements"
                             % (counts, s.count))
        if recv is None:
            recv = buffers.empty_like(s.obj, sum(counts))
        r = self._describe(recv, "recv buffer")
        if r.count != sum(counts) or r.dtype != s.dtype:
            raise ValueError("allgather: recv buffer has %d %s elements, need %d %s"
                             % (r.count, r.dtype, sum(counts), s.dtype))
        return (s.ptr, r.ptr, counts, DTYPES[s.dtype], a), r.obj, (s.obj, r.obj)

    def broadcast(self, buf, root=0, algorithm="auto"):
        """Every rank's buf becomes root's. Returns buf."""
        return self._run("broadcast", "broadcast",
                         lambda: self._prep_broadcast(buf, root, algorithm))

    def broadcast_async(self, buf, root=0, algorithm="auto", name="broadcast"):
        return self._run("broadcast", "broadcast",
                         lambda: self._prep_broadcast(buf, root, algorithm), name)

    def _prep_broadcast(self, buf, root, algorithm):
        a = self._gather_algo(algorithm)
        b = self._describe(buf, "buffer")
        if not 0 <= int(root) < self.size:
            raise ValueError("broadcast: root %d is not a rank (0..%d)" % (root, self.size - 1))
        return (b.ptr, b.count, DTYPES[b.dtype], int(root), a), b.obj, b.obj

    def shared_buffer(self, nbytes):
        """Collective over the ranks of each node: a zeroed, writable memoryview
        of nbytes in the node's shared memory, or None where that cannot help
        (one rank per node, or nodes with different rank counts). An in-place
        all-reduce (algorithm auto or hier) of exactly such a buffer runs with
        no staging copies: each local rank reduces its share straight from the
        others' buffers and writes the result into them. Lives until exit."""
        if self.local_size < 2:
            return None
        try:
            return self._ctx.shared_alloc(int(nbytes))
        except _core.CoreError as e:
            if "shared buffers need" in str(e):
                return None  # the same answer on every rank: nodes differ in size
            raise

    def alltoall(self, send, send_counts, unit=1):
        """All-to-all with per-destination counts (MPI_Alltoallv) of a contiguous
        CPU buffer (numpy array or torch tensor) of sum(send_counts) * unit
        elements. Returns (recv, recv_counts): a new 1-D buffer of send's kind
        and dtype, and the units from each rank. The C core has no all-to-all
        yet, so this one buffer collective goes to MPI through mpi4py (see
        alltoall.py for the rule across ranks)."""
        size, err = self.size, None
        try:
            sbytes, itemsize, counts = _a2a.prepare(send, send_counts, unit, size)
            unit = int(unit)
        except (TypeError, ValueError) as e:
            err, counts, itemsize = e, [0] * size, 1
        recv_counts = np.empty(size, dtype=np.int64)
        self.mpi.Alltoall(np.asarray(counts, dtype=np.int64), recv_counts)
        unit_bytes = unit * itemsize if err is None else 0
        ok = err is None and max(sum(counts), int(recv_counts.sum())) * unit_bytes <= _a2a.INT_MAX
        flags = np.array([1 if ok else 0], dtype=np.int32)
        self.mpi.Allreduce(MPI.IN_PLACE, flags, op=MPI.MIN)
        if err is not None:
            raise err
        if not flags[0]:
            raise MismatchError("alltoall: a rank passed invalid arguments or more than 2 GiB "
                                "(see the error on that rank)" if ok else
                                "alltoall: this rank would move more than 2 GiB; split the call")
        recv_counts = [int(c) for c in recv_counts]
        recv = _a2a.empty_like(send, sum(recv_counts) * unit)
        rbytes = _a2a.byte_view(recv)[0]
        self.mpi.Alltoallv([sbytes, _a2a.layout(counts, unit_bytes), MPI.BYTE],
                           [rbytes, _a2a.layout(recv_counts, unit_bytes), MPI.BYTE])
        return recv, recv_counts

    def adasum(self, vectors):
        """Adasum (adasum.py) of each 1-D float buffer in vectors (numpy or CPU
        torch, same lengths on every rank), combined per buffer; returns float64
        numpy arrays, the same on every rank. Blocking, over MPI point-to-point:
        the C core has no Adasum."""
        flat = [np.asarray(v, dtype=np.float64).reshape(-1) for v in vectors]
        bounds = np.cumsum([0] + [f.size for f in flat])
        segments = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        lengths = self.mpi.allgather(int(bounds[-1]))
        if len(set(lengths)) > 1:
            raise MismatchError("adasum: ranks disagree on the number of elements: %s"
                                % ", ".join("rank %d=%d" % rc for rc in enumerate(lengths)))
        whole = np.concatenate(flat) if flat else np.empty(0)
        out = _adasum.allreduce(self.mpi, self.rank, self.size, whole, segments)
        return [out[lo:hi] for lo, hi in segments]

    # ------------------------------------------------ objects and agreement
    @contextlib.contextmanager
    def _tracked(self, name):
        """An mpi4py collective counted by the stall inspector while it runs, as
        the core's blocking ones are: a rank that never calls it is named, and
        the job ends after HPCDL_STALL_SHUTDOWN_TIME_SECONDS instead of hanging."""
        try:
            self._ctx.blocking(name)
        except CoreError:  # closed (after shutdown()): no inspector to tell
            yield
            return
        try:
            yield
        except MPI.Exception as e:
            if self._ulfm and e.Get_error_class() in _LOST_CLASSES:
                raise self._lost_object_call(name, e) from None
            raise
        finally:
            self._ctx.blocking(None)

    def allgather_object(self, obj):
        """Every rank's obj (picklable), in rank order, on every rank."""
        with self._tracked("allgather_object"):
            return self.mpi.allgather(obj)

    def bcast_object(self, obj, root=0):
        """root's obj on every rank (the others pass anything, e.g. None)."""
        with self._tracked("bcast_object"):
            return self.mpi.bcast(obj, root=root)

    def gather_object(self, obj, root=0):
        """Every rank's obj in rank order on root; None on the other ranks."""
        with self._tracked("gather_object"):
            return self.mpi.gather(obj, root=root)

    def any_rank(self, flag):
        """The largest of every rank's flag (an int; True counts 1), so truthy
        exactly when some rank set it: overflow checks, stop requests (the
        largest signal number). One 4-byte all-reduce."""
        t = np.array([int(flag)], dtype=np.int32)
        self.allreduce(t, op="max")
        return int(t[0])

    def raise_if_any(self, error, exc_type=RuntimeError):
        """Collective: error is this rank's exception or message, None if it did
        fine; if any rank failed every rank raises (utils/agree.py has the rule)."""
        raise_on_every_rank(self.allgather_object, self.rank, error, exc_type)

    @staticmethod
    def wtime():
        """MPI_Wtime(): seconds, the clock of the engine's timeline records."""
        return wtime()

    def timeline(self):
        """Drains the engine's records: dicts with name, bytes, algorithm, times."""
        keys = ("handle", "name", "bytes", "algorithm", "t_submit", "t_start", "t_agreed",
                "t_end", "status")
        return [dict(zip(keys, rec)) for rec in self._ctx.timeline_drain()]

    # ---------------------------------------------------------------- helpers
    def _counts(self, counts, total, call):
        if counts is None:
            q, r = divmod(total, self.size)
            return [q + (1 if i < r else 0) for i in range(self.size)]
        counts = [int(c) for c in counts]
        if len(counts) != self.size or any(c < 0 for c in counts) or sum(counts) != total:
            raise ValueError("%s: counts %s must be %d non-negative ints summing to the "
                             "send buffer's %d elements" % (call, counts, self.size, total))
        return counts

    @staticmethod
    def _gather_algo(algorithm):
        # hier is an all-reduce design; the other collectives use the ring for it
        a = algo_code(algorithm)
        return algo_code("ring") if a == algo_code("hier") else a
