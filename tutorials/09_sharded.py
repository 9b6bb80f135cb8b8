"""Tutorial 09 - sharded data parallelism (ZeRO): who keeps which bytes.

Run it with 2 or 4 ranks:

    hpcdl run -n 4 -- python tutorials/09_sharded.py

Data parallelism (tutorial 03) keeps everything on every rank: parameters,
gradients and optimizer state. With Adam the state alone is twice the model,
so a model whose training state does not fit one rank's memory cannot train
that way, however many ranks there are. ZeRO (Rajbhandari et al. 2020)
splits the state over the N ranks instead of copying it:

    stage 1   each rank keeps Adam's state for 1/N of the parameters
    stage 2   ... and only its 1/N of the averaged gradient
    stage 3   ... and only its 1/N of the parameters (gathered per layer
              just before it runs, freed after: what FSDP does)

Three parts, each visible below:
  1. the arithmetic: bytes per rank of each stage, for this model and N;
  2. stage 1 written out by hand with hpcdl.comm: all-reduce the gradient,
     update only this rank's slice (with this rank's slice of Adam's state),
     all-gather the updated slices; checked against one process on the
     global batch;
  3. the library: DistributedOptimizer(zero_stage=1|2) and hvd.shard_model
     (stage 3) on the same model; the bytes each rank really holds, measured,
     against the arithmetic; every stage ends where stage 0 ends.

Exercise (for the student):
  a. Stage 1 by hand all-reduces the whole gradient, but each rank then reads
     only its slice. Replace the all-reduce by comm.reduce_scatter (each rank
     receives just its averaged slice). Does the check still pass? Count the
     bytes each rank sends per step for stage 0 (ring all-reduce: 2(N-1)/N M),
     for stage 1 as written and for your version (reduce-scatter + all-gather).
     Which stage of the library does your version correspond to?
  b. Before running: with N = 4 and Adam, what fraction of stage 0's bytes
     does each rank hold at stage 1, 2 and 3 (parameters + gradients + state)?
     Compare with the table the program prints. What is the limit as N grows?
  c. Stage 3 gathers a layer's parameters twice per step (forward, and again
     before its backward). Print shards.param_bytes() with prefetch=True and
     with shard_model(..., prefetch=False): what does prefetching cost in
     memory, and what does it buy?
"""
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hpcdl.torch as hvd
from hpcdl import comm

c = comm.init()
rank, size = c.rank, c.size
torch.manual_seed(0)
torch.set_num_threads(1)

GLOBAL_BATCH, STEPS, LR = 48 * size, 20, 1e-2
LOCAL = GLOBAL_BATCH // size
x, y = load_digits(return_X_y=True)
x = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-8), dtype=torch.float32)
y = torch.tensor(y)


def make_model():
    torch.manual_seed(0)  # the same weights on every rank and for every stage
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10))


def batch(step, whole=False):
    """This rank's slice of the step's global batch (or the whole batch)."""
    idx = torch.from_numpy(np.random.default_rng(step).choice(len(y), GLOBAL_BATCH,
                                                              replace=False))
    if not whole:
        idx = idx[rank * LOCAL:(rank + 1) * LOCAL]
    return x[idx], y[idx]


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def state_bytes(opt):
    """Bytes of Adam's per-element state (exp_avg, exp_avg_sq) this rank holds."""
    return nbytes(v for st in opt.state.values() for k, v in st.items()
                  if torch.is_tensor(v) and v.dim() > 0)


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def max_rel(a, b):
    """Largest relative difference between two lists of weights."""
    return max(((p - q).abs().max() / q.abs().max()).item() for p, q in zip(a, b))


# against one process on the global batch: float32 sums in another order, which
# Adam (dividing by the root of tiny second moments) magnifies; 6e-6 seen on 4 ranks
ONE_PROCESS_TOL = 1e-4
checks = []


def check(ok, what):
    checks.append(bool(ok))
    comm.print0("  [%s] %s" % ("ok" if ok else "FAILED", what))


# ---------------------------------------------------------------- 1. arithmetic
P = sum(p.numel() for p in make_model().parameters())
full = {"params": 4 * P, "grads": 4 * P, "adam": 8 * P}  # float32; Adam: 2 values each
expect = {0: (1, 1, 1), 1: (1, 1, 1 / size), 2: (1, 1 / size, 1 / size),
          3: (1 / size, 1 / size, 1 / size)}  # fraction kept of params, grads, state
comm.print0("1. %d parameters, Adam, %d ranks: bytes per rank between steps" % (P, size))
comm.print0("   stage   params    grads     Adam     total  (of stage 0)")
for s, (fp, fg, fs) in expect.items():
    row = (fp * full["params"], fg * full["grads"], fs * full["adam"])
    comm.print0("   %5d %8.0f %8.0f %8.0f %9.0f  (%.2f)" % (s, *row, sum(row),
                                                         sum(row) / sum(full.values())))

# ---------------------------------------------------------------- 2. stage 1 by hand
comm.print0("2. stage 1 by hand: all-reduce, update my slice, all-gather")
model = make_model()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
counts = [P // size + (r < P % size) for r in range(size)]  # any P, any N
lo = sum(counts[:rank])
mine = torch.nn.Parameter(flat[lo:lo + counts[rank]].clone())  # my slice of the weights
adam = torch.optim.Adam([mine], lr=LR)                            # state for my slice only


def load_flat(model, flat):
    """The flat vector back into the model's parameters."""
    at = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()


for step in range(STEPS):
    xs, ys = batch(step)
    model.zero_grad()
    F.cross_entropy(model(xs), ys).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    c.allreduce(grad, op="average")          # the whole averaged gradient, on every rank
    mine.grad = grad[lo:lo + counts[rank]]   # ... of which this rank uses its slice
    adam.step()                              # Adam on 1/N of the parameters
    c.allgather(mine.detach(), flat, counts=counts)  # everyone's updated slices
    load_flat(model, flat)

ref = make_model()  # one process on the whole global batch, with a whole Adam
ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
for step in range(STEPS):
    xs, ys = batch(step, whole=True)
    ref_opt.zero_grad()
    F.cross_entropy(ref(xs), ys).backward()
    ref_opt.step()
by_hand, ref = weights(model), weights(ref)
check(max_rel(by_hand, ref) < ONE_PROCESS_TOL, "stage 1 by hand == one process on the "
      "global batch (%.1e relative)" % max_rel(by_hand, ref))
check(state_bytes(adam) <= full["adam"] / size + 8,
      "this rank's Adam state: %d of %d bytes" % (state_bytes(adam), full["adam"]))

# ---------------------------------------------------------------- 3. the library
comm.print0("3. the library: DistributedOptimizer(zero_stage=0|1|2), shard_model (3)")
hvd.init()
models, held = {}, {}
for stage in (0, 1, 2, 3):
    m = make_model()
    if stage == 3:
        shards = hvd.shard_model(m)  # m.parameters() are now this rank's pieces
        opt = torch.optim.Adam(m.parameters(), lr=LR)  # a plain optimizer over them
    else:
        opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=LR),
                                       named_parameters=m.named_parameters(),
                                       zero_stage=stage)
    for step in range(STEPS):
        xs, ys = batch(step)
        opt.zero_grad()
        F.cross_entropy(m(xs), ys).backward()
        opt.step()
    if stage == 3:
        params, grads = shards.param_bytes()["shard"], nbytes(p.grad for p in m.parameters())
        shards.unshard()  # the whole model on every rank, to compare
    elif stage == 2:  # the averaged gradient lives only as this rank's blocks
        params, grads = nbytes(m.parameters()), nbytes(opt.grad_shards())
    else:
        params, grads = nbytes(m.parameters()), nbytes(p.grad for p in m.parameters())
    held[stage] = (params, grads, state_bytes(opt))
    models[stage] = weights(m)

comm.print0("   stage   params    grads     Adam     total  (of stage 0; this rank, measured)")
for s, row in held.items():
    comm.print0("   %5d %8d %8d %8d %9d  (%.2f)" % (s, *row, sum(row), sum(row) / sum(held[0])))
for s in (1, 2, 3):
    fp, fg, fs = expect[s]
    ok = all(got <= f * whole + 16 for got, f, whole in
             zip(held[s], (fp, fg, fs), (full["params"], full["grads"], full["adam"])))
    check(ok, "stage %d holds what the arithmetic says (within a block's rounding)" % s)
    check(max_rel(models[s], models[0]) < 1e-5, "stage %d ends where stage 0 ends "
          "(%.1e relative)" % (s, max_rel(models[s], models[0])))
check(max_rel(models[0], ref) < ONE_PROCESS_TOL,
      "stage 0 == one process (%.1e)" % max_rel(models[0], ref))

every = c.allgather_object(all(checks))
comm.print0("all checks passed" if all(every) else "SOME CHECKS FAILED")
raise SystemExit(0 if all(every) else 1)
