"""sharded_embedding_check.py - run under mpirun (any N >= 2): ShardedEmbeddingBag
on backend hpcdl against one process holding every table as torch.nn.EmbeddingBag
and the global batch (every rank's bags in rank order).

Cases (one launch): uneven tables (rows and dims), uneven bag sizes with empty
bags, B differing between ranks (the last rank B = 0 in one case), a rank owning
no table (T < N), modes sum and mean, a given placement with sparse gradients. For each: the forward
rows, the owned tables' gradients after backward of a rank- and position-weighted
loss, the tables after one SGD step and the rows of a second forward. Then bad
input: an id out of range and bad offsets on one rank, tables that differ on one
rank at construction -> the same ValueError on every rank, and the layer still
works afterwards. With a second argument (a JSON path) it also runs a tiny
`hpcdl bench embedding` (hpcdl.bench.embedding.run). Prints 'rank R checks C
FAILED F'. argv[1]: the backend (default hpcdl; gloo runs under hpcdl run with
MASTER_ADDR/PORT set).

Bound: the owner pools each table with one embedding_bag call over the global
bags in the reference's order, so the values should be equal (dense gradients
were bit-equal); sparse gradients are coalesced in another order (6e-8 seen).
Asserted within TOL (float32 sums of up to 6 rows of N(0,1) values, SGD lr 0.1).
"""
import sys

import torch
import torch.distributed as dist

import hpcdl.torch  # noqa: F401 - registers backend "hpcdl"
from hpcdl.torch.distributed import ShardedEmbeddingBag
from hpcdl.torch.distributed.sharded_embedding import init_table

TOL = 1e-6
BACKEND = sys.argv[1] if sys.argv[1:] else "hpcdl"   # gloo: by hand, under hpcdl run
BENCH_JSON = sys.argv[2] if sys.argv[2:] else None  # also run a tiny hpcdl bench embedding
dist.init_process_group(BACKEND)
RANK, N = dist.get_rank(), dist.get_world_size()
checks, failed, worst = 0, 0, 0.0


def check(ok, what):
    global checks, failed
    checks += 1
    if not ok:
        failed += 1
        print("rank %d FAIL %s" % (RANK, what), flush=True)


def close(a, b, what):
    global worst
    d = (a - b).abs().max().item() if a.numel() else 0.0
    worst = max(worst, d)
    check(a.shape == b.shape and d <= TOL, "%s: max diff %g shapes %s %s"
          % (what, d, tuple(a.shape), tuple(b.shape)))


def global_batch(shapes, batches, seed):
    """Per rank, per table: (ids, offsets); bag sizes 0..5, every 4th bag empty."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(N):
        per = []
        for t, (rows, _) in enumerate(shapes):
            lens = torch.randint(0, 6, (batches[r],), generator=g)
            lens[(torch.arange(batches[r]) + r + t) % 4 == 0] = 0
            ids = torch.randint(0, rows, (int(lens.sum()),), generator=g)
            per.append((ids, torch.cumsum(lens, 0) - lens))
        out.append(per)
    return out


def run_case(name, shapes, batches, mode, placement=None, seed=0, sparse=False):
    emb = ShardedEmbeddingBag(shapes, mode=mode, placement=placement, seed=seed, sparse=sparse)
    ref = [torch.nn.EmbeddingBag(r, d, mode=mode) for r, d in shapes]
    for t, e in enumerate(ref):
        e.weight.data.copy_(init_table(shapes[t], t, seed))
    data = global_batch(shapes, batches, seed + 1)
    lo, hi = sum(batches[:RANK]), sum(batches[:RANK + 1])
    width = sum(d for _, d in shapes)
    weight = (torch.arange(sum(batches) * width, dtype=torch.float32).view(-1, width) % 7
              - 3) * 0.25
    mine = list(emb.parameters())             # empty on a rank that owns no table
    opt = torch.optim.SGD(mine, lr=0.1) if mine else None
    ref_opt = torch.optim.SGD([p for e in ref for p in e.parameters()], lr=0.1)
    for step in range(2):
        out = emb([data[RANK][t][0] for t in range(len(shapes))],
                  [data[RANK][t][1] for t in range(len(shapes))])
        want = torch.cat([e(torch.cat([data[r][t][0] for r in range(N)]),
                            _global_offsets([data[r][t] for r in range(N)]))
                          for t, e in enumerate(ref)], 1)
        close(out, want[lo:hi], "%s step %d forward" % (name, step))
        if step:
            break
        (out * weight[lo:hi]).sum().backward()
        (want * weight).sum().backward()
        for t in emb.owned:
            grad = emb.table(t).grad
            check(grad.is_sparse == sparse, "%s table %d sparse gradient" % (name, t))
            close(grad.to_dense(), ref[t].weight.grad, "%s table %d grad" % (name, t))
        if opt:
            opt.step()
        ref_opt.step()
        for t in emb.owned:
            close(emb.table(t).data, ref[t].weight.data, "%s table %d after SGD" % (name, t))
    check(emb.traffic["forward"] > 0 or N == 1, "%s traffic counted" % name)
    check(sorted(emb.owned) == [t for t in range(len(shapes))
                                if (placement or [u % N for u in range(len(shapes))])[t] == RANK],
          "%s owned tables" % name)
    return emb


def _global_offsets(pieces):
    """Offsets of the concatenated bags of every rank."""
    out, base = [], 0
    for ids, offs in pieces:
        out.append(offs + base)
        base += ids.numel()
    return torch.cat(out)


def expect_error(call, words, what):
    try:
        call()
    except ValueError as e:
        check(all(w in str(e) for w in words), "%s: message %r lacks %s" % (what, str(e), words))
        return
    check(False, "%s: no error" % what)


# ------------------------------------------------------------------ cases
run_case("even", [(20, 4), (7, 4), (33, 4)], [5] * N, "sum")
run_case("uneven", [(50, 3), (9, 8), (101, 5), (2, 2), (17, 6)],
         [4 + 3 * r for r in range(N - 1)] + [0], "mean", seed=3)
run_case("fewer tables than ranks", [(11, 5)] * (N - 1), [6 - r % 3 for r in range(N)], "sum",
         seed=5)
emb = run_case("placed", [(13, 3), (29, 4), (8, 2)], [3 + r for r in range(N)], "mean",
               placement=[N - 1, N - 1, 0], seed=7, sparse=True)

# ------------------------------------------------------------------ bad input
shapes = emb.shapes
ok_ids = [torch.zeros(2, dtype=torch.int64) for _ in shapes]
ok_offs = [torch.tensor([0, 1]) for _ in shapes]
bad_ids = list(ok_ids)
if RANK == 1:
    bad_ids[2] = torch.tensor([0, shapes[2][0]])
expect_error(lambda: emb(bad_ids, ok_offs),
             ["rank 1", "table 2 has id %d, out of range [0, %d)" % (shapes[2][0], shapes[2][0])],
             "id out of range")
bad_offs = list(ok_offs)
if RANK == N - 1:
    bad_offs[0] = torch.tensor([1, 0])
expect_error(lambda: emb(ok_ids, bad_offs), ["rank %d" % (N - 1), "offsets of table 0"],
             "bad offsets")
expect_error(lambda: emb(ok_ids[:-1], ok_offs[:-1]), ["rank 0", "lists of 3"], "table count")
out = emb(ok_ids, ok_offs)
check(tuple(out.shape) == (2, 9), "works after errors: shape %s" % (tuple(out.shape),))
no_bags = [torch.zeros(0, dtype=torch.int64)] * 3   # B = 0 with ids given: ids ignored
out = emb([torch.tensor([1, 2])] * 3, no_bags)
check(tuple(out.shape) == (0, 9), "no bags: shape %s" % (tuple(out.shape),))
mine = [(10, 4), (12, 4)] if RANK != N - 1 else [(10, 4), (12, 5)]
expect_error(lambda: ShardedEmbeddingBag(mine), ["ranks disagree", "rank %d" % (N - 1)],
             "shape mismatch")
mine = [(10, 4)] * (2 if RANK else 3)
expect_error(lambda: ShardedEmbeddingBag(mine), ["ranks disagree"], "table count mismatch")

if BENCH_JSON:  # the benchmark's own check, in this launch (one start of the ranks fewer)
    from hpcdl.bench import embedding
    status = embedding.run(embedding.Options(rows=(40, 300), tables=3, dim=4, batch=5, steps=1,
                                             warmup=0, json=BENCH_JSON))
    check(status == 0, "bench embedding exit status %d" % status)
print("rank %d checks %d FAILED %d (largest difference %.3g)" % (RANK, checks, failed, worst),
      flush=True)
dist.destroy_process_group()
sys.exit(1 if failed else 0)
