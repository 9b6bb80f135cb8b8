"""sharded_embedding.py - ShardedEmbeddingBag: embedding tables sharded
table-wise over the ranks of a torch.distributed process group, looked up
through all-to-all (the recommendation-model case: DLRM / ZionEX).

    dist.init_process_group("hpcdl")
    emb = ShardedEmbeddingBag([(1000, 16), (50, 16), (70000, 32)], mode="sum")
    out = emb(indices, offsets)      # this rank's batch: (B, 16 + 16 + 32)
    out.sum().backward()             # owners get their tables' gradients
    torch.optim.SGD(emb.parameters(), lr=0.1).step()   # each rank steps its own tables

T tables, table t of shape tables[t] = (rows_t, dim_t), owned by rank
placement[t] (default t % N): only the owner holds it (emb.parameters() are
this rank's tables; sparse=True gives them sparse gradients, as
nn.EmbeddingBag's, so an update touches only the looked-up rows). Every
rank passes its own batch of B bags for every table, EmbeddingBag style:
indices[t] the ids, offsets[t] the B starts (offsets[t][0] == 0; empty bags
allowed, pooled as zeros). B may differ between ranks, not between one
rank's tables. Output: (B, sum of dim_t), the tables side by side in order.

forward (3 all-to-alls on the group, in this order):
  1. header: rank r tells every rank s (B_r, the ids r sends s, an error
     code): every rank learns every rank's verdict, so bad input on one rank
     is the same one-line ValueError on all of them, not a hang.
  2. ids out: r sends owner s, for each table s owns, its B_r bag lengths
     then the ids (int64), in table order.
  3. owners pool (F.embedding_bag over every rank's bags, in rank order:
     the same order one process uses on the global batch) and send each rank
     its (B_r, dim_t) rows back; the requester concatenates them per table.
backward: the reverse all-to-all of the pooled rows' gradient (_PooledToBatch),
then embedding_bag's own backward accumulates each owner's row gradients.

This model-parallel <-> data-parallel exchange is the layer's whole cost:
per step each rank sends ids (8 B each) and receives B x sum(dim_t) pooled
values, instead of touching whole tables (an all-gather of the tables, or
the all-reduce of a replicated table's gradient). `traffic` holds the bytes
this rank sent to other ranks in its last forward / backward.

The exchange is torch.distributed's all_to_all_single, so the layer runs on
any backend with it: "hpcdl" (hpcdl's all-to-all over MPI), gloo, NCCL.
Keep the tables out of DDP (they are not replicas): wrap only the dense
part, or ignore these parameters. Every rank must call forward and backward
(the loss must depend on the output on every rank), like any collective.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

_HEADER = 5          # per destination: B, ids sent, error code, table, bad value
_BAD_ARGS, _BAD_OFFSETS, _BAD_ID = 1, 2, 3


class ShardedEmbeddingBag(nn.Module):
    """Table-wise sharded EmbeddingBag; see the module docstring."""

    def __init__(self, tables, mode="sum", placement=None, group=None, dtype=torch.float32,
                 seed=0, sparse=False):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError("ShardedEmbeddingBag: mode %r; use 'sum' or 'mean'" % (mode,))
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.shapes = [(int(r), int(d)) for r, d in tables]
        if not self.shapes or any(r < 1 or d < 1 for r, d in self.shapes):
            raise ValueError("ShardedEmbeddingBag: tables %s must be a non-empty list of "
                             "(rows, dim) with rows, dim >= 1" % (list(tables),))
        self.placement = ([t % self.size for t in range(len(self.shapes))] if placement is None
                          else [int(p) for p in placement])
        if (len(self.placement) != len(self.shapes)
                or any(not 0 <= p < self.size for p in self.placement)):
            raise ValueError("ShardedEmbeddingBag: placement %s must give each of the %d "
                             "tables a rank in [0, %d)" % (self.placement, len(self.shapes),
                                                            self.size))
        self.mode, self.dtype, self.sparse = mode, dtype, bool(sparse)
        self._agree()
        self.owned = [t for t, p in enumerate(self.placement) if p == self.rank]
        self.weights = nn.ParameterDict({
            str(t): nn.Parameter(init_table(self.shapes[t], t, seed, dtype))
            for t in self.owned})
        self.traffic = {"forward": 0, "backward": 0}

    def extra_repr(self):
        return "tables=%d, mode=%s, owned=%s of %d ranks" % (
            len(self.shapes), self.mode, self.owned, self.size)

    def _agree(self):
        """Same tables, mode and placement on every rank, else ValueError on all."""
        mine = (self.shapes, self.mode, self.placement, str(self.dtype))
        every = [None] * self.size
        dist.all_gather_object(every, mine, group=self.group)
        for r, theirs in enumerate(every):
            if theirs != every[0]:
                raise ValueError(
                    "ShardedEmbeddingBag: ranks disagree on the tables: rank 0 has (tables, "
                    "mode, placement, dtype) %s, rank %d has %s; build the layer alike on "
                    "every rank" % (every[0], r, theirs))

    def table(self, t):
        """This rank's weight of table t (a Parameter), None if another rank owns it."""
        return self.weights[str(t)] if str(t) in self.weights else None

    # ---------------------------------------------------------------- forward
    def forward(self, indices, offsets):
        T, N = len(self.shapes), self.size
        try:
            lengths, ids, batch = self._check(indices, offsets)
            err = (0, -1, 0)
        except _BadInput as e:
            lengths, ids, batch, err = None, None, 0, e.code
        # 1. header: to every rank s, (B, ids for s, error code, table, value)
        per_dest = [0] * N
        if lengths is not None:
            for t in range(T):
                per_dest[self.placement[t]] += ids[t].numel() + batch
        header = torch.tensor([[batch, per_dest[s]] + list(err) for s in range(N)],
                              dtype=torch.int64)
        got = torch.empty_like(header)
        dist.all_to_all_single(got.view(-1), header.view(-1), group=self.group)
        self._raise_first_error(got)
        batches, incoming = got[:, 0].tolist(), got[:, 1].tolist()
        # 2. ids out: per owner, for each of its tables, the B lengths then the ids
        send = torch.cat([torch.empty(0, dtype=torch.int64)]
                         + [torch.cat([lengths[t], ids[t]]) for s in range(N) for t in range(T)
                            if self.placement[t] == s])
        recv = torch.empty(sum(incoming), dtype=torch.int64)
        dist.all_to_all_single(recv, send, incoming, per_dest, group=self.group)
        # 3. owners pool every rank's bags per table, rows go back to the requesters
        pooled, back_counts = self._pool(recv, batches, incoming)
        dims = [self.shapes[t][1] for t in range(T)]
        want = [batch * sum(dims[t] for t in range(T) if self.placement[t] == s)
                for s in range(N)]
        anchor = torch.empty(0, requires_grad=True)   # backward runs on every rank
        flat = _PooledToBatch.apply(pooled, anchor, back_counts, want, self.group)
        self.traffic["forward"] = _bytes_to_others(per_dest, self.rank, 8) + \
            _bytes_to_others(back_counts, self.rank, flat.element_size()) + \
            8 * _HEADER * (N - 1)
        self.traffic["backward"] = _bytes_to_others(want, self.rank, flat.element_size())
        return self._unpack(flat, batch, dims)

    def _pool(self, recv, batches, incoming):
        """(flat pooled rows in send order: per requester, per owned table,
        (B_r, dim_t)), element counts per requester)."""
        N = self.size
        owned = self.owned
        per_table = {t: ([], []) for t in owned}        # t -> ([lengths], [ids]) in rank order
        pos = 0
        for r in range(N):
            for t in owned:
                n = int(recv[pos:pos + batches[r]].sum()) if batches[r] else 0
                per_table[t][0].append(recv[pos:pos + batches[r]])
                per_table[t][1].append(recv[pos + batches[r]:pos + batches[r] + n])
                pos += batches[r] + n
        assert pos == sum(incoming), (pos, incoming)
        blocks = {}
        for t in owned:
            lens = torch.cat(per_table[t][0])
            offs = torch.cumsum(lens, 0) - lens
            rows = F.embedding_bag(torch.cat(per_table[t][1]), self.weights[str(t)], offs,
                                   mode=self.mode, sparse=self.sparse)
            blocks[t] = torch.split(rows, batches)
        parts = [blocks[t][r].reshape(-1) for r in range(N) for t in owned]
        counts = [batches[r] * sum(self.shapes[t][1] for t in owned) for r in range(N)]
        if not parts:
            return torch.empty(0, dtype=self.dtype), counts
        return torch.cat(parts), counts

    def _unpack(self, flat, batch, dims):
        """(B, sum(dims)) in table order from the received blocks (owner order)."""
        T, N = len(self.shapes), self.size
        cols, pos = [None] * T, 0
        for s in range(N):
            for t in range(T):
                if self.placement[t] == s:
                    n = batch * dims[t]
                    cols[t] = flat[pos:pos + n].view(batch, dims[t])
                    pos += n
        return torch.cat(cols, 1)

    # ------------------------------------------------------------- checking
    def _check(self, indices, offsets):
        """(lengths[t], ids[t], B) as int64 CPU tensors; _BadInput otherwise."""
        T = len(self.shapes)
        if (not isinstance(indices, (list, tuple)) or not isinstance(offsets, (list, tuple))
                or len(indices) != T or len(offsets) != T):
            raise _BadInput((_BAD_ARGS, -1, 0))
        lengths, ids, batch = [], [], None
        for t in range(T):
            i, o = indices[t], offsets[t]
            if (not isinstance(i, torch.Tensor) or not isinstance(o, torch.Tensor)
                    or i.dim() != 1 or o.dim() != 1 or i.is_floating_point()
                    or o.is_floating_point()):
                raise _BadInput((_BAD_ARGS, t, 0))
            i, o = i.to("cpu", torch.int64), o.to("cpu", torch.int64)
            if batch is None:
                batch = o.numel()
            if not o.numel():
                i = i[:0]          # no bags: ids belong to none (as embedding_bag ignores them)
            ends = torch.cat([o[1:], torch.tensor([i.numel()])])
            if (o.numel() != batch or (batch and int(o[0]) != 0)
                    or bool((ends < o).any())):
                raise _BadInput((_BAD_OFFSETS, t, o.numel()))
            bad = (i < 0) | (i >= self.shapes[t][0])
            if bool(bad.any()):
                raise _BadInput((_BAD_ID, t, int(i[bad][0])))
            lengths.append(ends - o)
            ids.append(i)
        return lengths, ids, batch

    def _raise_first_error(self, got):
        """The lowest rank's error, as the same ValueError on every rank."""
        codes = got[:, 2].tolist()
        for r, code in enumerate(codes):
            if code:
                t, value = int(got[r, 3]), int(got[r, 4])
                what = {
                    _BAD_ARGS: "indices and offsets must be lists of %d one-dimensional integer "
                               "tensors (problem at table %d)" % (len(self.shapes), t),
                    _BAD_OFFSETS: "offsets of table %d are not B increasing starts from 0 "
                                  "within its ids (%d offsets; every table needs the same B)"
                                  % (t, value),
                    _BAD_ID: "table %d has id %d, out of range [0, %d)"
                             % (t, value, self.shapes[t][0] if 0 <= t < len(self.shapes)
                                else 0),
                }[code]
                raise ValueError("ShardedEmbeddingBag: bad input on rank %d: %s" % (r, what))


class _BadInput(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


class _PooledToBatch(torch.autograd.Function):
    """Owner layout -> requester layout by all_to_all_single; backward: the
    reverse exchange of the gradient (requester -> owner)."""

    @staticmethod
    def forward(ctx, pooled, anchor, send_counts, recv_counts, group):
        ctx.counts, ctx.group = (send_counts, recv_counts), group
        out = pooled.new_empty(sum(recv_counts))
        dist.all_to_all_single(out, pooled.detach().contiguous(), recv_counts, send_counts,
                               group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        back = grad.new_empty(sum(send_counts))
        dist.all_to_all_single(back, grad.contiguous(), send_counts, recv_counts,
                               group=ctx.group)
        return back, None, None, None, None


def init_table(shape, t, seed=0, dtype=torch.float32):
    """Table t's initial weight, N(0, 1) as torch.nn.EmbeddingBag's, from a
    generator seeded by (seed, t): the same on whichever rank owns it (a
    single-process reference builds it with this too)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + t)
    return torch.randn(shape, generator=g).to(dtype)


def _bytes_to_others(counts, rank, itemsize):
    return itemsize * sum(c for s, c in enumerate(counts) if s != rank)
