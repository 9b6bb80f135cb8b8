"""zero_exact.py - run under mpirun: DistributedOptimizer(zero_stage=STAGE)
equals stage 0 on the same ranks and one process on the whole global batch.

argv: STAGE (1|2) OPTIMIZER (sgd|nesterov|adam|adamw|lars|larc) PASSES TOL
[clip] [buckets]. The model has uneven sizes on purpose (13x7 weights, a 3-element
bias, a 0-d scalar: layers smaller than the rank count, blocks that cut
layers), two parameter groups with different hyper-parameters and a
per-step LR schedule. Each rank trains on its B/N slice; three copies train
side by side: ZeRO, stage 0, and (every rank) one process on all B samples.
Also: optimizer-state bytes per rank, the consolidated state_dict() against
stage 0's, loading it into a plain torch optimizer and into a fresh ZeRO
optimizer that then steps like the original. Prints 'ZERO OK ...' per rank
and exits non-zero on any failure."""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl import optim as hoptim

STAGE, OPT, PASSES, TOL = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
CLIP = "clip" in sys.argv[5:]
GROUPS = 3 if "buckets" in sys.argv[5:] else None  # 3 buckets instead of one
B, STEPS = 24, 6
hvd.init()
R, N = hvd.rank(), hvd.size()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(13, 7), nn.Linear(7, 3)
        self.temp = nn.Parameter(torch.tensor(1.3))  # one element: fewer than N ranks

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.temp


torch.manual_seed(1234)
models = {k: Net() for k in ("zero", "plain", "ref")}
for m in models.values():
    m.load_state_dict(models["zero"].state_dict())
initial = copy.deepcopy(models["zero"])
X, Y = torch.randn(STEPS, B, 13), torch.randint(0, 3, (STEPS, B))


def make_opt(model):
    decayed = [model.fc1.weight, model.fc2.weight]
    rest = [model.fc1.bias, model.fc2.bias, model.temp]
    groups = [{"params": decayed, "weight_decay": 1e-2}, {"params": rest, "lr": 0.05}]
    if OPT in ("sgd", "nesterov"):
        opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=OPT == "nesterov")
    elif OPT == "adam":
        opt = torch.optim.Adam(groups, lr=1e-2)
    elif OPT == "adamw":
        opt = torch.optim.AdamW(groups, lr=1e-2)
    elif OPT == "lars":
        groups[1]["lars_adaptation"] = False
        opt = hoptim.LARS(groups, lr=0.5, momentum=0.9, trust_coefficient=0.02)
    else:
        opt = hoptim.LARC(torch.optim.SGD(groups, lr=0.1, momentum=0.9),
                          trust_coefficient=0.02, clip=False)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def make_dist(model, stage):
    opt, _ = make_opt(model)
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    backward_passes_per_step=PASSES, zero_stage=stage,
                                    groups=GROUPS)
    return dist, torch.optim.lr_scheduler.StepLR(dist, step_size=2, gamma=0.5)


def train_step(model, opt, sched, x, y, passes):
    opt.zero_grad()
    for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
        (F.cross_entropy(model(xs), ys) / passes).backward()
    if not CLIP:
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


fails = []
zero, zsched = make_dist(models["zero"], STAGE)
plain, psched = make_dist(models["plain"], 0)
ref, rsched = make_opt(models["ref"])
per = B // N
for s in range(STEPS):
    x, y = X[s, R * per:(R + 1) * per], Y[s, R * per:(R + 1) * per]
    train_step(models["zero"], zero, zsched, x, y, PASSES)
    train_step(models["plain"], plain, psched, x, y, PASSES)
    train_step(models["ref"], ref, rsched, X[s], Y[s], 1)
    if STAGE == 2 and any(p.grad is not None for p in models["zero"].parameters()):
        fails.append("stage 2 left a full p.grad after step")

vs_plain, vs_ref = max_rel(models["zero"], models["plain"]), max_rel(models["zero"], models["ref"])
moved = max_rel(models["ref"], initial)
if vs_plain > 1e-6 or vs_ref > TOL or moved < 1e-3:
    fails.append("params: vs stage 0 %.3g (tol 1e-6), vs one process %.3g (tol %g), moved %.3g"
                 % (vs_plain, vs_ref, TOL, moved))

# optimizer state held by this rank: about 1/N of stage 0's
mine, full = state_bytes(zero), state_bytes(plain)
total = hvd.allreduce(torch.tensor(float(mine)), op=hvd.Sum).item()
if full and (mine > full / N * 1.05 + 64 or abs(total - full) > 0):
    fails.append("state bytes: this rank %d, all ranks %d, unsharded %d" % (mine, total, full))

# consolidated state_dict == stage 0's; it loads into a plain optimizer and a fresh ZeRO one
sd, sd0 = zero.state_dict(), plain.state_dict()
for i, st in sd0["state"].items():
    for k, v in st.items():
        got = sd["state"].get(i, {}).get(k)
        if got is None or (torch.is_tensor(v) and not torch.allclose(got, v, rtol=1e-5,
                                                                      atol=1e-7)):
            fails.append("state_dict state[%d][%s] differs from stage 0's" % (i, k))
if [g["lr"] for g in sd["param_groups"]] != [g["lr"] for g in sd0["param_groups"]]:
    fails.append("state_dict param_groups lr differ")
unsharded, _ = make_opt(copy.deepcopy(models["zero"]))
unsharded.load_state_dict(sd)
again_model = copy.deepcopy(models["zero"])
again, _ = make_dist(again_model, STAGE)
again.load_state_dict(sd)
x, y = X[0, R * per:(R + 1) * per], Y[0, R * per:(R + 1) * per]
for model, opt in ((models["zero"], zero), (again_model, again)):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
resumed = max_rel(again_model, models["zero"])
if resumed > 0:
    fails.append("a fresh ZeRO optimizer loaded from state_dict() stepped differently: %.3g"
                 % resumed)

print("[rank %d] ZERO %s stage=%d opt=%s passes=%d clip=%s vs_stage0=%.3g vs_one_process=%.3g "
      "state_bytes=%d/%d (%.3f of unsharded)%s"
      % (R, "FAIL" if fails else "OK", STAGE, OPT, PASSES, CLIP, vs_plain, vs_ref, mine, full,
         mine / full if full else 0, "".join("\n  " + f for f in fails)), flush=True)
sys.exit(1 if fails else 0)
