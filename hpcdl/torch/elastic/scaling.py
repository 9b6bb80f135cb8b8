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
            scaling.end_epoch(step_s)    # rule "goodput": re-pick the batch

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
computes the same values from rank 0's synced state.

The goodput rule's comm term is measured on one layout (ranks, hosts): after
a restart onto another, it is stale. Meanwhile the rule uses the ring's
estimate (StepTime.comm_moved: comm x 2(N-1)/N over the measured N's, said
in the log), and the next end_epoch(step_s) re-fits comm from the new run's
step time averaged over the ranks, keeping the per-rank compute line."""
import math
import numbers
import sys

import torch

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


def _rank_sums(values, name):
    """values (floats) summed over the ranks (collective)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    return mpi_ops.allreduce(t, op=mpi_ops.Sum, name=name).tolist()


def _hosts():
    """The job's host count: its ranks of local rank 0 (collective)."""
    return int(_rank_sums([mpi_ops.local_rank() == 0], "elastic.scaling.hosts")[0])


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
        self.hosts = _hosts() if rule == "goodput" else None
        self.comm_at = self.layout  # where step_time's comm was measured (or given)
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

    @property
    def layout(self):
        return [self.ranks, self.hosts]

    @property
    def comm_stale(self):
        """True when the step-time model's comm was measured on another layout
        (ranks, hosts) than this job's: until end_epoch(step_s) re-measures it,
        the rule uses model()'s estimate."""
        return self.rule == "goodput" and self.step_time is not None and \
            self.comm_at != self.layout

    def model(self):
        """The step-time model the goodput rule uses now: step_time, or while
        comm_stale its comm moved to this rank count by the ring's bytes per
        rank (goodput.StepTime.comm_moved); None without one (or measured on
        one rank: then the target is kept until re-measured)."""
        if self.step_time is None:
            return None
        return self.step_time.comm_moved(self.comm_at[0], self.ranks)

    def b_noise(self):
        """The running B_simple (samples) from the optimizer's noise meter, or None."""
        meter = getattr(self.opt, "noise_meter", None)
        ns = meter.result(self.local_batch * self.accum) if meter is not None else None
        return ns.b_simple if ns is not None else None

    def set_step_time(self, step_time):
        """The goodput rule's model t(L, k) = k (a + c L) + comm (a StepTime or
        (a, c, comm) seconds), its comm taken as measured on this job's layout;
        give every rank the same one. See fit_step_time."""
        self.step_time = _step_time(step_time)
        self.comm_at = self.layout

    def fit_step_time(self, passes, step_seconds):
        """Sets the model from this rank's measurements, averaged over the ranks
        (collective; the same local batches on every rank, so that every rank
        fits the same model): passes = [(local batch, seconds of one
        forward+backward)] (a + c L is their least-squares line) and
        step_seconds = a measured step at the current batch (comm = the rest).
        Returns the StepTime."""
        batches = [p[0] for p in passes]
        for b in batches:
            check_count("fit_step_time's local batch", b, "samples")
        m, n = len(batches), self.ranks
        sums = _rank_sums(batches + [b * b for b in batches] + [p[1] for p in passes] +
                          [step_seconds], "elastic.scaling.fit")
        if any(sums[m + i] * n != sums[i] ** 2 for i in range(m)):
            raise ValueError("fit_step_time: the ranks gave different local batches %s "
                             "(this rank's): give the same on every rank" % batches)
        secs = [x / n for x in sums[2 * m:]]
        self.step_time = gp.StepTime.fit(list(zip(batches, secs[:m])), secs[m],
                                         self.local_batch, self.accum)
        self.comm_at = self.layout
        return self.step_time

    # ------------------------------------------------------------ changes
    def end_epoch(self, step_s=None):
        """Rule goodput: re-picks the target for this rank count from the
        running B_noise (the same on every rank); returns the goodput table
        (None for other rules or without a step-time model). step_s: this
        rank's mean step time (seconds) since the job (re)started, at
        local_batch; read only while comm_stale: then every rank's are
        averaged (collective: give it on every rank or on none) and comm is
        re-fitted from the mean (StepTime.with_comm) before the pick."""
        if self.rule != "goodput" or self.step_time is None:
            return None
        if self.comm_stale:
            self._remeasure_comm(step_s)
        model = self.model()
        if model is None:
            return None
        target, rows = rescale.pick(self.b_noise(), self.base_batch, model,
                                    self.ranks, self.ceiling, self.accum)
        if target != self.target:
            self._change(dict(rescale.rederive(self.rule, self.ranks, self.base_batch, target,
                                               self.local_batch, self.accum, "global"),
                              table=rows), "goodput")
        return rows

    def _remeasure_comm(self, step_s):
        """comm from the ranks' mean step time on this layout (collective; one
        line on every rank when step_s is bad or given on some ranks only)."""
        ok = isinstance(step_s, numbers.Real) and not isinstance(step_s, bool) and \
            math.isfinite(step_s) and step_s > 0
        total, given, bad = _rank_sums([step_s if ok else 0.0, step_s is not None,
                                        step_s is not None and not ok], "elastic.scaling.comm")
        if bad or 0 < given < self.ranks:
            raise ValueError("BatchScaling.end_epoch(step_s): step_s must be a positive "
                             "number of seconds on every rank (or None on every rank); got "
                             "%r here, given on %d of %d ranks" % (step_s, given, self.ranks))
        if not given:
            return  # the estimate stays until a step time is given
        old = self.model()
        self.step_time = self.step_time.with_comm(total / self.ranks, self.local_batch,
                                                  self.accum)
        self.comm_at = self.layout
        self._log("comm re-measured on %d ranks, %d host(s): %.4g s (the estimate was %s)"
                  % (self.ranks, self.hosts, self.step_time.comm,
                     "%.4g s" % old.comm if old is not None else "none"))

    def on_reset(self):
        """After a restart from a commit (TorchState calls it before the reset
        callbacks): the batch and lr for hvd.size() ranks, if it changed, and
        for the goodput rule a stale comm on another layout (class docstring)."""
        ranks = mpi_ops.size()
        hosts = _hosts() if self.rule == "goodput" else None
        if [ranks, hosts] == self.layout:
            return
        if ranks < 2 and self.rule in ("adascale", "goodput"):
            raise RuntimeError("BatchScaling(rule=%r): the job restarted on 1 rank, where "
                               "AdaScale has no gain (it compares the ranks' gradients); "
                               "keep --min-np at 2 or more" % self.rule)
        old_ranks, self.ranks, self.hosts = self.ranks, ranks, hosts
        model = self.model()
        if self.comm_stale:
            self._log("comm %.4g s was measured on %d ranks, %d host(s); now %d ranks, %d "
                      "host(s): %s until end_epoch(step_s) re-measures it"
                      % (self.step_time.comm, self.comm_at[0], self.comm_at[1], ranks, hosts,
                         "the ring's 2(N-1)/N estimate %.4g s" % model.comm
                         if model is not None else "no estimate, the target kept"))
        if ranks == old_ranks:
            return
        new = rescale.rederive(self.rule, ranks, self.base_batch, self.target, self.local_batch,
                               self.accum, self.keep, self.b_noise(), model, self.ceiling)
        self._change(new, "%d ranks -> %d" % (old_ranks, ranks))

    def _log(self, text):
        if mpi_ops.rank() == 0:
            print("hpcdl elastic: " + text, file=sys.stderr, flush=True)

    def _change(self, new, why):
        old = (self.global_batch, self.local_batch, self.lr_factor)
        self.target, self.global_batch = new["target"], new["global_batch"]
        self._apply(new["local_batch"], new["lr_factor"])
        self.changes.append(dict(ranks=self.ranks, global_batch=self.global_batch,
                                 local_batch=self.local_batch, why=why))
        goodput = "" if not new.get("table") else "; predicted goodput " + ", ".join(
            "%d: %.0f" % (r["global_batch"], r["goodput"]) for r in new["table"])
        self._log("%s: global batch %d -> %d (local %d -> %d), %s%s"
                  % (why, old[0], self.global_batch, old[1], self.local_batch,
                     "AdaScale scale %g" % self.scale if self._ada is not None
                     else "lr x %g" % (self.lr_factor / old[2]), goodput))

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
                    hosts=self.hosts, comm_at=list(self.comm_at),
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
        self.hosts = state.get("hosts", self.hosts)  # a commit older than these keys:
        self.comm_at = list(state.get("comm_at", self.layout))  # taken as measured there
        ada = self._ada
        if ada is not None and state["adascale"] is not None:
            ada.load_state_dict(state["adascale"])
            ada.progress.scale = check_scale(self.scale)
