"""zero.py - the trainer's ZeRO strategies. Zero3 (`--zero 3`, parameters
sharded too) is described at its class. `hpcdl train --zero 1|2`: the
all-reduce strategy with DistributedOptimizer(zero_stage=1|2), so each rank
keeps the optimizer state (and at stage 2 the averaged gradients) of only its
1/N of every fusion bucket; the updated parameters are all-gathered after
each step, so every rank still holds the whole model for forward and backward.

Everything else is allreduce.py's: the data slices, the fp16 loss scale (its
overflow check reads this rank's gradient shard, agreed by every rank).

Checkpoints of every stage are sharded: each rank writes its own pieces and
their optimizer state, by parameter name, into a save directory beside
checkpoint.pt (one file per rank plus a manifest; hpcdl/checkpoint/zero.py
and buckets.py; directories as hpcdl/checkpoint/root.py's SaveDirs keeps
them), so no rank ever holds the whole optimizer. checkpoint.pt (rank 0)
names that directory and holds the rest (stages 1-2: the whole model, which
every rank has). Resuming reshards to the current rank count and cut: any
stage resumes any other's checkpoint (0-3) on any rank count; a run resumed
on the same ranks at the same stage ends with exactly the parameters of one
that never stopped.
"""
import torch

from .. import comm
from ..checkpoint import buckets, zero as zero_checkpoint
from ..checkpoint.reshard import Whole, optimizer_names
from ..torch.zero.stage3 import shard_model
from . import build, checkpoint
from .allreduce import AllReduce
from .errors import ConfigError
from .precision import LossScaler


class Zero(AllReduce):
    """AllReduce with a sharded optimizer (cfg.zero is 1 or 2)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.zero_stage = cfg.zero
        _refuse_gpu(self.device, cfg.zero)
        self.save_prefix = "zero%d" % cfg.zero

    def describe(self, ds):
        return "%s, ZeRO stage %d" % (super().describe(ds), self.zero_stage)

    def state_bytes(self):
        """Optimizer-state bytes this rank holds (its shard)."""
        return self.opt.state_bytes()

    def finish(self):
        """The summary's fields, plus the stage and the largest per-rank state."""
        extra = super().finish()
        every = comm.allgather_object(self.state_bytes())
        return dict(extra, zero_stage=self.zero_stage, optimizer_state_bytes=max(every))

    def save(self, dirs):
        """Collective: checkpoint.pt holds the replica's state itself, its
        optimizer part the name of the shard directory (optimizer_state)."""
        return self.replica_state(dirs)

    def optimizer_state(self, dirs):
        """Collective: each rank writes its pieces and their optimizer state
        into a fresh shard directory (dirs); checkpoint.pt names it."""
        name = dirs.save(lambda path: buckets.save_sharded(self.opt, path))
        return {"zero12": {"dir": name, "stage": self.zero_stage, "ranks": comm.size()}}

    def load_model_and_optimizer(self, state, dirs):
        """Collective: this rank's pieces and state from a directory of pieces
        (any stage's, resharded to this rank count and these buckets), or the
        whole optimizer a --zero 0 checkpoint holds (each rank keeps its
        pieces' state)."""
        name = checkpoint.pieces_dir(state)
        if name is None:
            super().load_model_and_optimizer(state, dirs)
            return
        if "model" in state or "buffers" in state:  # the parameters come from the pieces
            self.model.load_state_dict(state.get("model") or state["buffers"],
                                       strict="model" in state)
        dirs.load(name, lambda path: buckets.load_sharded(self.opt, path))


class Zero3(AllReduce):
    """--zero 3: the model itself is sharded (hvd.shard_model): each module's
    parameters are gathered around its forward and backward, its gradients
    reduce-scattered into this rank's pieces, which a plain optimizer (SGD or
    Adam) updates; no DistributedOptimizer. Evaluation runs on the whole
    model (unshard() after each epoch's training: ranks score different
    numbers of test batches, and a sharded forward is collective).

    Checkpoints are sharded: checkpoint.pt (rank 0, as for every strategy)
    holds the run's position, schedule, loss scale, RNG and the model's
    buffers and names a directory beside it with one file per rank plus a
    manifest (hpcdl/checkpoint/zero.py), written first; a fresh directory per
    save, so the rename of checkpoint.pt switches from one whole checkpoint
    to the next, and older directories are removed after. Resuming reshards
    to the current rank count, from any stage's checkpoint."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.zero_stage = 3
        _refuse_gpu(self.device, 3)
        self.shards = None
        self.save_prefix = "zero3"

    def build(self, model, steps):
        """Shards the model (rank 0's weights on every rank), then the local
        optimizer over the pieces, the schedule, the loss scaler."""
        cfg = self.cfg
        self.model = model
        # the groups (LARS's, or no decay on biases and norm) judge parameters by
        # their shape: take them from the whole model (a piece is 1-D), by name,
        # since sharding swaps the tensors
        groups = _names_of(model, build.param_groups(cfg, model))
        self.compression = build.build_compression(cfg.compression)
        self.shards = shard_model(model, compression=self.compression)
        self.opt = build.build_optimizer(cfg, model, _params_of(model, groups))
        self.sched = build.build_schedule(cfg, self.opt, steps)
        self.scaler = LossScaler(agree=comm.any_rank) if cfg.precision == "fp16" else None

    def start_fresh(self):
        pass  # shard_model already cut every rank's pieces from rank 0's weights

    def describe(self, ds):
        pb = self.shards.param_bytes()
        return "%s, ZeRO stage 3 (%d units, %d of %d parameter bytes on this rank)" % (
            super().describe(ds), len(self.shards.units), pb["shard"], pb["full"])

    def start_epoch(self):
        self.shards.reshard()  # evaluation and the summary saw the whole model
        super().start_epoch()

    def backward_and_step(self, loss):
        """The gradients arrive averaged on the pieces during backward; the
        plain optimizer steps (fp16: the pieces checked, agreed by every rank);
        LARS and LARC get whole-layer norms (one all-reduce)."""
        if self.scaler is None:
            loss.backward()
            self._step()
        else:
            self.scaler.scale_loss(loss).backward()
            if self.scaler.unscale_and_check(list(self.model.parameters())):
                self._step()

    def _step(self):
        with self.shards.layer_norms(self.opt):
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
    def save(self, dirs):
        """Collective: writes this save's shard directory (dirs); returns what
        checkpoint.pt holds (it names the directory, and holds the buffers)."""
        name = dirs.save(
            lambda path: zero_checkpoint.save_sharded(self.shards, path, self.opt))
        pieces = {n for n, *_ in self.shards.named_pieces()}
        return {"zero3": {"dir": name, "ranks": comm.size()},
                "buffers": {k: v for k, v in self.model.state_dict().items()
                            if k not in pieces},
                "scheduler": self.sched.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "rng": {"torch": torch.get_rng_state()}, "ranks": comm.size()}

    def load_model_and_optimizer(self, state, dirs):
        """Collective: this rank's pieces and their state from a directory of
        pieces (any stage's, resharded to these units and ranks), or cut
        from the whole model and optimizer a --zero 0 checkpoint holds."""
        name = checkpoint.pieces_dir(state)
        if name is None:
            self.shards.load_full(state["model"])  # the buffers too
            whole = Whole.of_torch(state["model"], state["optimizer"],
                                   optimizer_names(self.model, self.opt))
            zero_checkpoint.load_pieces(self.shards, self.opt, whole.piece, whole.piece_state,
                                        whole.groups)
            return
        dirs.load(name, lambda path: zero_checkpoint.load_sharded(self.shards, path, self.opt))
        pieces = {n for n, *_ in self.shards.named_pieces()}
        buffers = {k: v for k, v in (state.get("model") or state.get("buffers") or {}).items()
                   if k not in pieces}
        self.model.load_state_dict(buffers, strict=False)


def _names_of(model, groups):
    """groups with parameter names in place of the parameters (None: None)."""
    if groups is None:
        return None
    name = {p: n for n, p in model.named_parameters()}
    return [dict(g, params=[name[p] for p in g["params"]]) for g in groups]


def _params_of(model, groups):
    """_names_of undone on the (sharded) model: its parameters of those names."""
    if groups is None:
        return None
    param = dict(model.named_parameters())
    return [dict(g, params=[param[n] for n in g["params"]]) for g in groups]


def _refuse_gpu(device, stage):
    """ConfigError on every rank (each picks its device alike) before any collective."""
    if device.type != "cpu":
        raise ConfigError("--zero %d trains on the CPU only for now (this rank would use %s): "
                          "hpcdl's reduce-scatter and all-gather take host buffers; use "
                          "--zero 0 on GPUs, or CUDA_VISIBLE_DEVICES= to train on the CPU"
                          % (stage, device))


def _state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for k, v in st.items() if torch.is_tensor(v) and k != "step")
