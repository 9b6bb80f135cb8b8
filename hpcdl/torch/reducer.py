"""reducer.py - the gradient path: Reducer puts parameters into fusion
buckets, hooks their gradients, submits each bucket in order, takes part in
hvd.join() and records the timeline; how a bucket's gradients meet over the
ranks is one seam, its comm hook. DistributedOptimizer (optimizer.py) and
the ZeRO 1-2 optimizer (zero/optimizer.py) are a Reducer plus a step.

When things happen:
  * at construction, parameters go to buckets in reverse order of
    registration (roughly the order backward produces their gradients): a
    small first bucket so communication starts early, then buckets of
    HPCDL_FUSION_THRESHOLD bytes (default 25 MiB). Each parameter's .grad
    becomes a view into its bucket's flat buffer, so no packing copy is needed.
  * during backward, a hook fires as each gradient is accumulated; once every
    parameter of bucket i has its gradient (after backward_passes_per_step
    passes) and buckets 0..i-1 are submitted, bucket i is handed to the comm
    hook's start(). Submitting strictly in bucket order keeps the order
    identical on every rank whatever order the hooks fire in.
  * synchronize() submits buckets whose parameters got no gradient (as
    zeros), waits for each bucket's handle and calls the hook's finish().

COMM HOOK (one per reducer; `reducer.register_comm_hook(state, hook)`, as
torch DDP's): decides how one bucket's gradients meet.
    hook(state, bucket) -> handle        called once per bucket and step, in
        bucket order on every rank, with bucket.buffer holding this rank's
        gradients (flat, bucket.size elements). handle: an object with
        wait() (hpcdl.comm handles, torch.futures.Future) or an int handle of
        hpcdl.torch's *_async calls. wait() returns the reduced flat tensor,
        or None when the hook reduced into bucket.buffer in place.
    The reducer waits (in synchronize()) and copies the result into
    bucket.buffer, so p.grad holds it. The hook replaces the default's
    compression, gradient_predivide_factor and op: it does all of the
    reduction. Example: sum instead of average,
        reducer.register_comm_hook(comm, lambda c, b: c.allreduce_async(
            b.buffer, op="sum", name="sum.%d" % b.index))
reducer.adasum_hook is one: Adasum per parameter instead of the average.
Built-in hooks are objects with start(bucket) -> handle and
finish(bucket, result) -> the reduced tensor this rank keeps:
AllReduceHook (the default: compression, gradient_predivide_factor, op) and
ZeRO 2's reduce-scatter (zero/sharding.py); set_comm_hook(obj) installs one.
hvd.join() is answered only under the default hook.

STATISTICS SEAM (for the gradient noise scale and the like):
    rec = reducer.add_stats_hook(before=None, after=None, end=None, extra=0)
    before(grad, bucket, tail)    at each bucket's submission, before the
        comm hook: grad is this rank's own flat gradient of the bucket
        (bucket.numel elements, the sum of backward_passes_per_step passes,
        missing gradients as zeros; read it, do not change it).
    after(reduced, bucket, tail)  once the bucket's reduction is finished:
        reduced is what this rank keeps (the averaged bucket under all-reduce;
        under ZeRO 2's reduce-scatter this rank's block only).
    end()                         once per step, after every bucket's after().
    extra=k reserves k trailing elements in the LAST bucket's buffer (the one
        submitted last, so every other bucket's before() has run): `tail` is
        that hook's own k-element slice there (None in other buckets and
        when extra=0). Values written into it in before() travel in the same
        all-reduce as the gradients (same op, compression and predivide: the
        default averages them over ranks) and are read back in after(): no
        extra communication round. Call add_stats_hook on every rank in the
        same order, before the first backward (the last buffer is rebuilt);
        refused for hooks that do not carry the buffer whole (ZeRO 2).
    rec.remove() unregisters the before/after/end calls (the tail stays).
"""
import itertools
import warnings

import torch

from .. import comm
from ..trace import timeline as _timeline
from ..utils import settings
from . import _join
from .compression import Compression, compress
from . import adasum_ops
from .mpi_ops import synchronize
from .process_sets import comm_of, global_process_set

FIRST_BUCKET_BYTES = 1 << 20

# Join numbers: hvd.join()'s answering rank finds the reducer named in a step's
# descriptor round by this number. It is module state because it must be the
# same on every rank without any communication: every rank builds its
# optimizers (so its reducers) in the same order, so the n-th reducer has the
# same number everywhere. Kept as a counter, not derived from the parameters,
# so two optimizers over the same model still differ.
_numbers = itertools.count(1)


def fusion_threshold():
    return settings.get("HPCDL_FUSION_THRESHOLD")


def bucket_buffer(numel, dtype, device, on):
    """A bucket's flat buffer. On the CPU, in the node's shared memory when
    the node has several ranks (HPCDL_SHARED_BUCKETS=0 turns this off): the
    engine then all-reduces it in place without staging copies (src_c/shared.c).
    Collective over each node: every rank builds the same buckets in order."""
    # on: the world's Communicator; None (a process set's) keeps plain buffers, since
    # a node-shared window lives until exit and would outlive the set's communicator
    if (on is not None and device.type == "cpu" and numel > 0
            and settings.get("HPCDL_SHARED_BUCKETS")):
        view = on.shared_buffer(numel * torch.empty((), dtype=dtype).element_size())
        if view is not None:
            return torch.frombuffer(view, dtype=dtype, count=numel)
    return torch.zeros(numel, dtype=dtype, device=device)


class Bucket:
    """Parameters fused into one flat buffer and one reduction. buffer holds
    numel gradient elements, then `extra` trailing ones (statistics)."""

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        self.numel = sum(p.numel() for p in params)
        self.extra = 0
        self.buffer, self.views = None, []
        self.ready = 0        # parameters whose gradient is complete this step
        self.handle = None    # the comm hook's handle while in flight
        self.ctx = self.sent = None  # scratch of the comm hook (compression)
        self.t_ready = self.t_submit = self.t_submitted = 0.0

    @property
    def size(self):
        """Elements of the buffer: the gradients and the trailing extras."""
        return self.numel + self.extra

    @property
    def dtype(self):
        return self.params[0].dtype

    def allocate(self, on=None):
        p0 = self.params[0]
        self.buffer = bucket_buffer(self.size, p0.dtype, p0.device, on)
        self.views, offset = [], 0
        for p in self.params:
            self.views.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def release(self):
        self.buffer, self.views = None, []


# ---------------------------------------------------------------- comm hooks
def pack(bucket, compression, predivide):
    """Scales bucket.buffer by 1/predivide and compresses it; the tensor to send."""
    if predivide != 1.0:
        bucket.buffer.mul_(1.0 / predivide)
    bucket.sent, bucket.ctx = compress(compression, bucket.buffer, "bucket.%d" % bucket.index)
    return bucket.sent


class AllReduceHook:
    """The default comm hook: the bucket (compressed) all-reduced with op."""
    joinable = True       # a joined rank can answer it with zeros (join_answer)
    carries_tail = True   # the whole buffer travels, statistics' tail included

    def __init__(self, on, op, compression, predivide):
        self.on, self.op, self.compression, self.predivide = on, op, compression, predivide

    def start(self, b):
        return self.on.allreduce_async(pack(b, self.compression, self.predivide),
                                       op=self.op, name="bucket.%d" % b.index)

    def finish(self, b, result):
        out = self.compression.decompress(b.sent, b.ctx)
        if out is not b.buffer:
            b.buffer.copy_(out)
        if self.predivide != 1.0:
            b.buffer.mul_(self.predivide)
        return b.buffer[:b.numel]

    def join_answer(self, b, op):
        """A joined rank's part: the bucket's buffer zeroed (node-shared
        buckets stay on their fast path), all-reduced with op."""
        zeros = b.buffer.zero_()
        if getattr(self.compression, "needs_name", False):  # top-k: a new tensor
            sent = torch.zeros_like(zeros)
        else:                                                # the buffer, or its cast
            sent, _ = compress(self.compression, zeros, None)
        return self.on.allreduce_async(sent, op=op, name="join.bucket.%d" % b.index)


class _Waits:
    """An int handle of hpcdl.torch's *_async calls as an object with wait()."""

    def __init__(self, handle):
        self.handle = handle

    def wait(self):
        return synchronize(self.handle)


class FunctionHook:
    """A user's hook(state, bucket) -> handle (register_comm_hook)."""
    joinable = False
    carries_tail = True

    def __init__(self, state, fn):
        self.state, self.fn = state, fn

    def start(self, b):
        h = self.fn(self.state, b)
        if isinstance(h, int):
            return _Waits(h)
        if not hasattr(h, "wait"):
            raise TypeError("comm hook %r returned %s; it must return a handle with wait() "
                            "(a Communicator's *_async, a torch Future) or an hpcdl.torch "
                            "*_async handle" % (self.fn, type(h).__name__))
        return h

    def finish(self, b, result):
        if torch.is_tensor(result) and result is not b.buffer:
            if result.numel() != b.size:
                raise ValueError("comm hook %r returned %d elements for bucket %d of %d"
                                 % (self.fn, result.numel(), b.index, b.size))
            b.buffer.copy_(result.reshape(-1))
        return b.buffer[:b.numel]


def adasum_hook(on, bucket):
    """A comm hook: each parameter's gradient in the bucket combined with
    Adasum over on's ranks (adasum_ops.py, per tensor as Horovod's op=Adasum
    on gradients), in place. `opt.reducer.register_comm_hook(opt.reducer.comm,
    adasum_hook)`; hvd.DistributedOptimizer(op=hvd.Adasum) is the other
    Adasum, Horovod's delta optimizer (adasum_optimizer.py)."""
    return adasum_ops.start(list(bucket.views), True, "adasum.bucket.%d" % bucket.index,
                            1.0, 1.0, on, grouped=True)


def retire_in_order(pending, done, finish, keep):
    """The in-flight policy of ZeRO's reduce-scatters (stage 2's buckets,
    stage 3's units): from the oldest of pending (in submission order), each
    entry that is done, and any beyond the newest `keep`, is removed and
    finish(entry)ed (it waits); the engine runs them in the order queued, so
    the oldest finishes first."""
    while pending:
        if len(pending) <= keep and not done(pending[0]):
            return
        finish(pending.pop(0))


class _Stats:
    """One add_stats_hook registration."""

    def __init__(self, reducer, before, after, end, offset, extra):
        self.reducer, self.before, self.after, self.end = reducer, before, after, end
        self.offset, self.extra = offset, extra

    def tail(self, b):
        if not self.extra or b.index != len(self.reducer.buckets) - 1 or b.buffer is None:
            return None
        at = b.numel + self.offset
        return b.buffer[at:at + self.extra]

    def remove(self):
        if self in self.reducer._stats:
            self.reducer._stats.remove(self)


# ---------------------------------------------------------------- the reducer
class Reducer:
    """Buckets, gradient hooks, in-order submission, join and the timeline
    for params (a list of the tensors whose gradients meet), over the
    Communicator `on` (None: this rank is outside the process set, nothing
    is reduced). names: {param: name}. Options:
      compression, op, predivide   the default all-reduce hook's
      passes_per_step               backward passes summed before a bucket goes
      groups                        bucket plan: None, an int, or lists of params
      shared                        buffers in node-shared memory (the world's)
      lazy                          buffers allocated at each step's first
                                    gradient and freed by the comm hook (ZeRO 2)
      join                          hvd.join() may answer this reducer's steps
      keep_in_flight                if set, finished buckets are retired during
                                    backward, waiting beyond that many in flight
    """

    def __init__(self, params, names, on, *, compression=None, op="average", predivide=1.0,
                 passes_per_step=1, groups=None, shared=False, lazy=False, join=False,
                 keep_in_flight=None):
        self.comm, self.names, self.op = on, names, op
        self.compression = compression if compression is not None else Compression.none
        self.passes_per_step = int(passes_per_step)
        if self.passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        if on is None:
            params = []
        plan = plan_buckets(params, groups)
        if on is not None:
            check_same_plan(plan, on)
        self._shared_on = on if shared else None
        self.buckets = [Bucket(i, g, [names[p] for p in g]) for i, g in enumerate(plan)]
        self.lazy, self.keep_in_flight = lazy, keep_in_flight
        for b in self.buckets:
            if not lazy:
                b.allocate(self._shared_on)
                for p, v in zip(b.params, b.views):
                    p.grad = v
        self._bucket_of = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._passes = {p: 0 for p in params}
        self._sparse = set()      # parameters whose gradients came sparse
        self.sparse_error = None  # a message: sparse gradients are refused (ZeRO)
        self._next_submit = 0
        self._t_backward = None   # first gradient hook of this step (MPI_Wtime)
        self._stats = []
        self.peak_bucket_bytes = 0  # lazy: most bytes of buckets alive at once
        self._hook = AllReduceHook(on, op, self.compression, float(predivide))
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self.join_number = next(_numbers)  # see _numbers
        self._join_round = None
        if join and on is not None:
            _join.joinable[self.join_number] = self

    # ------------------------------------------------------------ public seams
    @property
    def params(self):
        """The tensors whose gradients this reducer reduces (hooked)."""
        return list(self._passes)

    @property
    def comm_hook(self):
        return self._hook

    def register_comm_hook(self, state, hook):
        """hook(state, bucket) -> handle decides how each bucket's gradients
        meet from now on (module docstring); hvd.join() no longer answers
        this reducer's steps. Call it on every rank alike, between steps."""
        if not callable(hook):
            raise TypeError("register_comm_hook(state, hook): hook must be callable, got %s"
                            % type(hook).__name__)
        self.set_comm_hook(FunctionHook(state, hook))

    def set_comm_hook(self, hook):
        """Installs a hook object (start(bucket) -> handle, finish(bucket,
        result) -> kept tensor; optional joinable, carries_tail)."""
        self._refuse_mid_step("set a comm hook")
        if self.lazy and isinstance(hook, FunctionHook):
            raise ValueError("register_comm_hook is not supported with ZeRO stage 2 (its "
                             "buckets are reduce-scattered); use zero_stage=0 or 1")
        if any(s.extra for s in self._stats) and not getattr(hook, "carries_tail", False):
            raise ValueError("a statistics hook reserved trailing elements, which this comm "
                             "hook does not carry")
        self._hook = hook
        if not getattr(hook, "joinable", False):
            _join.joinable.pop(self.join_number, None)

    def add_stats_hook(self, before=None, after=None, end=None, extra=0):
        """Registers per-step gradient statistics callbacks (module docstring);
        returns a record with remove()."""
        extra = int(extra)
        if extra < 0:
            raise ValueError("add_stats_hook: extra must be >= 0, got %d" % extra)
        if extra:
            self._refuse_mid_step("reserve statistics elements")
            if not getattr(self._hook, "carries_tail", False):
                raise ValueError("add_stats_hook(extra=%d): this optimizer's buckets are not "
                                 "reduced whole (ZeRO stage 2's reduce-scatter); use extra=0 "
                                 "and reduce the statistics yourself" % extra)
        offset = sum(s.extra for s in self._stats)
        rec = _Stats(self, before, after, end, offset, extra)
        self._stats.append(rec)
        if extra and self.buckets:
            self._grow_last(extra)
        return rec

    def _grow_last(self, extra):
        """Rebuilds the last bucket's buffer with `extra` more trailing elements."""
        b = self.buckets[-1]
        old, old_views = b.buffer, b.views
        b.extra += extra
        if old is None:  # lazy: allocated at the next step
            return
        b.allocate(self._shared_on)
        b.buffer[:old.numel()].copy_(old)
        for p, ov, nv in zip(b.params, old_views, b.views):
            if p.grad is ov:
                p.grad = nv

    def _refuse_mid_step(self, what):
        if self.in_step:
            raise RuntimeError("cannot %s between backward() and step()" % what)

    @property
    def submitted(self):
        """Buckets submitted so far this step."""
        return self._next_submit

    @property
    def in_step(self):
        """True between a backward's first gradient and synchronize()."""
        return self._next_submit > 0 or any(n for n in self._passes.values())

    # ------------------------------------------------------------ backward side
    def _grad_ready(self, p):
        if self._t_backward is None:
            self._t_backward = comm.wtime()
        b, i = self._bucket_of[p]
        if b.buffer is None:  # lazy: the first gradient of the bucket this step
            self._allocate(b)
        if self.sparse_error is not None and p.grad.is_sparse:
            raise RuntimeError(self.sparse_error % self.names[p])
        if p.grad is not b.views[i]:  # first pass since zero_grad(): into the bucket
            if p.grad.is_sparse:
                self._sparse.add(p)
                b.views[i].copy_(p.grad.to_dense())
            else:
                b.views[i].copy_(p.grad)
            p.grad = b.views[i]
        self._passes[p] += 1
        if self._passes[p] > self.passes_per_step:
            raise RuntimeError(
                "gradients of %s were computed %d times before step(), but "
                "backward_passes_per_step=%d: the all-reduce of its bucket is already in "
                "flight and would read a half-updated buffer. Call step() (or "
                "synchronize()) after every %d backward passes."
                % (self.names[p], self._passes[p], self.passes_per_step,
                   self.passes_per_step))
        if self._passes[p] == self.passes_per_step:
            b.ready += 1
            if b.ready == len(b.params):
                b.t_ready = comm.wtime()
                self._submit_in_order(force=False)

    def _allocate(self, b):
        b.allocate()
        self._count_live_bytes()

    def _count_live_bytes(self):
        """Keeps the most bytes of bucket buffers alive at once (being filled,
        or in flight with their compressed copies): lazy buffers' peak."""
        live = 0
        for b in self.buckets:
            if b.buffer is not None:
                live += b.buffer.numel() * b.buffer.element_size()
            if b.sent is not None and b.sent is not b.buffer:  # fp16/bf16 copy in flight
                live += b.sent.numel() * b.sent.element_size()
        self.peak_bucket_bytes = max(self.peak_bucket_bytes, live)

    def _submit_in_order(self, force):
        """Submits buckets from the next one on while each is complete (or force)."""
        while self._next_submit < len(self.buckets):
            b = self.buckets[self._next_submit]
            if not force and b.ready < len(b.params):
                return
            self._submit(b)
            self._next_submit += 1

    def _submit(self, b):
        b.t_submit = comm.wtime()
        if b.buffer is None:  # lazy: no gradient in this bucket at all
            self._allocate(b)
        if b.ready < len(b.params):  # sent by synchronize(), not by its last hook
            b.t_ready = b.t_submit
            for p, v in zip(b.params, b.views):
                if self._passes[p] == 0:  # no gradient this step: it counts as zero
                    v.zero_()
                    p.grad = v
        if b.index == 0 and self.join_number in _join.joinable:
            self._join_round = _join.start_step_round(
                self.comm, self.join_number, self.op, [(x.size, x.dtype) for x in self.buckets])
        for s in self._stats:
            if s.before is not None:
                s.before(b.buffer[:b.numel], b, s.tail(b))
        b.handle = self._hook.start(b)
        b.t_submitted = comm.wtime()
        if self.lazy:
            self._count_live_bytes()
        if self.keep_in_flight is not None:
            in_flight = [x for x in self.buckets[:self._next_submit + 1] if x.handle is not None]
            tl = _timeline.active()
            retire_in_order(in_flight, lambda x: x.handle.poll(),
                            lambda x: self._finish(x, tl), self.keep_in_flight)

    # ------------------------------------------------------------- step side
    def synchronize(self):
        """Waits for every bucket's reduction (module docstring). Returns
        False when no gradient arrived since the last call (nothing done)."""
        if self._next_submit == 0 and all(n == 0 for n in self._passes.values()):
            return False
        self._submit_in_order(force=True)
        tl = _timeline.active()
        if tl is not None and self._t_backward is not None:
            tl.span("backward", "backward", self._t_backward,
                    max(b.t_ready for b in self.buckets))
        for b in self.buckets:
            if b.handle is not None:  # not retired during backward
                self._finish(b, tl)
        if self._join_round is not None:
            self._join_round.wait()
            self._join_round = None
        if tl is not None:
            tl.add_engine_records(self.comm.timeline())
        for p in self._sparse:  # back to sparse for optimizers that need it (SparseAdam)
            b, i = self._bucket_of[p]
            p.grad = b.views[i].to_sparse()
        for p in self._passes:
            self._passes[p] = 0
        self._next_submit = 0
        self._t_backward = None
        for s in list(self._stats):
            if s.end is not None:
                s.end()
        return True

    def _finish(self, b, tl):
        """Waits for bucket b's handle; the comm hook's finish step."""
        t_wait = comm.wtime()
        result = b.handle.wait()
        t_done = comm.wtime()
        kept = self._hook.finish(b, result)
        for s in self._stats:
            if s.after is not None:
                s.after(kept, b, s.tail(b))
        if tl is not None:
            row = "bucket.%d" % b.index
            tl.span(row, "pack", b.t_ready, b.t_submitted, params=len(b.params))
            tl.span(row, "wait", t_wait, t_done)
            tl.span(row, "unpack", t_done, comm.wtime())
        b.handle = b.sent = b.ctx = None
        b.ready = 0

    def join_answer(self, op):
        """For join() on a rank that has joined: every bucket's part in bucket
        order (AllReduceHook.join_answer); returns the handles."""
        return [self._hook.join_answer(b, op) for b in self.buckets]

    def zero_grad(self, set_to_none=True):
        """Each .grad None (set_to_none) or its bucket view zeroed."""
        for b in self.buckets:
            if not set_to_none and b.buffer is not None:
                b.buffer.zero_()
            for p, v in zip(b.params, b.views):
                p.grad = None if set_to_none else v


# ---------------------------------------------------------------- helpers
def param_names(params, named_parameters):
    """{param: name}; checks Horovod's rules on named_parameters."""
    if named_parameters is None:
        return {p: "allreduce.noname.%d" % i for i, p in enumerate(params)}
    named = list(named_parameters)
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError("parameter names in named_parameters must be unique; duplicates: %s"
                         % ", ".join(dups))
    by_param = {p: n for n, p in named}
    missing = [p for p in params if p not in by_param]
    if missing:
        raise ValueError("named_parameters was given, but %d parameter(s) of the optimizer "
                         "are not in it (shapes %s). Pass model.named_parameters() of the "
                         "model whose parameters the optimizer holds."
                         % (len(missing), [tuple(p.shape) for p in missing[:5]]))
    return {p: by_param[p] for p in params}


def plan_buckets(params, groups):
    """Parameter lists, one per bucket, in reverse parameter order: a small
    first one, then threshold-sized, never mixing dtypes or devices. groups:
    None, an int (that many equal buckets) or a list of parameter lists (each
    one bucket)."""
    if isinstance(groups, (list, tuple)):
        listed = [p for g in groups for p in g]
        rest = [p for p in params if p not in set(listed)]
        return [list(g) for g in groups if g] + [[p] for p in reversed(rest)]
    order = list(reversed(params))
    if isinstance(groups, int) and groups > 0:
        per = -(-len(order) // groups)
        return [order[i:i + per] for i in range(0, len(order), per)]
    plan, cur, cur_bytes, limit = [], [], 0, FIRST_BUCKET_BYTES
    for p in order:
        nbytes = p.numel() * p.element_size()
        if cur and (cur_bytes + nbytes > limit or p.dtype != cur[0].dtype
                    or p.device != cur[0].device):
            plan.append(cur)
            cur, cur_bytes, limit = [], 0, fusion_threshold()
        cur.append(p)
        cur_bytes += nbytes
    if cur:
        plan.append(cur)
    return plan


def check_same_plan(plan, on):
    """Collective over on: every rank must build the same buckets (they are
    allocated together in node shared memory and all-reduced pairwise);
    otherwise a ValueError on every rank that says how they differ."""
    mine = [(sum(p.numel() for p in g), str(g[0].dtype)) for g in plan]
    every = on.allgather_object(mine)
    if any(b != every[0] for b in every):
        ranks = ", ".join("rank %d: %d buckets, %d elements" % (r, len(b), sum(n for n, _ in b))
                          for r, b in enumerate(every[:8]))
        raise ValueError("DistributedOptimizer: ranks built different fusion buckets (%s). "
                         "Every rank must wrap an optimizer over the same model, with the "
                         "same HPCDL_FUSION_THRESHOLD and groups." % ranks)


def member_comm(process_set):
    """The Communicator of process_set (None: the global set) on this rank;
    None outside it."""
    if process_set is None:
        process_set = global_process_set
    if process_set.process_set_id not in (0, None) and not process_set.included():
        return None
    return comm_of(process_set, "DistributedOptimizer")


def warn_no_gradient():
    warnings.warn(
        "DistributedOptimizer: no gradient of its parameters arrived since the "
        "last step(), so nothing is averaged or updated. Did backward() run on "
        "the parameters this optimizer was built with? Replacing them after "
        "building it (model.load_state_dict(..., assign=True), new modules) "
        "leaves it holding the old ones: build the optimizer after loading.")
