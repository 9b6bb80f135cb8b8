"""zero_checkpoint.py - run under mpirun on 4 ranks: sharded checkpoints of
a ZeRO stage 1/2 DistributedOptimizer (hpcdl.checkpoint.buckets), saved
on 4 ranks and resumed on 3 and on 2 (process sets of the same launch).

argv: DIR STAGE (the stage saved). The model has uneven sizes (13x7, a 0-d
scalar: fewer elements than ranks), Adam over two parameter groups, three
buckets. Each rank trains on its B/N slice of the global batch; every rank
also trains one process on all B samples for 6 steps (the reference). Save:
3 steps on 4 ranks, saved to DIR, loaded into a fresh model and optimizer on
the same ranks: the next step (its learning rates halved through the
wrapper's param_groups, as a scheduler does) is bit-identical, and within
1e-6 relative when the optimizer cuts 2 buckets (loaded by resharding); then the refusals: another
model, another parameter order (the optimizer's weights listed the other way
round: other buckets), another optimizer class (SGD for Adam), a stage-3
model's directory, a missing rank file, two rank files swapped: a
ValueError on every rank naming it, and no file changed. Resume: ranks 0-2 (stage 1), then ranks 0-1 (stage
2) load DIR into a fresh model and train steps 4-6: within 1e-5 relative of
the reference. Prints 'CKPT OK' per rank, exits non-zero on any failure."""
import os
import shutil
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl.checkpoint import zero as checkpoint
from hpcdl.checkpoint.buckets import load_sharded, save_sharded
import zero_common
from zero_common import digest

DIR, STAGE = sys.argv[1], int(sys.argv[2])
B, STEPS, TOL = 24, 6, 1e-5
hvd.init()
R, N = hvd.rank(), hvd.size()
fails = []


class Net(nn.Module):
    def __init__(self, hidden=7):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(13, hidden), nn.Linear(hidden, 3)
        self.temp = nn.Parameter(torch.tensor(1.3))  # one element: fewer than N ranks

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.temp


def make_opt(model, dist=True, swap=False, ps=None, buckets=3, sgd=False):
    weights = [model.fc1.weight, model.fc2.weight]
    groups = [{"params": weights[::-1] if swap else weights, "weight_decay": 1e-2},
              {"params": [model.fc1.bias, model.fc2.bias, model.temp], "lr": 0.05}]
    opt = torch.optim.SGD(groups, lr=1e-2, momentum=0.9) if sgd else \
        torch.optim.Adam(groups, lr=1e-2)
    if not dist:
        return opt
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    zero_stage=STAGE if ps is None else {3: 1, 2: 2}[ps.size()],
                                    groups=buckets, process_set=ps)


def step(model, opt, k, whole=False, n=None):
    x, y, n = X[k], Y[k], n or N
    if not whole:
        x, y = x[R * B // n:(R + 1) * B // n], y[R * B // n:(R + 1) * B // n]
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def fresh(seed, hidden=7, swap=False, ps=None, buckets=3, sgd=False):
    torch.manual_seed(seed)
    model = Net(hidden)
    return model, make_opt(model, swap=swap, ps=ps, buckets=buckets, sgd=sgd)


torch.manual_seed(1234)
X, Y = torch.randn(STEPS, B, 13), torch.randint(0, 3, (STEPS, B))
torch.manual_seed(99)
ref = Net()
ref_opt = make_opt(ref, dist=False)
for k in range(STEPS):
    step(ref, ref_opt, k, whole=True)



def refused(what, words, load):
    before = digest(DIR)
    zero_common.refused(fails, what, words, load)
    if digest(DIR) != before:
        fails.append("%s: the checkpoint's files changed" % what)


def save():
    model, opt = fresh(99)
    for k in range(3):
        step(model, opt, k)
    save_sharded(opt, DIR, extra={"step": 3})
    again, again_opt = fresh(7)
    if load_sharded(again_opt, DIR) != {"step": 3}:
        fails.append("extra not returned")
    other, other_opt = fresh(8, buckets=2)  # other buckets: loaded by resharding
    load_sharded(other_opt, DIR)
    for o in (opt, again_opt, other_opt):  # as an LR scheduler does: the wrapper's groups
        for g in o.param_groups:
            g["lr"] *= 0.5
    for m, o in ((model, opt), (again, again_opt), (other, other_opt)):
        step(m, o, 3)
    if any(not torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters())):
        fails.append("same ranks: the step after a load differs")
    worst = max(((a - b).abs().max() / b.abs().max()).item()
                for a, b in zip(other.parameters(), model.parameters()))
    if worst > 1e-6:
        fails.append("same ranks, other buckets: %.3g relative after a step" % worst)
    refused("another model", "parameter fc1.bias is float32 [7] there",
            lambda: load_sharded(fresh(1, hidden=5)[1], DIR))
    refused("another parameter order", "another parameter order",
            lambda: load_sharded(fresh(1, swap=True)[1], DIR))
    refused("another optimizer class", "saved with optimizer class Adam, this optimizer is "
            "SGD; build it as when it was saved (Adam)",
            lambda: load_sharded(fresh(1, sgd=True)[1], DIR))
    stage3 = DIR + ".stage3"  # a stage-3 model's checkpoint of the same model loads too
    torch.manual_seed(3)
    plain = Net()
    want = {k: v.clone() for k, v in plain.state_dict().items()}  # the same on every rank
    checkpoint.save_sharded(hvd.shard_model(plain), stage3, make_opt(plain, dist=False))
    before = digest(stage3)
    model3, opt3 = fresh(1)
    load_sharded(opt3, stage3)  # its units joined by name, cut into this optimizer's buckets
    if any(not torch.equal(model3.state_dict()[k], v) for k, v in want.items()):
        fails.append("a stage-3 checkpoint: other parameters loaded")
    if digest(stage3) != before:
        fails.append("stage-3 checkpoint: files changed")
    gone = DIR + ".partial"
    if R == 0:
        shutil.copytree(DIR, gone, dirs_exist_ok=True)
        os.unlink(os.path.join(gone, "rank-00001-of-%05d.pt" % N))
    hvd.allreduce(torch.zeros(1), name="copied")  # rank 0's copy is complete
    before = digest(gone)
    zero_common.refused(fails, "a missing rank file", "missing rank file(s) rank-00001-of-%05d"
                        ".pt of %d; copy the whole directory as it was written" % (N, N),
                        lambda: load_sharded(fresh(1)[1], gone))
    if digest(gone) != before:
        fails.append("missing rank file: files changed")
    swapped = DIR + ".swapped"  # rank 0's and rank 1's files trade places
    if R == 0:
        shutil.copytree(DIR, swapped, dirs_exist_ok=True)
        a, b = (os.path.join(swapped, "rank-%05d-of-%05d.pt" % (r, N)) for r in (0, 1))
        os.rename(a, a + ".x")
        os.rename(b, a)
        os.rename(a + ".x", b)
    hvd.allreduce(torch.zeros(1), name="swapped")
    before = digest(swapped)
    zero_common.refused(fails, "swapped rank files", "holds rank 1 of %d of save" % N,
                        lambda: load_sharded(fresh(1)[1], swapped))
    if digest(swapped) != before:
        fails.append("swapped rank files: files changed")


def resume(n):
    """Ranks 0..n-1 (a process set) load DIR and train on: stage 1 on 3 ranks, 2 on 2."""
    ps = hvd.add_process_set(list(range(n)))
    if R < n:
        model, opt = fresh(5, ps=ps)
        if load_sharded(opt, DIR) != {"step": 3}:
            fails.append("extra not returned on %d ranks" % n)
        for k in range(3, STEPS):
            step(model, opt, k, n=n)
        worst = max(((a - b).abs().max() / b.abs().max()).item()
                    for a, b in zip(model.parameters(), ref.parameters()))
        if worst > TOL:
            fails.append("resumed on %d ranks: %.3g relative from one process" % (n, worst))
    hvd.remove_process_set(ps)


save()
for n in (3, 2):
    resume(n)
print("[rank %d] CKPT %s%s" % (R, "FAIL" if fails else "OK", "".join("\n  " + f for f in fails)),
      flush=True)
sys.exit(1 if fails else 0)
