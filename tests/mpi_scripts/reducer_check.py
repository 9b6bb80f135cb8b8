"""reducer_check.py - run under mpirun: the Reducer's two seams against
one-process math. Every rank's gradient comes from data that depends on its
rank and position; the reference recomputes every rank's gradient in this
process on a copy of the model.

  comm hooks   a user hook that sums instead of averaging (Communicator
               handle, in place), one that sends fp16 and returns a new tensor
               (a torch Future), one through hvd.allreduce_async (int handle),
               reducer.adasum_hook (Adasum's formula on 2 ranks);
  stats hooks  before() sees each rank's own bucket, after() the average,
               end() once a step; extra=1 in the last bucket carries each
               rank's squared norm in the same all-reduce (its mean over ranks
               comes back); at ZeRO 1 as well; refusals explain themselves.
Prints 'CHECKS n FAILED k' (torch_common)."""
import copy

import torch
import torch.nn as nn

from torch_common import N, R, check, close, run
import hpcdl.torch as hvd

torch.manual_seed(7)
MODEL = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batch(rank, step):
    """Inputs and targets that depend on rank, step and position."""
    i = torch.arange(5 * 6, dtype=torch.float32).view(5, 6)
    x = torch.sin(0.3 * i + 0.7 * rank + 0.11 * step)
    y = torch.cos(0.2 * torch.arange(5 * 3, dtype=torch.float32).view(5, 3) + rank)
    return x, y


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return ((model(x) - y) ** 2).sum()


def grads_of(model, rank, step):
    """{name: gradient} of rank's loss, in this process."""
    m = copy.deepcopy(model)
    loss_of(m, rank, step).backward()
    return {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def build(**kw):
    model = copy.deepcopy(MODEL)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), **kw)
    return model, opt


def check_grads(model, opt, combine, what, step=0, **tol):
    """Backward, synchronize; each p.grad must be combine([rank grads])
    (combine may be a dict: {name: the expected gradient})."""
    every = [grads_of(model, r, step) for r in range(N)]
    opt.zero_grad()
    loss_of(model, R, step).backward()
    opt.synchronize()
    for n, p in model.named_parameters():
        want = combine[n] if isinstance(combine, dict) else combine([g[n] for g in every])
        close(p.grad, want, "%s: grad of %s" % (what, n), **tol)
    with opt.skip_synchronize():
        opt.step()


def sum_hook():
    model, opt = build(groups=3)

    def hook(on, bucket):
        return on.allreduce_async(bucket.buffer, op="sum", name="sum.%d" % bucket.index)
    opt.reducer.register_comm_hook(opt.reducer.comm, hook)
    for step in range(2):
        check_grads(model, opt, lambda gs: sum(gs), "sum hook step %d" % step, step=step)


def fp16_future_hook():
    model, opt = build()
    seen = []

    def hook(state, bucket):
        seen.append(bucket.index)
        half = bucket.buffer.to(torch.float16)
        h = state.allreduce_async(half, op="sum", name="half.%d" % bucket.index)
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut.then(lambda _: h.wait().float() / N)
    opt.register_comm_hook(opt.reducer.comm, hook)
    check_grads(model, opt, lambda gs: sum(gs) / N, "fp16 hook", rtol=2e-3, atol=2e-3)
    check(seen == list(range(len(opt.reducer.buckets))), "hook saw buckets %s" % seen)


def hvd_handle_hook():
    model, opt = build(groups=2)
    opt.reducer.register_comm_hook(None, lambda _, b: hvd.allreduce_async(
        b.buffer, op=hvd.Average, name="hvd.bucket.%d" % b.index))
    check_grads(model, opt, lambda gs: sum(gs) / N, "hvd handle hook")


def adasum(a, b):
    """One-process Adasum of two gradients (comm/adasum.py's formula)."""
    dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
    return (1 - dot / (2 * aa)) * a + (1 - dot / (2 * bb)) * b


def adasum_comm_hook():
    from hpcdl.torch.reducer import adasum_hook
    model, opt = build(groups=2)
    opt.reducer.register_comm_hook(opt.reducer.comm, adasum_hook)
    if N == 2:
        combine = lambda gs: adasum(gs[0].double(), gs[1].double()).float()  # noqa: E731
    else:  # the tree over more ranks: against hvd.allreduce(op=Adasum) of each gradient
        mine = grads_of(model, R, 0)
        want = {n: hvd.allreduce(g, op=hvd.Adasum, name="want." + n) for n, g in mine.items()}
        combine = want
    check_grads(model, opt, combine, "adasum hook")


def stats(zero_stage=0):
    model, opt = build(groups=4, zero_stage=zero_stage)
    buckets = opt.reducer.buckets
    log = {"before": [], "after": [], "end": 0, "sq": 0.0, "mean_sq": None, "avg_sq": 0.0}

    def before(grad, bucket, tail):
        log["before"].append(bucket.index)
        check(grad.numel() == bucket.numel, "before: grad has the bucket's elements")
        log["sq"] += float(grad.double().square().sum())
        check((tail is not None) == (bucket.index == len(buckets) - 1), "tail only in the last")
        if tail is not None:
            tail[0] = log["sq"]  # every earlier bucket was submitted before the last

    def after(reduced, bucket, tail):
        log["after"].append(bucket.index)
        log["avg_sq"] += float(reduced.double().square().sum())
        if tail is not None:
            log["mean_sq"] = float(tail[0])

    def end():
        log["end"] += 1
    rec = opt.reducer.add_stats_hook(before=before, after=after, end=end, extra=1)
    check(buckets[-1].size == buckets[-1].numel + 1, "last bucket holds one more element")
    every = [grads_of(model, r, 0) for r in range(N)]
    mean = {n: sum(g[n] for g in every) / N for n in every[0]}
    check_grads(model, opt, lambda gs: sum(gs) / N, "stats zero_stage=%d" % zero_stage)
    order = list(range(len(buckets)))
    check(log["before"] == order and log["after"] == order and log["end"] == 1,
          "calls before %s after %s end %d" % (log["before"], log["after"], log["end"]))
    own = sum(float(g.double().square().sum()) for g in every[R].values())
    mean_own = sum(sum(float(g.double().square().sum()) for g in e.values())
                   for e in every) / N
    avg = sum(float(g.double().square().sum()) for g in mean.values())
    check(abs(log["sq"] - own) <= 1e-5 * own, "local |g|^2 %g want %g" % (log["sq"], own))
    check(log["mean_sq"] is not None and abs(log["mean_sq"] - mean_own) <= 1e-5 * mean_own,
          "tail: mean of |g_r|^2 %s want %g" % (log["mean_sq"], mean_own))
    check(abs(log["avg_sq"] - avg) <= 1e-5 * avg, "|mean g|^2 %g want %g" % (log["avg_sq"], avg))
    rec.remove()
    check_grads(model, opt, lambda gs: sum(gs) / N, "after remove", step=1)
    check(log["end"] == 1, "removed hook still called")


def stats_zero1():
    stats(zero_stage=1)


def refusals():
    model, opt = build(zero_stage=2)
    try:
        opt.reducer.add_stats_hook(before=lambda *a: None, extra=2)
        check(False, "stats extra at ZeRO 2 was accepted")
    except ValueError as e:
        check("ZeRO stage 2" in str(e), "message: %s" % e)
    try:
        opt.reducer.register_comm_hook(None, lambda s, b: None)
        check(False, "a user comm hook at ZeRO 2 was accepted")
    except ValueError as e:
        check("stage 2" in str(e), "message: %s" % e)
    model, opt = build()
    try:
        opt.reducer.register_comm_hook(None, "not a function")
        check(False, "a non-callable hook was accepted")
    except TypeError as e:
        check("callable" in str(e), "message: %s" % e)
    loss_of(model, R, 0).backward()
    try:
        opt.reducer.register_comm_hook(None, lambda s, b: None)
        check(False, "a comm hook between backward and step was accepted")
    except RuntimeError as e:
        check("between backward() and step()" in str(e), "message: %s" % e)
    opt.step()


run(sum_hook, fp16_future_hook, hvd_handle_hook, adasum_comm_hook, stats, stats_zero1,
    refusals)
