"""goodput.py - `hpcdl train --global-batch auto` (docs/goodput.md): every
--repick-steps steps within an epoch and at each epoch's end the global batch is
re-picked to maximise goodput (hpcdl/optim/goodput.py) from the running
gradient noise scale B_simple and a step-time model; the lr follows by
AdaScale (its scale set to batch / base).

The step-time model t(L) = a + c L + comm is measured once, at the first
re-pick (--repick-steps steps into the first epoch, or its end if it is
shorter): a + c L fitted to forward+backward times of a fresh copy of the
model at the candidates' local batches (the mean over ranks, so every rank
fits the same line), comm = the measured mean step time so far less the
fitted compute at its local batch. It is then kept (and checkpointed): later
choices depend only on B_simple, the same on every rank and in a resumed run.

Changing the batch from G to G' (local L to L'): the rest of the epoch's
permutation (or the next epoch's) is cut at G' (data.epoch_shard reads
cfg.global_batch and the samples already read), AdaScale's scale becomes
G' / base batch, and the noise scale's smoothed per-step variance, kept in
units of one rank's step, is rescaled by L / L'. The rank count is fixed, and
so is accumulation (k = 1: DistributedOptimizer's passes per step are set
when it is built).
"""
import time

import numpy as np
import torch
import torch.nn.functional as F

from .. import comm
from ..optim import goodput as gp
from ..optim.adascale import check_scale
from . import build
from .precision import autocast
from .report import global_sums

CEILING_OVER_BASE = 16  # the default --max-global-batch, over --base-batch
PROBE_REPEATS = 3       # timed forward+backward passes per local batch (after one warm-up)


class AutoBatch:
    """The batch choice of one run (trainer.py calls it every --repick-steps
    steps within an epoch and at each epoch's end)."""

    def __init__(self, cfg, strategy, ds):
        self.cfg, self.strategy, self.ds = cfg, strategy, ds
        self.ranks = comm.size()
        ceiling = cfg.max_global_batch or CEILING_OVER_BASE * cfg.base_batch
        self.ceiling = min(ceiling, ds.n_train)
        self.cands = gp.candidates(self.ranks, cfg.base_batch, self.ceiling)
        self.model = None   # gp.StepTime, measured at the first re-pick
        self.changes = 0
        self.within = []    # this epoch's changes within it, for its record
        self.measured = False  # the model was measured this epoch (for its record)

    def describe(self):
        every = self.cfg.repick_steps
        when = ("every %d steps and at each epoch's end" % every if every
                else "at each epoch's end")
        return ("global batch auto: one of %s (base %d, ceiling %d), re-picked %s for the "
                "largest predicted goodput; lr by AdaScale"
                % (",".join(str(m) for m, _, _ in self.cands), self.cfg.base_batch,
                   self.ceiling, when))

    # ------------------------------------------------------------ the choice
    def due(self, step, steps):
        """Whether to re-pick after step `step` of the `steps` the epoch has at
        this batch (counted since the last change; not at the epoch's end,
        where end_epoch does). The same on every rank. Why every 200 steps by
        default: B_simple is smoothed over about the last 100, so 200 rest on
        fresh statistics, and waiting for the first epoch's end at the base
        batch cost 5-7 s of an 11-14 s run (benchmarks/large-batch.md)."""
        every = self.cfg.repick_steps
        return every > 0 and step % every == 0 and step < steps

    def within_epoch(self, epoch, global_step, step_s):
        """A re-pick within the epoch, after global_step steps whose mean time
        so far is step_s (this rank's). True when the batch changed: the
        trainer then cuts the rest of the epoch at the new batch. Collective
        the first time (the step-time model is measured)."""
        if self.model is None:
            self.set_model(step_s)
        old = self.cfg.global_batch
        rows, pick, b_noise = self.choose("step %d (epoch %d)" % (global_step, epoch))
        if pick == old:
            return False
        self.within.append(dict(step=global_step, global_batch=old, next_global_batch=pick,
                                b_simple=b_noise, goodput=_record(rows)))
        return True

    def end_epoch(self, epoch, dt, seen):
        """After an epoch of dt seconds (mean over ranks) over seen samples (all
        ranks): the record's fields, and the next epoch's batch applied.
        Collective if the model is still to be measured."""
        fields = {"global_batch": self.cfg.global_batch}
        if self.model is None:
            self.set_model(dt / max(1, round(seen / self.cfg.global_batch)))
        if self.measured:
            fields["step_time_model"] = self.model.state_dict()
        if self.within:
            fields["changes_within"] = self.within
        self.within, self.measured = [], False
        rows, pick, _ = self.choose("epoch %d" % epoch)
        fields.update(goodput=_record(rows), next_global_batch=pick)
        return fields

    def choose(self, where):
        """(the goodput table, the pick, B_simple) now; the pick applied, and
        a line printed, when it changes the batch."""
        cfg = self.cfg
        b_noise = self.strategy.b_simple()
        rows = gp.table(b_noise, cfg.base_batch, self.model, self.cands)
        pick = gp.best(rows)["global_batch"]
        if pick != cfg.global_batch:
            comm.print0("hpcdl train: %s: global batch %d -> %d (B_simple %s; predicted "
                        "goodput %s)" % (where, cfg.global_batch, pick,
                                         "%.4g" % b_noise if b_noise else "not measured",
                                         ", ".join("%d: %.0f" % (r["global_batch"],
                                                                 r["goodput"]) for r in rows)))
            self.apply(pick)
            self.changes += 1
        return rows, pick, b_noise

    def apply(self, batch):
        """The next steps take global batch `batch` (see the module docstring)."""
        old_local, new_local = self.cfg.global_batch // self.ranks, batch // self.ranks
        meter = self.strategy.opt.noise_meter
        if meter is not None:
            meter.settle()
            meter.smoothed.var *= old_local / new_local
        self.strategy.adascale().progress.scale = check_scale(batch / self.cfg.base_batch)
        self.cfg.global_batch = batch

    # ------------------------------------------------------------ the step-time model
    def set_model(self, step_s):
        self.model, self.measured = self.measure(step_s), True

    def measure(self, step_s):
        """StepTime from the probe and the measured step time (collective)."""
        locals_ = sorted({local for _, local, _ in self.cands})
        x, y = self.samples(locals_[-1])
        # the mean over ranks, so every rank fits the same line
        secs = [s / self.ranks for s in global_sums(*(self.probe(local, x, y)
                                                        for local in locals_))]
        step_s = global_sums(step_s)[0] / self.ranks
        return gp.StepTime.fit(list(zip(locals_, secs)), step_s,
                               self.cfg.global_batch // self.ranks)

    def samples(self, n):
        """The first n training samples as one batch on the device, read through
        the data source's train_batches: a shard directory (--data DIR,
        train/shards.py) holds no x_train in memory. The run's random state is
        untouched (a DataLoader draws its seed from it)."""
        n = min(n, self.ds.n_train)
        with torch.random.fork_rng(devices=[]):
            batches = self.ds.train_batches(np.arange(n).reshape(1, n))
            try:
                x, y = next(batches)
            finally:
                batches.close()
        return x.to(self.strategy.device), y.to(self.strategy.device)

    def probe(self, local, x, y):
        """Seconds of one forward+backward of a fresh model copy at `local`
        samples of x, y (the fastest of PROBE_REPEATS after a warm-up). The
        run's model, optimizer and random state are untouched."""
        cfg, device = self.cfg, self.strategy.device
        with torch.random.fork_rng(devices=[]):
            model = build.build_model(cfg, self.ds).to(device)
        model.train()
        n = min(local, len(y))
        x, y = x[:n], y[:n]
        best = float("inf")
        for rep in range(PROBE_REPEATS + 1):
            t0 = time.perf_counter()
            with autocast(cfg.precision, device):
                logits = model(x)
            F.cross_entropy(logits.float(), y).backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if rep:
                best = min(best, time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        return best * local / n

    # ------------------------------------------------------------ checkpoints
    def state_dict(self):
        return dict(global_batch=self.cfg.global_batch, changes=self.changes,
                    model=self.model.state_dict() if self.model else None,
                    within=self.within, measured=self.measured)

    def adopt(self, state):
        """The checkpoint's chosen batch becomes this run's, before the strategy's
        state is restored (checkpoint.load has checked that it is a --global-batch
        auto checkpoint; its meta records the batch of the epoch it stopped in)."""
        self.cfg.global_batch = state["goodput"]["global_batch"]

    def load_state_dict(self, state):
        """After the strategy's state: the model, and AdaScale's scale for the batch."""
        g = state["goodput"]
        self.changes = g["changes"]
        self.model = gp.StepTime(**g["model"]) if g["model"] else None
        self.within, self.measured = g.get("within", []), g.get("measured", False)
        self.strategy.adascale().progress.scale = check_scale(
            self.cfg.global_batch / self.cfg.base_batch)


def _record(rows):
    """The goodput table as metrics.jsonl keeps it."""
    return [dict(global_batch=r["global_batch"], step_time_s=r["step_time_s"],
                 efficiency=r["efficiency"], goodput=r["goodput"]) for r in rows]
