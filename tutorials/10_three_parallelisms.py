"""Tutorial 10 - three kinds of parallelism: data, tensor and pipeline.

Run it with 4 ranks (2 works too: two layers per pipeline stage):

    hpcdl run -n 4 -- python tutorials/10_three_parallelisms.py

One small model, a 7-module MLP (Linear, Tanh, Linear, Tanh, Linear, Tanh,
Linear), is trained three ways over torch.distributed on hpcdl's backend
(`init_process_group("hpcdl")`: torch's DDP, DTensor and pipelining
running on hpcdl's collectives and point-to-point messages, docs/torch_distributed.md):

    data parallel      every rank holds the whole model and 1/N of the batch;
                       DDP averages the gradients (one all-reduce per bucket)
    tensor parallel    every rank holds 1/N of each weight matrix and the
                       whole batch: Linear 1 split by columns, Linear 2 by rows
                       (the partial sums meet in one all-reduce), 3 and 4 again
    pipeline parallel  rank r holds layer r (a stage) and passes activations
                       to rank r + 1 and gradients back: the batch is cut into
                       m micro-batches so that stages can work at once

Each is checked against one process training on the same global batch.
Then the pipeline's cost, with p stages and m micro-batches:

    bubble = idle / (p x step time) = (p - 1) / (m + p - 1)      (GPipe)

because the last stage starts its first forward only after the p - 1
stages before it have each run one (the fill), and the first stage its
last backward only after the p - 1 stages after it have run theirs (the
drain): every stage idles (p - 1)(f + b) of a step of (m + p - 1)(f + b),
f and b being one micro-batch's forward and backward on a stage. It is
measured two ways, with each stage's compute replaced by a sleep (4 ms
forward, 8 ms backward) that logs when it runs: (a) on the wall clock, and
(b) replayed on a logical clock from the order in which each stage really
ran its micro-batches (exact: it is checked). Last, memory:
GPipe keeps the activations of all m micro-batches until their backward;
1F1B (one forward, one backward) starts backwards early and keeps at most
p - s on stage s, whatever m is. Both counted with the same hook.

Exercise (for the student):
  a. Predict, before running, the bubble of GPipe with m = 2p micro-batches
     (p = 4: m = 8), and the step time in units of one micro-batch's forward
     + backward. Check both against the table. What m makes the bubble < 5%?
  b. The replay says 1F1B has the same bubble as GPipe. Then what does 1F1B
     buy? Read the activation table and say why stage s never holds more than
     p - s micro-batches (hint: count the forwards stage s runs before its
     first backward can arrive). What does that bound cost when m < p?
  c. The replay prices a backward at twice a forward (unit = (1, 2)). Set
     unit = (1, 1), then (1, 3): does the bubble fraction change? Explain
     with the timeline pictures printed in part 4.
  d. (bonus) Each micro-batch sends an activation of (B/m) x 24 floats
     forward across each stage boundary, and its gradient back. Price the
     m = 4 step at 1 Gbit/s with the model of docs/sim.md (192 ms is one
     device's compute at 12 ms per micro-batch and stage):
         hpcdl sim pipeline --stages 4 --micro-batches 4 --batch 32 \\
             --activation-elements 24 --step-compute-ms 192 --alpha 50us --beta 1Gbit/s
     How much do the messages add? The wall-clock step in part 4 is longer
     still: what, if not the link, makes the difference here?
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torch.nn.parallel import DistributedDataParallel as DDP

import hpcdl.torch  # noqa: F401  (registers the backend "hpcdl")

dist.init_process_group("hpcdl")
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
if size not in (2, 4):
    if rank == 0:
        print("error: run tutorial 10 on 4 ranks (or 2): the model's 4 Linear layers are "
              "split into one pipeline stage per rank")
    raise SystemExit(1)

D_IN, HID, D_OUT = 16, 24, 4       # HID divides by 2 and 4 (tensor parallel)
BATCH, STEPS, LR = 32, 5, 0.1      # the global batch: 32 rows = 8 micro-batches of 4
MICRO = 4                          # micro-batches in part 3's checks
T_FORWARD, T_BACKWARD = 0.004, 0.008   # seconds a stage "computes" per micro-batch (part 4)
# vs one process on the same global batch: float32 sums in another order
# (gradient averaging, split matrix products); 1.3e-7 seen on 4 ranks
TOL = 1e-5
checks = []


def print0(*args):
    if rank == 0:
        print(*args, flush=True)


def check(ok, what):
    checks.append(bool(ok))
    print0("  [%s] %s" % ("ok" if ok else "FAILED", what))


def make_model():
    torch.manual_seed(0)  # the same weights on every rank, every time
    return torch.nn.Sequential(torch.nn.Linear(D_IN, HID), torch.nn.Tanh(),
                               torch.nn.Linear(HID, HID), torch.nn.Tanh(),
                               torch.nn.Linear(HID, HID), torch.nn.Tanh(),
                               torch.nn.Linear(HID, D_OUT))


def batch(step):
    """The step's global batch; the same on every rank."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


def train(model, params, shard=lambda t: t):
    """STEPS of SGD with momentum on the mean squared error of shard(batch)."""
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x)), shard(y)).backward()
        opt.step()
    return model


def rel_diff(got, want):
    """Largest relative difference between two lists of tensors (DTensors gathered)."""
    worst = 0.0
    for p, q in zip(got, want):
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        worst = max(worst, ((p - q).abs().max() / q.abs().max()).item())
    return worst


reference = make_model()
train(reference, reference.parameters())  # one process, the whole global batch

# ---------------------------------------------------------------- 1. data parallel
print0("1. data parallel (DDP): the whole model on each of %d ranks, %d rows each"
       % (size, BATCH // size))
rows = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
ddp = DDP(make_model())
train(ddp, ddp.parameters(), shard=lambda t: t[rows])
diff = rel_diff(list(ddp.module.parameters()), list(reference.parameters()))
check(diff < TOL, "DDP == one process (max relative difference %.1e)" % diff)

# ---------------------------------------------------------------- 2. tensor parallel
print0("2. tensor parallel (DTensor): each rank 1/%d of every weight, the whole batch" % size)
mesh = init_device_mesh("cpu", (size,))
tp = make_model()
parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                              "4": ColwiseParallel(), "6": RowwiseParallel()})
local = tp[0].weight.to_local().shape
check(tuple(local) == (HID // size, D_IN), "Linear 1's weight here: %s of (%d, %d)"
      % (tuple(local), HID, D_IN))
train(tp, tp.parameters())
diff = rel_diff(list(tp.parameters()), list(reference.parameters()))
check(diff < TOL, "tensor parallel == one process (max relative difference %.1e)" % diff)

# ---------------------------------------------------------------- 3. pipeline parallel
PER = 8 // size  # modules per stage: 2 on 4 ranks (Linear + Tanh), 4 on 2


def my_stage(model):
    return model[rank * PER:(rank + 1) * PER]  # the last stage: its Linear only


def pipeline_step(schedule, x, y):
    """One schedule step: the first stage feeds the batch, the last the target."""
    if rank == 0:
        schedule.step(x)
    elif rank == size - 1:
        schedule.step(target=y)
    else:
        schedule.step()


def pipelined(schedule_cls, m, wrap=None):
    """A schedule over this rank's stage (wrap(stage) if given) and m micro-batches."""
    part = my_stage(make_model())
    stage = PipelineStage(wrap(part) if wrap else part, rank, size, torch.device("cpu"))
    return part, schedule_cls(stage, n_microbatches=m, loss_fn=F.mse_loss)


print0("3. pipeline parallel: rank r runs stage r = model[%dr : %d(r + 1)], %d micro-batches "
       "of %d rows" % (PER, PER, MICRO, BATCH // MICRO))
for cls in (ScheduleGPipe, Schedule1F1B):
    part, schedule = pipelined(cls, MICRO)
    opt = torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        pipeline_step(schedule, *batch(step))  # the mean of the micro-batch losses
        opt.step()
    diff = rel_diff(list(part.parameters()), list(my_stage(reference).parameters()))
    every = [None] * size
    dist.all_gather_object(every, diff)
    check(max(every) < TOL, "%s == one process on every stage (max relative difference %.1e)"
          % (cls.__name__, max(every)))


# ---------------------------------------------------------------- 4. the bubble
class Busy(torch.autograd.Function):
    """Stands in for a stage's compute: sleeps T_FORWARD in forward and
    T_BACKWARD in backward, logging (kind, start, end) and how many
    micro-batches' activations are alive (forward done, backward not yet)."""
    log, live, peak = [], 0, 0

    @staticmethod
    def forward(ctx, x):
        t0 = time.perf_counter()
        time.sleep(T_FORWARD)
        Busy.log.append(("F", t0, time.perf_counter()))
        Busy.live += 1
        Busy.peak = max(Busy.peak, Busy.live)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        t0 = time.perf_counter()
        time.sleep(T_BACKWARD)
        Busy.log.append(("B", t0, time.perf_counter()))
        Busy.live -= 1
        return grad

    @staticmethod
    def reset():
        Busy.log, Busy.live, Busy.peak = [], 0, 0


class Timed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return Busy.apply(self.inner(x))


def measure(schedule_cls, m):
    """One timed step (after one to warm up): this stage's ordered actions
    [("F", i), ("B", i), ...], busy seconds, the step's wall time, peak live."""
    _, schedule = pipelined(schedule_cls, m, wrap=Timed)
    x, y = batch(0)
    pipeline_step(schedule, x, y)
    Busy.reset()
    dist.barrier()
    t0 = time.perf_counter()
    pipeline_step(schedule, x, y)
    dist.barrier()
    wall = time.perf_counter() - t0
    seen = {"F": 0, "B": 0}  # micro-batch i is the i-th forward (and backward) here
    order = []
    for kind, _, _ in Busy.log:
        order.append((kind, seen[kind]))
        seen[kind] += 1
    busy = sum(t1 - t0 for _, t0, t1 in Busy.log)
    every = [None] * size
    dist.all_gather_object(every, (order, busy, wall, Busy.peak))
    return every


def replay(orders, t_f, t_b):
    """The logical clock: stage s runs orders[s] in that order, each action as
    soon as its stage is free and its input exists (F(s, i) after F(s-1, i);
    B(s, i) after B(s+1, i)); forwards take t_f, backwards t_b, messages 0.
    Returns (step time, {(kind, s, i): start})."""
    p, free, nxt, end, start = len(orders), [0.0] * len(orders), [0] * len(orders), {}, {}
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, i = orders[s][nxt[s]]
                src = s - 1 if kind == "F" else s + 1
                if 0 <= src < p and (kind, src, i) not in end:
                    break  # its input is not there yet
                begin = max(free[s], end.get((kind, src, i), 0.0))
                start[(kind, s, i)] = begin
                free[s] = end[(kind, s, i)] = begin + (t_f if kind == "F" else t_b)
                nxt[s] += 1
                moved = True
    if any(nxt[s] < len(orders[s]) for s in range(p)):
        raise RuntimeError("the recorded orders wait on each other: %s" % orders)
    return max(free), start


def timeline(orders, start, t_f, t_b):
    """One text row per stage: forward i as the digit i, backward i as the
    letter i (a = 0), one character per time unit, '.' idle."""
    width = int(max(start[(k, s, i)] + (t_f if k == "F" else t_b)
                    for s in range(len(orders)) for k, i in orders[s]))
    rows = []
    for s, order in enumerate(orders):
        row = ["."] * width
        for kind, i in order:
            t = int(start[(kind, s, i)])
            mark = str(i) if kind == "F" else "abcdefghij"[i]
            row[t:t + (t_f if kind == "F" else t_b)] = mark * (t_f if kind == "F" else t_b)
        rows.append("   stage %d |%s|" % (s, "".join(row)))
    return "\n".join(rows)


p = size
print0("4. the bubble: p = %d stages, forward %.0f ms, backward %.0f ms per micro-batch "
       "(sleeps)" % (p, T_FORWARD * 1e3, T_BACKWARD * 1e3))
print0("   schedule   m  (p-1)/(m+p-1)  replayed  wall clock  step(ms)  (m+p-1)(f+b)  "
       "idle per stage (ms; (p-1)(f+b) = %.0f)" % ((p - 1) * (T_FORWARD + T_BACKWARD) * 1e3))
results, unit = {}, (1, 2)  # the replay's t_f : t_b, as the sleeps
for cls, ms in ((ScheduleGPipe, sorted({1, 2, 4, 2 * p})), (Schedule1F1B, (p, 2 * p))):
    for m in ms:
        every = measure(cls, m)
        orders = [e[0] for e in every]
        results[(cls, m)] = (orders, [e[3] for e in every])
        span, _ = replay(orders, *unit)
        replayed = 1 - m * sum(unit) / span            # each stage busy m (t_f + t_b)
        wall = max(e[2] for e in every)
        measured = 1 - sum(e[1] for e in every) / (p * wall)
        formula = (p - 1) / (m + p - 1)
        idle = " ".join("%.0f" % ((wall - e[1]) * 1e3) for e in every)
        print0("   %-9s %2d  %13.3f  %8.3f  %10.3f  %8.1f  %12.1f  %s"
               % (cls.__name__[8:], m, formula, replayed, measured, wall * 1e3,
                  (m + p - 1) * (T_FORWARD + T_BACKWARD) * 1e3, idle))
        check(abs(replayed - formula) < 1e-12 and all(len(o) == 2 * m for o in orders),
              "%s m=%d: the recorded schedule's bubble is (p-1)/(m+p-1) = %.3f"
              % (cls.__name__, m, formula))
print0("   (wall clock: 1 - busy / (p x step), idle = step - busy; above the formula by "
       "the messages and the shared cores; not checked)")
for cls in (ScheduleGPipe, Schedule1F1B):
    orders = results[(cls, p)][0]
    print0("   %s, m = %d, replayed (digit: forward of micro-batch i, letter: its "
           "backward):" % (cls.__name__, p))
    print0(timeline(orders, replay(orders, *unit)[1], *unit))

# ---------------------------------------------------------------- 5. activation memory
m = 2 * p
gpipe, one_f = results[(ScheduleGPipe, m)][1], results[(Schedule1F1B, m)][1]
print0("5. activations alive at once (micro-batches of %d rows, %d floats each at a "
       "boundary), m = %d" % (BATCH // m, BATCH // m * HID, m))
print0("   stage  GPipe  1F1B  min(m, p - s)")
for s in range(p):
    print0("   %5d  %5d  %4d  %13d" % (s, gpipe[s], one_f[s], min(m, p - s)))
check(gpipe == [m] * p, "GPipe keeps all m = %d micro-batches alive on every stage" % m)
check(one_f == [min(m, p - s) for s in range(p)],
      "1F1B keeps at most p - s on stage s (%s), whatever m is" % one_f)
check(results[(Schedule1F1B, p)][1] == one_f, "1F1B's peak at m = p equals its peak at m = 2p")

every = [None] * size
dist.all_gather_object(every, all(checks))
print0("all checks passed" if all(every) else "SOME CHECKS FAILED")
dist.destroy_process_group()
raise SystemExit(0 if all(every) else 1)
