"""test_ps.py - the parameter server (hpcdl.ps): shard layout, settings checks,
the servers' update rule against torch.optim.SGD, the SSP clock and its
replay; then, under mpirun, BSP against synchronous all-reduce SGD (1 and 2
servers), the SSP bound with a slowed worker, ASP learning, bad settings and
unequal rounds failing on every rank."""
import os

import numpy as np
import pytest
import torch

from hpcdl import ps
from hpcdl.ps import protocol
from hpcdl.ps.clock import VectorClock, replay
from hpcdl.ps.rules import ShardSGD
from hpcdl.utils import backoff
from mpi_harness import REPO, run_python

SCRIPTS = os.path.join(REPO, "tests", "mpi_scripts")


# ---------------------------------------------------------------- waiting
def test_backoff_spins_then_doubles_up_to_the_ceiling(monkeypatch):
    # ps/wait.py, comm/p2p.py and the torch backend's finisher all pause through it
    slept = []
    monkeypatch.setattr(backoff.time, "sleep", slept.append)
    b = backoff.Backoff(spins=3, first_s=1e-4, max_s=5e-4)
    for _ in range(8):
        b.pause()
    assert slept == [0, 0, 0, 1e-4, 2e-4, 4e-4, 5e-4, 5e-4]
    answers = iter([False, False, True])
    assert b.poll_until(lambda: next(answers), deadline=float("inf"))
    assert not b.poll_until(lambda: False, deadline=0.0)  # past the deadline: gives up


# ---------------------------------------------------------------- layout, settings
@pytest.mark.parametrize("num_params,servers", [(0, 1), (1, 3), (10, 3), (7, 7), (5, 8),
                                                (50_890, 2)])
def test_shards_are_contiguous_near_equal_and_cover_the_vector(num_params, servers):
    bounds = protocol.shard_bounds(num_params, servers)
    assert len(bounds) == servers and bounds[0][0] == 0 and bounds[-1][1] == num_params
    assert all(bounds[j][1] == bounds[j + 1][0] for j in range(servers - 1))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_header_round_trip_keeps_clock_and_lr_exact():
    h = protocol.set_header(protocol.header(), protocol.PUSH, 2**40 + 3, 0.1 / 3)
    assert protocol.read_header(h) == (protocol.PUSH, 2**40 + 3, 0.1 / 3)


@pytest.mark.parametrize("size,mode,staleness,ps_ranks,want", [
    (2, "bsp", None, 1, 0), (4, "bsp", 0, 3, 0), (4, "asp", None, 2, None),
    (4, "ssp", 0, 1, 0), (3, "ssp", 5, 1, 5), (3, "ssp", np.int64(2), 1, 2)])
def test_good_settings_give_the_bound(size, mode, staleness, ps_ranks, want):
    assert ps.check(size, mode, staleness, ps_ranks) == want
    assert ps.num_workers(size, ps_ranks) == size - ps_ranks


@pytest.mark.parametrize("size,mode,staleness,ps_ranks,words", [
    (4, "ssp", -1, 1, "--staleness is -1"),
    (4, "ssp", 1.5, 1, "--staleness is 1.5"),
    (4, "ssp", None, 1, "ps-ssp needs --staleness"),
    (4, "asp", 3, 1, "only applies to ps-ssp"),
    (4, "bsp", 0, 4, "--ps-ranks 4 leaves no worker"),
    (4, "bsp", 0, 9, "use --ps-ranks 3 or fewer"),
    (4, "bsp", 0, 0, "--ps-ranks is 0"),
    (1, "bsp", 0, 1, "needs at least 2 ranks"),
    (4, "ps-bsp", 0, 1, "unknown parameter-server mode 'ps-bsp'"),
])
def test_bad_settings_name_the_problem(size, mode, staleness, ps_ranks, words):
    with pytest.raises(ps.PSConfigError) as e:
        ps.check(size, mode, staleness, ps_ranks)
    assert words in str(e.value)


def test_only_plain_sgd_runs_on_the_servers():
    ps.check_optimizer("sgd")
    for name, nesterov in (("lars", False), ("adam", False), ("sgd", True)):
        with pytest.raises(ps.PSConfigError, match="SGD with momentum"):
            ps.check_optimizer(name, nesterov)


# ---------------------------------------------------------------- the update rule
def _grads(steps, workers, n, seed=0):
    """Gradients that depend on step, worker and position: (steps, workers, n)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, workers, n, generator=g).numpy()


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2),
                                                   (0.0, 1e-2)])
def test_step_is_torch_sgd_bit_for_bit(momentum, weight_decay):
    p0 = torch.randn(37, generator=torch.Generator().manual_seed(1))
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.SGD([ref], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    shard = p0.numpy().copy()
    rule = ShardSGD(shard, 1, momentum, weight_decay)
    for t, g in enumerate(_grads(6, 1, 37)[:, 0]):
        lr = 0.1 / (t + 1)
        ref.grad = torch.from_numpy(g.copy())
        opt.param_groups[0]["lr"] = lr
        opt.step()
        rule.step(g, lr)
        assert torch.equal(torch.from_numpy(shard), ref.detach()), t


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2),
                                                   (0.0, 1e-2)])
@pytest.mark.parametrize("workers", [1, 3])
def test_pushes_add_up_to_steps_on_the_mean(momentum, weight_decay, workers):
    # W pushes of a step, in a different worker order each step, reach the
    # parameters of one step on the mean gradient (float rounding apart)
    n = 41
    p0 = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    stepped, pushed = p0.copy(), p0.copy()
    by_step = ShardSGD(stepped, workers, momentum, weight_decay)
    by_push = ShardSGD(pushed, workers, momentum, weight_decay)
    grads = _grads(5, workers, n, seed=3)
    for t in range(5):
        lr = 0.05 * (1 + t % 2)
        by_step.step(grads[t].mean(axis=0), lr)
        for w in np.random.default_rng(t).permutation(workers):
            by_push.push(grads[t, w], lr)
        np.testing.assert_allclose(pushed, stepped, rtol=1e-5, atol=1e-6)
    assert not np.allclose(pushed, p0)


# ---------------------------------------------------------------- the SSP clock
def test_clock_answers_a_pull_only_within_the_bound():
    ssp = VectorClock(3, staleness=1, record=True)
    for w, c in ((0, 0), (0, 1), (1, 0)):
        ssp.push(w, c)
    # pushes: worker 0 twice, worker 1 once, worker 2 never: min_clock 0
    assert ssp.min_clock() == 0
    assert ssp.ready(1) and not ssp.ready(2)
    ssp.push(2, 0)
    assert ssp.ready(2) and not ssp.ready(3)
    ssp.answered(0, 2)
    assert replay(ssp.events, 3) == [(0, 2, 1)]
    assert VectorClock(3, staleness=None).ready(10**6)   # ASP never waits
    assert not VectorClock(2, staleness=0).ready(1)      # BSP: step 0 not in yet


def test_clock_rejects_a_lost_or_repeated_push():
    clock = VectorClock(2, staleness=0)
    clock.push(1, 0)
    with pytest.raises(RuntimeError, match="worker 1 pushed step 0 but its next step is 1"):
        clock.push(1, 0)


def test_replay_counts_pushes_itself():
    events = [("push", 0, 0), ("reply", 0, 1, 99), ("push", 1, 0), ("push", 0, 1),
              ("reply", 0, 2, 99), ("push", 1, 1), ("reply", 1, 2, 99)]
    assert replay(events, 2) == [(0, 1, 1), (0, 2, 1), (1, 2, 0)]
    with pytest.raises(ValueError, match="worker 0 pushed step 1 after 0"):
        replay([("push", 0, 1)], 1)


# ---------------------------------------------------------------- under mpirun
@pytest.mark.mpi
@pytest.mark.parametrize("n,servers", [(3, 1), (4, 2)], ids=["3ranks-1server",
                                                             "4ranks-2servers"])
def test_bsp_equals_allreduce_sgd_and_resumes_exactly(n, servers):
    r = run_python(n, os.path.join(SCRIPTS, "ps_bsp_check.py"), args=[str(servers)],
                   timeout=120)
    assert "CHECKS" in r.stdout and " FAILED 0" in r.stdout, r.stdout
    assert r.stdout.count("BSP vs all-reduce SGD on %d workers" % (n - servers)) == n - servers


@pytest.mark.mpi
def test_ssp_bound_with_a_slow_worker_asp_learns_bad_settings_fail():
    r = run_python(4, os.path.join(SCRIPTS, "ps_ssp_asp_check.py"), args=["2"], timeout=120)
    assert "CHECKS" in r.stdout and " FAILED 0" in r.stdout, r.stdout
    assert "SSP(2), worker 0 sleeping" in r.stdout and "ASP: training loss" in r.stdout
    assert r.stdout.count("same number of steps in a round") == 2, r.stdout
