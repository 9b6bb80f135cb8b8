"""test_optim.py - hpcdl.optim against math written out here in float64:
LARS (momentum, nesterov, weight decay, excluded groups, zero norms) and LARC
(clip and scale over SGD with momentum and weight decay) step by step; the
scaling rules; schedule values against their closed forms; checkpoint resume
equals a continuous run; bad input raises clear errors. On 2 ranks:
DistributedOptimizer around LARS / LARC equals one process on the global batch."""
import io
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

from hpcdl import optim
from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")
SHAPES = [(4, 3), (5,), (2, 3, 2), (7,)]
LRS = [0.5, 1.0, 2.0, 1.5, 0.25]  # changed before each step, as a scheduler would


# ------------------------------------------------------------------ test data
def start_weights(zero=()):
    """Weights that depend on tensor and position; tensors in `zero` are all 0."""
    ws = []
    for i, shape in enumerate(SHAPES):
        n = int(np.prod(shape))
        w = np.cos(0.7 * np.arange(n) + i) * (i + 1)
        ws.append(np.zeros(shape) if i in zero else w.reshape(shape))
    return ws


def grads(step, shapes, zero=()):
    """Step-, tensor- and position-dependent gradients whose scales differ by
    tensor (so trust ratios differ); (step, i) in `zero` gives a zero gradient."""
    out = []
    for i, shape in enumerate(shapes):
        n = int(np.prod(shape))
        g = np.sin(0.37 * np.arange(n) + 1.3 * step + i) * 10.0 ** (i - 2)
        out.append(np.zeros(shape) if (step, i) in zero else g.reshape(shape))
    return out


def norm(x):
    return math.sqrt(float(np.sum(x * x)))


def run_torch(opt, params, steps, zero_g=(), lrs=LRS):
    for t in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[t]
        for p, g in zip(params, grads(t, [p.shape for p in params], zero_g)):
            p.grad = torch.tensor(g, dtype=p.dtype)
        opt.step()
    return [p.detach().double().numpy() for p in params]


# ------------------------------------------------------------- reference math
def lars_reference(ws, steps, momentum, wd, trust, eps, nesterov, adapt, zero_g=(), lrs=LRS):
    """You et al. 2017 written out: wd and adapt are per tensor."""
    ws = [w.copy() for w in ws]
    vs = [np.zeros_like(w) for w in ws]
    for t in range(steps):
        for i, g in enumerate(grads(t, [w.shape for w in ws], zero_g)):
            w = ws[i]
            wn, gn = norm(w), norm(g)
            local = trust * wn / (gn + wd[i] * wn + eps) if adapt[i] and wn > 0 and gn > 0 else 1.0
            d = lrs[t] * local * (g + wd[i] * w)
            vs[i] = momentum * vs[i] + d
            ws[i] = w - (momentum * vs[i] + d if nesterov else vs[i])
    return ws


def larc_sgd_reference(ws, steps, momentum, wd, trust, eps, clip, adapt, hits=None):
    """apex LARC around torch SGD(momentum, dampening 0): the decayed gradient is
    scaled by min(local_lr / lr, 1) (clip) or local_lr (scale); SGD's own weight
    decay is off for adapted tensors. hits counts clipped / unclipped tensors."""
    ws = [w.copy() for w in ws]
    bufs = [None] * len(ws)
    for t in range(steps):
        lr = LRS[t]
        for i, g in enumerate(grads(t, [w.shape for w in ws])):
            w = ws[i]
            d = g + wd[i] * w
            if adapt[i]:
                local = trust * norm(w) / (norm(g) + wd[i] * norm(w) + eps)
                factor = min(local / lr, 1.0) if clip else local
                if hits is not None:
                    hits[local / lr < 1.0] += 1
                d = d * factor
            bufs[i] = d if bufs[i] is None else momentum * bufs[i] + d
            ws[i] = w - lr * bufs[i]
    return ws


def assert_close(got, want, rtol=1e-12):
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-3, err_msg="tensor %d" % i)


def as_params(ws, dtype=torch.float64):
    return [torch.tensor(w, dtype=dtype, requires_grad=True) for w in ws]


# ----------------------------------------------------------------------- LARS
@pytest.mark.parametrize("momentum,wd,nesterov", [(0.9, 0.0, False), (0.9, 0.01, False),
                                                  (0.9, 0.01, True), (0.0, 0.01, False)])
def test_lars_matches_reference(momentum, wd, nesterov):
    params = as_params(start_weights())
    opt = optim.LARS(params, lr=1.0, momentum=momentum, weight_decay=wd,
                     trust_coefficient=0.02, nesterov=nesterov)
    got = run_torch(opt, params, 5)
    n = len(SHAPES)
    want = lars_reference(start_weights(), 5, momentum, [wd] * n, 0.02, 1e-8, nesterov,
                          [True] * n)
    assert_close(got, want)
    assert max(norm(a - b) for a, b in zip(got, start_weights())) > 1e-3  # it moved


def test_lars_float32_close_to_float64_math():
    params = as_params(start_weights(), torch.float32)
    opt = optim.LARS(params, lr=1.0, weight_decay=0.01, trust_coefficient=0.02)
    n = len(SHAPES)
    want = lars_reference(start_weights(), 5, 0.9, [0.01] * n, 0.02, 1e-8, False, [True] * n)
    assert_close(run_torch(opt, params, 5), want, rtol=1e-5)


def test_lars_zero_norms_use_local_lr_one():
    # tensor 1 starts at zero; tensor 2 gets a zero gradient at steps 0 and 2
    zero_g = {(0, 2), (2, 2)}
    params = as_params(start_weights(zero=(1,)))
    opt = optim.LARS(params, lr=1.0, momentum=0.9, weight_decay=0.01, trust_coefficient=0.02)
    got = run_torch(opt, params, 4, zero_g=zero_g)
    n = len(SHAPES)
    want = lars_reference(start_weights(zero=(1,)), 4, 0.9, [0.01] * n, 0.02, 1e-8, False,
                          [True] * n, zero_g=zero_g)
    assert_close(got, want)
    assert np.all(np.isfinite(got[1])) and norm(got[1]) > 0


def norm_model():
    torch.manual_seed(0)
    return nn.ModuleDict({"fc1": nn.Linear(5, 4), "bn": nn.BatchNorm1d(4),
                          "ln": nn.LayerNorm((2, 3)), "gn": nn.GroupNorm(2, 4),
                          "fc2": nn.Linear(4, 3, bias=False)}).double()


def test_exclude_bias_and_norm_groups():
    model = norm_model()
    groups = optim.exclude_bias_and_norm(model, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in groups[0]["params"]] == ["fc1.weight", "fc2.weight"]
    assert sorted(names[id(p)] for p in groups[1]["params"]) == sorted(
        ["fc1.bias", "bn.weight", "bn.bias", "ln.weight", "ln.bias", "gn.weight", "gn.bias"])
    assert groups[0]["weight_decay"] == 0.01 and "lars_adaptation" not in groups[0]
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["lars_adaptation"] is False
    # no weight_decay given: the optimizer's default applies to the first group
    opt = torch.optim.SGD(optim.exclude_bias_and_norm(model), lr=0.1, weight_decay=0.5)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]


def test_lars_excluded_group_is_plain_sgd_without_decay():
    model = norm_model()
    params = list(model.parameters())
    groups = optim.exclude_bias_and_norm(model, weight_decay=0.01)
    excluded = {id(p) for p in groups[1]["params"]}
    opt = optim.LARS(groups, lr=1.0, momentum=0.9, trust_coefficient=0.02)
    ws = [p.detach().numpy().copy() for p in params]
    got = run_torch(opt, params, 4)
    adapt = [id(p) not in excluded for p in params]
    want = lars_reference(ws, 4, 0.9, [0.01 if a else 0.0 for a in adapt], 0.02, 1e-8,
                          False, adapt)
    assert_close(got, want)


# ----------------------------------------------------------------------- LARC
@pytest.mark.parametrize("clip", [True, False])
def test_larc_over_sgd_matches_reference(clip):
    params = as_params(start_weights())
    # tensor 3 in a group LARC leaves alone: SGD applies its own decay, unscaled
    sgd = torch.optim.SGD([{"params": params[:3]},
                           {"params": params[3:], "lars_adaptation": False,
                            "weight_decay": 0.005}],
                          lr=1.0, momentum=0.9, weight_decay=0.01)
    opt = optim.LARC(sgd, trust_coefficient=0.02, clip=clip)
    got = run_torch(opt, params, 5)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.005]  # restored
    hits = {True: 0, False: 0}
    want = larc_sgd_reference(start_weights(), 5, 0.9, [0.01, 0.01, 0.01, 0.005], 0.02, 1e-8,
                              clip, [True, True, True, False], hits)
    assert_close(got, want)
    assert hits[True] > 0 and hits[False] > 0  # both sides of min(local_lr / lr, 1) ran


def test_larc_with_torch_scheduler_and_inner_state():
    params = as_params(start_weights())
    opt = optim.LARC(torch.optim.SGD(params, lr=1.0, momentum=0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for t in range(4):
        for p, g in zip(params, grads(t, SHAPES)):
            p.grad = torch.tensor(g)
        opt.step()
        sched.step()
    assert opt.optimizer.param_groups[0]["lr"] == 0.25  # the scheduler drove the inner lr
    assert opt.state is opt.optimizer.state and len(opt.state) == len(params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


# ------------------------------------------------------- checkpoint round trip
def build(kind, decay, with_scheduler=True):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
    groups = optim.exclude_bias_and_norm(model, weight_decay=1e-3)
    if kind == "lars":
        opt = optim.LARS(groups, lr=optim.scale_lr(0.1, 1024), trust_coefficient=0.02)
    else:
        opt = optim.LARC(torch.optim.SGD(groups, lr=0.8, momentum=0.9, nesterov=True))
    return model, opt, make_scheduler(opt, decay) if with_scheduler else None


def make_scheduler(opt, decay):
    kw = dict(milestones=(2,)) if decay == "step" else {}
    return optim.warmup_schedule(opt, steps_per_epoch=2, epochs=4, warmup_epochs=1,
                                 warmup_start=0.05, decay=decay, **kw)


def train(model, opt, sched, steps, first):
    for t in range(first, first + steps):
        g = torch.Generator().manual_seed(t)
        x = torch.randn(16, 6, generator=g) + 0.1 * t
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()


@pytest.mark.parametrize("kind,decay", [("lars", "poly"), ("larc", "step"),
                                        ("lars", "cosine")])
@pytest.mark.parametrize("order", ["make-sched,load-opt,load-sched",
                                   "make-sched,load-sched,load-opt",
                                   "load-opt,make-sched,load-sched"])
def test_resume_equals_continuous_run(kind, decay, order):
    model, opt, sched = build(kind, decay)
    train(model, opt, sched, 7, 0)
    m1, o1, s1 = build(kind, decay)
    train(m1, o1, s1, 3, 0)
    buf = io.BytesIO()  # a real checkpoint: serialised and read back
    torch.save({"model": m1.state_dict(), "opt": o1.state_dict(), "sched": s1.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    # torch advises making the scheduler before loading the optimizer; any order works
    m2, o2, s2 = build(kind, decay, with_scheduler=order.startswith("make"))
    m2.load_state_dict(ck["model"])
    for action in order.split(","):
        if action == "make-sched" and s2 is None:
            s2 = make_scheduler(o2, decay)
        elif action == "load-opt":
            o2.load_state_dict(ck["opt"])
        elif action == "load-sched":
            s2.load_state_dict(ck["sched"])
    train(m2, o2, s2, 4, 3)
    for a, b in zip(model.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert opt.param_groups[0]["lr"] == o2.param_groups[0]["lr"]
    assert sched.last_epoch == s2.last_epoch == 7


# --------------------------------------------------------------- scale_lr
def test_scale_lr_rules():
    assert optim.scale_lr(0.1, 8192) == pytest.approx(0.1 * 32)
    assert optim.scale_lr(0.1, 8192, rule="sqrt") == pytest.approx(0.1 * 32 ** 0.5)
    assert optim.scale_lr(0.1, 8192, rule="none") == 0.1
    assert optim.scale_lr(0.2, 128, base_batch=512) == pytest.approx(0.05)
    assert optim.scale_lr(0.1, np.int64(512)) == pytest.approx(0.2)


@pytest.mark.parametrize("args,words", [
    ((0.0, 256), "base_lr"), ((-0.1, 256), "base_lr"), ((float("nan"), 256), "base_lr"),
    ((0.1, 0), "global_batch"), ((0.1, 256.5), "global_batch"), ((0.1, True), "global_batch"),
    ((0.1, 256, 0), "base_batch"), ((0.1, 256, 256, "cubic"), "linear, sqrt, none"),
])
def test_scale_lr_bad_input(args, words):
    with pytest.raises(ValueError, match=words):
        optim.scale_lr(*args)


# --------------------------------------------------------------- schedules
def closed_form(decay, s, target=1.6, start=0.1, W=20, T=200, milestones=(100, 150)):
    """The schedules' formulas, written out for one group (steps_per_epoch 10)."""
    if s < W:
        return start + (target - start) * (s + 1) / W
    p = min(1.0, (s - W) / (T - W))
    return {"constant": target,
            "step": target * 0.1 ** sum(s >= m for m in milestones),
            "poly": target * (1 - p) ** 2,
            "cosine": target * 0.5 * (1 + math.cos(math.pi * p))}[decay]


@pytest.mark.parametrize("decay", ["constant", "step", "poly", "cosine"])
def test_schedule_values(decay):
    kw = dict(milestones=(10, 15)) if decay == "step" else {}
    spec = dict(steps_per_epoch=10, epochs=20, warmup_epochs=2, warmup_start=0.1, decay=decay,
                **kw)
    for s in (0, 9, 19, 20, 99, 100, 110, 150, 199, 200, 230):
        want = closed_form(decay, s)
        assert optim.lr_at(s, 1.6, **spec) == pytest.approx(want, rel=1e-12, abs=1e-15), s
    assert optim.lr_at(19, 1.6, **spec) == optim.lr_at(20, 1.6, **spec) == 1.6  # seamless
    # the torch scheduler gives the same lr at every step, stepped once per step
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=1.6)
    sched = optim.warmup_schedule(opt, **spec)
    for s in range(205):
        assert opt.param_groups[0]["lr"] == pytest.approx(closed_form(decay, s), abs=1e-15), s
        opt.step()
        sched.step()


def test_schedule_landmarks():
    lr = optim.lr_at
    assert lr(0, 1.0, 10, 5) == 1.0                                   # no warmup: target
    assert lr(0, 1.0, 10, 5, warmup_epochs=1) == pytest.approx(0.1)   # from 0: 1/W
    assert lr(4, 1.0, 10, 5, warmup_epochs=0.5) == pytest.approx(1.0)  # 5 warmup steps
    assert lr(30, 2.0, 10, 5, warmup_epochs=1, decay="cosine") == pytest.approx(1.0)  # midway
    assert lr(30, 2.0, 10, 5, warmup_epochs=1, decay="poly", power=1.0) == pytest.approx(1.0)
    assert lr(49, 1.0, 10, 5, decay="poly") == pytest.approx(0.02 ** 2)  # last step still moves


def test_schedule_groups_with_different_lrs():
    a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [a], "lr": 2.0}, {"params": [b], "lr": 0.5}], lr=1.0)
    optim.warmup_schedule(opt, 4, 3, warmup_epochs=1, warmup_start=0.2)
    # each group starts at the same fraction 0.2 / 2.0 of its own lr
    f = 0.1 + 0.9 * 1 / 4
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([2.0 * f, 0.5 * f])


@pytest.mark.parametrize("kw,words", [
    (dict(decay="linear"), "constant, step, poly, cosine"),
    (dict(decay="step"), "needs milestones"),
    (dict(decay="step", milestones=(6, 4)), "increasing"),
    (dict(decay="step", milestones=(12,)), "milestone"),
    (dict(decay="step", milestones=(1,), warmup_epochs=2), "milestone"),
    (dict(decay="poly", milestones=(4,)), "only to decay='step'"),
    (dict(warmup_epochs=11), "warmup_epochs"),
    (dict(warmup_epochs=1, warmup_start=2.0), "warmup_start"),
    (dict(warmup_start=0.1), "warmup_epochs is 0"),
    (dict(steps_per_epoch=0), "steps_per_epoch"),
    (dict(epochs=0), "epochs"),
    (dict(decay="step", milestones=(4,), gamma=0.0), "gamma"),
    (dict(decay="poly", power=-1.0), "power"),
])
def test_schedule_bad_input(kw, words):
    spec = dict(steps_per_epoch=10, epochs=10)
    spec.update(kw)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match=words):
        optim.warmup_schedule(opt, **spec)
    with pytest.raises(ValueError, match=words):
        optim.lr_at(0, 1.0, **spec)


# -------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,words", [
    (dict(lr=-0.1), "lr"), (dict(momentum=-0.5), "momentum"),
    (dict(weight_decay="0.1"), "weight_decay"), (dict(trust_coefficient=0.0), "trust_coeff"),
    (dict(eps=float("nan")), "eps"), (dict(momentum=0.0, nesterov=True), "nesterov"),
])
def test_lars_bad_input(kw, words):
    spec = dict(lr=0.1)
    spec.update(kw)
    with pytest.raises(ValueError, match=words):
        optim.LARS([torch.zeros(2, requires_grad=True)], **spec)


def test_larc_and_groups_bad_input():
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        optim.LARC([p])
    with pytest.raises(ValueError, match="trust_coefficient"):
        optim.LARC(torch.optim.SGD([p], lr=0.1), trust_coefficient=-1.0)
    with pytest.raises(TypeError, match="nn.Module"):
        optim.exclude_bias_and_norm([p])
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        optim.exclude_bias_and_norm(frozen)


# ------------------------------------------------------------- multi-rank
@pytest.mark.mpi
def test_distributed_optimizer_around_lars_and_larc():
    r = run_python(2, os.path.join(SCRIPTS, "optim_distributed_check.py"), timeout=90)
    assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, r.stdout
