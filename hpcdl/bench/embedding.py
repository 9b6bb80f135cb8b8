"""embedding.py - `hpcdl bench embedding`: embedding tables sharded table-wise
and looked up by all-to-all (ShardedEmbeddingBag) against the two ways of
keeping every table whole on every rank, on torch.distributed backend "hpcdl".

    hpcdl bench embedding -n 4 --rows 1000,10000,100000 --json emb.json

Workload per size: T tables of (rows, dim) float32, each rank a batch of B bags
per table with 0..2L ids (L on average), loss = sum(rows * fixed weights), one
SGD step. Three ways, one training step each (forward, backward, update):
  sharded     ShardedEmbeddingBag: ids to the owners, pooled rows back, the
              reverse in backward (3 + 1 all-to-alls; the tables never move);
              sparse gradients, so SGD touches only the looked-up rows
  replicated  every rank holds every table (torch.nn.EmbeddingBag), looks up
              locally, and all-reduces the whole tables' gradient (one fused
              dist.all_reduce, as DDP would) before its SGD step
  allgather   each rank keeps its own tables (one padded block per rank); each
              step all-gathers every block (the full tables), looks up locally,
              and reduce-scatters the tables' gradient back to the owners
Bytes are what one rank sends to other ranks per step: sharded counts its
actual all-to-all traffic (ShardedEmbeddingBag.traffic, the largest rank);
replicated the ring's 2(N-1)/N x table bytes; allgather 2(N-1) x block bytes.
Timing: steps interleaved, order rotating, each timed from a barrier, the
slowest rank's time; the median and the fastest step (load on a shared
machine only adds time). "x sharded" is the median's ratio. Correctness in the same run, outside
the timed loop: from the same tables and batch, the three forwards and each
owner's tables after one step must agree within 1e-4 (#wrong; exit 1).
"""
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm
from .allreduce import start_hpcdl_group
from ..torch.distributed import ShardedEmbeddingBag
from ..torch.distributed.sharded_embedding import init_table
from ..utils.atomic import write_json

METHODS = ("sharded", "replicated", "allgather")
WRONG = 1e-4


@dataclass
class Options:
    rows: tuple = (1000, 10000, 100000)   # rows per table, one measurement each
    tables: int = 8
    dim: int = 32
    batch: int = 256                       # bags per table per rank
    pooling: int = 8                       # mean ids per bag
    methods: tuple = METHODS
    steps: int = 10
    warmup: int = 2
    lr: float = 0.1
    threads: int = 0                       # torch threads per rank; 0 = cores / local ranks
    json: str = None


# ---------------------------------------------------------------- workload
def make_batch(opts, rows, rank, step):
    """This rank's (indices, offsets) per table; depends on rank and step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids, offs = [], []
    for _ in range(opts.tables):
        lens = torch.randint(0, 2 * opts.pooling + 1, (opts.batch,), generator=g)
        ids.append(torch.randint(0, rows, (int(lens.sum()),), generator=g))
        offs.append(torch.cumsum(lens, 0) - lens)
    return ids, offs


def loss_weight(opts, rank):
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randn(opts.batch, opts.tables * opts.dim, generator=g)


class Sharded:
    def __init__(self, opts, rows, group):
        self.emb = ShardedEmbeddingBag([(rows, opts.dim)] * opts.tables, group=group,
                                       sparse=True)
        self.lr = opts.lr

    def step(self, batch, weight):
        out = self.emb(*batch)
        (out * weight).sum().backward()
        with torch.no_grad():
            for p in self.emb.parameters():
                p.add_(p.grad, alpha=-self.lr)     # sparse: only the looked-up rows
                p.grad = None
        return out.detach()

    def owned(self):
        return {t: self.emb.table(t).detach() for t in self.emb.owned}

    def bytes_sent(self):
        return self.emb.traffic["forward"] + self.emb.traffic["backward"]


class Replicated:
    def __init__(self, opts, rows, group):
        self.group, self.lr, self.opts = group, opts.lr, opts
        self.flat = torch.cat([init_table((rows, opts.dim), t).reshape(-1)
                               for t in range(opts.tables)]).requires_grad_()
        self.rows = rows

    def tables(self):
        return self.flat.view(self.opts.tables, self.rows, self.opts.dim)

    def lookup(self, tables, batch):
        return torch.cat([F.embedding_bag(i, tables[t], o, mode="sum")
                          for t, (i, o) in enumerate(zip(*batch))], 1)

    def step(self, batch, weight):
        out = self.lookup(self.tables(), batch)
        (out * weight).sum().backward()
        dist.all_reduce(self.flat.grad, group=self.group)
        with torch.no_grad():
            self.flat -= self.lr * self.flat.grad
        self.flat.grad = None
        return out.detach()

    def owned(self):
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        return {t: self.tables()[t].detach() for t in range(self.opts.tables) if t % size == rank}

    def bytes_sent(self):
        n = dist.get_world_size(self.group)
        return 2 * (n - 1) * self.flat.numel() * 4 // n


class AllGather(Replicated):
    """Owned tables in a padded block per rank; full tables all-gathered per step."""

    def __init__(self, opts, rows, group):
        self.group, self.lr, self.opts, self.rows = group, opts.lr, opts, rows
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        per_rank = -(-opts.tables // self.size)          # most tables one rank owns
        self.slot = rows * opts.dim
        self.block = torch.zeros(per_rank * self.slot)
        for k, t in enumerate(range(self.rank, opts.tables, self.size)):
            self.block[k * self.slot:(k + 1) * self.slot] = init_table((rows, opts.dim), t).view(-1)

    def _table_views(self, full):
        """Table t is slot t // N of rank t % N's block."""
        per = full.view(self.size, -1)
        return [per[t % self.size, (t // self.size) * self.slot:
                    (t // self.size + 1) * self.slot].view(self.rows, self.opts.dim)
                for t in range(self.opts.tables)]

    def step(self, batch, weight):
        full = self.block.new_empty(self.size * self.block.numel())
        _collective("all_gather_single", "all_gather_into_tensor")(full, self.block,
                                                                  group=self.group)
        full.requires_grad_()
        out = self.lookup(self._table_views(full), batch)
        (out * weight).sum().backward()
        mine = torch.empty_like(self.block)
        _collective("reduce_scatter_single", "reduce_scatter_tensor")(mine, full.grad,
                                                                      group=self.group)
        self.block -= self.lr * mine
        return out.detach()

    def owned(self):
        return {t: self.block[k * self.slot:(k + 1) * self.slot].view(self.rows, self.opts.dim)
                for k, t in enumerate(range(self.rank, self.opts.tables, self.size))}

    def bytes_sent(self):
        return 2 * (self.size - 1) * self.block.numel() * 4


def _collective(name, older):
    """torch.distributed's call by its current name (torch >= 2.13), else the older one."""
    return getattr(dist, name, None) or getattr(dist, older)


BUILD = {"sharded": Sharded, "replicated": Replicated, "allgather": AllGather}


# ---------------------------------------------------------------- measuring
def check(opts, rows, group, mpi):
    """Largest difference between the methods after one step from the same start."""
    from mpi4py import MPI  # on use: the launcher side imports Options and starts no MPI
    batch, weight = make_batch(opts, rows, mpi.rank, -1), loss_weight(opts, mpi.rank)
    outs, tables = {}, {}
    for m in opts.methods:
        impl = BUILD[m](opts, rows, group)
        outs[m] = impl.step(batch, weight)
        tables[m] = impl.owned()
    first, worst = opts.methods[0], 0.0
    for m in opts.methods[1:]:
        worst = max(worst, (outs[m] - outs[first]).abs().max().item())
        for t, w in tables[first].items():
            worst = max(worst, (tables[m][t] - w).abs().max().item())
    return mpi.allreduce(worst, op=MPI.MAX)


def measure(opts, rows, group, mpi):
    """{method: (median step seconds, fastest step seconds, bytes sent per rank per step)},
    step times of the slowest rank, steps interleaved as in bench train."""
    from mpi4py import MPI  # on use, as in check()
    from .train import Impl, interleaved  # bench.train imports mpi4py.MPI at its top
    impls = {m: BUILD[m](opts, rows, group) for m in opts.methods}
    weight = loss_weight(opts, mpi.rank)
    data = ((make_batch(opts, rows, mpi.rank, step), weight)
            for step in range(opts.warmup + opts.steps))
    times = interleaved(opts, [Impl(m, None, impls[m].step) for m in opts.methods], data, mpi)
    return {m: (statistics.median(times[m]), min(times[m]),
                mpi.allreduce(impls[m].bytes_sent(), op=MPI.MAX)) for m in opts.methods}


def run(opts):
    from .train import start  # on use, as in measure()
    world, job, threads = start(opts)
    mpi = world.mpi
    group = start_hpcdl_group()
    say = comm.print0
    say("# hpcdl bench embedding: table-wise sharded all-to-all lookup vs whole tables on "
        "every rank (backend hpcdl)")
    say("#  ranks %d | hosts %d | MPI: %s | cores %s | torch threads per rank %d | load %.1f"
        % (world.size, len(job["hosts"]), job["mpi_library"], job["cores"], threads,
           job["load_avg_1min"]))
    say("#  %d tables x dim %d float32 | batch %d bags per table per rank, %d ids per bag on "
        "average | SGD lr %g | %d steps after %d warm-up, interleaved, median of the slowest "
        "rank" % (opts.tables, opts.dim, opts.batch, opts.pooling, opts.lr, opts.steps,
                  opts.warmup))
    say("#\n#%9s %10s %11s %10s %10s %14s %10s %8s"
        % ("rows", "tables_MB", "method", "step(ms)", "min(ms)", "bytes/rank", "x sharded",
           "#wrong"))
    out, wrong = [], False
    for rows in opts.rows:
        diff = check(opts, rows, group, mpi)
        bad = diff > WRONG
        wrong |= bad
        res = measure(opts, rows, group, mpi)
        base = res.get("sharded", (None,))[0]
        mb = opts.tables * rows * opts.dim * 4 / 1e6
        for m, (sec, fastest, nbytes) in res.items():
            ratio = sec / base if base else float("nan")
            say(" %9d %10.1f %11s %10.2f %10.2f %14d %9.2fx %8s"
                % (rows, mb, m, 1e3 * sec, 1e3 * fastest, nbytes, ratio,
                   "%.1g" % diff if bad else "0"))
            out.append(dict(rows=rows, tables_mb=mb, method=m, step_s=sec, fastest_s=fastest,
                            bytes_per_rank=nbytes, time_vs_sharded=ratio, max_diff=diff,
                            wrong=bad))
    say("# methods agree after one step within %g: %s" % (WRONG, "FAILED" if wrong else "OK"))
    if opts.json and world.rank == 0:
        write_json(opts.json, {"ranks": world.size, "tables": opts.tables, "dim": opts.dim,
                               "batch_per_rank": opts.batch, "pooling": opts.pooling,
                               "steps": opts.steps, "threads": threads,
                               "load_avg_1min": job["load_avg_1min"], "rows": out}, indent=1)
    return 1 if wrong else 0
