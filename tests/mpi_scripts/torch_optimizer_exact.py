"""torch_optimizer_exact.py - run under mpirun: synchronous SGD through
DistributedOptimizer equals one process training on the whole global batch.

argv: CASE... (all in this one launch), CASE = OPTIMIZER:PASSES:COMPRESSION:TOL
[:FUSION]: OPTIMIZER sgd|adam, PASSES backward_passes_per_step, COMPRESSION
none|fp16|bf16|topk, TOL the relative tolerance, FUSION a fusion threshold in
bytes (HPCDL_FUSION_THRESHOLD). The old form OPTIMIZER PASSES COMPRESSION TOL
is one case. Each rank trains on its B/N slice (in PASSES micro-batches, loss
scaled by 1/PASSES); the one-process reference runs the same steps on all B
samples. Prints 'EXACT <case> max_diff=...' per case and exits non-zero if any
parameter of any case differs by more than its TOL (relative)."""
import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd

B, STEPS = 24, 5
hvd.init()
R, N = hvd.rank(), hvd.size()
COMPRESSION = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
               "bf16": hvd.Compression.bf16, "topk": hvd.Compression.topk(1.0)}


def make_opt(name, params):
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def run_case(text):
    """One case (see the module docstring); True when within its tolerance."""
    opt_name, passes, comp, tol, *fusion = text.split(":")
    passes, tol = int(passes), float(tol)
    if fusion:
        os.environ["HPCDL_FUSION_THRESHOLD"] = fusion[0]
    else:
        os.environ.pop("HPCDL_FUSION_THRESHOLD", None)
    torch.manual_seed(1234)  # same model and data everywhere; rank 0's wins anyway
    model = nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 30), nn.Tanh(),
                          nn.Linear(30, 5))
    ref_model = copy.deepcopy(model)
    initial = copy.deepcopy(model)
    X = torch.randn(STEPS, B, 12)
    Y = torch.randint(0, 5, (STEPS, B))
    opt = hvd.DistributedOptimizer(make_opt(opt_name, model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   compression=COMPRESSION[comp], backward_passes_per_step=passes)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    per_rank = B // N
    for s in range(STEPS):
        opt.zero_grad()
        xs = X[s, R * per_rank:(R + 1) * per_rank]
        ys = Y[s, R * per_rank:(R + 1) * per_rank]
        for x, y in zip(xs.chunk(passes), ys.chunk(passes)):
            (F.cross_entropy(model(x), y) / passes).backward()
        opt.step()

    # the single-process reference on the whole global batch
    ref_opt = make_opt(opt_name, ref_model.parameters())
    for s in range(STEPS):
        ref_opt.zero_grad()
        F.cross_entropy(ref_model(X[s]), Y[s]).backward()
        ref_opt.step()

    diff = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
               for p, q in zip(model.parameters(), ref_model.parameters()))
    moved = max((p - q).abs().max().item()
                for p, q in zip(ref_model.parameters(), initial.parameters()))
    print("[rank %d] EXACT %s max_diff=%.3g tol=%g moved=%.3g" % (R, text, diff, tol, moved),
          flush=True)
    return diff <= tol and moved > 1e-3


cases = sys.argv[1:]
if len(cases) == 4 and ":" not in cases[0]:  # OPTIMIZER PASSES COMPRESSION TOL
    cases = [":".join(cases)]
results = [run_case(case) for case in cases]
sys.exit(0 if all(results) else 1)
