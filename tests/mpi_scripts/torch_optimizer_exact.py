"""torch_optimizer_exact.py - run under mpirun: synchronous SGD through
DistributedOptimizer equals one process training on the whole global batch.

argv: OPTIMIZER (sgd|adam) PASSES (backward_passes_per_step) COMPRESSION
(none|fp16|bf16|topk) TOL. Each rank trains on its B/N slice (in PASSES
micro-batches, loss scaled by 1/PASSES); rank-0-only reference training runs
the same k steps on all B samples in one process. Prints 'EXACT max_diff=...'
and exits non-zero if any parameter differs by more than TOL (relative)."""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd

OPT, PASSES, COMP, TOL = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
B, STEPS = 24, 5
hvd.init()
R, N = hvd.rank(), hvd.size()
torch.manual_seed(1234)  # same model and data everywhere; rank 0's wins anyway
model = nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 30), nn.Tanh(),
                      nn.Linear(30, 5))
ref_model = copy.deepcopy(model)
initial = copy.deepcopy(model)
X = torch.randn(STEPS, B, 12)
Y = torch.randint(0, 5, (STEPS, B))


def make_opt(params):
    if OPT == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
               "bf16": hvd.Compression.bf16, "topk": hvd.Compression.topk(1.0)}[COMP]
opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                               named_parameters=model.named_parameters(),
                               compression=compression, backward_passes_per_step=PASSES)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
per_rank = B // N
for s in range(STEPS):
    opt.zero_grad()
    xs = X[s, R * per_rank:(R + 1) * per_rank]
    ys = Y[s, R * per_rank:(R + 1) * per_rank]
    for x, y in zip(xs.chunk(PASSES), ys.chunk(PASSES)):
        (F.cross_entropy(model(x), y) / PASSES).backward()
    opt.step()

# the single-process reference on the whole global batch
ref_opt = make_opt(ref_model.parameters())
for s in range(STEPS):
    ref_opt.zero_grad()
    F.cross_entropy(ref_model(X[s]), Y[s]).backward()
    ref_opt.step()

diff = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
           for p, q in zip(model.parameters(), ref_model.parameters()))
moved = max((p - q).abs().max().item()
            for p, q in zip(ref_model.parameters(), initial.parameters()))
print("[rank %d] EXACT max_diff=%.3g tol=%g moved=%.3g" % (R, diff, TOL, moved), flush=True)
sys.exit(0 if diff <= TOL and moved > 1e-3 else 1)
