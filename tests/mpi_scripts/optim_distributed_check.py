"""optim_distributed_check.py - run under mpirun: DistributedOptimizer around
hpcdl.optim.LARS, LAMB and around LARC(SGD), driven by a warmup schedule and with
bias / norm exclusion, equals one process training on the whole global batch
(float64, so only rounding may differ); broadcast_optimizer_state works
through them; LARC outside DistributedOptimizer and LAMB at ZeRO stage 1 are
refused. Ends with
torch_common's verdict line 'CHECKS n FAILED k'."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl import optim
from torch_common import N, R, check, run

B, STEPS = 24, 6


def make(kind, model):
    groups = optim.exclude_bias_and_norm(model, weight_decay=1e-3)
    if kind == "lars":
        opt = optim.LARS(groups, lr=optim.scale_lr(0.1, B, base_batch=8), trust_coefficient=0.02)
    elif kind == "lamb":
        opt = optim.LAMB(groups, lr=0.05, weight_decay=0.01)
    else:
        opt = optim.LARC(torch.optim.SGD(groups, lr=0.3, momentum=0.9), trust_coefficient=0.02)
    return opt


def schedule(opt):
    return optim.warmup_schedule(opt, steps_per_epoch=2, epochs=3, warmup_epochs=1,
                                 decay="cosine")


def train_against_one_process(kind):
    torch.manual_seed(7)  # same model and data on every rank
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    ref_model, start = copy.deepcopy(model), copy.deepcopy(model)
    X, Y = torch.randn(STEPS, B, 10, dtype=torch.float64), torch.randint(0, 4, (STEPS, B))
    opt = hvd.DistributedOptimizer(make(kind, model), named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sched = schedule(opt)
    part = slice(R * (B // N), (R + 1) * (B // N))
    for s in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(X[s, part]), Y[s, part]).backward()
        opt.step()
        sched.step()
    ref_opt = make(kind, ref_model)
    ref_sched = schedule(ref_opt)
    for s in range(STEPS):
        ref_opt.zero_grad()
        F.cross_entropy(ref_model(X[s]), Y[s]).backward()
        ref_opt.step()
        ref_sched.step()
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(),
                                                          ref_model.parameters()))
    moved = max((p - q).abs().max().item() for p, q in zip(ref_model.parameters(),
                                                           start.parameters()))
    check(diff < 1e-10 and moved > 1e-3, "%s: max |diff| %.3g vs one process (moved %.3g)"
          % (kind, diff, moved))
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # with momentum buffers in the state
    check(len(opt.state) == len(list(model.parameters())), "%s: state after broadcast" % kind)
    if R == 0:
        print("%s: max |diff| vs one process %.3g (parameters moved %.3g)" % (kind, diff, moved),
              flush=True)


def test_lars():
    train_against_one_process("lars")


def test_larc():
    train_against_one_process("larc")


def test_lamb():
    train_against_one_process("lamb")


def test_lamb_refuses_zero_shards():
    model = nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(optim.LAMB(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), zero_stage=1)
    model(torch.ones(2, 3)).sum().backward()
    try:
        opt.step()
        check(False, "LAMB at zero_stage=1 raised nothing")
    except RuntimeError as e:
        check("LAMB cannot step on ZeRO shards" in str(e), "message: %s" % e)


def test_larc_outside_is_refused():
    model = nn.Linear(3, 2)
    inner = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    try:
        optim.LARC(inner)
        check(False, "LARC(DistributedOptimizer(...)) raised nothing")
    except TypeError as e:
        check("DistributedOptimizer(LARC(optimizer)" in str(e), "message: %s" % e)


run(test_lars, test_larc, test_lamb, test_lamb_refuses_zero_shards,
    test_larc_outside_is_refused)
