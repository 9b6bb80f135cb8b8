"""adascale_check.py - run under mpirun (2+ ranks): DistributedOptimizer(adascale=...)
against one-process math on rank- and step-dependent data.

Cases (each prints 'CASE <name> ok' per rank; the first failure exits non-zero):
  formula   plain SGD, adascale=S: each step's gain equals the formula on the
            one-process noise estimate from every rank's gradient (all-gathered),
            the update is lr x gain x the average gradient, the progress is the
            sum of the gains, the same on every rank bit for bit
  passes    backward_passes_per_step=2 (loss / 2, B samples a pass) against one
            pass of 2B samples with the same scale: the same gains, progress and
            parameters (momentum SGD); adascale=True's scale is ranks x passes
  zero      the one-pass run at ZeRO stages 1 and 2: the same gains and parameters
  resume    4 steps against 2 steps, state_dict()s, a fresh optimizer and scheduler
            loaded, 2 more steps: bitwise equal (the progress, the smoothed estimates,
            a ScaleInvariantScheduler over a warmup schedule)
  bad       bad adascale values and incompatible options: one-line ValueErrors
"""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl.optim import warmup_schedule
from hpcdl.optim.adascale import ScaleInvariantScheduler, gain_from_noise
from hpcdl.optim.noise_scale import Smoothed

TOL = 1e-5
B = 6          # samples per rank per backward pass
STEPS = 4
BETA = 0.5     # a short memory, so every step shows in the gain
LR = 0.05

hvd.init()
R, N = hvd.rank(), hvd.size()


def model_and_data(seed):
    """The same model on every rank; data per rank and step (2 passes of B)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 5))
    g = torch.Generator().manual_seed(seed * 1000 + R)
    xs = torch.randn(STEPS, 2, B, 12, generator=g) * (1 + 0.25 * R)
    rule = torch.linspace(-1, 1, 60).reshape(12, 5)
    ys = (xs @ rule).argmax(-1)
    flip = torch.rand(ys.shape, generator=g) < 0.3
    ys[flip] = torch.randint(0, 5, ys.shape, generator=g)[flip]
    return model, xs, ys


def same_everywhere(value, what):
    every = hvd.allgather_object(value)
    assert all(v == every[0] for v in every), "%s differs over ranks: %s" % (what, every)


def close(a, b, what, tol=TOL):
    assert abs(a - b) <= tol * max(1.0, abs(b)), "%s: got %r, want %r" % (what, a, b)


def params_close(m1, m2, what, tol=TOL):
    for (n, p), q in zip(m1.named_parameters(), m2.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), "%s: %s differs by %g" % (
            what, n, float((p - q).abs().max()))


def train(model, xs, ys, passes, momentum=0.9, **opt_args):
    """STEPS steps of SGD under DistributedOptimizer(adascale=...); each step
    `passes` backward passes over the step's 2 B samples. Returns (opt, gains)."""
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **opt_args)
    gains = []
    for s in range(STEPS):
        opt.zero_grad()
        x, y = xs[s].reshape(passes, -1, 12), ys[s].reshape(passes, -1)
        for k in range(passes):
            (F.cross_entropy(model(x[k]), y[k]) / passes).backward()
        opt.step()
        gains.append(opt.gain())
        assert opt.param_groups[0]["lr"] == LR, "the schedule's lr was not put back"
    same_everywhere((gains, opt.scale_invariant_steps), "gains and progress")
    return opt, gains


# ---------------------------------------------------------------- cases
def case_formula():
    scale = 8.0  # the base batch is a quarter of one rank's 2 B samples
    model, xs, ys = model_and_data(1)
    ref_model = copy.deepcopy(model)
    params = list(ref_model.parameters())
    ref, want_gains = Smoothed(BETA), []
    for s in range(STEPS):  # the one-process reference: every rank's gradient
        gs = torch.autograd.grad(F.cross_entropy(ref_model(xs[s].reshape(-1, 12)),
                                                 ys[s].reshape(-1)), params)
        local = torch.cat([g.reshape(-1) for g in gs]).double()
        every = torch.stack(hvd.allgather_object(local))
        avg = every.mean(0)
        ref.add(float((every ** 2).sum(1).mean()), float(avg.dot(avg)), N)
        ns = ref.result(1)
        r = gain_from_noise(ns.grad_var, ns.grad_sqr, scale, batch=N)
        want_gains.append(r)
        with torch.no_grad():
            at = 0
            for p in params:
                p -= LR * r * avg[at:at + p.numel()].reshape(p.shape).float()
                at += p.numel()
    opt, gains = train(model, xs, ys, 1, momentum=0.0, adascale=scale, noise_scale=BETA)
    for s, (got, want) in enumerate(zip(gains, want_gains)):
        close(got, want, "step %d's gain" % s)
        assert 1.0 <= got <= scale, got
    assert any(g > 1.01 for g in gains), "every gain ~1: the data shows no noise %s" % gains
    close(opt.scale_invariant_steps, sum(want_gains), "progress")
    assert opt.adascale.progress.iterations == STEPS
    params_close(model, ref_model, "parameters after lr x gain steps")


def case_passes():
    m_acc, xs, ys = model_and_data(2)
    m_one = copy.deepcopy(m_acc)
    o_acc, g_acc = train(m_acc, xs, ys, 2, adascale=True, noise_scale=BETA)
    assert o_acc.adascale.scale == 2.0 * N, o_acc.adascale.scale
    o_one, g_one = train(m_one, xs, ys, 1, adascale=2.0 * N, noise_scale=BETA)
    for s, (a, b) in enumerate(zip(g_acc, g_one)):
        close(a, b, "step %d's gain with 2 passes" % s)
    assert any(g > 1.01 for g in g_one), g_one
    close(o_acc.scale_invariant_steps, o_one.scale_invariant_steps, "progress with 2 passes")
    params_close(m_acc, m_one, "2 passes against one pass of 2B")
    return m_one, g_one


def case_zero(m_ref, g_ref):
    for stage in (1, 2):
        model, xs, ys = model_and_data(2)
        _, gains = train(model, xs, ys, 1, adascale=2.0 * N, noise_scale=BETA,
                         zero_stage=stage)
        for s, (a, b) in enumerate(zip(gains, g_ref)):
            close(a, b, "ZeRO %d step %d's gain" % (stage, s))
        params_close(model, m_ref, "ZeRO %d" % stage)


def resumable(model):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                   named_parameters=model.named_parameters(), adascale=4.0,
                                   noise_scale=BETA)
    sched = ScaleInvariantScheduler(warmup_schedule(opt, steps_per_epoch=10, epochs=2,
                                                    warmup_epochs=1, decay="cosine"),
                                    lambda: opt.scale_invariant_steps)
    return opt, sched


def steps(model, opt, sched, xs, ys, at, count):
    for s in range(at, at + count):
        opt.zero_grad()
        F.cross_entropy(model(xs[s].reshape(-1, 12)), ys[s].reshape(-1)).backward()
        opt.step()
        sched.step()


def case_resume():
    m_full, xs, ys = model_and_data(3)
    m_half = copy.deepcopy(m_full)
    o_full, s_full = resumable(m_full)
    steps(m_full, o_full, s_full, xs, ys, 0, STEPS)
    o_half, s_half = resumable(m_half)
    steps(m_half, o_half, s_half, xs, ys, 0, STEPS // 2)
    saved = copy.deepcopy((m_half.state_dict(), o_half.state_dict(), s_half.state_dict(),
                           o_half.adascale.state_dict()))
    m_new, _, _ = model_and_data(99)  # other weights, then the saved ones
    m_new.load_state_dict(saved[0])
    o_new, s_new = resumable(m_new)
    o_new.load_state_dict(saved[1])
    s_new.load_state_dict(saved[2])
    o_new.adascale.load_state_dict(saved[3])
    steps(m_new, o_new, s_new, xs, ys, STEPS // 2, STEPS - STEPS // 2)
    for p, q in zip(m_new.parameters(), m_full.parameters()):
        assert torch.equal(p, q), "resumed parameters differ from the uninterrupted run"
    assert o_new.scale_invariant_steps == o_full.scale_invariant_steps
    assert s_new.last_epoch == s_full.last_epoch > STEPS, (s_new.last_epoch, s_full.last_epoch)
    assert o_new.param_groups[0]["lr"] == o_full.param_groups[0]["lr"]


def case_bad():
    model, _, _ = model_and_data(4)

    def refused(message, **kwargs):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                     named_parameters=model.named_parameters(), **kwargs)
        except ValueError as e:
            assert message in str(e) and "\n" not in str(e), str(e)
            return
        raise AssertionError("%s was accepted" % kwargs)

    refused("a number >= 1; got 0.5", adascale=0.5)
    refused("a number >= 1; got 'yes'", adascale="yes")
    refused("adascale: noise_scale needs op=Average", adascale=True, op=hvd.Sum)
    refused("adascale: noise_scale needs the whole averaged gradient", adascale=True,
            compression=hvd.Compression.topk(0.5))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    try:
        opt.gain()
    except RuntimeError as e:
        assert "adascale=True" in str(e), str(e)
    else:
        raise AssertionError("gain() without adascale was accepted")
    assert opt.scale_invariant_steps == 0.0 and opt.adascale is None


CASES = {"formula": case_formula, "passes": case_passes, "resume": case_resume,
         "bad": case_bad}

if __name__ == "__main__":
    for name in sys.argv[1:] or ["formula", "passes", "zero", "resume", "bad"]:
        if name == "zero":
            case_zero(*case_passes())
        else:
            CASES[name]()
        print("CASE %s ok (rank %d)" % (name, R), flush=True)
