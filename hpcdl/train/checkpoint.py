"""checkpoint.py - the trainer's checkpoints: written atomically by rank 0,
read back with torch.load(weights_only=True) (tensors and plain values only, no
arbitrary pickle), checked against the run before anything is restored.

A checkpoint holds everything the next step depends on: model, optimizer,
LR schedule, loss scale, the data position (epoch, step within it; the order
of samples is a function of seed and epoch), RNG states, the per-rank top-k
residuals, and the partial sums of the interrupted epoch's metrics. So a run
stopped anywhere and resumed ends with exactly the parameters of a run that
never stopped.

Atomic: the file is written under a temporary name in the same directory,
flushed to disk, then renamed over checkpoint.pt; a kill during the save
leaves the previous checkpoint whole. checkpoint.pt is the checkpoint's root:
at --zero 1-3 the per-rank state is a save directory of hpcdl's one sharded
format (utils/sharded.py) beside it, written first and named by it
(train/zero.py), so the rename of checkpoint.pt commits the whole save as a
manifest commits a directory.

Everything a run is checked against before anything is restored is here
(meta_of, _mismatch), from one read of the file: the model, data, batch,
optimizer, seed, --mode, and whether the checkpoint was written under
--global-batch auto (a run with it adopts the checkpoint's batch) and under
--lr-scaling adascale.
"""
import os

import torch

from .. import comm
from ..utils.atomic import atomic_open
from .errors import ConfigError

FORMAT = 1
FILENAME = "checkpoint.pt"


def path_in(directory):
    return os.path.join(directory, FILENAME)


def resumed_path(cfg):
    """The checkpoint.pt a resuming run reads (--resume PATH, or --resume
    [auto] in --checkpoint-dir), for messages and the files beside it."""
    return cfg.resume if cfg.resume not in (None, "auto") else path_in(cfg.checkpoint_dir)


def meta_of(cfg, model):
    """What a checkpoint must match to be resumed by this run. auto_batch and
    adascale are checked against the state itself (its goodput and adascale
    parts), which checkpoints from before these keys also have."""
    return {"model": cfg.model, "mode": cfg.mode, "hidden": list(cfg.hidden), "data": cfg.data,
            "global_batch": cfg.global_batch, "optimizer": cfg.optimizer,
            "seed": cfg.seed, "epochs": cfg.epochs,
            "auto_batch": bool(getattr(cfg, "auto_batch", False)),
            "adascale": cfg.lr_scaling == "adascale",
            "shapes": _shapes(model)}


def _shapes(model):
    """The model's tensors' shapes; a stage-3 model's whole, not its pieces."""
    from ..torch.zero import shards_of
    shards = shards_of(model)
    if shards is not None:
        return shards.full_shapes()
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def save(path, state):
    """Rank 0 writes state to path atomically; every rank returns after it is
    on disk (collective)."""
    error = None
    if comm.rank() == 0:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with atomic_open(path) as f:
                torch.save(state, f)
        except OSError as e:
            error = "could not write checkpoint %s: %s" % (path, e)
    comm.raise_if_any(error, ConfigError)


def load(path, cfg, model):
    """The checkpoint at path, checked against this run (collective: every
    rank reads it and every rank raises ConfigError if any rank could not)."""
    error, state = None, None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        error = _mismatch(path, state, meta_of(cfg, model))
    except FileNotFoundError:
        error = "checkpoint %s does not exist" % path
    except Exception as e:  # torch/zip/pickle errors of a damaged file
        error = ("checkpoint %s cannot be read (truncated, corrupted or not written by hpcdl "
                 "train; %s); delete it or resume from another" % (path, type(e).__name__))
    comm.raise_if_any(error, ConfigError)
    return state


def _mismatch(path, state, meta):
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return "%s is not an hpcdl train checkpoint (format %d)" % (path, FORMAT)
    old = state["meta"]
    was = old.get("mode", meta["mode"])  # checkpoints before the mode was recorded
    if _family(was) != _family(meta["mode"]):
        return ("checkpoint %s was written by a run with --mode %s, this run has --mode %s; "
                "%s checkpoints are not resumed by %s runs: resume with --mode %s"
                % (path, was, meta["mode"], _family(was), _family(meta["mode"]), was))
    auto = state.get("goodput") is not None
    if auto != meta.get("auto_batch", False):
        return ("checkpoint %s was written by a run with a fixed --global-batch; resume it with "
                "that batch, not auto" % path if meta.get("auto_batch") else
                "checkpoint %s was written by a run with --global-batch auto; resume it with "
                "--global-batch auto" % path)
    adascale = state.get("adascale") is not None
    if adascale != meta.get("adascale", False):
        return ("checkpoint %s was written by a run %s --lr-scaling adascale, this run is %s "
                "it; resume with the same --lr-scaling"
                % ((path,) + (("with", "without") if adascale else ("without", "with"))))
    for key, flag in (("model", "--model"), ("hidden", "--hidden"), ("data", "--data"),
                      ("global_batch", "--global-batch"), ("optimizer", "--optimizer"),
                      ("seed", "--seed")):
        if key == "global_batch" and auto:  # the run adopts the checkpoint's batch
            continue
        if old[key] != meta[key]:
            return ("checkpoint %s was written by a run with %s %s, this run has %s; "
                    "resume with the same %s (or start without --resume)"
                    % (path, flag, _show(old[key]), _show(meta[key]), flag))
    if old["shapes"] != meta["shapes"]:
        return ("checkpoint %s holds a model with other parameters (%d tensors) than "
                "--model %s here (%d tensors)" % (path, len(old["shapes"]), meta["model"],
                                                  len(meta["shapes"])))
    return None


def _family(mode):
    """The kind of state a --mode checkpoints: hpcdl's replicas, DDP's (either
    backend: they resume each other's) or a parameter server's."""
    if mode == "allreduce":
        return "all-reduce"
    return "DDP" if mode.startswith("ddp-") else "parameter-server"


def _show(v):
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)
