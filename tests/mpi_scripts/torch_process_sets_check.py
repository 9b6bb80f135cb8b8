"""torch_process_sets_check.py - run under mpirun (2, 3 or 4 ranks): Horovod's
process sets, names and shapes in hpcdl.torch, against single-process math
on rank- and position-dependent data.

  sets:    even / odd ranks and an overlapping {0, 1}: every collective with
           process_set= equals the same math over the set's ranks only;
           rank() / size() / included(); barrier; objects; the optimizer
           averages over its set (members) or steps alone (others); a set
           removed and added again
  bad:     a rank outside a set, an unregistered set, empty / repeated /
           unknown ranks, a duplicate set, ranks that disagree, removing the
           global set: a clear error on every rank concerned, no hang
  names:   a second async op with a name in flight -> ValueError at once on
           that rank (allreduce, allgather, broadcast, reducescatter); the
           name is free again after synchronize
  shapes:  equal counts, different shapes ([17, 1311] vs [17, 23, 57]) ->
           HorovodInternalError (and MismatchError) on every rank naming both
           and, as in Horovod's test, rank 0 queuing an allgather_async long
           before the others (it must not wait for them)
  sparse:  sparse_allreduce_async equals the dense all-reduce; a sparse
           embedding trains with SparseAdam (sparse_as_dense on and off)
  join:    each rank in turn joins first (and two at once): the others'
           allreduce / grouped_allreduce (Sum, Average, Max; float, int)
           equal the math over the ranks that have not joined, the joined
           ones counting as zeros and Average still dividing by size;
           allgather / broadcast / reducescatter / alltoall / Adasum raise
           Horovod's "not supported with Join" on every rank that called them; join()
           returns the last rank to join, the same everywhere; ranks run
           different numbers of steps; a DistributedOptimizer (shared and
           plain buckets, fp16 compression) where rank k trains k + 1 steps
           then joins equals one process averaging the live ranks'
           gradients over size; a comm-level call while rank 0 has joined
           fails on every rank (one node)
Prints 'CHECKS n FAILED k'."""
import warnings

import torch

from hpcdl.comm import MismatchError
from torch_common import N, R, check, close, hvd, run, section, values


def expect_error(fn, exc, words, what):
    try:
        fn()
    except exc as e:
        check(all(w in str(e) for w in words), "%s: message %r lacks %s" % (what, str(e), words))
        return
    except Exception as e:  # noqa: BLE001 - the wrong error is a failure too
        check(False, "%s: raised %s: %s, want %s" % (what, type(e).__name__, e, exc.__name__))
        return
    check(False, "%s: no error" % what)


def set_math(ranks, shape, op):
    xs = torch.stack([values(k, shape) for k in ranks])
    return xs.sum(0) if op == hvd.Sum else xs.mean(0)


def sets():
    if not section("sets"):
        return
    even = hvd.add_process_set([k for k in range(N) if k % 2 == 0])
    odd = hvd.add_process_set([k for k in range(N) if k % 2 == 1]) if N > 1 else None
    ends = hvd.add_process_set([0, 1]) if N > 2 else None  # overlaps even and odd
    mine = even if R % 2 == 0 else odd
    check(mine.included() and mine.size() == len(mine.ranks)
          and mine.rank() == mine.ranks.index(R), "rank/size/included of %s" % mine)
    other = odd if mine is even else even
    check(other.included() is False and other.rank() == -1, "outside: included() False")
    check(hvd.global_process_set.size() == N and hvd.global_process_set.rank() == R,
          "global set")
    for op in (hvd.Sum, hvd.Average):
        for shape in [(0,), (1,), (5, 3), (2 * N + 1, 2)]:
            got = hvd.allreduce(values(R, shape), op=op, process_set=mine)
            close(got, set_math(mine.ranks, shape, op), "allreduce %s %s on %s"
                  % (op.name, shape, mine.ranks))
        a, b = hvd.grouped_allreduce([values(R, (3,)), values(R, (2, 2))], op=op,
                                     process_set=mine)
        close(a, set_math(mine.ranks, (3,), op), "grouped_allreduce a")
        close(b, set_math(mine.ranks, (2, 2), op), "grouped_allreduce b")
    # all-gather: rows depend on the rank
    got = hvd.allgather(values(R, (R + 1, 2)), process_set=mine)
    close(got, torch.cat([values(k, (k + 1, 2)) for k in mine.ranks]), "allgather on set")
    # broadcast: root is a global rank (the set's last)
    root = mine.ranks[-1]
    close(hvd.broadcast(values(R, (4,)), root, process_set=mine), values(root, (4,)),
          "broadcast root %d" % root)
    # reduce-scatter: Horovod's split of rows over the set
    rows = 2 * len(mine.ranks) + 1
    full = set_math(mine.ranks, (rows, 2), hvd.Sum)
    q, extra = divmod(rows, len(mine.ranks))
    cuts = [q + (1 if k < extra else 0) for k in range(len(mine.ranks))]
    close(hvd.reducescatter(values(R, (rows, 2)), op=hvd.Sum, process_set=mine),
          torch.split(full, cuts)[mine.rank()], "reducescatter on set")
    # all-to-all: one row to each member
    got, received = hvd.alltoall(values(R, (len(mine.ranks), 2)),
                                 splits=[1] * len(mine.ranks), process_set=mine)
    close(got, torch.stack([values(k, (len(mine.ranks), 2))[mine.rank()] for k in mine.ranks]),
          "alltoall on set")
    # objects and barrier
    check(hvd.allgather_object(R * 10, process_set=mine) == [k * 10 for k in mine.ranks],
          "allgather_object on set")
    check(hvd.broadcast_object({"r": R}, root_rank=root, process_set=mine) == {"r": root},
          "broadcast_object on set")
    hvd.barrier(process_set=mine)
    # the overlapping set: members {0, 1} reduce among themselves
    if ends is not None and ends.included():
        close(hvd.allreduce(values(R, (6,)), op=hvd.Sum, process_set=ends),
              set_math(ends.ranks, (6,), hvd.Sum), "allreduce on overlapping set")
    optimizer_on_set(even)
    # remove and add again: the same ranks make a working set
    for s in (ends, odd, even):
        if s is not None:
            check(hvd.remove_process_set(s) is True and s.process_set_id is None,
                  "remove %s" % s)
    check(hvd.remove_process_set(even) is False, "removing twice returns False")
    again = hvd.add_process_set([0])
    if again.included():
        close(hvd.allreduce(values(R, (3,)), op=hvd.Sum, process_set=again), values(0, (3,)),
              "set added again")
    hvd.remove_process_set(again)


def optimizer_on_set(even):
    """Members of even average their gradients over even; others step alone."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=even)
    x = values(R, (4, 3), dtype=torch.float32) * 0.1
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    # d(sum of W x + b)/dW = column sums of x, per output row
    group = even.ranks if even.included() else [R]
    gw = torch.stack([(values(k, (4, 3), dtype=torch.float32) * 0.1).sum(0)
                      for k in group]).mean(0)
    close(model.weight.detach(), w0 - 0.5 * gw.expand(2, 3), "optimizer on set: weight")
    close(model.bias.detach(), b0 - 0.5 * 4.0, "optimizer on set: bias")


def bad_input():
    if not section("bad"):
        return
    expect_error(lambda: hvd.add_process_set([]), ValueError, ["non-empty"], "empty set")
    expect_error(lambda: hvd.add_process_set([0, 0]), ValueError, ["distinct"], "repeated rank")
    expect_error(lambda: hvd.add_process_set([N]), ValueError, ["0..%d" % (N - 1)],
                 "unknown rank")
    if N > 1:
        expect_error(lambda: hvd.add_process_set([R]), ValueError, ["different lists"],
                     "ranks disagree")
    expect_error(lambda: hvd.add_process_set(list(range(N))), ValueError, ["duplicate"],
                 "the global set's ranks")
    first = hvd.add_process_set([0])
    expect_error(lambda: hvd.add_process_set([0]), ValueError, ["duplicate process set"],
                 "duplicate set")
    if R != 0:
        expect_error(lambda: hvd.allreduce(torch.ones(2), process_set=first), ValueError,
                     ["rank %d is not in" % R, "included()"], "rank outside the set")
    if R == 0 and N > 1:
        expect_error(lambda: hvd.broadcast(torch.ones(2), N - 1, process_set=first),
                     ValueError, ["root_rank %d is not in" % (N - 1)], "root outside the set")
    hvd.remove_process_set(first)
    expect_error(lambda: hvd.allreduce(torch.ones(2), process_set=first), ValueError,
                 ["not registered"], "removed set")
    expect_error(lambda: hvd.remove_process_set(hvd.global_process_set), ValueError,
                 ["global process set"], "remove the global set")
    close(hvd.allreduce(values(R, (3,)), op=hvd.Sum), set_math(range(N), (3,), hvd.Sum),
          "the world still works after the errors")


def names():
    if not section("names"):
        return
    x = values(R, (6, 2))
    starts = {
        "allreduce": lambda n: hvd.allreduce_async(x, name=n),
        "allgather": lambda n: hvd.allgather_async(x, name=n),
        "broadcast": lambda n: hvd.broadcast_async(x, 0, name=n),
        "reducescatter": lambda n: hvd.reducescatter_async(x, name=n),
    }
    for kind, start in starts.items():
        h = start("dup." + kind)
        expect_error(lambda: start("dup." + kind), ValueError,
                     ["same name as another tensor", "dup." + kind], "duplicate %s" % kind)
        hvd.synchronize(h)
        hvd.synchronize(start("dup." + kind))  # free again after synchronize
    # Horovod's test: rank 0 queues (and refuses a duplicate) while the others
    # are still in a barrier; the first handle completes once they queue theirs
    handles = []
    for turn in (0, 1):
        if (R == 0) == (turn == 0):
            handles.append(hvd.allgather_async(x, name="dup.late"))
            expect_error(lambda: hvd.allgather_async(x, name="dup.late"), ValueError,
                         ["same name"], "duplicate allgather while the others wait")
        hvd.barrier()
    close(hvd.synchronize(handles[0]), torch.cat([values(k, (6, 2)) for k in range(N)]),
          "allgather queued before the others arrived")


def shapes():
    if not section("shapes"):
        return
    mine = torch.zeros(17, 1311) if R % 2 == 0 else torch.zeros(17, 23, 57)  # equal counts
    calls = {"allreduce": lambda t: hvd.allreduce(t, name="shape.ar"),
             "broadcast": lambda t: hvd.broadcast(t, 0, name="shape.bc"),
             "reducescatter": lambda t: hvd.reducescatter(t, name="shape.rs")}
    for kind, fn in calls.items():
        if N == 1:
            break
        expect_error(lambda: fn(mine), hvd.HorovodInternalError,
                     ["Mismatched %s tensor shapes" % kind, "[17, 1311]", "[17, 23, 57]"],
                     "%s shapes" % kind)
        try:
            fn(mine)
        except MismatchError:
            check(True, "also an hpcdl MismatchError")
    close(hvd.allreduce(values(R, (3,)), op=hvd.Sum), set_math(range(N), (3,), hvd.Sum),
          "the world still works after shape errors")


def sparse():
    if not section("sparse"):
        return
    for d0 in (1, 5, 17):
        dense = values(R, (d0, 4)) * ((values(R + 1, (d0, 4)) % 3) == 0)
        want = hvd.allreduce(dense, op=hvd.Average)
        got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp.%d" % d0, op=hvd.Average)()
        check(got.is_sparse, "sparse result is sparse")
        close(got.to_dense(), want, "sparse_allreduce %d rows" % d0)
    for as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        ref = torch.nn.Embedding(10, 3, sparse=True)
        ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=as_dense)
        rows = [torch.tensor([(k + j) % 10 for j in range(3 + k)]) for k in range(N)]
        opt.zero_grad()
        emb(rows[R]).sum().backward()
        opt.step()
        check(emb.weight.grad.is_sparse, "the wrapped optimizer got a sparse gradient")
        ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
        grad = sum(torch.zeros(10, 3).index_add_(0, r, torch.ones(len(r), 3)) for r in rows) / N
        ref.weight.grad = grad.to_sparse()
        ref_opt.step()
        close(emb.weight.detach(), ref.weight.detach(), "sparse embedding, sparse_as_dense=%s"
              % as_dense)


def optimizer_internals():
    if not section("names"):
        return
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1))
    names_ = opt._parameter_names
    check(len(names_) == 4 and len(set(names_.values())) == 4, "_parameter_names unique")
    opt.zero_grad()
    model(values(R, (1, 2), dtype=torch.float32)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        opt.step()
    check(len(ws) == 1 and "optimizer.step() called without optimizer.skip_synchronize()"
          in str(ws[0].message), "Horovod's step-after-synchronize warning")


def join():
    if not section("join"):
        return
    x = values(R, (5, 3))
    for first in list(range(N)) + ([[0, N - 1]] if N > 2 else []):
        firsts = first if isinstance(first, list) else [first]
        live = [k for k in range(N) if k not in firsts]
        if R not in firsts:
            for kind, fn in (("Allgather", lambda: hvd.allgather(x)),
                             ("Broadcast", lambda: hvd.broadcast(x, live[0])),
                             ("Reducescatter", lambda: hvd.reducescatter(x)),
                             ("Alltoall", lambda: hvd.alltoall(torch.zeros(N, 3))),
                             ("Adasum", lambda: hvd.allreduce(x, op=hvd.Adasum))):
                expect_error(fn, hvd.HorovodInternalError,
                             ["%s is not supported with Join" % kind], "join: " + kind)
            for step in range(2 + R):  # ranks run different numbers of steps
                mine = x + step
                want = sum(values(k, (5, 3)) + step for k in live if step < 2 + k)
                close(hvd.allreduce(mine, op=hvd.Sum, name="join.sum"), want,
                      "join %s step %d: Sum over the ranks not joined" % (first, step))
                close(hvd.allreduce(mine, name="join.avg"), want / N,
                      "join %s step %d: Average divides by size (Horovod)" % (first, step))
                if step == 0:  # every rank still runs: once is enough (a short launch)
                    got = hvd.grouped_allreduce([mine, mine.to(torch.int32)], op=hvd.Sum)
                    close(got[1], want.to(torch.int32), "join %s: grouped int32" % first)
                    close(hvd.allreduce(-mine.abs() - 1, op=hvd.Max),
                          torch.zeros(5, 3).double(),
                          "join %s: Max sees the joined ranks' zeros" % first)
        last = hvd.join()
        every = hvd.allgather_object(last)
        check(every == [max(live)] * N, "join %s returned %s, want %d everywhere (the rank "
              "with the most steps)" % (first, every, max(live)))
    for compression in (hvd.Compression.none, hvd.Compression.fp16):
        join_optimizer(compression)
    if hvd.cross_size() == 1:  # one node: the core's agreement check meets in shared memory
        import numpy as np
        from hpcdl.torch._handles import world
        if R == 0:  # a call join cannot answer: an error on every rank, not a hang
            expect_error(hvd.join, hvd.HorovodInternalError,
                         ["hvd.join(): another rank made a collective"], "join vs comm call")
        else:
            expect_error(lambda: world().allreduce_async(np.ones(7, np.float32)).wait(),
                         MismatchError, ["disagree"], "comm call while rank 0 joined")
    close(hvd.allreduce(values(R, (3,)), op=hvd.Sum), set_math(range(N), (3,), hvd.Sum),
          "the world works as usual after join")


def join_optimizer(compression):
    """Rank k trains k + 1 steps, then joins; its parameters must be those of
    one process that averages, at step s, the gradients of ranks k > s - 1
    over all N ranks (the joined ones sending zeros, as in Horovod)."""
    def model_():
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))

    def loss(m, k, s):
        return m(values(k, (5, 3), dtype=torch.float32) / 8 + s).pow(2).mean()
    model, ref = model_(), model_()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for s in range(R + 1):
        opt.zero_grad()
        loss(model, R, s).backward()
        opt.step()
        ref_opt.zero_grad()
        for k in range(s, N):  # the ranks still training at step s
            (loss(ref, k, s) / N).backward()
        ref_opt.step()
    last = hvd.join()
    check(last == N - 1, "optimizer join returned %s, want %d" % (last, N - 1))
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), "join with DistributedOptimizer (%s): %s after %d "
              "steps" % (compression.__name__, name, R + 1),
              rtol=1e-2 if compression is hvd.Compression.fp16 else None,
              atol=1e-3 if compression is hvd.Compression.fp16 else None)


if __name__ == "__main__":
    run(sets, bad_input, names, shapes, sparse, optimizer_internals, join)
