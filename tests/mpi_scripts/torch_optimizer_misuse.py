"""torch_optimizer_misuse.py - run under mpirun: DistributedOptimizer's
misuse errors explain themselves, and synchronize() + skip_synchronize()
allow gradient clipping. Prints 'MISUSE OK'."""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.manual_seed(0)
problems = []


def expect_error(exc, words, fn):
    try:
        fn()
    except exc as e:
        if not all(w in str(e) for w in words):
            problems.append("message lacks %s: %s" % (words, e))
        return
    problems.append("no %s from %s" % (exc.__name__, fn))


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
named = list(model.named_parameters())
# duplicate and missing names
expect_error(ValueError, ["unique", "dup"],
             lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              named_parameters=[("dup", p) for _, p in named]))
expect_error(ValueError, ["not in it"],
             lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              named_parameters=named[:2]))
# a different model on the last rank: every rank is told, nobody hangs
odd = nn.Linear(8, 16 + (R == N - 1))
expect_error(ValueError, ["different fusion buckets", "rank %d" % (N - 1)],
             lambda: hvd.DistributedOptimizer(torch.optim.SGD(odd.parameters(), lr=0.1)))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
x, y = torch.randn(4, 8) + R, torch.tensor([0, 1, 2, R % 3])
twin = copy.deepcopy(model)  # local gradients, computed apart from the optimizer's hooks
local = torch.autograd.grad(F.cross_entropy(twin(x), y), list(twin.parameters()))
want = [hvd.allreduce(g, op=hvd.Average) for g in local]
F.cross_entropy(model(x), y).backward()
# zero_grad between backward and step
expect_error(RuntimeError, ["zero_grad()", "before step()"], opt.zero_grad)
# gradient clipping: synchronize, clip the averaged gradients, then step
opt.synchronize()
if not all(torch.allclose(p.grad, w, atol=1e-6) for p, w in zip(model.parameters(), want)):
    problems.append("synchronize() did not leave the averaged gradients")
torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
with opt.skip_synchronize():
    opt.step()
opt.zero_grad()
# too many backward passes for backward_passes_per_step=1
F.cross_entropy(model(x), y).backward()
expect_error(RuntimeError, ["backward_passes_per_step"],
             lambda: F.cross_entropy(model(x), y).backward())
# zero_grad() sets grads to None; a parameter without a gradient this step
# (the unused head) is sent as zeros and ends with a zero grad, the others
# with the average over ranks of fresh gradients (not added to old ones)
two = nn.ModuleDict({"used": nn.Linear(8, 3), "unused": nn.Linear(8, 3)})
opt2 = hvd.DistributedOptimizer(torch.optim.SGD(two.parameters(), lr=0.1),
                                named_parameters=two.named_parameters())
for step in range(2):
    opt2.zero_grad()
    if any(p.grad is not None for p in two.parameters()):
        problems.append("zero_grad() left a gradient")
    loss = F.cross_entropy(two["used"](x), y)
    loss.backward()
    mine = [p.grad.clone() for p in two["used"].parameters()]
    opt2.synchronize()
    for p, g in zip(two["used"].parameters(), mine):
        if not torch.allclose(p.grad, hvd.allreduce(g, op=hvd.Average), atol=1e-6):
            problems.append("step %d: used grad is not this step's average" % step)
    if any(p.grad is None or p.grad.abs().max() != 0 for p in two["unused"].parameters()):
        problems.append("step %d: unused parameter's grad is not zero" % step)
    with opt2.skip_synchronize():
        opt2.step()
opt2.zero_grad(set_to_none=False)
if any(p.grad is None or p.grad.abs().max() != 0 for p in two.parameters()):
    problems.append("zero_grad(set_to_none=False) did not leave zero grads")
bad = hvd.allreduce(torch.tensor(float(len(problems))), op=hvd.Sum).item()
for p in problems:
    print("[rank %d] FAIL %s" % (R, p), flush=True)
if R == 0:
    print("MISUSE OK" if bad == 0 else "MISUSE FAILED", flush=True)
sys.exit(1 if bad else 0)
