"""allreduce.py - the trainer's all-reduce strategy (`--mode allreduce`, the
default): synchronous data parallelism over hpcdl.torch.DistributedOptimizer.

Every rank holds the whole model; they start identical (rank 0's weights are
broadcast, or every rank loads the same checkpoint). Each step every rank
computes gradients on its own L-sample slice of the global batch of G
(data.epoch_shard); DistributedOptimizer averages them in fusion buckets
while backward runs; every rank takes the same step. Because the slices are
equal, the average of the slice-mean gradients is the gradient of the whole
batch: N ranks follow the path of one process with the same G and seed, up to
float rounding (models with batch norm normalise per rank, as DDP does, so
they follow it only approximately).

--lr-scaling adascale (docs/adascale.md): DistributedOptimizer(adascale=G /
base batch) multiplies each step's lr by the AdaScale gain; the schedule is
the base batch's (its steps per epoch), read at the scale-invariant progress,
and training ends when the progress reaches that schedule's steps (done()),
in the middle of a pass over the data if need be.

State saved: the replica (model, optimizer, schedule, loss scale, RNG) as
every rank holds it, plus each rank's top-k residuals and AdaScale's progress
and noise estimates; rank 0 writes it as a one-file save directory beside
checkpoint.pt (train/checkpoint.py).
The loop around it is trainer.py's; the interface it fills is described there.
"""
import math
import os

import torch

from .. import comm
from ..checkpoint import zero as zero_checkpoint
from ..checkpoint.reshard import optimizer_names
from . import build, checkpoint, data
from .precision import LossScaler, autocast
from .. import torch as hvd
from ..optim.adascale import ScaleInvariantScheduler
from ..utils.device import select_device


def noise_scale_option(cfg):
    """DistributedOptimizer's noise_scale: measured whenever there are two
    batch sizes to compare (2+ ranks) and the reduced gradient is the exact
    average (not under top-k compression)."""
    return comm.size() > 1 and not cfg.compression.startswith("topk")


def pick_device():
    """One GPU per local rank when there are GPUs, else the CPU."""
    device = select_device()
    if device.type == "cpu":  # the node's cores are shared by its ranks: split threads
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.local_size()))
    return device


class AllReduce:
    """Gradients meet in DistributedOptimizer's all-reduce; every rank steps alike."""

    save_prefix = "state"  # the name of its save directories (zero.py's: one per stage)

    def __init__(self, cfg):
        self.cfg = cfg
        self.device = pick_device()
        self.data_rank, self.data_ranks = comm.rank(), comm.size()
        self.opt = self.sched = self.scaler = self.compression = None
        self.zero_stage = 0  # zero.py's strategy shards the optimizer (1, 2)
        self.noise_on = False  # DistributedOptimizer measures the noise scale (build())
        self.n_train = None    # training samples, set by the trainer before build()
        self.base_total = None  # adascale: the base schedule's steps (the end of training)

    # ------------------------------------------------------------ set-up
    def build(self, model, steps):
        """The local optimizer wrapped by DistributedOptimizer, its schedule,
        the fp16 loss scaler (its overflow decision agreed by every rank)."""
        cfg = self.cfg
        self.model = model
        local = build.build_optimizer(cfg, model)
        self.noise_on = noise_scale_option(cfg)
        self.compression = build.build_compression(cfg.compression)
        adascale = cfg.lr_scaling == "adascale"
        self.opt = hvd.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                            compression=self.compression,
                                            zero_stage=self.zero_stage,
                                            noise_scale=self.noise_on,
                                            adascale=cfg.global_batch / cfg.base_batch
                                            if adascale else False)
        if adascale:  # the base batch's schedule, read at the scale-invariant progress
            base = build.build_schedule(cfg, self.opt, data.steps_per_epoch(
                self.n_train, cfg.base_batch))
            self.base_total = base.plan["total_steps"]
            self.sched = ScaleInvariantScheduler(base, lambda: self.opt.scale_invariant_steps)
        else:
            self.sched = build.build_schedule(cfg, self.opt, steps)
        self.scaler = LossScaler(agree=comm.any_rank) if cfg.precision == "fp16" else None

    def start_fresh(self):
        """Rank 0's initial weights on every rank."""
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def describe(self, ds):
        cfg, size = self.cfg, comm.size()
        return ("%s on %s (%d train / %d test), %d rank(s), global batch %d (%d per rank), %d "
                "steps/epoch, %s lr %g (base %g, %s scaling), warmup %g epoch(s), %s schedule, "
                "%s precision, %s compression, seed %d, %s"
                % (cfg.model, cfg.data, ds.n_train, ds.n_test, size, cfg.global_batch,
                   cfg.global_batch // size, data.steps_per_epoch(ds.n_train, cfg.global_batch),
                   cfg.optimizer, build.peak_lr(cfg), cfg.base_lr, cfg.lr_scaling,
                   cfg.warmup_epochs, cfg.schedule, cfg.precision, cfg.compression, cfg.seed,
                   self.device)) + self.describe_adascale()

    def describe_adascale(self):
        """adascale: where training ends (the epochs shown are passes over the data)."""
        if self.base_total is None:
            return ""
        return ("; AdaScale: the schedule of batch %d (%d steps in %g epochs) read at the "
                "scale-invariant progress, training ends when it reaches %d"
                % (self.cfg.base_batch, self.base_total, self.cfg.epochs, self.base_total))

    def lr(self):
        return self.opt.param_groups[0]["lr"]

    # ------------------------------------------------------------ training
    def start_epoch(self):
        self.model.train()

    def train_step(self, x, y):
        """One synchronous step on this rank's slice. Returns (summed loss,
        correct) over the slice, before the update."""
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self.opt.zero_grad()
        with autocast(self.cfg.precision, self.device):
            logits = self.model(x)
        loss = build.train_loss(self.cfg, logits.float(), y)
        self.backward_and_step(loss)
        self.sched.step()
        return loss.item() * len(y), (logits.argmax(1) == y).sum().item()

    def backward_and_step(self, loss):
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:  # fp16: scaled backward, averaged grads checked for overflow on every rank
            self.opt.set_loss_scale(self.scaler.scale)  # the noise scale divides it out
            self.scaler.scale_loss(loss).backward()
            self.opt.synchronize()
            if self.scaler.unscale_and_check(self.opt.local_parameters()):
                with self.opt.skip_synchronize():
                    self.opt.step()

    def end_epoch(self, run):
        """Batch-norm statistics are per rank: use rank 0's, as DDP does.
        Returns the record's extra fields."""
        buffers = {k: v for k, v in self.model.named_buffers() if v.is_floating_point()}
        if buffers:
            hvd.broadcast_parameters(buffers, root_rank=0)
        extra = dict(b_simple=self.b_simple())
        if self.base_total is not None:  # adascale: this step's gain, the progress so far
            extra.update(gain=self.opt.gain(), scale_invariant_steps=self.opt.
                         scale_invariant_steps, base_steps=self.base_total)
        if self.scaler is None:
            return extra
        return dict(extra, loss_scale=self.scaler.scale, skipped_steps=self.scaler.skipped)

    def b_simple(self):
        """The gradient noise scale B_simple so far (samples; smoothed over about
        the last 100 steps, docs/noise_scale.md), or None (one rank, no step yet,
        |G|^2 estimated <= 0)."""
        ns = self.opt.noise_scale(batch_size=self.cfg.global_batch // comm.size()) \
            if self.noise_on else None
        return ns.b_simple if ns is not None and math.isfinite(ns.b_simple) else None

    def adascale(self):
        """The optimizer's AdaScale (--lr-scaling adascale), or None."""
        return getattr(self.opt, "adascale", None)

    def done(self):
        """Whether training is over before --epochs passes over the data: with
        adascale, once the progress reaches the base schedule's steps; None
        (the trainer counts epochs) otherwise. The same on every rank."""
        if self.base_total is None:
            return None
        return self.opt.scale_invariant_steps >= self.base_total

    def finish(self):
        """Collective, after the last epoch: the summary's extra fields."""
        extra = dict(optimizer=self.cfg.optimizer, precision=self.cfg.precision,
                     skipped_steps=self.scaler.skipped if self.scaler else 0)
        if self.base_total is not None:
            progress = self.adascale().progress
            extra.update(scale_invariant_steps=progress.steps, base_steps=self.base_total,
                         mean_gain=progress.mean_gain())
        return extra

    # ------------------------------------------------------------ checkpoints
    def save(self, dirs):
        """Collective: the replica's state written by dirs (the run's
        checkpoint.SaveDirs) as a one-file save directory; returns
        checkpoint.pt's entry naming it."""
        return dirs.save_state(self.replica_state(dirs))

    def replica_state(self, dirs):
        """Everything of the replica the next step depends on (see checkpoint.py)."""
        compression = getattr(self.compression, "state_dict", None)  # stateful: top-k
        return {
            "model": self.model.state_dict(), **self.optimizer_state(dirs),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": {"torch": torch.get_rng_state()},
            # top-k residuals differ per rank: rank r's dict is item r
            "residuals": comm.gather_object(compression(), root=0) if compression else None,
            "ranks": comm.size(),
            "adascale": self.adascale().state_dict() if self.adascale() else None,
        }

    def restore(self, state, dirs):
        """Collective: the state save() wrote (checkpoint.load merged its save
        directory in), or any --zero stage's on any rank count: the model and
        optimizer through load_model_and_optimizer, the rest as saved."""
        self.load_model_and_optimizer(state, dirs)
        self.sched.load_state_dict(state["scheduler"])
        if self.adascale() is not None:
            self.adascale().load_state_dict(state["adascale"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])
        residuals = state.get("residuals")  # --zero 3 keeps none
        if residuals is not None and hasattr(self.compression, "load_state_dict"):
            if state["ranks"] == comm.size():
                self.compression.load_state_dict(residuals[comm.rank()])
            else:
                comm.warn("top-k residuals were saved by %d ranks, this job has %d: they start "
                          "from zero (the run will not match an uninterrupted one exactly)"
                          % (state["ranks"], comm.size()))

    def optimizer_state(self, dirs):
        """The checkpoint's optimizer part: the whole optimizer (every rank has it)."""
        return {"optimizer": self.opt.state_dict()}

    def load_model_and_optimizer(self, state, dirs):
        """The whole model and optimizer: as checkpoint.pt holds them, or
        joined by parameter name from the pieces of a --zero 1-3 save."""
        name = checkpoint.pieces_dir(state)
        if name is None:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            return
        whole = dirs.load(name, lambda path: zero_checkpoint.read_whole(path, comm))
        if "model" in state:  # stages 1-2 keep the whole model in checkpoint.pt
            self.model.load_state_dict(state["model"])
        else:  # stage 3: its pieces joined, its buffers when saved
            self.model.load_state_dict(whole.model_state(state.get("buffers")),
                                       strict="buffers" in state)
        self.opt.load_state_dict(whole.torch_optimizer(optimizer_names(self.model, self.opt)))
