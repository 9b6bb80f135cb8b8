"""test_elastic_scaling.py - the batch and lr re-derived for a new rank count
(hpcdl/optim/rescale.py, pure) and hvd.elastic.BatchScaling applying it to an
optimizer, without MPI (the world size faked): splits and rounding, the lr
factors, the goodput rule's choice for another rank count against a table
worked by hand, keep="global"/"local", the lr / initial_lr / scheduler
base_lrs ratio, AdaScale's scale and the noise variance's units, the goodput
rule's comm term stale after a restart on another layout (the ring's
estimate, then re-measured), bad input.
The real restarts are in test_elastic.py (test_batch_scaling_follows_the_rule...)."""
import math

import pytest
import torch

from hpcdl.optim import goodput as gp, rescale
from hpcdl.optim.adascale import Progress
from hpcdl.optim.noise_scale import Smoothed
from hpcdl.torch.elastic import scaling as scaling_mod

STEP = gp.StepTime(a=0.01, c=0.002, comm=0.03)


# ------------------------------------------------------------------ pure
@pytest.mark.parametrize("g,n,k,want", [(20, 2, 1, (10, 20)), (20, 3, 1, (7, 21)),
                                        (24, 3, 2, (4, 24)), (25, 3, 2, (5, 30)),
                                        (1, 4, 1, (1, 4))])
def test_split_rounds_the_local_batch_up(g, n, k, want):
    assert rescale.split(g, n, k) == want


def test_lr_factors():
    assert rescale.lr_factor("linear", 24, 8) == 3.0
    assert rescale.lr_factor("sqrt", 32, 8) == 2.0
    assert rescale.lr_factor("adascale", 24, 8) == 1.0
    assert rescale.lr_factor("goodput", 24, 8) == 1.0


def test_candidates_for_any_rank_count():
    assert rescale.candidates(3, 4, 32) == [(4, (6, 2, 1)), (8, (9, 3, 1)), (16, (18, 6, 1)),
                                             (32, (33, 11, 1))]
    # 5 ranks x 2 passes: 4 and 8 both round to 10, the repeat is left out
    assert rescale.candidates(5, 4, 16, accum=2) == [(4, (10, 1, 2)), (16, (20, 2, 2))]


def goodput_by_hand(b, n, target):
    """The goodput rule's formula written out for base 4, ceiling 32, STEP."""
    local = math.ceil(target / n)
    m = n * local
    t = 0.01 + 0.002 * local + 0.03
    return m / t * (b + 4) / (b + m)


@pytest.mark.parametrize("b_noise,ranks", [(0.0, 2), (3.26, 2), (3.26, 3), (7.09, 2),
                                           (40.0, 3), (40.0, 4)])
def test_goodput_pick_for_a_new_rank_count_by_hand(b_noise, ranks):
    targets = [4, 8, 16, 32]
    scores = [goodput_by_hand(b_noise, ranks, t) for t in targets]
    want = targets[scores.index(max(scores))]
    got, rows = rescale.pick(b_noise, 4, STEP, ranks, 32)
    assert got == want
    assert [r["goodput"] for r in rows] == pytest.approx(scores)


def test_goodput_pick_hand_worked_values():
    # B_noise 3: on 2 ranks target 8 is M 8, L 4, t = 0.01 + 0.008 + 0.03 = 0.048 s,
    # goodput 8 / 0.048 x 7 / 11 = 106.06; target 16 is 16 / 0.056 x 7 / 19 = 105.26: 8.
    # On 3 ranks target 16 is M 18, L 6, t 0.052: 18 / 0.052 x 7 / 21 = 115.38, target 8
    # is M 9, L 3, t 0.046: 9 / 0.046 x 7 / 12 = 114.13: 16, more ranks, a bigger batch
    got2, rows2 = rescale.pick(3.0, 4, STEP, 2, 32)
    got3, rows3 = rescale.pick(3.0, 4, STEP, 3, 32)
    assert (got2, got3) == (8, 16)
    assert rows2[1]["goodput"] == pytest.approx(106.06, abs=0.01)
    assert rows2[2]["goodput"] == pytest.approx(105.26, abs=0.01)
    assert rows3[2]["goodput"] == pytest.approx(115.38, abs=0.01)
    assert rows3[1]["goodput"] == pytest.approx(114.13, abs=0.01)
    assert [r["global_batch"] for r in rows3] == [6, 9, 18, 33]


def test_rederive_keeps_the_global_or_the_local_batch():
    ada = rescale.rederive("adascale", 3, 8, target=20, local=10)
    assert (ada["local_batch"], ada["global_batch"], ada["scale"], ada["lr_factor"]) == \
        (7, 21, 21 / 8, 1.0)
    lin = rescale.rederive("linear", 3, 8, target=16, local=8, keep="local")
    assert (lin["target"], lin["local_batch"], lin["global_batch"], lin["lr_factor"]) == \
        (24, 8, 24, 3.0)
    assert rescale.rederive("linear", 3, 8, target=16, local=8)["global_batch"] == 18
    sq = rescale.rederive("sqrt", 4, 8, target=16, local=8, keep="local")
    assert sq["lr_factor"] == 2.0
    # AdaScale keeping the local batch: 4 ranks x 8 at base 32, then 3 ranks
    # would give 24 < base (S 0.75); the local batch grows to keep S >= 1
    low = rescale.rederive("adascale", 3, 32, target=32, local=8, keep="local")
    assert (low["target"], low["local_batch"], low["global_batch"], low["scale"]) == \
        (32, 11, 33, 33 / 32)
    # goodput without a step-time model yet: the target stays
    assert rescale.rederive("goodput", 3, 4, target=8, local=4)["global_batch"] == 9
    gpr = rescale.rederive("goodput", 3, 4, target=8, local=4, b_noise=3.26, step_time=STEP,
                           ceiling=32)
    assert gpr["global_batch"] == 18 and len(gpr["table"]) == 4


def test_comm_moved_by_the_ring_bytes_and_refitted_by_hand():
    assert [gp.ring_bytes(n) for n in (1, 2, 3, 4)] == [0.0, 1.0, 4 / 3, 1.5]
    # comm 30 ms measured on 2 ranks (ring bytes 1): on 3 ranks x (4/3) / 1 = 40 ms,
    # on 4 x 1.5 = 45 ms; 45 ms measured on 4, on 2: x 1 / 1.5 = 30 ms
    assert STEP.comm_moved(2, 3) == gp.StepTime(0.01, 0.002, pytest.approx(0.04))
    assert STEP.comm_moved(2, 4).comm == pytest.approx(0.045)
    assert gp.StepTime(0.01, 0.002, 0.045).comm_moved(4, 2).comm == pytest.approx(0.03)
    assert STEP.comm_moved(2, 2) is STEP
    assert STEP.comm_moved(1, 2) is None  # no all-reduce in a 1-rank step to scale
    # a step of 62 ms at L 6: compute 10 + 2 x 6 = 22 ms, comm 40 ms; with 2 passes 18 ms;
    # below the compute: 0
    assert STEP.with_comm(0.062, 6) == gp.StepTime(0.01, 0.002, pytest.approx(0.040))
    assert STEP.with_comm(0.062, 6, accum=2).comm == pytest.approx(0.018)
    assert STEP.with_comm(0.015, 6).comm == 0.0
    with pytest.raises(ValueError, match="step seconds must be a number >= 0"):
        STEP.with_comm(float("nan"), 6)


def test_the_comm_estimate_changes_the_pick_by_hand():
    # B_noise 8 on 3 ranks. comm 30 ms: target 16 (M 18, L 6, t 52 ms) 18 / 0.052 x 12 / 26
    # = 159.76 beats 32 (M 33, L 11, t 62 ms) 33 / 0.062 x 12 / 41 = 155.78. comm 40 ms
    # (the estimate from 2 ranks): 18 / 0.062 x 12 / 26 = 133.99 < 33 / 0.072 x 12 / 41
    # = 134.15: 32
    old, rows_old = rescale.pick(8.0, 4, STEP, 3, 32)
    new, rows_new = rescale.pick(8.0, 4, STEP.comm_moved(2, 3), 3, 32)
    assert (old, new) == (16, 32)
    assert [r["goodput"] for r in rows_old[2:]] == pytest.approx([159.76, 155.78], abs=0.01)
    assert [r["goodput"] for r in rows_new[2:]] == pytest.approx([133.99, 134.15], abs=0.01)


@pytest.mark.parametrize("call,words", [
    (lambda: rescale.check_rule("cubic"), "one of adascale, goodput, linear, sqrt"),
    (lambda: rescale.check_rule("linear", "both"), "keep must be 'global'"),
    (lambda: rescale.split(0, 2), "global batch must be a positive integer"),
    (lambda: rescale.split(8, 2, 0), "accumulation must be")])
def test_pure_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# ------------------------------------------------------------------ BatchScaling
class FakeMeter:
    def __init__(self):
        self.smoothed = Smoothed(0.9)

    def settle(self):
        pass

    def result(self, b_small):
        return self.smoothed.result(b_small)


class FakeAdaScale:
    def __init__(self, scale):
        self.meter, self.progress = FakeMeter(), Progress(scale)

    def state_dict(self):
        return dict(progress=self.progress.state_dict(), noise=self.meter.smoothed.state_dict())

    def load_state_dict(self, state):
        self.progress.load_state_dict(state["progress"])
        self.meter.smoothed.load_state_dict(state["noise"])


class FakeOpt:
    """param_groups, and the two things BatchScaling reads: adascale, noise_meter."""

    def __init__(self, lr, adascale=False):
        self.param_groups = [dict(lr=lr), dict(lr=2 * lr, initial_lr=2 * lr)]
        self.adascale = FakeAdaScale(1.0) if adascale else None
        self.noise_meter = self.adascale.meter if adascale else None


@pytest.fixture
def world(monkeypatch):
    """n ranks on `hosts` hosts; a sum over ranks is `sums`(this rank's values),
    by default every rank giving the same."""
    size = {"n": 2, "hosts": 1}
    size["sums"] = lambda values: [v * size["n"] for v in values]
    monkeypatch.setattr(scaling_mod.mpi_ops, "size", lambda: size["n"])
    monkeypatch.setattr(scaling_mod.mpi_ops, "rank", lambda: 1)  # no log line
    monkeypatch.setattr(scaling_mod, "_hosts", lambda: size["hosts"])
    monkeypatch.setattr(scaling_mod, "_rank_sums",
                        lambda values, name: size["sums"]([float(v) for v in values]))
    return size


def restarted(make, world, old, new):
    """A BatchScaling built at `old` ranks, its state committed, loaded by one
    built at `new` ranks (whose optimizer got the committed lr), then reset."""
    world["n"] = old
    first = make()
    commit, groups = first.state_dict(), [dict(g) for g in first.opt.param_groups]
    world["n"] = new
    second = make()
    for g, saved in zip(second.opt.param_groups, groups):
        g.update(saved)  # what TorchState's optimizer handler restores
    second.load_state_dict(commit)
    second.on_reset()
    return first, second


def test_linear_keep_local_follows_the_ranks(world):
    def make():  # a scheduler built afresh by each launch, as the docs say
        sched = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1)], lr=0.1),
                                                  lambda e: 1.0)
        return scaling_mod.BatchScaling(FakeOpt(0.1), base_batch=8, global_batch=16,
                                        rule="linear", keep="local", schedulers=[sched])
    first, second = restarted(make, world, 2, 3)
    assert first.schedulers[0].base_lrs == pytest.approx([0.2])
    assert second.schedulers[0].base_lrs == pytest.approx([0.3])
    assert [g["lr"] for g in first.opt.param_groups] == pytest.approx([0.2, 0.4])
    assert (second.local_batch, second.global_batch) == (8, 24)
    assert [g["lr"] for g in second.opt.param_groups] == pytest.approx([0.3, 0.6])
    assert second.opt.param_groups[1]["initial_lr"] == pytest.approx(0.6)
    assert second.changes[-1]["why"] == "2 ranks -> 3"
    world["n"] = 2
    second.on_reset()
    assert second.global_batch == 16 and second.opt.param_groups[0]["lr"] == pytest.approx(0.2)


def test_adascale_keeps_the_global_batch_and_the_noise_units(world):
    def make():
        return scaling_mod.BatchScaling(FakeOpt(0.05, adascale=True), base_batch=8,
                                        global_batch=20)
    world["n"] = 2
    first = make()
    first.opt.adascale.meter.smoothed.add(10.0, 4.0, 2)  # one step's squared norms
    first.opt.adascale.progress.advance(1.7)
    b_before = first.b_noise()
    commit = first.state_dict()
    world["n"] = 3
    second = make()
    second.load_state_dict(commit)
    second.on_reset()
    assert (second.local_batch, second.global_batch) == (7, 21)
    assert second.opt.adascale.progress.scale == 21 / 8
    assert second.opt.adascale.progress.steps == 1.7  # the progress carries on
    assert second.opt.param_groups[0]["lr"] == 0.05  # AdaScale: the schedule's lr
    # the smoothed variance is per rank-step: times 10 / 7, so B_simple is unchanged
    assert second.b_noise() == pytest.approx(b_before)
    assert second.opt.adascale.meter.smoothed.var == pytest.approx(
        first.opt.adascale.meter.smoothed.var * 10 / 7)


def goodput_scaling(b_noise=None):
    """The goodput rule at base 4, ceiling 32, STEP given; B_noise fixed if given."""
    s = scaling_mod.BatchScaling(FakeOpt(0.05, adascale=True), base_batch=4, rule="goodput",
                                 max_global_batch=32, step_time=STEP)
    if b_noise is not None:
        s.b_noise = lambda: b_noise
    return s


def test_goodput_repicks_for_the_new_rank_count(world):
    make = goodput_scaling
    world["n"] = 2
    s = make()
    assert s.global_batch == 4 and s.end_epoch()[0]["global_batch"] == 4  # no estimate: base
    first, second = restarted(make, world, 2, 3)
    assert second.global_batch == 6  # B_noise unknown counts as 0: the base, rounded up


def test_goodput_comm_is_stale_after_a_restart_until_remeasured(world):
    def make():
        return goodput_scaling(b_noise=8.0)
    world["n"] = 2
    first = make()
    commit = first.state_dict()
    assert commit["comm_at"] == [2, 1] and not first.comm_stale
    world["n"] = 3
    second = make()
    second.load_state_dict(commit)
    second.on_reset()
    # the commit's comm (2 ranks) is stale on 3: the pick used the ring's 40 ms (32, see
    # test_the_comm_estimate_changes_the_pick_by_hand), not 30 ms as if measured (16)
    assert second.comm_stale and second.model().comm == pytest.approx(0.04)
    assert second.step_time == STEP and (second.target, second.local_batch) == (32, 11)
    assert second.end_epoch()[3]["step_time_s"] == pytest.approx(0.072)  # no step_s: estimate
    assert second.comm_stale
    # re-measured: a mean step of 50 ms at L 11 -> comm = 50 - (10 + 22) = 18 ms; the
    # compute line stays, and at 18 ms target 16 (M 18, L 6, t 40 ms) 18 / 0.04 x 12 / 26
    # = 207.7 beats 32 (t 50 ms: 33 / 0.05 x 12 / 41 = 193.2)
    rows = second.end_epoch(0.050)
    assert not second.comm_stale and second.comm_at == [3, 1]
    assert second.step_time == gp.StepTime(0.01, 0.002, pytest.approx(0.018))
    assert second.target == 16 and rows[2]["goodput"] == pytest.approx(207.69, abs=0.01)
    second.end_epoch(0.5)  # fresh: step_s is not read (and no collective)
    assert second.step_time.comm == pytest.approx(0.018)
    # back to 2 ranks from this commit: 18 ms measured on 3, estimated x 1 / (4/3)
    commit = second.state_dict()
    world["n"] = 2
    third = make()
    third.load_state_dict(commit)
    third.on_reset()
    assert third.comm_stale and third.model().comm == pytest.approx(0.0135)
    # the same rank count on another host count: stale, the ring bytes the same
    world["hosts"] = 2
    third.end_epoch(0.05)
    third.on_reset()
    assert third.comm_stale and third.comm_at == [2, 1] and third.layout == [2, 2]
    assert third.model().comm == third.step_time.comm and third.changes[-1]["ranks"] == 2


def test_goodput_step_s_bad_or_on_some_ranks_only(world):
    s = goodput_scaling()
    s.comm_at = [3, 1]  # measured elsewhere: the next end_epoch reads step_s
    with pytest.raises(ValueError, match="positive number of seconds on every rank.*-1"):
        s.end_epoch(-1)
    world["sums"] = lambda v: [v[0], v[1], v[2]]  # the other rank gave None
    with pytest.raises(ValueError, match="given on 1 of 2 ranks"):
        s.end_epoch(0.05)
    # fit_step_time: the other rank fitted at L 2, 4, 6 (this one 2, 4, 8)
    world["sums"] = lambda v: [v[0] * 2, v[1] * 2, 14.0, v[3] * 2, v[4] * 2, 100.0] + \
        [x * 2 for x in v[6:]]
    with pytest.raises(ValueError, match="ranks gave different local batches"):
        s.fit_step_time([(2, 0.014), (4, 0.018), (8, 0.026)], 0.050)


def test_fit_step_time_by_hand(world):
    s = scaling_mod.BatchScaling(FakeOpt(0.05, adascale=True), base_batch=4, global_batch=8,
                                 rule="goodput")
    assert s.end_epoch() is None  # no model yet: nothing picked
    # passes at L = 2, 4, 8: 14, 18, 26 ms -> a = 10 ms, c = 2 ms; a step at L = 4
    # took 50 ms: comm = 50 - 18 = 32 ms
    st = s.fit_step_time([(2, 0.014), (4, 0.018), (8, 0.026)], 0.050)
    assert (st.a, st.c, st.comm) == pytest.approx((0.010, 0.002, 0.032))
    assert s.state_dict()["step_time"] == pytest.approx(dict(a=0.010, c=0.002, comm=0.032))
    assert [r["global_batch"] for r in s.end_epoch()] == [4, 8, 16, 32, 64]


def test_one_rank_with_adascale_is_refused_at_the_reset(world):
    def make():
        return scaling_mod.BatchScaling(FakeOpt(0.05, adascale=True), base_batch=8,
                                        global_batch=16)
    with pytest.raises(RuntimeError, match="restarted on 1 rank.*--min-np"):
        restarted(make, world, 2, 1)


@pytest.mark.parametrize("kw,words", [
    (dict(rule="adascale"), "needs hvd.DistributedOptimizer\\(..., adascale=True\\)"),
    (dict(rule="linear", ada=True), "scale the lr twice"),
    (dict(rule="adascale", ada=True, global_batch=4), "below base_batch 8"),
    (dict(rule="goodput", ada=True, step_time="fast"), "step_time must be"),
    (dict(rule="linear", base_batch=0), "base_batch must be a positive integer")])
def test_batch_scaling_bad_input(world, kw, words):
    ada = kw.pop("ada", False)
    kw.setdefault("base_batch", 8)
    with pytest.raises(ValueError, match=words):
        scaling_mod.BatchScaling(FakeOpt(0.1, adascale=ada), **kw)


def test_a_commit_of_another_rule_is_refused(world):
    lin = scaling_mod.BatchScaling(FakeOpt(0.1), base_batch=8, rule="linear")
    ada = scaling_mod.BatchScaling(FakeOpt(0.1, adascale=True), base_batch=8)
    with pytest.raises(RuntimeError, match="rule is 'linear', this script's 'adascale'"):
        ada.load_state_dict(lin.state_dict())
