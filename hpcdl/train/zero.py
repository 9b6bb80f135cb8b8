"""zero.py - the trainer's ZeRO strategies. Zero3 (`--zero 3`, parameters
sharded too) is described at its class. `hpcdl train --zero 1|2`: the
all-reduce strategy with DistributedOptimizer(zero_stage=1|2), so each rank
keeps the optimizer state (and at stage 2 the averaged gradients) of only its
1/N of every fusion bucket; the updated parameters are all-gathered after
each step, so every rank still holds the whole model for forward and backward.

Everything else is allreduce.py's: the data slices, the fp16 loss scale (its
overflow check reads this rank's gradient shard, agreed by every rank), the
checkpoint. The optimizer's state_dict() is consolidated (collective), so a
checkpoint holds the unsharded optimizer: it resumes under any --zero stage
and any rank count, and a run resumed on the same ranks ends with exactly the
parameters of one that never stopped.
"""
import os
import shutil
import time

import torch

from .. import comm
from . import build, checkpoint
from .allreduce import AllReduce


class Zero(AllReduce):
    """AllReduce with a sharded optimizer (cfg.zero is 1 or 2)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.zero_stage = cfg.zero
        _refuse_gpu(self.device, cfg.zero)

    def describe(self, ds):
        return "%s, ZeRO stage %d" % (super().describe(ds), self.zero_stage)

    def state_bytes(self):
        """Optimizer-state bytes this rank holds (its shard)."""
        return self.opt._zero.state_bytes()

    def finish(self):
        """The summary's fields, plus the stage and the largest per-rank state."""
        extra = super().finish()
        every = comm.allgather_object(self.state_bytes())
        return dict(extra, zero_stage=self.zero_stage, optimizer_state_bytes=max(every))


class Zero3(AllReduce):
    """--zero 3: the model itself is sharded (hvd.shard_model): each module's
    parameters are gathered around its forward and backward, its gradients
    reduce-scattered into this rank's pieces, which a plain optimizer (SGD or
    Adam) updates; no DistributedOptimizer. Evaluation runs on the whole
    model (unshard() after each epoch's training: ranks score different
    numbers of test batches, and a sharded forward is collective).

    Checkpoints are sharded: checkpoint.pt (rank 0, as for every strategy)
    holds the run's position, schedule, loss scale and RNG and names a
    directory beside it with one file per rank plus a manifest
    (hpcdl/torch/zero/checkpoint.py), written first; a fresh directory per
    save, so the rename of checkpoint.pt switches from one whole checkpoint
    to the next, and older directories are removed after. Resuming reshards
    to the current rank count."""

    KEEP = 2  # shard directories kept: the one checkpoint.pt names, and the newest

    def __init__(self, cfg):
        super().__init__(cfg)
        self.zero_stage = 3
        _refuse_gpu(self.device, 3)
        self.shards = None
        self._dirs = []  # shard directories written or loaded by this run, oldest first

    def build(self, model, steps):
        """Shards the model (rank 0's weights on every rank), then the local
        optimizer over the pieces, the schedule, the loss scaler."""
        from ..torch.zero import shard_model
        from .precision import LossScaler
        cfg = self.cfg
        self.model = model
        self.shards = shard_model(model)
        self.opt = build.build_optimizer(cfg, model)
        self.sched = build.build_schedule(cfg, self.opt, steps)
        self.scaler = LossScaler(agree=comm.any_rank) if cfg.precision == "fp16" else None

    def start_fresh(self):
        pass  # shard_model already cut every rank's pieces from rank 0's weights

    def describe(self, ds):
        pb = self.shards.param_bytes()
        return "%s, ZeRO stage 3 (%d units, %d of %d parameter bytes on this rank)" % (
            super().describe(ds), len(self.shards.units), pb["shard"], pb["full"])

    def train_epoch(self, run, rows, reporter, stop):
        self.shards.reshard()
        return super().train_epoch(run, rows, reporter, stop)

    def backward_and_step(self, loss):
        """The gradients arrive averaged on the pieces during backward; the
        plain optimizer steps (fp16: the pieces checked, agreed by every rank)."""
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale_loss(loss).backward()
            if self.scaler.unscale_and_check(list(self.model.parameters())):
                self.opt.step()

    def end_epoch(self, run):
        extra = super().end_epoch(run)
        self.shards.unshard()  # for the evaluation that follows (collective)
        return extra

    def finish(self):
        """The whole model from now on (the summary's digest, model.pt); the
        largest per-rank optimizer-state and parameter bytes."""
        self.shards.unshard()
        extra = super().finish()
        pb = self.shards.param_bytes()
        every = comm.allgather_object((_state_bytes(self.opt), pb["shard"], pb["peak_gathered"]))
        return dict(extra, zero_stage=3, optimizer_state_bytes=max(e[0] for e in every),
                    parameter_bytes=max(e[1] for e in every),
                    peak_gathered_bytes=max(e[2] for e in every))

    # ------------------------------------------------------------ checkpoints
    def state_dict(self):
        """Collective: writes this save's shard directory; returns what
        checkpoint.pt holds (it names the directory)."""
        from ..torch.zero.checkpoint import save_sharded
        name = comm.bcast_object("zero3-%d-%d" % (time.time_ns(), os.getpid()))
        save_sharded(self.shards, os.path.join(self.cfg.checkpoint_dir, name), self.opt)
        self._dirs.append(name)
        self._prune()
        return {"zero3": {"dir": name, "ranks": comm.size()},
                "scheduler": self.sched.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "rng": {"torch": torch.get_rng_state()}, "ranks": comm.size()}

    def _prune(self):
        """Rank 0 removes shard directories older than the last KEEP: the one
        before the newest is what checkpoint.pt names until it is replaced."""
        old, self._dirs = self._dirs[:-self.KEEP], self._dirs[-self.KEEP:]
        if comm.rank() == 0:
            for name in old:
                shutil.rmtree(os.path.join(self.cfg.checkpoint_dir, name), ignore_errors=True)

    def load_state_dict(self, state):
        from ..torch.zero.checkpoint import load_sharded
        from .errors import ConfigError
        if "zero3" not in state:
            raise ConfigError("this checkpoint holds an unsharded model (--zero 0, 1 or 2); "
                              "--zero 3 resumes only its own sharded checkpoints")
        where = os.path.dirname(os.path.abspath(
            self.cfg.resume if self.cfg.resume not in (None, "auto")
            else checkpoint.path_in(self.cfg.checkpoint_dir)))
        try:
            load_sharded(self.shards, os.path.join(where, state["zero3"]["dir"]), self.opt)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if os.path.abspath(self.cfg.checkpoint_dir or "") == where:
            self._dirs.append(state["zero3"]["dir"])
        self.sched.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])


def _refuse_gpu(device, stage):
    """ConfigError on every rank (each picks its device alike) before any collective."""
    if device.type != "cpu":
        from .errors import ConfigError
        raise ConfigError("--zero %d trains on the CPU only for now (this rank would use %s): "
                          "hpcdl's reduce-scatter and all-gather take host buffers; use "
                          "--zero 0 on GPUs, or CUDA_VISIBLE_DEVICES= to train on the CPU"
                          % (stage, device))


def _state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for k, v in st.items() if torch.is_tensor(v) and k != "step")
