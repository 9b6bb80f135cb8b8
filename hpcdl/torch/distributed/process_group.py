"""process_group.py - ProcessGroupHpcdl: torch.distributed's collectives on
hpcdl's Communicator (hpcdl.comm), for init_process_group("hpcdl").

A Python subclass of torch's ProcessGroup (torch calls its methods from
Python and, through its trampoline, from C++: DDP's reducer, functional
collectives). Rank and size are the Communicator's, i.e. MPI's.

Where each call runs:
- engine (asynchronous, in submission order, the core's agreement check
  and stall inspector): all_reduce (+ coalesced), reduce (an all-reduce whose
  result only the root keeps), broadcast, all_gather, all_gather_into_tensor,
  reduce_scatter, reduce_scatter_tensor, barrier (a 1-element all-reduce).
- caller's thread, after the engine's queue of this group is done (so the
  order of calls is the order they were made): gather, scatter, all_to_all,
  all_to_all_single (the Communicator's all-to-all; gather and scatter are
  all-to-alls where only the root sends or receives). Their Works are done
  when returned.
- point-to-point (send, recv, isend, irecv, batch_isend_irecv, recv from
  any source): started at once on hpcdl.comm.p2p (its own duplicate
  communicator), finished like the engine's Works; monitored_barrier too.

Sub-groups: torch's new_group() delegates to new_group() here, which splits
the Communicator (collective over every rank, like new_group itself).
"""
import contextlib

import torch
import torch.distributed as dist

from . import _tensors as T
from ._work import Work, done_work
from ...comm.p2p import PointToPoint

BACKEND_NAME = "hpcdl"


class ProcessGroupHpcdl(dist.ProcessGroup):
    """torch.distributed's ProcessGroup over one hpcdl Communicator."""

    def __init__(self, communicator, timeout=None):
        super().__init__(communicator.rank, communicator.size)
        self._comm = communicator
        self._timeout = timeout  # kept for torch; hpcdl's stall inspector handles hangs
        self._pending = []       # engine Works not yet known to be done, in order
        self._cuda = _core_has_cuda()
        self._p2p = PointToPoint(communicator)  # collective, like creating the group

    def getBackendName(self):
        return BACKEND_NAME

    # torch names a group after creating it (DeviceMesh and functional
    # collectives look groups up by name); a Python group keeps them itself
    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return "ProcessGroupHpcdl(rank=%d, size=%d)" % (self.rank(), self.size())

    # ------------------------------------------------------------ plumbing
    def _queued(self, handles, result, then, name):
        work = Work(handles, result, then, name)
        pending = self._pending
        if len(pending) >= 64:
            pending[:] = [w for w in pending if not w.is_completed()]
        pending.append(work)
        return work

    @contextlib.contextmanager
    def _refusing(self, kind):
        """This rank's checks of a call, before anything is queued: when they
        fail, the other ranks are told through the agreement check (they raise
        MismatchError instead of waiting for this rank) and this rank raises
        its own error. kind: the Communicator call the others are making."""
        try:
            yield
        except (TypeError, ValueError):
            _tell_others(self._comm, kind)
            raise

    def _drain(self):
        """Waits for this group's queued engine work (before a caller-thread call)."""
        pending, self._pending = self._pending, []
        for work in pending:
            if not work.is_completed():  # a finished one's error went to its waiter
                work.wait()

    # ----------------------------------------------------------- all-reduce
    def allreduce(self, tensors, opts=None):
        fold = T.bitwise_fold(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
        if fold is not None:
            return self._bitwise(tensors, fold, None, "all_reduce")
        with self._refusing("allreduce"):
            op = T.reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
            views = [T.core_view(t, op, device_ok=self._cuda) for t in tensors]
        handles = [self._comm.allreduce_async(v, op=op, name="torch.all_reduce")
                   for v, _ in views]
        return self._queued(handles, list(tensors), T.chain(*[t for _, t in views]),
                            "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        fold = T.bitwise_fold(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
        if fold is not None:
            tensor = tensors[_opt(opts, "rootTensor", 0)]
            return self._bitwise([tensor], fold, _opt(opts, "rootRank", 0), "reduce")
        with self._refusing("allreduce"):
            op = T.reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
            root = _opt(opts, "rootRank", 0)
            view, then = T.core_view(tensors[_opt(opts, "rootTensor", 0)], op)
        if self.rank() == root:
            h = self._comm.allreduce_async(view, op=op, name="torch.reduce")
        else:  # the root's result only: this rank's tensor stays as it was
            h = self._comm.allreduce_async(view, torch.empty_like(view), op=op,
                                           name="torch.reduce")
            then = None
        return self._queued([h], list(tensors), then, "reduce")

    def _bitwise(self, tensors, fold, root, name):
        """BAND / BOR / BXOR (not in the core): every rank's tensor all-gathered
        (as all_gather does, moved by its bytes), folded with torch's bitwise
        function on each rank (root None) or on the root only."""
        size = self.size()
        with self._refusing("allgather"):
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    raise TypeError("%s: bitwise ReduceOps take integer or bool tensors, not %s"
                                    % (name, t.dtype))
            rows = [[torch.empty_like(t, device="cpu") for _ in range(size)] for t in tensors]
            plans = [self._plan_allgather(outs, t) for outs, t in zip(rows, tensors)]
        handles = [self._comm.allgather_async(view, flat, counts=counts, name="torch." + name)
                   for view, flat, counts, _ in plans]

        def then():
            if root is not None and self.rank() != root:
                return
            for t, outs, (_, _, _, unpack) in zip(tensors, rows, plans):
                unpack()
                out = outs[0]
                for row in outs[1:]:
                    out = fold(out, row)
                t.copy_(out)
        return self._queued(handles, list(tensors), then, name)

    # -------------------------------------------------------- data movement
    def broadcast(self, tensors, opts=None):
        root = _opt(opts, "rootRank", 0)
        with self._refusing("broadcast"):
            views = [T.core_view(t) for t in tensors]
        handles = [self._comm.broadcast_async(v, root, name="torch.broadcast") for v, _ in views]
        return self._queued(handles, list(tensors), T.chain(*[t for _, t in views]),
                            "broadcast")

    def allgather(self, output_lists, inputs, opts=None):
        with self._refusing("allgather"):
            plans = [self._plan_allgather(outs, inp) for outs, inp in zip(output_lists, inputs)]
        handles = [self._comm.allgather_async(view, flat, counts=counts, name="torch.all_gather")
                   for view, flat, counts, _ in plans]
        return self._queued(handles, list(output_lists), T.chain(*[p[3] for p in plans]),
                            "all_gather")

    def _plan_allgather(self, outs, inp):
        _check_list(outs, self.size(), "all_gather: output list")
        counts = [o.numel() for o in outs]
        if inp.numel() != counts[self.rank()]:
            raise ValueError("all_gather: input has %d elements but output[%d] has %d"
                             % (inp.numel(), self.rank(), counts[self.rank()]))
        view, _ = T.core_view(inp)
        flat = torch.empty(sum(counts), dtype=T.word_dtype(inp))
        return view, flat, counts, _unpack(flat, outs)

    def all_gather_single(self, output, inp, opts=None):
        n = inp.numel()
        with self._refusing("allgather"):
            _check_whole(output, n, self.size(), "all_gather_into_tensor: output")
            out_view, then = T.core_view(output)
            in_view, _ = T.core_view(inp)
        h = self._comm.allgather_async(in_view, out_view, counts=[n] * self.size(),
                                       name="torch.all_gather_into_tensor")
        return self._queued([h], [output], then, "all_gather_into_tensor")

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return _each(self.all_gather_single, outputs, inputs, opts, "all_gather_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ------------------------------------------------------- reduce-scatter
    def reduce_scatter(self, outputs, input_lists, opts=None):
        with self._refusing("reduce_scatter"):
            op = T.reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
            plans = [self._plan_reduce_scatter(out, ins, op)
                     for out, ins in zip(outputs, input_lists)]
        handles = [self._comm.reduce_scatter_async(send, recv, counts=counts, op=op,
                                                   name="torch.reduce_scatter")
                   for send, recv, counts, _ in plans]
        return self._queued(handles, list(outputs), T.chain(*[p[3] for p in plans]),
                            "reduce_scatter")

    def _plan_reduce_scatter(self, out, ins, op):
        _check_list(ins, self.size(), "reduce_scatter: input list")
        counts = [i.numel() for i in ins]
        if out.numel() != counts[self.rank()]:
            raise ValueError("reduce_scatter: output has %d elements but input[%d] has %d"
                             % (out.numel(), self.rank(), counts[self.rank()]))
        send, _ = T.core_view(torch.cat([T.host_flat(i) for i in ins]), op)
        recv, then = T.core_view(out, op)
        return send, recv, counts, then

    def reduce_scatter_single(self, output, inp, opts=None):
        n = output.numel()
        with self._refusing("reduce_scatter"):
            op = T.reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM))
            _check_whole(inp, n, self.size(), "reduce_scatter_tensor: input")
            send, _ = T.core_view(inp, op)
            recv, then = T.core_view(output, op)
        h = self._comm.reduce_scatter_async(send, recv, counts=[n] * self.size(), op=op,
                                            name="torch.reduce_scatter_tensor")
        return self._queued([h], [output], then, "reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return _each(self.reduce_scatter_single, outputs, inputs, opts,
                     "reduce_scatter_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -------------------------------------------------------------- barrier
    def barrier(self, opts=None):
        token = torch.zeros(1, dtype=torch.int32)
        h = self._comm.allreduce_async(token, name="torch.barrier")
        return self._queued([h], [token], None, "barrier")

    # ------------------------------------ all-to-all family (caller's thread)
    def _alltoall(self, send, send_counts, unit, what):
        self._drain()
        return self._comm.alltoall(send, send_counts, unit)

    def alltoall(self, outputs, inputs, opts=None):
        _check_list(outputs, self.size(), "all_to_all: output list")
        _check_list(inputs, self.size(), "all_to_all: input list")
        send = _cat(inputs, outputs[0] if outputs else None)
        recv, counts = self._alltoall(send, [i.numel() for i in inputs], 1, "all_to_all")
        _expect(counts, [o.numel() for o in outputs], "all_to_all: output tensors")
        _unpack(recv, outputs)()
        return done_work(list(outputs), "all_to_all")

    def all_to_all_single(self, output, inp, output_splits, input_splits, opts=None):
        size = self.size()
        unit = _row_elements(inp)
        in_rows = _splits(input_splits, inp, size, "input")
        out_rows = _splits(output_splits, output, size, "output")
        recv, counts = self._alltoall(T.host_flat(inp), in_rows, unit, "all_to_all_single")
        _expect(counts, out_rows, "all_to_all_single: output_split_sizes")
        output.copy_(recv.reshape(output.shape))
        return done_work([output], "all_to_all_single")

    alltoall_base = all_to_all_single

    def gather(self, output_lists, inputs, opts=None):
        root, size = _opt(opts, "rootRank", 0), self.size()
        inp = inputs[0]
        counts = [0] * size
        counts[root] = inp.numel()
        recv, got = self._alltoall(T.host_flat(inp), counts, 1, "gather")
        if self.rank() == root:
            outs = output_lists[0]
            _check_list(outs, size, "gather: gather_list")
            _expect(got, [o.numel() for o in outs], "gather: gather_list tensors")
            _unpack(recv, outs)()
        return done_work(list(output_lists), "gather")

    def scatter(self, outputs, input_lists, opts=None):
        root, size = _opt(opts, "rootRank", 0), self.size()
        out = outputs[0]
        if self.rank() == root:
            ins = input_lists[0]
            _check_list(ins, size, "scatter: scatter_list")
            send, counts = _cat(ins, out), [i.numel() for i in ins]
        else:
            send, counts = torch.empty(0, dtype=out.dtype), [0] * size
        recv, got = self._alltoall(send, counts, 1, "scatter")
        _expect([got[root]], [out.numel()], "scatter: output tensor")
        out.copy_(recv.reshape(out.shape))
        return done_work(list(outputs), "scatter")

    # ------------------------------------------------------- point-to-point
    # isend / irecv on the group's PointToPoint (MPI_Isend / MPI_Irecv on a
    # duplicate communicator), started at once on the caller's thread, outside
    # the engine: their Works finish like the engine's (wait or future).
    # dst / src are ranks of this group (torch translates global ranks).
    def send(self, tensors, dst, tag=0):
        requests = []
        for t in tensors:
            requests.append(self._p2p.isend(T.host_flat(t), dst, tag))
        return Work(requests, list(tensors), None, "send")

    def recv(self, tensors, src, tag=0):
        return self._receive(tensors, src, tag, Work, "recv")

    def _receive(self, tensors, src, tag, work_class, name):
        requests, thens = [], []
        for t in tensors:
            if t.device.type == "cpu" and t.is_contiguous():
                requests.append(self._p2p.irecv(t.detach(), src, tag))
                continue
            staged = torch.empty(t.shape, dtype=t.dtype)
            requests.append(self._p2p.irecv(staged, src, tag))
            thens.append(lambda t=t, staged=staged: t.copy_(staged))
        return work_class(requests, list(tensors), T.chain(*thens), name)

    def recv_anysource(self, tensors, tag=0):
        """dist.recv(t) / irecv(t) without src: MPI_ANY_SOURCE; torch asks the
        Work's _source_rank() which rank it came from."""
        if len(tensors) != 1:
            raise ValueError("recv from any source takes one tensor, not %d" % len(tensors))
        return self._receive(tensors, None, tag, _AnySourceWork, "recv_anysource")

    # ---------------------------------------------------- monitored barrier
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier that names the ranks that do not arrive within timeout
        (a timedelta or seconds; default this group's timeout): BarrierTimeout
        (a RuntimeError) on rank 0 and on the ranks that came. torch's
        dist.monitored_barrier admits gloo only: call
        hpcdl.torch.distributed.monitored_barrier(group, timeout)."""
        timeout = self._timeout if timeout is None else timeout
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        self._p2p.monitored_barrier(seconds, wait_all_ranks)

    # ----------------------------------------------------------- sub-groups
    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None,
                  group_desc=None):
        """torch's new_group() lands here on every rank of this group: a
        ProcessGroupHpcdl over the split Communicator, None outside it."""
        ranks = list(range(self.size())) if ranks is None else list(ranks)
        if ranks != sorted(ranks):
            raise ValueError("new_group(ranks=%s): the hpcdl backend numbers a sub-group's ranks "
                             "in ascending order; pass sort_ranks=True" % ranks)
        self._drain()
        child = self._comm.split(ranks)
        if child is None:
            return None
        group = ProcessGroupHpcdl(child, timeout)
        group._owns_comm = True
        group.setGroupName(group_name or "")  # torch registers it under this name
        group.setGroupDesc(group_desc or "")
        return group

    def shutdown(self):
        """destroy_process_group(): waits for this group's work; a sub-group
        frees its Communicator (collective over its ranks; torch shuts groups
        down in the same order on every rank). The world's Communicator stays
        with hpcdl.comm, which closes it at exit."""
        self._drain()
        if self._p2p is not None:
            self._p2p.close()
            self._p2p = None
        if getattr(self, "_owns_comm", False) and self._comm is not None:
            comm, self._comm = self._comm, None
            comm.free()


class _AnySourceWork(Work):
    """A receive from any source: _source_rank() is the sender's rank in the group."""

    def _source_rank(self):
        self.wait()
        return self._sources[0].source

    def __init__(self, handles, result, then, name):
        super().__init__(handles, result, then, name)
        self._sources = list(handles)  # Work forgets its handles once done


def _tell_others(communicator, kind):
    """Joins the agreement check of a `kind` call as invalid (a buffer the
    Communicator refuses), so that the ranks making it raise MismatchError."""
    call = {"allreduce": lambda: communicator.allreduce_async(None),
            "broadcast": lambda: communicator.broadcast_async(None),
            "allgather": lambda: communicator.allgather_async(None, counts=[0] * communicator.size),
            "reduce_scatter": lambda: communicator.reduce_scatter_async(
                None, counts=[0] * communicator.size)}[kind]
    try:
        call().wait()  # not reached: the Communicator refuses None
    except (TypeError, ValueError):
        pass


def _core_has_cuda():
    from ... import _core  # on use: loads hpcdl._core
    return bool(_core.built_with_cuda())


def _opt(opts, name, default):
    return default if opts is None else getattr(opts, name, default)


def _check_list(tensors, size, what):
    if len(tensors) != size:
        raise ValueError("%s has %d tensors; the group has %d ranks" % (what, len(tensors), size))


def _check_whole(whole, block, size, what):
    """whole must hold one block of `block` elements per rank."""
    if whole.numel() != block * size:
        raise ValueError("%s has %d elements, need %d x %d ranks = %d"
                         % (what, whole.numel(), block, size, block * size))


def _expect(got, want, what):
    if list(got) != list(want):
        raise ValueError("%s hold %s elements per rank, but the ranks sent %s"
                         % (what, list(want), list(got)))


def _cat(tensors, like):
    """The tensors' elements, flat and concatenated on the host."""
    if not tensors:
        return torch.empty(0, dtype=like.dtype if like is not None else torch.float32)
    return torch.cat([T.host_flat(t) for t in tensors])


def _unpack(flat, outs):
    """A step copying consecutive pieces of flat into outs (their sizes, dtypes)."""
    def then():
        start = 0
        for o in outs:
            n = o.numel()
            o.copy_(T.unword(flat[start:start + n], o))
            start += n
    return then


def _each(call, outputs, inputs, opts, name):
    """A coalesced call: call on each (output, input) pair, one Work done when
    all of theirs are."""
    works = [call(o, i, opts) for o, i in zip(outputs, inputs)]

    def then():
        for w in works:
            w.wait()
    return Work((), list(outputs), then, name)


def _row_elements(t):
    """Elements per row along dim 0 (the unit all_to_all_single splits by)."""
    if t.dim() == 0:
        return 1
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


def _splits(splits, t, size, what):
    rows = t.shape[0] if t.dim() else t.numel()
    if splits:
        if len(splits) != size or sum(splits) != rows:
            raise ValueError("all_to_all_single: %s_split_sizes %s must be %d sizes summing to "
                             "its %d rows" % (what, list(splits), size, rows))
        return [int(s) for s in splits]
    if rows % size:
        raise ValueError("all_to_all_single: %s has %d rows, not divisible by %d ranks; pass "
                         "%s_split_sizes" % (what, rows, size, what))
    return [rows // size] * size
