"""zero_exact.py - run under mpirun: DistributedOptimizer(zero_stage=1|2)
equals stage 0 on the same ranks and one process on the whole global batch.

argv: TOL CASE... with CASE = STAGE:OPTIMIZER:PASSES[:clip][:scale][:buckets][:fp16|:bf16]
(STAGE 1|2; OPTIMIZER sgd|nesterov|adam|adamw|lars|larc; clip: global-norm
clipping across shards; scale: a dynamic loss scale (the trainer's fp16
LossScaler) over the gradients this rank steps from, an inf put into one
gradient element on the last rank at step 2, so that only the rank whose shard
holds it sees it and every rank must skip that step and halve the scale, as
the one process does; buckets: 5 buckets instead of one; fp16|bf16: the
gradients compressed at both stages, tolerance 3e-3 and at least 1e-5 from
float32), all cases in one launch. The model has uneven sizes on purpose
(13x7 weights, a 3-element bias, a 0-d scalar: layers smaller than the rank
count, blocks that cut layers), two parameter groups with different
hyper-parameters and a per-step LR schedule. Each rank trains on its B/N
slice; three copies train side by side: ZeRO, stage 0, and (every rank) one
process on all B samples. Also: optimizer-state bytes per rank, the
consolidated state_dict() against stage 0's, loading it into a plain torch
optimizer and into a fresh ZeRO optimizer that then steps like the original.
Prints 'ZERO OK ...' per rank and case; exits non-zero on any failure."""
import contextlib
import copy
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl import comm, optim as hoptim
from hpcdl.train.precision import LossScaler

B, STEPS = 24, 6
hvd.init()
R, N = hvd.rank(), hvd.size()


@dataclass
class Case:
    stage: int
    opt: str
    passes: int
    clip: bool
    scale: bool      # loss scaling with an overflow at step 2 (PASSES 1)
    groups: object   # 5 buckets (one per parameter), or None: one
    comp: str        # none | fp16 | bf16, at both stages
    tol: float       # against one process

    @classmethod
    def parse(cls, text, tol):
        stage, opt, passes, *flags = text.split(":")
        comp = ([f for f in flags if f in ("fp16", "bf16")] or ["none"])[0]
        return cls(int(stage), opt, int(passes), "clip" in flags, "scale" in flags,
                   5 if "buckets" in flags else None, comp,
                   tol if comp == "none" else max(tol, 3e-3))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(13, 7), nn.Linear(7, 3)
        self.temp = nn.Parameter(torch.tensor(1.3))  # one element: fewer than N ranks

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.temp


def make_opt(c, model):
    decayed = [model.fc1.weight, model.fc2.weight]
    rest = [model.fc1.bias, model.fc2.bias, model.temp]
    groups = [{"params": decayed, "weight_decay": 1e-2}, {"params": rest, "lr": 0.05}]
    if c.opt in ("sgd", "nesterov"):
        opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=c.opt == "nesterov")
    elif c.opt == "adam":
        opt = torch.optim.Adam(groups, lr=1e-2)
    elif c.opt == "adamw":
        opt = torch.optim.AdamW(groups, lr=1e-2)
    elif c.opt == "lars":
        groups[1]["lars_adaptation"] = False
        opt = hoptim.LARS(groups, lr=0.5, momentum=0.9, trust_coefficient=0.02)
    else:
        opt = hoptim.LARC(torch.optim.SGD(groups, lr=0.1, momentum=0.9),
                          trust_coefficient=0.02, clip=False)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def make_dist(c, model, stage):
    opt, _ = make_opt(c, model)
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    backward_passes_per_step=c.passes, zero_stage=stage,
                                    groups=c.groups, compression=getattr(hvd.Compression, c.comp))
    return dist, torch.optim.lr_scheduler.StepLR(dist, step_size=2, gamma=0.5)


def train_step(c, model, opt, sched, x, y, passes, scaler=None):
    opt.zero_grad()
    for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
        loss = F.cross_entropy(model(xs), ys) / passes
        (scaler.scale_loss(loss) if scaler else loss).backward()
    if scaler is not None:  # as hpcdl train --precision fp16 does
        dist = hasattr(opt, "synchronize")
        if dist:
            opt.synchronize()
        if scaler.unscale_and_check(opt.local_parameters() if dist else model.parameters()):
            with opt.skip_synchronize() if dist else contextlib.nullcontext():
                opt.step()
    elif not c.clip:
        opt.step()
    elif hasattr(opt, "clip_grad_norm_"):
        opt.synchronize()
        opt.clip_grad_norm_(0.3)
        with opt.skip_synchronize():
            opt.step()
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        opt.step()
    sched.step()


def max_rel(a, b):
    return max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
               for p, q in zip(a.parameters(), b.parameters()))


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for v in st.values() if torch.is_tensor(v) and v.dim() > 0)


def train(c, fails):
    """The three copies after STEPS steps: (models, ZeRO optimizer, stage 0's, data)."""
    torch.manual_seed(1234)
    models = {k: Net() for k in ("zero", "plain", "ref")}
    for m in models.values():
        m.load_state_dict(models["zero"].state_dict())
    initial = copy.deepcopy(models["zero"])
    X, Y = torch.randn(STEPS, B, 13), torch.randint(0, 3, (STEPS, B))
    zero, zsched = make_dist(c, models["zero"], c.stage)
    plain, psched = make_dist(c, models["plain"], 0)
    ref, rsched = make_opt(c, models["ref"])
    scalers, poison = overflow_at_step_2(c, models)
    per = B // N
    for s in range(STEPS):
        poison[0] = s == 2
        x, y = X[s, R * per:(R + 1) * per], Y[s, R * per:(R + 1) * per]
        train_step(c, models["zero"], zero, zsched, x, y, c.passes, scalers.get("zero"))
        train_step(c, models["plain"], plain, psched, x, y, c.passes, scalers.get("plain"))
        train_step(c, models["ref"], ref, rsched, X[s], Y[s], 1, scalers.get("ref"))
        if c.stage == 2 and any(p.grad is not None for p in models["zero"].parameters()):
            fails.append("stage 2 left a full p.grad after step")
    if c.stage == 2:
        check_grad_bytes(c, zero, fails)
    for k, sc in scalers.items():
        if (sc.skipped, sc.scale) != (1, 2.0 ** 7):
            fails.append("loss scale (%s): %d steps skipped, scale %g; want 1 and 128"
                         % (k, sc.skipped, sc.scale))
    models["initial"] = initial
    return models, zero, plain, (X, Y)


def overflow_at_step_2(c, models):
    """Case `scale`: a LossScaler per copy (the distributed ones agree on
    overflow over ranks) and a gradient hook putting inf into fc2.bias[0] while
    poison[0] is set: on the last rank of the distributed copies, and in the
    one process (whose batch holds every rank's)."""
    poison = [False]
    if not c.scale:
        return {}, poison

    def inf_at_0(g):
        if not poison[0]:
            return g
        g = g.clone()
        g[0] = float("inf")
        return g
    scalers = {}
    for k, m in models.items():
        scalers[k] = LossScaler(init_scale=2.0 ** 8, agree=None if k == "ref" else comm.any_rank)
        if k == "ref" or R == N - 1:
            m.fc2.bias.register_hook(inf_at_0)
    return scalers, poison


def check_grad_bytes(c, zero, fails):
    """Stage 2 holds its gradient blocks between steps, and during backward
    at most REDUCE_IN_FLIGHT full buckets in flight plus those filling (one,
    or two where hooks of adjacent buckets interleave), each with its 16-bit
    copy when compressed; a bucket held until step() breaks the bound with 5.
    With backward_passes_per_step > 1 every bucket accumulates locally until
    its last pass, so the whole gradient is held then."""
    from hpcdl.torch.zero.layout import REDUCE_IN_FLIGHT
    got = zero.grad_bytes()
    sizes = sorted(b.numel * 4 for b in zero.reducer.buckets)
    shard = sum(g.numel() * 4 for g in zero.grad_shards())
    held = sizes if c.passes > 1 else sizes[-(REDUCE_IN_FLIGHT + 2):]
    bound = shard + sum(held) * (1.5 if c.comp != "none" else 1)
    if got["shard"] != shard or got["peak"] > bound or got["peak"] <= shard:
        fails.append("stage 2 gradient bytes: shard %d (expected %d), peak %d (bound %d)"
                     % (got["shard"], shard, got["peak"], bound))


def check_params(c, models, fails):
    # against stage 0: exact up to float32 rounding, or 16-bit sums rounded in another order
    vs0 = 1e-6 if c.comp == "none" else c.tol
    vs_plain, vs_ref = max_rel(models["zero"], models["plain"]), max_rel(models["zero"],
                                                                         models["ref"])
    moved = max_rel(models["ref"], models["initial"])
    if vs_plain > vs0 or vs_ref > c.tol or moved < 1e-3:
        fails.append("params: vs stage 0 %.3g (tol %g), vs one process %.3g (tol %g), moved "
                     "%.3g" % (vs_plain, vs0, vs_ref, c.tol, moved))
    if c.comp != "none" and vs_ref < 1e-5:  # 16-bit gradients leave a trace float32 does not
        fails.append("%s: %.3g from one process in float32: was the compression applied?"
                     % (c.comp, vs_ref))
    return vs_plain, vs_ref


def check_state(c, models, zero, plain, data, fails):
    """Bytes held per rank; the consolidated state_dict() and loading it back."""
    mine, full = state_bytes(zero), state_bytes(plain)
    total = hvd.allreduce(torch.tensor(float(mine)), op=hvd.Sum).item()
    if full and (mine > full / N * 1.05 + 64 or abs(total - full) > 0):
        fails.append("state bytes: this rank %d, all ranks %d, unsharded %d" % (mine, total, full))
    rtol, atol = (1e-5, 1e-7) if c.comp == "none" else (10 * c.tol, 1e-5)
    sd, sd0 = zero.state_dict(), plain.state_dict()
    for i, st in sd0["state"].items():
        for k, v in st.items():
            got = sd["state"].get(i, {}).get(k)
            if got is None or (torch.is_tensor(v) and not torch.allclose(got, v, rtol=rtol,
                                                                          atol=atol)):
                fails.append("state_dict state[%d][%s] differs from stage 0's" % (i, k))
    if [g["lr"] for g in sd["param_groups"]] != [g["lr"] for g in sd0["param_groups"]]:
        fails.append("state_dict param_groups lr differ")
    unsharded, _ = make_opt(c, copy.deepcopy(models["zero"]))
    unsharded.load_state_dict(sd)
    again_model = copy.deepcopy(models["zero"])
    again, _ = make_dist(c, again_model, c.stage)
    again.load_state_dict(sd)
    per = B // N
    x, y = data[0][0, R * per:(R + 1) * per], data[1][0, R * per:(R + 1) * per]
    for model, opt in ((models["zero"], zero), (again_model, again)):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    resumed = max_rel(again_model, models["zero"])
    if resumed > 0:
        fails.append("a fresh ZeRO optimizer loaded from state_dict() stepped differently: "
                     "%.3g" % resumed)
    return mine, full


def run(c):
    fails = []
    models, zero, plain, data = train(c, fails)
    vs_plain, vs_ref = check_params(c, models, fails)
    mine, full = check_state(c, models, zero, plain, data, fails)
    print("[rank %d] ZERO %s stage=%d opt=%s passes=%d clip=%s scale=%s buckets=%s comp=%s "
          "vs_stage0=%.3g vs_one_process=%.3g state_bytes=%d/%d (%.3f of unsharded)%s"
          % (R, "FAIL" if fails else "OK", c.stage, c.opt, c.passes, c.clip, c.scale, c.groups or 1,
             c.comp, vs_plain, vs_ref, mine, full, mine / full if full else 0,
             "".join("\n  " + f for f in fails)), flush=True)
    return fails


if __name__ == "__main__":
    tol = float(sys.argv[1])
    failed = [f for text in sys.argv[2:] for f in run(Case.parse(text, tol))]
    sys.exit(1 if failed else 0)
