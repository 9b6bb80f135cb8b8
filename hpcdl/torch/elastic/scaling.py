"""scaling.py - hvd.elastic.BatchScaling: the global batch and the learning
rate of an elastic job follow one rule when a restart changes the rank count,
with no reset callback (docs/horovod.md, Elastic training).

    opt = hvd.DistributedOptimizer(SGD(model.parameters(), lr=base_lr),
                                   named_parameters=model.named_parameters(),
                                   adascale=True)
    scaling = hvd.elastic.BatchScaling(opt, base_batch=64, global_batch=1024)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, scaling=scaling, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            loader = DataLoader(data, batch_size=scaling.local_batch, sampler=sampler)
            ...  sampler.record_batch(i, scaling.local_batch); state.commit()
            scaling.end_epoch()          # rule "goodput": re-pick the batch

TorchState keeps it with each commit (the target and current batch, the lr
factor, AdaScale's progress and smoothed noise estimates, the step-time model)
and, after a restart from a commit, calls on_reset() before the user's reset
callbacks: the pure re-derivation (hpcdl/optim/rescale.py) for the new
hvd.size(), then applied here: each group's lr (and 'initial_lr', and the
base_lrs of `schedulers`, which are not committed: build them afresh in
each launch) times the new lr factor over the old, AdaScale's
scale set to G / base, the noise meter's smoothed per-step variance (kept in
units of one rank's step) times L_old / L_new. The optimizer must be in the
same TorchState (its handler restores the committed lr first). Every rank
computes the same values from rank 0's synced state."""
import sys

from ...optim import goodput as gp, rescale
from ...optim._checks import check_count
from ...optim.adascale import check_scale
from .. import mpi_ops

CEILING_OVER_BASE = 16  # the goodput rule's default max_global_batch, over base_batch


def _step_time(value):
    if value is None or isinstance(value, gp.StepTime):
        return value
    try:
        return gp.StepTime(**value) if isinstance(value, dict) else gp.StepTime(*value)
    except TypeError:
        raise ValueError("step_time must be a goodput.StepTime, (a, c, comm) seconds or "
                         "{'a':, 'c':, 'comm':}; got %r" % (value,)) from None


class BatchScaling:
    """The batch and lr rule of one optimizer across rank counts.

    rule: "adascale" (the default; needs DistributedOptimizer(adascale=...)):
    the lr is the schedule's, AdaScale's scale is G / base_batch; "goodput":
    AdaScale too, and the target batch re-picked for the largest goodput at
    each end_epoch() and for a new rank count (needs step_time, or
    set_step_time / fit_step_time later); "linear" / "sqrt": each group's lr is the base lr (the
    optimizer's when this is built) times G / base_batch or its square root.
    keep: what stays when the rank count changes (rules other than goodput):
    "global" (adaptdl's choice, the default) or "local" (Horovod's usual reset
    callback: the global batch follows the ranks)."""

    def __init__(self, optimizer, base_batch, global_batch=None, rule="adascale",
                 keep="global", max_global_batch=None, step_time=None, schedulers=()):
        rescale.check_rule(rule, keep)
        check_count("base_batch", base_batch, "samples")
        self.opt, self.rule, self.keep, self.base_batch = optimizer, rule, keep, base_batch
        self.schedulers = list(schedulers)
        ada = self._ada
        if rule in ("adascale", "goodput") and ada is None:
            raise ValueError("BatchScaling(rule=%r) needs hvd.DistributedOptimizer(..., "
                             "adascale=True): the gain scales the lr" % rule)
        if rule in ("linear", "sqrt") and ada is not None:
            raise ValueError("BatchScaling(rule=%r) with an AdaScale optimizer would scale "
                             "the lr twice; use rule='adascale'" % rule)
        reducer = getattr(optimizer, "reducer", None)
        self.accum = reducer.passes_per_step if reducer is not None else 1
        target = base_batch if global_batch is None else global_batch
        check_count("global_batch", target, "samples")
        if rule in ("adascale", "goodput") and target < base_batch:
            raise ValueError("global_batch %d is below base_batch %d: AdaScale's scale is "
                             "at least 1" % (target, base_batch))
        self.ceiling = max_global_batch or CEILING_OVER_BASE * base_batch
        check_count("max_global_batch", self.ceiling, "samples")
        self.step_time = _step_time(step_time)
        self.ranks = mpi_ops.size()
        self.target = target
        self.local_batch, self.global_batch = rescale.split(target, self.ranks, self.accum)
        self.lr_factor = 1.0
        self.changes = []   # one dict per change: {ranks, global_batch, local_batch, why}
        self._apply(self.local_batch, rescale.lr_factor(rule, self.global_batch, base_batch))

    # ------------------------------------------------------------ reading
    @property
    def _ada(self):
        return getattr(self.opt, "adascale", None)

    @property
    def scale(self):
        return self.global_batch / self.base_batch

    def b_noise(self):
        """The running B_simple (samples) from the optimizer's noise meter, or None."""
        meter = getattr(self.opt, "noise_meter", None)
        ns = meter.result(self.local_batch * self.accum) if meter is not None else None
        return ns.b_simple if ns is not None else None

    def set_step_time(self, step_time):
        """The goodput rule's model t(L, k) = k (a + c L) + comm (a StepTime or
        (a, c, comm) seconds); see fit_step_time."""
        self.step_time = _step_time(step_time)

    def fit_step_time(self, passes, step_seconds):
        """Sets the model from measurements: passes = [(local batch, seconds of
        one forward+backward)] (a + c L is their least-squares line) and
        step_seconds = a measured step at the current batch (comm = the rest).
        Give every rank the same numbers (e.g. averaged over ranks): the rule's
        choice must be the same everywhere. Returns the StepTime."""
        self.step_time = gp.StepTime.fit(passes, step_seconds, self.local_batch, self.accum)
        return self.step_time

    # ------------------------------------------------------------ changes
    def end_epoch(self):
        """Rule goodput: re-picks the target for this rank count from the
        running B_noise (the same on every rank: no communication); returns
        the goodput table (None for other rules or without a step-time model)."""
        if self.rule != "goodput" or self.step_time is None:
            return None
        target, rows = rescale.pick(self.b_noise(), self.base_batch, self.step_time,
                                    self.ranks, self.ceiling, self.accum)
        if target != self.target:
            self._change(dict(rescale.rederive(self.rule, self.ranks, self.base_batch, target,
                                               self.local_batch, self.accum, "global"),
                              table=rows), "goodput")
        return rows

    def on_reset(self):
        """After a restart from a commit (TorchState calls it before the reset
        callbacks): the batch and lr for hvd.size() ranks, if it changed."""
        ranks = mpi_ops.size()
        if ranks == self.ranks:
            return
        if ranks < 2 and self.rule in ("adascale", "goodput"):
            raise RuntimeError("BatchScaling(rule=%r): the job restarted on 1 rank, where "
                               "AdaScale has no gain (it compares the ranks' gradients); "
                               "keep --min-np at 2 or more" % self.rule)
        new = rescale.rederive(self.rule, ranks, self.base_batch, self.target, self.local_batch,
                               self.accum, self.keep, self.b_noise(), self.step_time,
                               self.ceiling)
        old_ranks, self.ranks = self.ranks, ranks
        self._change(new, "%d ranks -> %d" % (old_ranks, ranks))

    def _change(self, new, why):
        old = (self.global_batch, self.local_batch, self.lr_factor)
        self.target, self.global_batch = new["target"], new["global_batch"]
        self._apply(new["local_batch"], new["lr_factor"])
        self.changes.append(dict(ranks=self.ranks, global_batch=self.global_batch,
                                 local_batch=self.local_batch, why=why))
        if mpi_ops.rank() == 0:
            goodput = "" if not new.get("table") else "; predicted goodput " + ", ".join(
                "%d: %.0f" % (r["global_batch"], r["goodput"]) for r in new["table"])
            print("hpcdl elastic: %s: global batch %d -> %d (local %d -> %d), %s%s"
                  % (why, old[0], self.global_batch, old[1], self.local_batch,
                     "AdaScale scale %g" % self.scale if self._ada is not None
                     else "lr x %g" % (self.lr_factor / old[2]), goodput),
                  file=sys.stderr, flush=True)

    def _apply(self, local_batch, lr_factor):
        """Makes the optimizer follow self.global_batch (see the module docstring)."""
        ada = self._ada
        if ada is not None:
            meter = ada.meter
            if meter is not None and local_batch != self.local_batch:
                meter.settle()
                meter.smoothed.var *= self.local_batch / local_batch
            ada.progress.scale = check_scale(self.scale)
        ratio = lr_factor / self.lr_factor
        if ratio != 1.0:
            for g in self.opt.param_groups:
                g["lr"] *= ratio
                if "initial_lr" in g:
                    g["initial_lr"] *= ratio
            self._rescale_schedulers(ratio)
        self.local_batch, self.lr_factor = local_batch, lr_factor

    def _rescale_schedulers(self, ratio):
        for s in self.schedulers:
            s.base_lrs = [lr * ratio for lr in s.base_lrs]

    # ------------------------------------------------------------ commits
    def state_dict(self):
        ada = self._ada
        return dict(rule=self.rule, ranks=self.ranks, target=self.target,
                    global_batch=self.global_batch, local_batch=self.local_batch,
                    lr_factor=self.lr_factor, changes=list(self.changes),
                    step_time=self.step_time.state_dict() if self.step_time else None,
                    adascale=ada.state_dict() if ada is not None else None)

    def load_state_dict(self, state):
        """A commit's values, as they were on its rank count (on_reset then
        re-derives for this one). The optimizer's lr comes from its own state;
        the schedulers, built afresh by this launch, are moved to the commit's
        lr factor."""
        if state["rule"] != self.rule:
            raise RuntimeError("elastic: the last commit's BatchScaling rule is %r, this "
                               "script's %r" % (state["rule"], self.rule))
        self._rescale_schedulers(state["lr_factor"] / self.lr_factor)
        self.ranks, self.target = state["ranks"], state["target"]
        self.global_batch, self.local_batch = state["global_batch"], state["local_batch"]
        self.lr_factor, self.changes = state["lr_factor"], list(state["changes"])
        self.step_time = _step_time(state["step_time"])
        ada = self._ada
        if ada is not None and state["adascale"] is not None:
            ada.load_state_dict(state["adascale"])
            ada.progress.scale = check_scale(self.scale)
