"""sharding.py - ZeRO stages 1 and 2 inside DistributedOptimizer's buckets.

Each fusion bucket is cut into one block per rank (layout.py). A rank keeps
optimizer state only for the parameter pieces in its blocks: the wrapped
optimizer's param_groups are rebound to those pieces (1-D views into the
model's own parameters), so its step() updates 1/N of the model in place and
its state (momentum, Adam's moments) has 1/N of the elements. After the step
every bucket's updated blocks are all-gathered back into the parameters.

    stage 1   gradients as in stage 0: each bucket is all-reduced during
              backward and p.grad holds the average on every rank; a piece's
              .grad is a view into its bucket.
    stage 2   each bucket is reduce-scattered as it fills (async, in bucket
              order, overlapped with backward like stage 0's all-reduce);
              the rank keeps only its block of the averaged gradient, the
              full bucket is freed once the reduce-scatter is done, and the
              model's p.grad is None after backward.

LARS and LARC take per-layer norms of a whole layer: a split layer's norms
are summed over every rank's piece (norms.py) before the wrapped step.
"""
import collections

import torch

from .layout import block_counts, pieces_of
from . import norms, state

GATHER_WINDOW = 2  # all-gathers left in flight while the oldest is unpacked: bounds the buffers


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


class Sharding:
    """The sharded side of a DistributedOptimizer (opt) at zero_stage 1 or 2."""

    def __init__(self, opt, stage):
        self.opt, self.stage = opt, stage
        self.comm = opt._comm
        self.inner = opt._opt          # the wrapped optimizer, whose groups we rebind
        for b in opt._buckets:
            for p in b.params:
                if p.device.type != "cpu":  # the core's reduce-scatter / all-gather
                    raise ValueError("zero_stage=%d needs CPU parameters for now (%s is on "
                                     "%s): hpcdl's reduce-scatter and all-gather take host "
                                     "buffers only; use zero_stage=0 on GPUs"
                                     % (stage, opt._names[p], p.device))
                if not p.is_contiguous():
                    raise ValueError("zero_stage=%d needs contiguous parameters; %s is not "
                                     "(call .contiguous() on it before building the "
                                     "optimizer)" % (stage, opt._names[p]))
        self.shards = [_BucketShard(b, self.comm.size, self.comm.rank) for b in opt._buckets]
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
    def start_reduce(self, b, sent):
        """Queues bucket b's reduce-scatter of `sent` (the compressed buffer);
        the model's gradients of b are spent, so p.grad goes to None."""
        s = self.shards[b.index]
        s.recv = s.grad if sent.dtype == s.grad.dtype else torch.empty(
            s.count, dtype=sent.dtype, device=s.device)
        h = self.comm.reduce_scatter_async(sent, s.recv, counts=s.counts, op=self.opt._op,
                                           name="bucket.%d" % b.index)
        for p in b.params:
            p.grad = None
        return h

    def finish_reduce(self, b, ctx, predivide):
        """After the wait: the block into s.grad; the full bucket is freed."""
        s = self.shards[b.index]
        out = self.opt._compression.decompress(s.recv, ctx)
        if out is not s.grad:
            s.grad.copy_(out)
        if predivide != 1.0:
            s.grad.mul_(predivide)
        s.recv = None
        b.release()

    # ------------------------------------------------------------ step
    def attach_grads(self):
        """After synchronize(): each piece's .grad is its slice of the block."""
        for s in self.shards:
            for c, t in zip(s.pieces, s.tensors):
                t.grad = s.grad[c.at:c.at + c.numel].view(t.shape)

    def step(self, closure=None):
        """The wrapped optimizer updates this rank's pieces, then every
        bucket's blocks are all-gathered into the model's parameters."""
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

    @torch.no_grad()
    def gather_params(self):
        """All-gathers every bucket's updated blocks into the parameters,
        GATHER_WINDOW buckets in flight at a time."""
        window = collections.deque()
        for s in self.shards:
            send = torch.empty(s.count, dtype=s.dtype, device=s.device)
            for c, t in zip(s.pieces, s.tensors):
                send[c.at:c.at + c.numel].copy_(t.reshape(-1))
            recv = torch.empty(s.bucket.numel, dtype=s.dtype, device=s.device)
            h = self.comm.allgather_async(send, recv, counts=s.counts,
                                          name="gather.%d" % s.bucket.index)
            window.append((s, h, recv))
            if len(window) > GATHER_WINDOW:
                _unpack(*window.popleft())
        while window:
            _unpack(*window.popleft())

    # ------------------------------------------------------------ checkpoints
    def state_dict(self):
        return state.consolidate(self)

    def load_state_dict(self, full):
        state.load_full(self, full)

    def state_bytes(self):
        """Bytes of optimizer-state tensors this rank holds."""
        return sum(v.numel() * v.element_size() for st in self.inner.state.values()
                   for v in st.values() if torch.is_tensor(v))


def _unpack(s, handle, recv):
    handle.wait()
    offset = 0
    for p in s.bucket.params:
        p.detach().view(-1).copy_(recv[offset:offset + p.numel()])
        offset += p.numel()
