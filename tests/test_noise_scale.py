"""test_noise_scale.py - the gradient noise scale estimator (hpcdl/optim/noise_scale.py):
hand-worked values, unbiasedness over random batch draws on a frozen linear model
whose per-sample gradients are known exactly, the smoothing, and the offline
estimate at fixed weights. The multi-rank online estimate: test_noise_scale_mpi.py."""
import math
import os
import re

import pytest
import torch
from mpi_harness import run_python

from hpcdl.optim.noise_scale import (NoiseScale, Smoothed, estimates, offline_noise_scale,
                                     squared_norm)


# ---------------------------------------------------------------- a frozen linear model
def linear_problem(n=40, d=6, seed=0):
    """Least squares 0.5 (w.x - y)^2 at fixed w: per-sample gradient (w.x_i - y_i) x_i,
    so the true G (mean over the n samples) and tr(Sigma) (mean |g_i - G|^2) are exact."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) + torch.linspace(0, 1, d,
                                                                            dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64) + 2.0
    w = torch.randn(d, generator=g, dtype=torch.float64) * 0.3
    per_sample = (x @ w - y)[:, None] * x
    G = per_sample.mean(0)
    true_sqr = float(G.dot(G))
    true_var = float(((per_sample - G) ** 2).sum(1).mean())
    return x, y, w, per_sample, true_sqr, true_var


def test_per_sample_gradients_are_the_models():
    """The closed form above is what autograd gives for the model's loss."""
    x, y, w, per_sample, _, _ = linear_problem()
    model = torch.nn.Linear(x.shape[1], 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w[None])
    for i in (0, 7, 39):
        loss = 0.5 * (model(x[i:i + 1])[:, 0] - y[i:i + 1]).pow(2).mean()
        (gw,) = torch.autograd.grad(loss, [model.weight])
        assert torch.allclose(gw[0], per_sample[i], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- hand-worked values
def test_estimates_hand_worked():
    # |G|^2 = (8*3 - 2*5)/(8-2) = 14/6; tr(Sigma) = (5-3)/(1/2-1/8) = 16/3
    grad_sqr, grad_var = estimates(5.0, 3.0, 2, 8)
    assert grad_sqr == pytest.approx(14 / 6, rel=1e-15)
    assert grad_var == pytest.approx(16 / 3, rel=1e-15)


def test_estimates_need_two_batch_sizes():
    for bs, bb in ((4, 4), (8, 4), (0, 4)):
        with pytest.raises(ValueError, match="B_small < B_big"):
            estimates(1.0, 1.0, bs, bb)


def test_smoothed_hand_worked():
    """beta 0.5, 4 ranks, b_small 2. Step 1: small 5, big 3 -> |G|^2 = (4*3-5)/3 = 7/3,
    tr(Sigma)/B_small = 4 (5-3)/3 = 8/3. Step 2: small 4, big 1 -> 0 and 4. Bias-corrected
    weights 1/3 and 2/3: |G|^2 = 7/9, tr(Sigma) = 2 (8/9 + 8/3) = 64/9, B_simple = 64/7."""
    s = Smoothed(beta=0.5)
    assert s.result(2) is None
    assert s.add(5.0, 3.0, 4)
    r = s.result(2)
    assert (r.grad_sqr, r.grad_var, r.steps) == (pytest.approx(7 / 3), pytest.approx(16 / 3), 1)
    assert r.b_simple == pytest.approx(16 / 7)
    assert s.add(4.0, 1.0, 4)
    r = s.result(2)
    assert r == NoiseScale(pytest.approx(64 / 7), pytest.approx(7 / 9), pytest.approx(64 / 9), 2)
    # an overflowed step (fp16) is not counted and changes nothing
    assert not s.add(math.inf, 1.0, 4) and not s.add(1.0, math.nan, 4)
    assert s.result(2) == r
    # the state round-trips
    t = Smoothed()
    t.load_state_dict(s.state_dict())
    assert t.result(2) == r and t.beta == 0.5


def test_smoothed_bad_beta():
    for beta in (1.0, -0.1, 2):
        with pytest.raises(ValueError, match=r"beta must be in \[0, 1\)"):
            Smoothed(beta)


def test_smoothed_nonpositive_norm_gives_inf():
    s = Smoothed(beta=0.0)
    s.add(1.0, 0.0, 2)  # |G|^2 = (2*0 - 1)/1 = -1
    r = s.result(1)
    assert r.grad_sqr == -1.0 and r.b_simple == math.inf


# ---------------------------------------------------------------- unbiased over batch draws
@pytest.mark.parametrize("ranks,b", [(2, 1), (4, 3), (3, 8)])
def test_unbiased_over_random_batches(ranks, b):
    """Draw many data-parallel steps: each of `ranks` ranks averages b samples
    drawn with replacement; the mean of the one-step estimates over the draws
    is the true |G|^2 and tr(Sigma) within 4 standard errors (seeded)."""
    _, _, _, per_sample, true_sqr, true_var = linear_problem()
    trials = 20000
    gen = torch.Generator().manual_seed(ranks * 100 + b)
    idx = torch.randint(0, per_sample.shape[0], (trials, ranks, b), generator=gen)
    small = per_sample[idx].mean(2)            # (trials, ranks, d): each rank's gradient
    big = small.mean(1)                        # the all-reduced average
    small_sqr = (small ** 2).sum(2).mean(1)    # mean over ranks of |G_small|^2
    big_sqr = (big ** 2).sum(1)
    grad_sqr, grad_var = estimates(small_sqr, big_sqr, b, b * ranks)
    for est, truth in ((grad_sqr, true_sqr), (grad_var, true_var)):
        err = est.std().item() / math.sqrt(trials)
        assert abs(est.mean().item() - truth) < 4 * err, (est.mean().item(), truth, err)
    # the estimator is not trivially right: the raw small-batch norm is biased by tr/B
    assert abs(small_sqr.mean().item() - true_sqr - true_var / b) < 4 * small_sqr.std() \
        .item() / math.sqrt(trials)


def test_smoothed_converges_to_truth():
    """Many steps at fixed weights with beta 0.999: B_simple near the truth."""
    _, _, _, per_sample, true_sqr, true_var = linear_problem()
    gen = torch.Generator().manual_seed(5)
    s = Smoothed(beta=0.999)
    for _ in range(8000):
        idx = torch.randint(0, per_sample.shape[0], (4, 2), generator=gen)
        small = per_sample[idx].mean(1)
        s.add(float((small ** 2).sum(1).mean()), float((small.mean(0) ** 2).sum()), 4)
    r = s.result(2)
    assert r.steps == 8000
    assert r.b_simple == pytest.approx(true_var / true_sqr, rel=0.15)


# ---------------------------------------------------------------- squared norms
def test_squared_norm_accurate():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300_001, generator=g) * 3 + 0.5
    ref = float((x.double() ** 2).sum())
    assert squared_norm(x) == pytest.approx(ref, rel=1e-6)
    assert squared_norm(x[:300_000].view(3, -1)[:, :5]) == pytest.approx(
        float((x[:300_000].view(3, -1)[:, :5].double() ** 2).sum()), rel=1e-6)
    assert squared_norm(x[:1000].half()) == pytest.approx(
        float((x[:1000].half().double() ** 2).sum()), rel=1e-6)
    assert squared_norm(torch.zeros(0)) == 0.0


# ---------------------------------------------------------------- offline estimate
def test_offline_matches_sample_variance_form():
    """Offline = the same estimator with B_big = K b; hand-check against the sample
    variance of the K batch gradients: tr(Sigma) = b/(K-1) sum |G_i - mean|^2."""
    x, y, w, per_sample, _, _ = linear_problem()
    model = torch.nn.Linear(x.shape[1], 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w[None])
    loss = lambda out, t: 0.5 * (out[:, 0] - t).pow(2).mean()  # noqa: E731
    b, K = 5, 8
    batches = [(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]) for i in range(K)]
    r = offline_noise_scale(model, loss, batches)
    gi = torch.stack([per_sample[i * b:(i + 1) * b].mean(0) for i in range(K)])
    gm = gi.mean(0)
    var = b / (K - 1) * float(((gi - gm) ** 2).sum())
    sqr = float(gm.dot(gm)) - var / (K * b)
    assert r.steps == K
    assert r.grad_var == pytest.approx(var, rel=1e-10)
    assert r.grad_sqr == pytest.approx(sqr, rel=1e-10)
    assert r.b_simple == pytest.approx(var / sqr, rel=1e-10)


def test_offline_near_truth_and_leaves_model_alone():
    """Many random batches at fixed weights: near the true B_simple. The weights,
    .grad and batch-norm buffers are as before."""
    x, y, w, _, true_sqr, true_var = linear_problem()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(x.shape[1], affine=False),
                                torch.nn.Linear(x.shape[1], 1, bias=False)).double()
    model[0].eval()  # frozen statistics (mean 0, var 1): the plain linear model
    with torch.no_grad():
        model[1].weight.copy_(w[None])
    loss = lambda out, t: 0.5 * (out[:, 0] - t).pow(2).mean()  # noqa: E731
    gen = torch.Generator().manual_seed(3)
    batches = [(x[i], y[i]) for i in torch.randint(0, len(y), (3000, 4), generator=gen)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = offline_noise_scale(model, loss, batches)
    assert r.b_simple == pytest.approx(true_var / true_sqr, rel=0.1)
    assert r.grad_var == pytest.approx(true_var, rel=0.1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model[1].weight.grad is None
    model[0].train()  # running statistics move in forward; they are put back
    offline_noise_scale(model, loss, batches[:3])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_offline_bad_input():
    model = torch.nn.Linear(3, 1)
    loss = lambda out, t: out.pow(2).mean()  # noqa: E731
    with pytest.raises(ValueError, match="at least 2 batches"):
        offline_noise_scale(model, loss, [(torch.ones(2, 3), torch.ones(2))])
    with pytest.raises(ValueError, match="batches of one size"):
        offline_noise_scale(model, loss, [(torch.ones(2, 3), torch.ones(2)),
                                          (torch.ones(3, 3), torch.ones(3))])


# ---------------------------------------------------------------- online, on 2 and 4 ranks
SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "noise_scale_check.py")
CASES = ["stage0", "stage1", "stage2", "passes", "scaled", "pset", "frozen", "bad"]
CASE_LINES = {2: 12, 4: 13}  # 'CASE ... ok' lines per rank for all CASES (pset: 3+ ranks)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_online_equals_one_process(n):
    """DistributedOptimizer(noise_scale=True) at ZeRO 0, 1, 2, with 2 backward passes,
    with a loss scale and a skipped step, on a process set (4 ranks): the one-process
    estimate from the same per-rank gradients, the same on every rank, None before the
    first step; frozen weights: within 25% of the offline estimate."""
    r = run_python(n, SCRIPT, timeout=240, args=CASES)
    assert r.stdout.count(" ok") == CASE_LINES[n] * n, r.stdout


@pytest.mark.mpi
def test_train_records_b_simple(tmp_path):
    """hpcdl train on 2 ranks (ZeRO 1, fp16 loss scaling): B_simple in every epoch's
    record and line, finite and positive; curves.png written."""
    import json
    import sys
    from mpi_harness import run_mpi
    out = tmp_path / "run"
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "train", "--epochs", "2", "--global-batch",
                    "64", "--zero", "1", "--precision", "fp16", "--out", str(out)],
                timeout=180, check=True)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [rec["epoch"] for rec in recs] == [1, 2]
    assert all(0 < rec["b_simple"] < 1e6 for rec in recs), recs
    assert len(re.findall(r"^epoch .*  B_simple [\d.e+]+$", r.stdout, re.M)) == 2, r.stdout
    assert (out / "curves.png").stat().st_size > 0
