"""zero3_exact.py - run under mpirun: ZeRO stage 3 (hvd.shard_model) equals one
process on the whole global batch, and holds about 1/N of the parameters.

argv: TOL CASE... with CASE = OPTIMIZER:PASSES[:units][:noprefetch][:clip][:fp16|:bf16]
(optimizer sgd|adam|adamw|lars|larc; units: the Sequential and the rest as two
units instead of one per layer; noprefetch; clip: global-norm clipping to 0.3
by shards.clip_grad_norm_ against torch's on one process; the gradients'
reduce-scatter compressed,
tolerance 3e-3 and at least 1e-5 away from float32), all cases in one launch. The model has
uneven sizes on purpose (13x7 and 7x3 layers, a 3-element bias, a 0-d
scalar: units smaller than the rank count, blocks that cut layers), a layer
used twice in one forward (weights tied within one unit), two parameter
groups with different hyper-parameters and a per-step LR schedule. Each rank
trains on its B/N slice; every rank also trains one process's copy on all B
samples. Checked: parameters (gathered) against the copy; parameter bytes of
this rank's shard, the most gathered bytes alive at once; optimizer-state
bytes (about 1/N of the copy's). Prints 'ZERO3 OK ...' per rank, exits
non-zero on any failure."""
import contextlib
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl import optim as hoptim
from hpcdl.torch.zero.layout import REDUCE_IN_FLIGHT

hvd.init()
R, N = hvd.rank(), hvd.size()
B, STEPS = 24, 6


class Net(nn.Module):
    """13 -> 7 -> (7 -> 7, twice) -> 3, times a learned scalar."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(13, 7)
        self.mid = nn.Sequential(nn.Linear(7, 7), nn.Tanh())  # used twice per forward
        self.fc2 = nn.Linear(7, 3)
        self.temp = nn.Parameter(torch.tensor(1.3))  # one element: fewer than N ranks

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return self.fc2(self.mid(self.mid(h))) * self.temp


def make_opt(model, OPT):
    decayed = [model.fc1.weight, model.fc2.weight, model.mid[0].weight]
    rest = [model.fc1.bias, model.fc2.bias, model.mid[0].bias, model.temp]
    groups = [{"params": decayed, "weight_decay": 1e-2}, {"params": rest, "lr": 0.05}]
    if OPT == "sgd":
        opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)
    elif OPT == "adam":
        opt = torch.optim.Adam(groups, lr=1e-2)
    elif OPT == "lars":  # whole-layer norms: shards.layer_norms(opt) around the step
        groups[1]["lars_adaptation"] = False
        opt = hoptim.LARS(groups, lr=0.5, momentum=0.9, trust_coefficient=0.02)
    elif OPT == "larc":  # the same hook, through the LARC(SGD) wrapper chain
        opt = hoptim.LARC(torch.optim.SGD(groups, lr=0.1, momentum=0.9),
                          trust_coefficient=0.02, clip=False)
    else:
        opt = torch.optim.AdamW(groups, lr=1e-2)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def train_step(model, opt, sched, x, y, passes, clip=False):
    opt.zero_grad()
    for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
        (F.cross_entropy(model(xs), ys) / passes).backward()
    shards = getattr(model, "_hpcdl_shards", None)
    if clip and shards is not None:
        shards.clip_grad_norm_(0.3)
    elif clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
    with shards.layer_norms(opt) if shards is not None else contextlib.nullcontext():
        opt.step()
    sched.step()


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for k, v in st.items() if torch.is_tensor(v) and k != "step")


def run(case, TOL):
    """One case; returns the failures (TOL: relative, against one process)."""
    OPT, PASSES, *flags = case.split(":")
    PASSES, UNITS, PREFETCH = int(PASSES), "units" in flags, "noprefetch" not in flags
    CLIP = "clip" in flags
    COMP = ([f for f in flags if f in ("fp16", "bf16")] or ["none"])[0]
    if COMP != "none":  # 16-bit gradients on the wire: one process is about 1e-4 away
        TOL = max(TOL, 3e-3)
    torch.manual_seed(1234 + R)  # every rank a different init: shard_model syncs rank 0's
    model = Net()
    torch.manual_seed(1234)
    ref_model = Net()  # rank 0's init, on every rank
    initial = copy.deepcopy(ref_model)
    X, Y = torch.randn(STEPS, B, 13), torch.randint(0, 3, (STEPS, B))

    shards = hvd.shard_model(model, units=[model.mid, model] if UNITS else None,
                             prefetch=PREFETCH, compression=getattr(hvd.Compression, COMP))
    opt, sched = make_opt(model, OPT)
    ref, rsched = make_opt(ref_model, OPT)
    per = B // N
    fails = []
    for s in range(STEPS):
        x, y = X[s, R * per:(R + 1) * per], Y[s, R * per:(R + 1) * per]
        train_step(model, opt, sched, x, y, PASSES, CLIP)
        train_step(ref_model, ref, rsched, X[s], Y[s], 1, CLIP)
        if shards.live_bytes != 0:
            fails.append("step %d left %d gathered bytes alive" % (s, shards.live_bytes))

    # evaluation under no_grad, ranks running different numbers of forwards: unshard first
    shards.unshard()
    with torch.no_grad():
        for _ in range(R + 1):
            model(X[0])
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    shards.reshard()
    worst = max(((whole[k] - q).abs().max() / (q.abs().max() + 1e-12)).item()
                for k, q in ref_model.state_dict().items())
    moved = max(((p - q).abs().max()).item()
                for p, q in zip(ref_model.parameters(), initial.parameters()))
    if worst > TOL or moved < 1e-3:
        fails.append("params vs one process: %.3g (tol %g), moved %.3g" % (worst, TOL, moved))
    if COMP != "none" and worst < 1e-5:  # 16-bit gradients leave a trace float32 does not
        fails.append("%s: %.3g from one process in float32: was the compression applied?"
                     % (COMP, worst))

    # a sharded forward without grad, the same count on every rank, matches too
    with torch.no_grad():
        got, want = model(X[1]), ref_model(X[1])
    ftol = 1e-5 if COMP == "none" else 10 * TOL  # the parameters' distance, through the model
    if not torch.allclose(got, want, rtol=ftol, atol=ftol / 10):
        fails.append("no-grad sharded forward differs from one process")

    # bytes per rank: parameters and optimizer state about 1/N
    pb = shards.param_bytes()
    mine, full = state_bytes(opt), state_bytes(ref)
    every = hvd.allgather_object((pb["shard"], mine))
    if sum(e[0] for e in every) != pb["full"] or \
            pb["shard"] > pb["full"] / N + 4 * len(shards.units):  # a block: +1 element
        fails.append("parameter bytes: this rank %d, all %s, unsharded %d"
                     % (pb["shard"], [e[0] for e in every], pb["full"]))
    if full and (mine > full / N * 1.05 + 64 or sum(e[1] for e in every) != full):
        fails.append("state bytes: this rank %d, all ranks %s, unsharded %d"
                     % (mine, [e[1] for e in every], full))
    # gathered at once: the running unit, one prefetched, a backward one: at most three units
    if pb["peak_gathered"] > 3 * pb["largest_unit"]:
        fails.append("peak gathered %d > 3 x largest unit %d" % (pb["peak_gathered"],
                                                                 pb["largest_unit"]))
    # full gradients held by their reduce-scatters: the REDUCE_IN_FLIGHT + 1 largest
    # of one backward's (mid's twice), not all five: each is freed once it is done
    mid = sum(p.numel() for p in ref_model.mid.parameters())
    sizes = sorted([u.numel for u in shards.units] + [mid])
    wire = 4 if COMP == "none" else 2
    bound = wire * sum(sizes[-(REDUCE_IN_FLIGHT + 1):])
    reducing = shards.grad_bytes()["peak_reducing"]
    if not 0 < reducing <= bound:
        fails.append("full gradients in reduce-scatters at once: %d bytes, bound %d"
                     % (reducing, bound))
    print("[rank %d] ZERO3 %s opt=%s passes=%d units=%s prefetch=%s clip=%s comp=%s "
          "vs_one_process=%.3g "
          "param_bytes=%d/%d peak_gathered=%d (largest unit %d) state_bytes=%d/%d%s"
          % (R, "FAIL" if fails else "OK", OPT, PASSES, "mid+rest" if UNITS else "per-layer",
             PREFETCH, CLIP, COMP, worst, pb["shard"], pb["full"], pb["peak_gathered"],
             pb["largest_unit"], mine, full, "".join("\n  " + f for f in fails)), flush=True)
    return fails


if __name__ == "__main__":  # zero3_checkpoint.py imports the cases, the model and the step
    failed = [f for case in sys.argv[2:] for f in run(case, float(sys.argv[1]))]
    sys.exit(1 if failed else 0)
