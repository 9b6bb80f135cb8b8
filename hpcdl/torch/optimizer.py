"""optimizer.py - DistributedOptimizer: gradients are averaged over ranks in
fusion buckets while backward still runs.

When things happen:
  * at construction, parameters are assigned to buckets in reverse order of
    registration (roughly the order backward produces their gradients): a
    small first bucket so communication starts early, then buckets of
    HPCDL_FUSION_THRESHOLD bytes (default 25 MiB). Each parameter's .grad
    becomes a view into its bucket's flat buffer, so no packing copy is needed.
  * during backward, a hook fires as each gradient is accumulated; once every
    parameter of bucket i has its gradient (after backward_passes_per_step
    passes) and buckets 0..i-1 are submitted, bucket i goes to the engine
    thread as one asynchronous all-reduce. Submitting strictly in bucket order
    keeps the order identical on every rank whatever order hooks fire in.
  * step() (or synchronize()) submits buckets whose parameters got no gradient
    (as zeros), waits for every bucket, undoes compression and scaling in
    place, then calls the wrapped optimizer's step().
  * hvd.join(): with zero_stage=0 on the global process set, the first
    bucket of each step is preceded by one descriptor round naming this
    optimizer (its number: every rank builds its optimizers in the same
    order); a rank that has joined answers it with every bucket of its own
    copy, zeroed, in bucket order (_join.py). One tiny all-gather per step.
  * zero_stage=1|2 shards the optimizer state (and at 2 the gradients) over
    the ranks: zero/sharding.py, docs/zero.md.
"""
import contextlib
import itertools
import os
import warnings

import torch

from .. import comm
from ..optim.wrapper import OptimizerWrapper
from ..trace import timeline as _timeline
from .compression import compress
from . import _join, zero as _zero
from .zero.layout import REDUCE_IN_FLIGHT

FIRST_BUCKET_BYTES = 1 << 20
_numbers = itertools.count(1)


def fusion_threshold():
    return int(os.environ.get("HPCDL_FUSION_THRESHOLD", str(25 << 20)))


def _bucket_buffer(numel, dtype, device, on):
    """A bucket's flat buffer. On the CPU, in the node's shared memory when
    the node has several ranks (HPCDL_SHARED_BUCKETS=0 turns this off): the
    engine then all-reduces it in place without staging copies (src_c/shared.c).
    Collective over each node: every rank builds the same buckets in order."""
    # on: the world's Communicator; None (a process set's) keeps plain buffers, since
    # a node-shared window lives until exit and would outlive the set's communicator
    if (on is not None and device.type == "cpu" and numel > 0
            and os.environ.get("HPCDL_SHARED_BUCKETS", "1") != "0"):
        view = on.shared_buffer(numel * torch.empty((), dtype=dtype).element_size())
        if view is not None:
            return torch.frombuffer(view, dtype=dtype, count=numel)
    return torch.zeros(numel, dtype=dtype, device=device)


class _Bucket:
    """Parameters fused into one flat buffer and one all-reduce."""

    def __init__(self, index, params, names, on, lazy=False):
        self.index, self.params, self.names = index, params, names
        self.numel = sum(p.numel() for p in params)
        self.buffer, self.views = None, []
        if not lazy:  # lazy (ZeRO stage 2): allocated per step, freed once reduced
            self.allocate(on)
        self.ready = 0        # parameters whose gradient is complete this step
        self.handle = None    # comm.Handle while in flight
        self.ctx = None       # compression context
        self.sent = None      # the (possibly compressed) tensor in flight
        self.t_ready = self.t_submit = self.t_submitted = 0.0

    def allocate(self, on=None):
        dtype, device = self.params[0].dtype, self.params[0].device
        self.buffer = _bucket_buffer(self.numel, dtype, device, on)
        self.views, offset = [], 0
        for p in self.params:
            self.views.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def release(self):
        self.buffer, self.views = None, []


class DistributedOptimizer(OptimizerWrapper):
    """Wraps an optimizer so that step() applies gradients averaged over all
    ranks. A plain wrapper: param_groups and state are the wrapped optimizer's
    own objects, so LR schedulers and checkpoints see one optimizer.

    process_set: gradients are averaged over that set's ranks only; on a rank
    outside it the optimizer steps on its own gradients (as Horovod's).
    Sparse gradients (nn.Embedding(sparse=True)) travel dense in the buckets
    and are handed back to the wrapped optimizer sparse, whether or not
    sparse_as_dense is set (the same numbers as Horovod's all-gather of
    indices and values); they are recognised when .grad is None before
    backward (zero_grad()'s default).

    zero_stage: 0 (default) every rank holds all optimizer state; 1 each
    rank keeps the state of its 1/N of every bucket, updates that part and
    the parameters are all-gathered; 2 also the gradients are
    reduce-scattered, p.grad is None after backward (docs/zero.md). At 1 and
    2, state_dict() is collective (call it on every rank) and returns the
    unsharded optimizer's dict; clip_grad_norm_() clips across shards."""

    def __new__(cls, optimizer, named_parameters=None, compression=None,
                backward_passes_per_step=1, op="average", *args, **kwargs):
        from ._basics import Adasum
        if op == Adasum:  # Horovod's delta optimizer (adasum_optimizer.py)
            from .adasum_optimizer import DistributedAdasumOptimizer
            params = [p for g in optimizer.param_groups for p in g["params"]
                      if p.requires_grad]
            ps = kwargs.get("process_set")
            return DistributedAdasumOptimizer(
                optimizer, _param_names(params, named_parameters),
                compression if compression is not None else _none_compression(),
                _member_comm(ps if ps is not None else _global_set()))
        return super().__new__(cls)

    def __init__(self, optimizer, named_parameters=None, compression=None,
                 backward_passes_per_step=1, op="average", gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                 zero_stage=0):
        from .compression import Compression
        from ._basics import comm_op
        from .process_sets import global_process_set
        if num_groups and groups is None:
            warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                          "removed in v0.23.0.", DeprecationWarning)
            groups = int(num_groups)
        self.zero_stage = _zero.check_stage(zero_stage)
        self.process_set = process_set if process_set is not None else global_process_set
        self.sparse_as_dense = bool(sparse_as_dense)
        self._sparse = set()  # parameters whose gradients came sparse
        self._comm = _member_comm(self.process_set)  # None outside the set
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        super().__init__(optimizer, params)
        self._compression = compression if compression is not None else Compression.none
        self._passes_per_step = int(backward_passes_per_step)
        if self._passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._op = comm_op(op)
        self._predivide = float(gradient_predivide_factor)
        if self._predivide != 1.0 and self._op != "average":
            raise ValueError("gradient_predivide_factor needs op=Average")
        self._names = _param_names(params, named_parameters)
        self._parameter_names = self._names  # Horovod's name for {param: name}
        if self._comm is None:  # outside the process set: a plain optimizer
            params = []
        plan = _plan_buckets(params, groups)
        if self._comm is not None:
            _check_same_plan(plan, self._comm)
        shared_on = self._comm if self.process_set.process_set_id == 0 else None
        if self.zero_stage == 2:  # not in node-shared memory: those buffers are never freed
            shared_on = None
        self._buckets = [_Bucket(i, g, [self._names[p] for p in g], shared_on,
                                 lazy=self.zero_stage == 2) for i, g in enumerate(plan)]
        self._bucket_of = {p: (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        self._passes = {p: 0 for p in params}
        self._next_submit = 0
        self._synchronized = False
        self._skip_sync = False
        self._t_backward = None  # first gradient hook of this step (MPI_Wtime)
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in params]
        self._join_number = next(_numbers)     # the same on every rank: built in order
        self._join_round = None                # this step's round (comm handle)
        if (self._comm is not None and self.zero_stage == 0
                and self.process_set.process_set_id == 0):
            _join.joinable[self._join_number] = self
        for b in self._buckets:
            for p, v in zip(b.params, b.views):
                p.grad = v
        self._zero = None
        if self.zero_stage and self._comm is not None:
            self._zero = _zero.Sharding(self, self.zero_stage)

    # ------------------------------------------------------------ backward side
    def _hook(self, p):
        if self._t_backward is None:
            self._t_backward = comm.wtime()
        b, i = self._bucket_of[p]
        if b.buffer is None:  # ZeRO stage 2: the first gradient of the bucket this step
            self._zero.allocate(b)
        if self._zero is not None and p.grad.is_sparse:
            raise RuntimeError("zero_stage=%d does not support sparse gradients (%s); use "
                               "zero_stage=0" % (self.zero_stage, self._names[p]))
        if p.grad is not b.views[i]:  # first pass since zero_grad(): into the bucket
            if p.grad.is_sparse:
                self._sparse.add(p)
                b.views[i].copy_(p.grad.to_dense())
            else:
                b.views[i].copy_(p.grad)
            p.grad = b.views[i]
        self._passes[p] += 1
        if self._passes[p] > self._passes_per_step:
            raise RuntimeError(
                "gradients of %s were computed %d times before step(), but "
                "backward_passes_per_step=%d: the all-reduce of its bucket is already in "
                "flight and would read a half-updated buffer. Call step() (or "
                "synchronize()) after every %d backward passes."
                % (self._names[p], self._passes[p], self._passes_per_step,
                   self._passes_per_step))
        if self._passes[p] == self._passes_per_step:
            b.ready += 1
            if b.ready == len(b.params):
                b.t_ready = comm.wtime()
                self._submit_in_order(upto=len(self._buckets) - 1, force=False)

    def _submit_in_order(self, upto, force):
        """Submits buckets next_submit..upto while each is complete (or force)."""
        while self._next_submit <= upto:
            b = self._buckets[self._next_submit]
            if not force and b.ready < len(b.params):
                return
            self._submit(b)
            self._next_submit += 1

    def _submit(self, b):
        b.t_submit = comm.wtime()
        if b.buffer is None:  # ZeRO stage 2: no gradient in this bucket at all
            self._zero.allocate(b)
        if b.ready < len(b.params):  # sent by synchronize(), not by its last hook
            b.t_ready = b.t_submit
            for p, v in zip(b.params, b.views):
                if self._passes[p] == 0:  # no gradient this step: it counts as zero
                    v.zero_()
                    p.grad = v
        if b.index == 0 and self._join_number in _join.joinable:
            self._join_round = _join.start_step_round(self)
        t = b.buffer
        if self._predivide != 1.0:
            t.mul_(1.0 / self._predivide)
        b.sent, b.ctx = compress(self._compression, t, "bucket.%d" % b.index)
        if self.zero_stage == 2:
            b.handle = self._zero.start_reduce(b, b.sent)
        else:
            b.handle = self._comm.allreduce_async(b.sent, op=self._op,
                                                  name="bucket.%d" % b.index)
        b.t_submitted = comm.wtime()
        if self.zero_stage == 2:
            self._retire_reduced()

    def _retire_reduced(self):
        """ZeRO stage 2, during backward: each submitted bucket whose
        reduce-scatter is done keeps its block and frees its full buffer now,
        not at step(). Beyond REDUCE_IN_FLIGHT reduce-scatters in flight the
        oldest is waited for, so a rank holds its gradient blocks plus at most
        that many full buckets and the one filling (the engine runs them in
        submission order, so the oldest finishes first)."""
        in_flight = [b for b in self._buckets[:self._next_submit + 1] if b.handle is not None]
        tl = _timeline.active()
        for left, b in zip(range(len(in_flight), 0, -1), in_flight):
            if left <= REDUCE_IN_FLIGHT and not b.handle.poll():
                return
            self._finish(b, tl)

    # ------------------------------------------------------------- step side
    def synchronize(self):
        """Waits for every bucket's all-reduce; afterwards each p.grad holds the
        average over ranks. Buckets with parameters that got no gradient this
        step are sent now (their missing gradients count as zero)."""
        if self._next_submit == 0 and all(n == 0 for n in self._passes.values()):
            if not self._synchronized and self._comm is not None:
                warnings.warn(
                    "DistributedOptimizer: no gradient of its parameters arrived since the "
                    "last step(), so nothing is averaged or updated. Did backward() run on "
                    "the parameters this optimizer was built with? Replacing them after "
                    "building it (model.load_state_dict(..., assign=True), new modules) "
                    "leaves it holding the old ones: build the optimizer after loading.")
            self._synchronized = True
            return  # no backward since the last step: nothing to reduce
        self._submit_in_order(upto=len(self._buckets) - 1, force=True)
        tl = _timeline.active()
        if tl is not None and self._t_backward is not None:
            tl.span("backward", "backward", self._t_backward,
                    max(b.t_ready for b in self._buckets))
        for b in self._buckets:
            if b.handle is not None:  # not retired during backward (ZeRO stage 2)
                self._finish(b, tl)
        if self._join_round is not None:
            self._join_round.wait()
            self._join_round = None
        if tl is not None:
            tl.add_engine_records(self._comm.timeline())
        for p in self._sparse:  # back to sparse for optimizers that need it (SparseAdam)
            b, i = self._bucket_of[p]
            p.grad = b.views[i].to_sparse()
        for p in self._passes:
            self._passes[p] = 0
        self._next_submit = 0
        self._t_backward = None
        self._synchronized = True
        if self._zero is not None:
            self._zero.attach_grads()

    def _finish(self, b, tl):
        """Waits for bucket b's all-reduce (reduce-scatter at stage 2) and
        undoes compression and scaling: into b's buffer, or this rank's block."""
        t_wait = comm.wtime()
        b.handle.wait()
        t_done = comm.wtime()
        if self.zero_stage == 2:
            self._zero.finish_reduce(b, b.ctx, self._predivide)
        else:
            self._unpack(b)
        if tl is not None:
            row = "bucket.%d" % b.index
            tl.span(row, "pack", b.t_ready, b.t_submitted, params=len(b.params))
            tl.span(row, "wait", t_wait, t_done)
            tl.span(row, "unpack", t_done, comm.wtime())
        b.handle = b.sent = b.ctx = None
        b.ready = 0

    def join_answer(self, op):
        """For join() on a rank that has joined: queues every bucket's
        all-reduce (its buffer zeroed: node-shared buckets stay on their fast
        path) with op, in bucket order; returns the handles."""
        handles = []
        for b in self._buckets:
            zeros = b.buffer.zero_()
            if getattr(self._compression, "needs_name", False):  # top-k: a new tensor
                sent = torch.zeros_like(zeros)
            else:                                             # the buffer, or its cast
                sent, _ = compress(self._compression, zeros, None)
            handles.append(self._comm.allreduce_async(sent, op=op, name="join.bucket.%d"
                                                      % b.index))
        return handles

    def _unpack(self, b):
        out = self._compression.decompress(b.sent, b.ctx)
        if out is not b.buffer:
            b.buffer.copy_(out)
        if self._predivide != 1.0:
            b.buffer.mul_(self._predivide)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize again: for
        synchronize(); clip_grad_norm_(...); step() sequences."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure=None):
        if self._skip_sync:
            if not self._synchronized:
                raise RuntimeError("step() inside skip_synchronize() but synchronize() "
                                   "was not called since the last backward: gradients "
                                   "would not be averaged over ranks")
        else:
            if self._synchronized and self._next_submit == 0:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        if self._zero is not None:
            return self._zero.step(closure)
        return self._opt.step(closure)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the averaged gradients by their global norm, as
        torch.nn.utils.clip_grad_norm_ over the whole model: call it after
        synchronize(), then step() inside skip_synchronize(). At zero_stage 2
        the norm is summed over every rank's gradient shard (collective)."""
        if self.zero_stage == 2:
            grads = [t.grad for t in self._zero.pieces() if t.grad is not None]
            return _zero.norms.clip_pieces_(grads, max_norm, norm_type, self._comm)
        params = [p for g in self.param_groups for p in g["params"]] if not self._zero \
            else list(self._passes)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)

    def local_parameters(self):
        """The tensors whose .grad this rank steps from after synchronize():
        the parameters (stages 0, 1) or this rank's pieces of them (stage 2).
        For checks on the averaged gradients (loss-scale overflow, unscaling)."""
        if self.zero_stage == 2:
            return self._zero.pieces()
        return list(self._passes) if self._zero is not None else \
            [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        if self._zero is not None:  # collective: the pieces of every rank, joined
            return self._zero.state_dict()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        if self._zero is None:
            return super().load_state_dict(state_dict)
        self._zero.load_state_dict(state_dict)  # an unsharded dict; this rank keeps its part
        self.param_groups, self.state = self._opt.param_groups, self._opt.state

    def zero_grad(self, set_to_none=True):
        """Resets the gradients; refuses between backward and step. With
        set_to_none (the default, as in torch) each .grad becomes None and the
        next backward's gradient is copied into its bucket by the hook: one
        copy instead of zeroing the buckets and accumulating into them (which
        reads and writes every bucket once more)."""
        if self._next_submit > 0 or any(n for n in self._passes.values()):
            raise RuntimeError(
                "zero_grad() was called after backward() but before step() or "
                "synchronize(): the gradients' all-reduce is in flight (or about to be) "
                "and zeroing them now would lose this step. Call zero_grad() before "
                "backward(), or after step().")
        if self._comm is None:  # outside the process set: a plain optimizer
            return self._opt.zero_grad(set_to_none=set_to_none)
        for b in self._buckets:
            if not set_to_none and b.buffer is not None:
                b.buffer.zero_()
            for p, v in zip(b.params, b.views):
                p.grad = None if set_to_none else v

    # ------------------------------------- state_dict etc.: OptimizerWrapper's
    def add_param_group(self, param_group):
        if not hasattr(self, "_hooks"):  # torch.optim.Optimizer.__init__ building groups
            return super().add_param_group(param_group)
        raise RuntimeError("add_param_group on a DistributedOptimizer is not supported: "
                           "add the group to the wrapped optimizer first, then wrap it")

    def __repr__(self):
        return "DistributedOptimizer(%r, buckets=%d)" % (self._opt, len(self._buckets))


# ---------------------------------------------------------------- helpers
def _param_names(params, named_parameters):
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


def _plan_buckets(params, groups):
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


def _none_compression():
    from .compression import Compression
    return Compression.none


def _global_set():
    from .process_sets import global_process_set
    return global_process_set


def _member_comm(process_set):
    """The Communicator of process_set on this rank; None outside it."""
    from .process_sets import comm_of
    if process_set.process_set_id not in (0, None) and not process_set.included():
        return None
    return comm_of(process_set, "DistributedOptimizer")


def _check_same_plan(plan, on):
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
