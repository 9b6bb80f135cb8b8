"""stage3.py - ZeRO stage 3: the parameters themselves are sharded, as FSDP does.

    shards = hvd.shard_model(model)      # model's parameters become this rank's pieces
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # a plain optimizer over them
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()  # grads arrive averaged, on this rank's pieces only
        opt.step()

The model is cut into *units* (by default every module that has parameters
of its own; `units=[...]` groups whole sub-trees). A unit's parameters are one
flat buffer of M elements split into N blocks as stages 1-2 split a bucket
(layout.py): rank r keeps block r. Each original parameter is replaced in its
module by a 1-D nn.Parameter holding this rank's piece of it (a view into the
rank's block; empty when the rank owns none of it), so `model.parameters()`
keeps the same order and names, and parameter groups, schedulers, weight decay
and per-element optimizers (SGD, Adam, AdamW) work unchanged.

Around each unit's forward and backward:

    pre-forward     all-gather the unit's blocks into a full buffer (M elements)
                    and put views of it in the module's parameter slots; start
                    the all-gather of the next unit in forward order (prefetch)
    post-forward    the pieces go back into the slots; the full buffer's storage
                    is freed (autograd keeps the views, with no memory behind them)
    pre-backward    (a hook on the unit's outputs) re-gather into the same
                    storage, so the saved views are valid again; prefetch the
                    unit before it in forward order
    backward        the gradient of the full buffer (all of the unit's parameter
                    gradients, complete: every use of the views is done) is
                    reduce-scattered, averaged over ranks, into this rank's
                    block, queued on the engine while backward goes on; the
                    full buffer is freed
    after backward  (a callback autograd runs when the backward is done) wait
                    for the reduce-scatters; each block's slices are added to
                    the pieces' .grad

Every collective goes through the engine (queued, waited later), so
prefetches, gathers and reduce-scatters keep one order on every rank. Peak
parameter memory per rank: the 1/N blocks plus the gathered units alive at
once (the running one, the prefetched one); in backward also the full
gradients whose reduce-scatter is in flight: each is freed as soon as it is
done, and beyond REDUCE_IN_FLIGHT (2) the oldest is waited for in backward.

Not supported (refused or documented): parameters shared by two units (tied
weights across units: put both modules in one unit), GPU parameters (the
core's reduce-scatter and all-gather take host buffers), sparse gradients.
LARS and LARC need whole-layer norms: step them inside
`with shards.layer_norms(opt):`.
"""
import contextlib

import torch
import torch.nn as nn

from . import norms
from .layout import REDUCE_IN_FLIGHT, block_counts, pieces_of
from ..compression import Compression
from ..process_sets import comm_of, global_process_set
from ..reducer import retire_in_order


# ---------------------------------------------------------------- one unit
class _Unit:
    """One module's (sub-tree's) parameters, sharded as one flat buffer."""

    def __init__(self, owner, index, module, params, slots, names):
        self.owner, self.index, self.module = owner, index, module
        self.names = names                        # qualified name of each parameter
        self.shapes = [tuple(p.shape) for p in params]
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        comm = owner.comm
        self.counts = block_counts(self.numel, comm.size)
        self.dtype = params[0].dtype
        lo = sum(self.counts[:comm.rank])
        flat = torch.cat([p.detach().reshape(-1) for p in params]) if params else \
            torch.zeros(0)
        self.shard = flat[lo:lo + self.counts[comm.rank]].clone()  # this rank's block
        self.spans = [(0, 0)] * len(params)      # (offset in block, numel) of each piece
        for c in pieces_of(self.numels, self.counts, comm.rank):
            self.spans[c.index] = (c.at, c.numel)
        self.starts = [0] * len(params)          # first element of each piece in its param
        for c in pieces_of(self.numels, self.counts, comm.rank):
            self.starts[c.index] = c.start
        self.pieces = [nn.Parameter(self.shard[a:a + n], requires_grad=p.requires_grad)
                       for (a, n), p in zip(self.spans, params)]
        self.slots = slots                       # (module, attribute, parameter index)
        self.last_full = None                    # the latest forward's full buffer
        self.prefetched = None                   # (full, handle): next forward's gather
        self.bw_prefetched = None                # (full, handle): a backward re-gather

    # ------------------------------------------------------------ buffers
    def _alloc(self):
        self.owner.account(self.numel * self.shard.element_size())
        return torch.empty(self.numel, dtype=self.dtype)

    def _gather_into(self, full):
        return self.owner.comm.allgather_async(self.shard, full, counts=self.counts,
                                               name="zero3.gather.%d" % self.index)

    def free(self, full):
        """Releases full's memory; views of it stay valid objects with no data."""
        st = full.untyped_storage()
        if st.nbytes():
            st.resize_(0)
            self.owner.account(-self.numel * self.shard.element_size())

    def prefetch(self):
        """Starts the gather of a new full buffer for this unit's next forward."""
        if self.prefetched is None and self.numel:
            full = self._alloc()
            self.prefetched = (full, self._gather_into(full))

    def acquire(self):
        """A full buffer gathered for a forward (the prefetched one if any)."""
        self.drop_backward_prefetch()  # one whose backward never came is stale now
        if self.prefetched is not None:
            full, h = self.prefetched
            self.prefetched = None
            h.wait()
            return full
        full = self._alloc()
        self._gather_into(full).wait()
        return full

    def regather(self, full, wait=True):
        """Re-fills a freed full buffer before backward uses its saved views
        (wait=False: a prefetch, waited by the unit's own pre-backward)."""
        if self.bw_prefetched is not None:
            pending, h = self.bw_prefetched
            if pending is full:
                if wait:
                    self.bw_prefetched = None
                    h.wait()
                return
            self.drop_backward_prefetch()
        if full.untyped_storage().nbytes():
            return
        full.untyped_storage().resize_(self.numel * self.shard.element_size())
        self.owner.account(self.numel * self.shard.element_size())
        h = self._gather_into(full)
        if wait:
            h.wait()
        else:
            self.bw_prefetched = (full, h)

    def drop_backward_prefetch(self):
        if self.bw_prefetched is not None:
            full, h = self.bw_prefetched
            self.bw_prefetched = None
            h.wait()
            self.free(full)

    def drop_prefetch(self):
        self.drop_backward_prefetch()
        if self.prefetched is not None:
            full, h = self.prefetched
            self.prefetched = None
            h.wait()
            self.free(full)

    def start_reduce(self, grad):
        """Queues the reduce-scatter (average) of the unit's full gradient into
        this rank's block (in the wire dtype of the owner's compression: fp16 /
        bf16 halve the bytes); wait_reduce frees the full gradient, add_block
        puts the block into the pieces' .grad."""
        sent, ctx = self.owner.compression.compress(grad.contiguous())
        block = torch.empty(self.counts[self.owner.comm.rank], dtype=sent.dtype)
        h = self.owner.comm.reduce_scatter_async(sent, block, counts=self.counts,
                                                 op="average",
                                                 name="zero3.reduce.%d" % self.index)
        # the handle keeps what it sends (the full gradient, or its 16-bit copy)
        nbytes = sent.numel() * sent.element_size()
        self.owner.account_grad(nbytes)
        return h, (block, ctx, nbytes)

    def wait_reduce(self, handle, sent):
        """Waits for the reduce-scatter: the full gradient it held is freed;
        returns this rank's block (in the parameters' dtype)."""
        handle.wait()
        block, ctx, nbytes = sent
        self.owner.account_grad(-nbytes)
        return self.owner.compression.decompress(block, ctx)

    @torch.no_grad()
    def add_block(self, block):
        for piece, (a, n) in zip(self.pieces, self.spans):
            if piece.grad is None:
                piece.grad = block[a:a + n]
            else:  # backward_passes_per_step > 1, or zero_grad(set_to_none=False)
                piece.grad.add_(block[a:a + n])

    def views(self, full):
        out, at = [], 0
        for shape, n in zip(self.shapes, self.numels):
            out.append(full[at:at + n].view(shape))
            at += n
        return out

    def fill_slots(self, tensors):
        for module, attr, i in self.slots:
            module._parameters[attr] = tensors[i]


class _Gather(torch.autograd.Function):
    """pieces -> the unit's full flat buffer; backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, unit, *pieces):
        full = unit.acquire()
        ctx.unit, ctx.storage = unit, full.untyped_storage()  # no reference to the output
        return full

    @staticmethod
    def backward(ctx, grad):
        """The reduce-scatter runs on the engine while backward goes on; the
        pieces' .grad is set when the whole backward is done (owner.pending)."""
        unit = ctx.unit
        unit.owner.reduce_later(unit, *unit.start_reduce(grad))
        if ctx.storage.nbytes():
            ctx.storage.resize_(0)
            unit.owner.account(-unit.numel * unit.shard.element_size())
        return (None,) + (None,) * len(unit.pieces)


# ---------------------------------------------------------------- the model
class ShardedModel:
    """The controller shard_model() returns; the model itself is changed in place."""

    def __init__(self, model, units, comm, prefetch, compression):
        self.model, self.comm, self.prefetch_on = model, comm, prefetch
        self.compression = compression  # of the gradients' reduce-scatter
        self.sharded = True       # False between unshard() and reshard()
        self.live_bytes = self.peak_bytes = 0  # gathered (full) parameter bytes
        self.grad_live = self.grad_peak = 0    # full gradients in their reduce-scatter
        self.order, self._trace = [], []       # units in forward order
        self.pending = []         # (unit, handle, block): reduce-scatters of this backward
        self.callback_queued = False  # _backward_done queued for this backward
        self.reduced = []         # (unit, block): done in this backward, added at its end
        self.units = _make_units(self, model, units)
        for u in self.units:
            u.fill_slots(u.pieces)
            u.module.register_forward_pre_hook(self._pre_forward(u))
            u.module.register_forward_hook(self._post_forward(u))
        model.register_forward_pre_hook(self._model_starts)
        model.register_forward_hook(self._model_done)

    def account(self, nbytes):
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def account_grad(self, nbytes):
        self.grad_live += nbytes
        self.grad_peak = max(self.grad_peak, self.grad_live)

    # ------------------------------------------------------------ hooks
    def _pre_forward(self, u):
        def hook(module, args):
            if not self.sharded or not u.numel:
                return
            if torch.is_grad_enabled() and any(p.requires_grad for p in u.pieces):
                full = _Gather.apply(u, *u.pieces)
            else:
                full = u.acquire()
            u.last_full = full
            u.fill_slots(u.views(full))
            self._trace.append(u)
            if self.prefetch_on:
                nxt = self._neighbour(u, +1)
                if nxt is not None:
                    nxt.prefetch()
        return hook

    def _post_forward(self, u):
        def hook(module, args, output):
            if not self.sharded or not u.numel:
                return output
            full = u.last_full
            u.fill_slots(u.pieces)
            if full.requires_grad:
                _on_outputs(output, self._pre_backward(u, full))
            u.free(full)
            return output
        return hook

    def _pre_backward(self, u, full):
        done = []

        def hook(grad):
            if not done:
                done.append(True)
                u.regather(full)
                prev = self._before(u) if self.prefetch_on else None
                if prev is not None and prev.last_full is not None:
                    prev.regather(prev.last_full, wait=False)
            return grad
        return hook

    def reduce_later(self, unit, handle, block):
        """Called in backward: the first one queues _backward_done to run when
        autograd has finished this backward. Reduce-scatters that are done
        free the unit's full gradient now (their blocks wait in self.reduced:
        the pieces' .grad changes only when the whole backward has succeeded,
        so a backward that raises leaves no trace, whatever had finished);
        beyond REDUCE_IN_FLIGHT the oldest is waited for here (the engine runs
        them in the order queued, so the oldest finishes first)."""
        if not self.callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self.callback_queued = True
        self.pending.append((unit, handle, block))
        retire_in_order(self.pending, lambda e: e[1].poll(), self._keep_reduced,
                        REDUCE_IN_FLIGHT)

    def _keep_reduced(self, entry):
        unit, handle, block = entry
        self.reduced.append((unit, unit.wait_reduce(handle, block)))

    def _backward_done(self):
        pending, self.pending = self.pending, []
        self.callback_queued = False
        reduced = self.reduced + [(u, u.wait_reduce(h, b)) for u, h, b in pending]
        self.reduced = []
        for unit, block in reduced:  # in the order queued, as before
            unit.add_block(block)

    def _model_starts(self, module, args):
        for u in self.units:  # re-gathers of a backward that never reached them
            u.drop_backward_prefetch()
        for unit, handle, block in self.pending:  # a backward that raised before its callback
            unit.wait_reduce(handle, block)
        self.pending, self.reduced = [], []  # its gradients are dropped
        self.callback_queued = False

    def _model_done(self, module, args, output):
        if self._trace and not self.order:  # the first forward sets the order
            self.order = list(dict.fromkeys(self._trace))
        self._trace = []
        for u in self.units:  # prefetched for a unit this forward did not run
            u.drop_prefetch()
        return output

    def _before(self, u):
        """The unit whose backward comes next: the one before u in forward
        order (for the model itself, which runs first and ends last: the last)."""
        if u.module is self.model:
            return self.order[-1] if self.order and self.order[-1] is not u else None
        return self._neighbour(u, -1)

    def _neighbour(self, u, step):
        if u not in self.order:
            return None
        i = self.order.index(u) + step
        return self.order[i] if 0 <= i < len(self.order) else None

    # ------------------------------------------------------------ whole model
    def parameters(self):
        """This rank's pieces, in model.parameters() order."""
        return list(self.model.parameters())

    @contextlib.contextmanager
    def layer_norms(self, optimizer):
        """LARS and LARC (hpcdl.optim) over the pieces need the norms of whole
        layers: inside this block the ones in optimizer's wrapper chain get
        them (one all-reduce of every parameter's two sums of squares;
        collective when the chain has one, a no-op otherwise):

            with shards.layer_norms(opt):
                opt.step()
        """
        users = norms.layer_norm_users(optimizer)
        if users:
            table = norms.piece_norms([p for _, p, _, _ in self.named_pieces()], self.comm)
            for o in users:
                o.layer_norms = table.get
        try:
            yield
        finally:
            for o in users:
                o.layer_norms = None

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch.nn.utils.clip_grad_norm_ of the whole model, on the pieces'
        gradients (collective; between backward and opt.step()). Torch's own
        function on model.parameters() would take this rank's pieces' norm only:
        here each rank sums its pieces' powers and one all-reduce adds them."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        return norms.clip_pieces_(grads, max_norm, norm_type, self.comm)

    def named_pieces(self):
        """(qualified name, piece, unit, index in unit) for every parameter."""
        return [(u.names[i], p, u, i) for u in self.units for i, p in enumerate(u.pieces)]

    def full_shapes(self):
        """model.state_dict()'s names with the unsharded shapes."""
        full = {n: list(u.shapes[i]) for n, _, u, i in self.named_pieces()}
        return {k: full.get(k, list(v.shape)) for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def unshard(self):
        """Collective: every parameter slot holds the whole parameter (an
        nn.Parameter, requires_grad False) until reshard(); forward runs without
        communication then, so ranks may run different numbers of forwards
        (evaluation), and model.state_dict() is the whole model."""
        if not self.sharded:
            return
        self._drain()
        for u in self.units:
            if not u.numel:
                continue
            full = u.acquire()
            u.fill_slots([nn.Parameter(v, requires_grad=False) for v in u.views(full)])
            self.account(-u.numel * u.shard.element_size())  # held outside the accounting
        self.sharded = False

    def reshard(self):
        """Back to the pieces after unshard() (they were not changed)."""
        if self.sharded:
            return
        for u in self.units:
            u.fill_slots(u.pieces)
        self.sharded = True

    def _drain(self):
        for u in self.units:
            u.drop_prefetch()

    @torch.no_grad()
    def load_full(self, state_dict):
        """Each piece from a whole-model state_dict (model.state_dict() of an
        unsharded copy); buffers as well. No communication."""
        for name, piece, u, i in self.named_pieces():
            if name not in state_dict:
                raise KeyError("state_dict has no parameter %r" % name)
            t = state_dict[name]
            if tuple(t.shape) != u.shapes[i]:
                raise ValueError("parameter %s has shape %s in the state_dict, %s in the "
                                 "model" % (name, tuple(t.shape), u.shapes[i]))
            start = u.starts[i]
            piece.copy_(t.reshape(-1)[start:start + piece.numel()])
        names = {n for n, *_ in self.named_pieces()}
        buffers = {k: v for k, v in state_dict.items() if k not in names}
        self.model.load_state_dict(buffers, strict=False)

    def param_bytes(self):
        """{'shard': bytes of this rank's blocks, 'full': the unsharded model's,
        'peak_gathered': the most gathered bytes alive at once so far}."""
        es = [u.shard.element_size() for u in self.units]
        return {"shard": sum(u.shard.numel() * e for u, e in zip(self.units, es)),
                "full": sum(u.numel * e for u, e in zip(self.units, es)),
                "largest_unit": max((u.numel * e for u, e in zip(self.units, es)), default=0),
                "peak_gathered": self.peak_bytes}

    def grad_bytes(self):
        """{'peak_reducing': the most bytes of full unit gradients (or their
        16-bit copies) held at once by their reduce-scatters so far}: at most
        REDUCE_IN_FLIGHT + 1 units' (the one just queued, before the oldest
        is retired)."""
        return {"peak_reducing": self.grad_peak}


def _on_outputs(output, hook):
    """hook on every tensor of output (a tensor, or a tuple / list / dict of them)
    that autograd will reach."""
    if torch.is_tensor(output):
        if output.requires_grad:
            output.register_hook(hook)
    elif isinstance(output, (tuple, list)):
        for o in output:
            _on_outputs(o, hook)
    elif isinstance(output, dict):
        for o in output.values():
            _on_outputs(o, hook)


# ---------------------------------------------------------------- building
def _make_units(owner, model, units):
    """The units: each listed module (default: each with parameters of its own)
    owns the parameter slots in its sub-tree that no listed module inside it
    owns; the model owns the rest. One parameter in slots of two units (tied
    weights across units) is refused; within one unit it is gathered once."""
    if units is None:
        units = [m for m in model.modules() if any(p is not None for p in
                                                   m._parameters.values())]
    prefix = {m: n for n, m in model.named_modules()}
    for m in units:
        if m not in prefix:
            raise ValueError("shard_model: a module in units= is not part of the model")
    depth = {m: len(n.split(".")) if n else 0 for m, n in prefix.items()}
    ordered = sorted(dict.fromkeys(units), key=lambda m: -depth[m])
    if model not in ordered:
        ordered.append(model)
    taken, owner_of, out = set(), {}, []   # slots claimed; parameter -> (unit, name, index)
    for m in ordered:
        params, slots, names = [], [], []
        for mod_name, mod in m.named_modules(prefix=prefix[m]):
            for attr, p in mod._parameters.items():
                if p is None or (id(mod), attr) in taken:
                    continue
                taken.add((id(mod), attr))
                where = (mod_name + "." if mod_name else "") + attr
                if p in owner_of and owner_of[p][0] is not m:
                    raise ValueError(
                        "shard_model: parameter %s is also %s, in another unit (tied "
                        "weights); put the modules that share it into one unit "
                        "(units=[their common parent]) or do not share it"
                        % (where, owner_of[p][1]))
                if p not in owner_of:
                    owner_of[p] = (m, where, len(params))
                    params.append(p)
                    names.append(where)
                slots.append((mod, attr, owner_of[p][2]))
        if params:
            _check_params(params, names)
            out.append((m, params, slots, names))
    return [_Unit(owner, i, m, params, slots, names)
            for i, (m, params, slots, names) in enumerate(out)]


def _check_params(params, names):
    dtypes = {p.dtype for p in params}
    for p, n in zip(params, names):
        if p.device.type != "cpu":
            raise ValueError("shard_model needs CPU parameters for now (%s is on %s): "
                             "hpcdl's reduce-scatter and all-gather take host buffers only; "
                             "use zero_stage=0 on GPUs" % (n, p.device))
        if not p.is_floating_point():
            raise ValueError("shard_model: parameter %s is %s, not floating point" % (n, p.dtype))
    if len(dtypes) > 1:
        raise ValueError("shard_model: the parameters of one unit must share a dtype (%s "
                         "has %s); list its modules in units= separately" % (names[0], dtypes))


def shard_model(model, units=None, prefetch=True, sync=True, process_set=None,
                compression=None):
    """ZeRO stage 3 on model, in place (collective). Returns the ShardedModel
    controller; model.parameters() are this rank's pieces afterwards, to be
    given to a plain torch optimizer (not DistributedOptimizer: the gradients
    arrive averaged already). units: modules gathered as one (default: every
    module with parameters of its own). sync: broadcast rank 0's parameters
    and buffers first, so every rank cuts the same model. compression:
    hvd.Compression.fp16 or .bf16 sends the gradients' reduce-scatter in 16
    bits (the parameters' all-gather stays exact). docs/zero.md."""
    compression = Compression.none if compression is None else compression
    if compression not in (Compression.none, Compression.fp16, Compression.bf16):
        raise ValueError("shard_model: compression must be hvd.Compression.none, .fp16 or "
                         ".bf16, got %r (top-k keeps per-rank residuals of whole gradients, "
                         "which stage 3 never holds)" % (compression,))
    ps = process_set if process_set is not None else global_process_set
    if ps.process_set_id not in (0, None) and not ps.included():
        raise ValueError("shard_model: this rank is not in the process set")
    comm = comm_of(ps, "shard_model")
    if getattr(model, "_hpcdl_shards", None) is not None:
        raise ValueError("shard_model: this model is sharded already")
    bad = [n for n, p in model.named_parameters() if p.device.type != "cpu"]
    if bad:  # before any collective: every rank has the same model, so every rank raises
        raise ValueError("shard_model needs CPU parameters for now (%s is on %s): hpcdl's "
                         "reduce-scatter and all-gather take host buffers only; use "
                         "zero_stage=0 on GPUs" % (bad[0], model.get_parameter(bad[0]).device))
    sparse = [n for n, m in model.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    if sparse:
        raise ValueError("shard_model does not support sparse gradients (%s has sparse=True); "
                         "use sparse=False or zero_stage=0" % (sparse[0] or "the model"))
    if sync:
        _broadcast(list(model.state_dict().values()), comm)
    shards = ShardedModel(model, units, comm, prefetch, compression)
    model._hpcdl_shards = shards
    return shards


@torch.no_grad()
def _broadcast(tensors, comm):
    """Rank 0's values into every rank's tensors: one broadcast per dtype."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype in sorted(by_dtype, key=str):  # the same order on every rank
        group = by_dtype[dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        comm.broadcast(flat, root=0)
        at = 0
        for t in group:
            t.copy_(flat[at:at + t.numel()].view(t.shape))
            at += t.numel()


def shards_of(model):
    """The ShardedModel of a model shard_model() changed, else None."""
    return getattr(model, "_hpcdl_shards", None)
