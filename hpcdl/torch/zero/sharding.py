"""sharding.py - ZeRO stages 1 and 2 over a Reducer's buckets (ZeroOptimizer).

Each fusion bucket is cut into one block per rank (layout.py). A rank keeps
optimizer state only for the parameter pieces in its blocks: the wrapped
optimizer's param_groups are rebound to those pieces (1-D views into the
model's own parameters), so its step() updates 1/N of the model in place and
its state (momentum, Adam's moments) has 1/N of the elements. The model's
parameters are moved into one flat buffer per bucket, so after the step every
bucket's updated blocks are all-gathered back into the parameters in place.

    stage 1   gradients as in stage 0: each bucket is all-reduced during
              backward and p.grad holds the average on every rank; a piece's
              .grad is a view into its bucket.
    stage 2   each bucket is reduce-scattered as it fills (async, in bucket
              order, overlapped with backward like stage 0's all-reduce);
              the rank keeps only its block of the averaged gradient, the
              full bucket is freed once its reduce-scatter is done (checked
              as later buckets are submitted; the Reducer waits for the
              oldest beyond REDUCE_IN_FLIGHT), and the model's p.grad is None
              after backward. ReduceScatterHook is the Reducer's comm hook.

LARS and LARC take per-layer norms of a whole layer: a split layer's norms
are summed over every rank's piece (norms.py) before the wrapped step.
"""
import torch

from ..reducer import pack
from .layout import block_counts, pieces_of
from . import norms, state


class _BucketShard:
    """One bucket's split: this rank's block and the pieces in it."""

    def __init__(self, bucket, size, rank):
        self.bucket = bucket
        self.counts = block_counts(bucket.numel, size)
        self.lo = sum(self.counts[:rank])
        self.count = self.counts[rank]
        p0 = bucket.params[0]
        self.dtype, self.device = p0.dtype, p0.device
        self.pieces = pieces_of([p.numel() for p in bucket.params], self.counts, rank)
        self.tensors = [_piece_view(bucket.params[c.index], c) for c in self.pieces]
        self.grad = None    # this rank's block of the averaged gradient
        self.recv = None    # stage 2: the reduce-scatter's receive buffer in flight


def _piece_view(p, piece):
    """The piece as a leaf tensor sharing p's memory (updates land in the model)."""
    flat = p.detach().view(-1)[piece.start:piece.stop]
    return flat.view(()) if p.dim() == 0 else flat


class ReduceScatterHook:
    """Stage 2's comm hook: each bucket (compressed) reduce-scattered with op;
    this rank keeps its block of the result, the full buffer is freed."""
    joinable = False      # the joined rank would not take part in the all-gather
    carries_tail = False  # the tail would land in the last rank's block only

    def __init__(self, sharding, op, compression, predivide):
        self.sharding, self.op = sharding, op
        self.compression, self.predivide = compression, predivide

    def start(self, b):
        return self.sharding.start_reduce(b, pack(b, self.compression, self.predivide),
                                          self.op)

    def finish(self, b, result):
        return self.sharding.finish_reduce(b, b.ctx, self.compression, self.predivide)


class Sharding:
    """The sharded side of a ZeroOptimizer: its Reducer's buckets split over
    the ranks; inner is the wrapped optimizer, whose groups are rebound."""

    def __init__(self, reducer, inner, stage):
        self.reducer, self.stage = reducer, stage
        self.comm, self.names = reducer.comm, reducer.names
        self.inner = inner
        for b in reducer.buckets:
            for p in b.params:
                if p.device.type != "cpu":  # the core's reduce-scatter / all-gather
                    raise ValueError("zero_stage=%d needs CPU parameters for now (%s is on "
                                     "%s): hpcdl's reduce-scatter and all-gather take host "
                                     "buffers only; use zero_stage=0 on GPUs"
                                     % (stage, self.names[p], p.device))
                if not p.is_contiguous():
                    raise ValueError("zero_stage=%d needs contiguous parameters; %s is not "
                                     "(call .contiguous() on it before building the "
                                     "optimizer)" % (stage, self.names[p]))
        # the parameters move into one flat buffer per bucket (bucket order), so
        # the all-gather after the step lands in them in place: no pack, no unpack
        self.flats = [_flatten(b.params) for b in reducer.buckets]
        self.shards = [_BucketShard(b, self.comm.size, self.comm.rank) for b in reducer.buckets]
        for s in self.shards:
            if stage == 1:  # the all-reduced bucket holds the block already
                s.grad = s.bucket.buffer[s.lo:s.lo + s.count]
            else:
                s.grad = torch.zeros(s.count, dtype=s.dtype, device=s.device)
        self.piece_of = {}  # piece tensor -> (model parameter, Piece)
        for s in self.shards:
            for c, t in zip(s.pieces, s.tensors):
                self.piece_of[t] = (s.bucket.params[c.index], c)
        self.full_groups = [list(g["params"]) for g in self.inner.param_groups]
        saved = self.inner.state_dict() if self.inner.state else None
        self._rebind()
        if saved is not None:  # state the optimizer had before it was wrapped
            self.load_state_dict(saved)

    def _rebind(self):
        """Each group's params become this rank's pieces of its parameters."""
        mine = {self.piece_of[t][0]: t for t in self.piece_of}
        for group, full in zip(self.inner.param_groups, self.full_groups):
            group["params"] = [mine[p] for p in full if p in mine]

    def pieces(self):
        """This rank's piece tensors, bucket by bucket."""
        return [t for s in self.shards for t in s.tensors]

    # ------------------------------------------------------------ stage 2
    def grad_bytes(self):
        """Stage 2's gradient bytes on this rank: `shard` (its blocks, held
        between steps) and `peak` (the blocks plus the most full buckets that
        were alive at once during a backward: the Reducer keeps at most
        REDUCE_IN_FLIGHT in flight and one filling)."""
        shard = sum(s.grad.numel() * s.grad.element_size() for s in self.shards)
        return {"shard": shard, "peak": shard + self.reducer.peak_bucket_bytes}

    def start_reduce(self, b, sent, op):
        """Queues bucket b's reduce-scatter of `sent` (the compressed buffer);
        the model's gradients of b are spent, so p.grad goes to None."""
        s = self.shards[b.index]
        s.recv = s.grad if sent.dtype == s.grad.dtype else torch.empty(
            s.count, dtype=sent.dtype, device=s.device)
        h = self.comm.reduce_scatter_async(sent, s.recv, counts=s.counts, op=op,
                                           name="bucket.%d" % b.index)
        for p in b.params:
            p.grad = None
        return h

    def finish_reduce(self, b, ctx, compression, predivide):
        """After the wait: the block into s.grad (returned); the full bucket
        is freed."""
        s = self.shards[b.index]
        out = compression.decompress(s.recv, ctx)
        if out is not s.grad:
            s.grad.copy_(out)
        if predivide != 1.0:
            s.grad.mul_(predivide)
        s.recv = None
        b.release()
        return s.grad

    # ------------------------------------------------------------ step
    def attach_grads(self):
        """After synchronize(): each piece's .grad is its slice of the block."""
        for s in self.shards:
            if self.stage == 1:  # the bucket's buffer may have been rebuilt (stats' tail)
                s.grad = s.bucket.buffer[s.lo:s.lo + s.count]
            for c, t in zip(s.pieces, s.tensors):
                t.grad = s.grad[c.at:c.at + c.numel].view(t.shape)

    def step(self, closure=None):
        """The wrapped optimizer updates this rank's pieces, then every
        bucket's blocks are all-gathered into the model's parameters."""
        self._check_storage()
        targets = norms.layer_norm_users(self.inner)
        if targets:
            table = norms.layer_norms(self, self.comm)
            for o in targets:
                o.layer_norms = table.get
        try:
            loss = self.inner.step(closure)
        finally:
            for o in targets:
                o.layer_norms = None
            for t in self.piece_of:
                t.grad = None
        self.gather_params()
        return loss

    def _check_storage(self):
        """The pieces and the all-gather write into the flat buffers: a
        parameter whose storage was replaced since (p.data = ..., model.to(),
        ...) would silently stop training. Agreed
        over ranks (one 4-byte all-reduce) so that every rank raises."""
        err = None
        for s, flat in zip(self.shards, self.flats):
            at = flat.data_ptr()
            for p in s.bucket.params:
                if p.numel() and p.data_ptr() != at and err is None:
                    err = ("zero_stage=%d: on rank %d, parameter %s no longer lives in the buffer "
                           "the optimizer put it in (its .data was replaced: "
                           "model.to(), p.data = ...), so the "
                           "update would not reach it; move or load the model before building "
                           "the optimizer, or copy into p in place"
                           % (self.stage, self.comm.rank, self.names[p]))
                at += p.numel() * flat.element_size()
        if self.comm.any_rank(err is not None):
            self.comm.raise_if_any(err)

    @torch.no_grad()
    def gather_params(self):
        """All-gathers every bucket's updated block into its flat parameter
        buffer in place (each rank's block already sits at its offset there):
        all buckets queued at once, then waited. The ring, which skips the copy
        of a send buffer that is already the rank's block; MPI_Allgatherv would
        need MPI_IN_PLACE for that."""
        handles = [self.comm.allgather_async(flat[s.lo:s.lo + s.count], flat, counts=s.counts,
                                             algorithm="ring", name="gather.%d" % s.bucket.index)
                   for s, flat in zip(self.shards, self.flats)]
        for h in handles:
            h.wait()

    # ------------------------------------------------------------ checkpoints
    def state_dict(self):
        return state.consolidate(self)

    def load_state_dict(self, full):
        state.load_full(self, full)

    def state_bytes(self):
        """Bytes of optimizer-state tensors this rank holds."""
        return sum(v.numel() * v.element_size() for st in self.inner.state.values()
                   for v in st.values() if torch.is_tensor(v))


def _flatten(params):
    """One flat buffer holding params one after another; each parameter's
    .data becomes a view of its span (the same Parameter objects, so the model,
    its state_dict and the optimizer see the new storage)."""
    p0 = params[0]
    flat = torch.empty(sum(p.numel() for p in params), dtype=p0.dtype, device=p0.device)
    offset = 0
    with torch.no_grad():
        for p in params:
            span = flat[offset:offset + p.numel()]
            span.copy_(p.detach().reshape(-1))
            p.data = span.view(p.shape)
            offset += p.numel()
    return flat
