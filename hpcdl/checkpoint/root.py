"""root.py - checkpoint.pt, the root of the trainer's checkpoints: every
rank's state in hpcdl's one sharded format (files.py), committed by
checkpoint.pt, written atomically by rank 0; read back with
torch.load(weights_only=True) (tensors and plain values only, no arbitrary
pickle), checked against the run before anything is restored.

A checkpoint holds everything the next step depends on: model, optimizer,
LR schedule, loss scale, the data position (epoch, step within it; the order
of samples is a function of seed and epoch), RNG states, the per-rank top-k
residuals, and the partial sums of the interrupted epoch's metrics. So a run
stopped anywhere and resumed ends with exactly the parameters of a run that
never stopped.

    DIR/checkpoint.pt              the root: format, meta (what a resuming run
                                   is checked against), the loop's position,
                                   sums and --global-batch auto's state, and
                                   the name of the save directory beside it
    DIR/state-<time>-<pid>/        --zero 0 (every --mode but ZeRO's): the
                                   strategy's state (model, optimizer, schedule,
                                   loss scale, RNG, every rank's top-k
                                   residuals, AdaScale's; a parameter server's
                                   shards) as one file and its manifest
    DIR/zero1|2|3-<time>-<pid>/    --zero 1-3: one file per rank (its pieces and
                                   their optimizer state, by parameter name) and
                                   a manifest (zero.py, buckets.py);
                                   checkpoint.pt keeps the rest

Atomic: every file is written under a temporary name in the same directory,
flushed to disk, then renamed; a save directory is fresh for each save and
written first, so the rename of checkpoint.pt commits the whole save as a
manifest commits a directory, and a kill during the save leaves the previous
checkpoint whole. After the rename rank 0 removes every other save directory
(SaveDirs.written). checkpoint.pt and the directory it names belong together:
copy or move both. checkpoint.pt files of one piece (hpcdl before this layout,
72df3c7's among them) are read as before.

Everything a run is checked against before anything is restored is here
(meta_of, _mismatch), from one read of checkpoint.pt: the model, data, batch,
optimizer, seed, --mode's family, and whether the checkpoint was written
under --global-batch auto (a run with it adopts the checkpoint's batch) and
under --lr-scaling adascale. The --zero stage is not: any stage resumes any
other on any rank count (reshard.py). Then the save directory is read; a
missing, partial or damaged one is a one-line error on every rank (the
caller's class: the trainer's ConfigError).
"""
import os
import shutil

import torch

from .. import comm
from ..utils.atomic import atomic_open
from . import files as sharded

FORMAT = 1
FILENAME = "checkpoint.pt"
STATE = "state"  # checkpoint.pt's key naming the save directory of the strategy's state
KIND = "train"   # that directory's manifest kind
SAVE_DIRS = "state|zero[123]"  # the prefixes of SaveDirs' directories (files.py names)
# checkpoint.pt's entries naming a directory of pieces by parameter name
# (zero.py's format), as --zero 3 and --zero 1-2 have written them since 72df3c7
PIECES = ("zero3", "zero12")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or resumed; one line on every rank."""


def path_in(directory):
    return os.path.join(directory, FILENAME)


def resumed_path(cfg):
    """The checkpoint.pt a resuming run reads (--resume PATH, or --resume
    [auto] in --checkpoint-dir), for messages and the files beside it."""
    return cfg.resume if cfg.resume not in (None, "auto") else path_in(cfg.checkpoint_dir)


def meta_of(cfg, shapes):
    """What a checkpoint must match to be resumed by this run (shapes: the
    whole model's state_dict shapes by name). auto_batch and adascale are
    checked against the state itself (its goodput and adascale parts), which
    checkpoints from before these keys also have."""
    return {"model": cfg.model, "mode": cfg.mode, "hidden": list(cfg.hidden), "data": cfg.data,
            "global_batch": cfg.global_batch, "optimizer": cfg.optimizer,
            "seed": cfg.seed, "epochs": cfg.epochs,
            "auto_batch": bool(getattr(cfg, "auto_batch", False)),
            "adascale": cfg.lr_scaling == "adascale", "zero": cfg.zero,
            "shapes": shapes}


def pieces_dir(state):
    """The directory of pieces checkpoint.pt's state names (any stage 1-3's),
    or None: the state is whole (--zero 0, or a checkpoint.pt of one piece)."""
    for key in PIECES:
        if key in state:
            return state[key]["dir"]
    return None


def save(path, state, error_type=CheckpointError):
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
    comm.raise_if_any(error, error_type)


def load(path, meta, error_type=CheckpointError):
    """The checkpoint at path, checked against this run's meta, with the
    strategy's state from the save directory it names merged in (collective:
    every rank reads them and every rank raises error_type if any could not)."""
    error, state = None, None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        error = _mismatch(path, state, meta)
    except FileNotFoundError:
        error = "checkpoint %s does not exist" % path
    except Exception as e:  # torch/zip/pickle errors of a damaged file
        error = ("checkpoint %s cannot be read (truncated, corrupted or not written by hpcdl "
                 "train; %s); delete it or resume from another" % (path, type(e).__name__))
    if error is None and STATE in state:
        try:
            state = dict(state, **sharded.read_single(beside(path, state[STATE]["dir"]),
                                                      KIND)[STATE])
        except ValueError as e:  # missing, cut short, damaged: files.py's one line
            error = str(e)
    comm.raise_if_any(error, error_type)
    return state


def beside(root, name):
    """The save directory `name` beside the checkpoint.pt at root; a
    ValueError with one line when it is not there."""
    path = os.path.join(os.path.dirname(os.path.abspath(root)), name)
    if not os.path.isdir(path):
        raise ValueError("%s names the save directory %s, which does not exist: a checkpoint "
                         "is checkpoint.pt and the directory it names together; copy or move "
                         "both" % (root, path))
    return path


class SaveDirs:
    """The save directories of a strategy's checkpoints: a fresh one per
    save, written before checkpoint.pt, so the rename of checkpoint.pt
    switches from one whole checkpoint to the next. Once checkpoint.pt names
    the new one (written()), rank 0 removes every other save directory in
    checkpoint_dir: older saves, a save cut short, an earlier run's (of any
    stage). Its errors are of class error_type (the trainer's ConfigError)."""
    error_type = CheckpointError

    def __init__(self, cfg, prefix):
        self.cfg, self.prefix = cfg, prefix
        self.current = None  # the directory of this run's latest save

    def save(self, write):
        """Collective: write(path) into a fresh directory (the same name on
        every rank); returns its name. An OSError on any rank (a full disk) is
        an error on every rank, and the partial directory is removed."""
        name = comm.bcast_object(sharded.new_dir_name(self.prefix))
        path = os.path.join(self.cfg.checkpoint_dir, name)
        try:
            write(path)
        except OSError as e:
            if comm.rank() == 0:
                shutil.rmtree(path, ignore_errors=True)
            raise self.error_type("could not write the sharded checkpoint (%s); the previous "
                              "checkpoint is unchanged" % e) from None
        self.current = name
        return name

    def save_state(self, state):
        """Collective: state (the same on every rank; rank 0's is written) as
        a one-file save; returns what checkpoint.pt holds in its place (load()
        merges it back)."""
        def write(path):
            error = None
            if comm.rank() == 0:
                try:
                    sharded.write_single(path, KIND, {STATE: state})
                except OSError as e:
                    error = str(e)
            comm.raise_if_any(error, OSError)
        return {STATE: {"dir": self.save(write)}}

    def written(self):
        """After checkpoint.pt names self.current: the other directories go."""
        if comm.rank() == 0 and self.current is not None:
            sharded.prune(self.cfg.checkpoint_dir, SAVE_DIRS, keep=self.current)

    def path_of(self, name):
        """Collective: the directory `name` beside the checkpoint.pt being
        resumed; an error on every rank when it is not there."""
        error, path = None, None
        try:
            path = beside(resumed_path(self.cfg), name)
        except ValueError as e:
            error = str(e)
        comm.raise_if_any(error, self.error_type)
        return path

    def load(self, name, read):
        """Collective: read(path of directory `name`), returned; the loaders'
        ValueError (raised on every rank alike) becomes error_type."""
        path = self.path_of(name)
        try:
            return read(path)
        except self.error_type:
            raise
        except ValueError as e:
            raise self.error_type(str(e)) from None


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
    # a checkpoint.pt of one piece holds AdaScale's state; with a save directory, its meta says
    adascale = state["adascale"] is not None if "adascale" in state else bool(
        old.get("adascale"))
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
