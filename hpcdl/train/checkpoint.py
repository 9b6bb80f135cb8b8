"""checkpoint.py - the trainer's checkpoints: every rank's state in hpcdl's
one sharded format (utils/sharded.py), committed by checkpoint.pt, written
atomically by rank 0; read back with torch.load(weights_only=True) (tensors
and plain values only, no arbitrary pickle), checked against the run before
anything is restored.

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
                                   their optimizer state) and a manifest
                                   (hpcdl/torch/zero); checkpoint.pt keeps the
                                   rest (train/zero.py)

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
optimizer, seed, --mode, the --zero stage (stage_mismatch: 1 and 2 resume
each other and 0; 3 only its own), and whether the checkpoint was written under
--global-batch auto (a run with it adopts the checkpoint's batch) and under
--lr-scaling adascale. Then the save directory is read; a missing, partial
or damaged one is a one-line ConfigError on every rank.
"""
import os
import shutil

import torch

from .. import comm
from ..utils import sharded
from ..utils.atomic import atomic_open
from .errors import ConfigError

FORMAT = 1
FILENAME = "checkpoint.pt"
STATE = "state"  # checkpoint.pt's key naming the save directory of the strategy's state
KIND = "train"   # that directory's manifest kind
SAVE_DIRS = "state|zero[123]"  # the prefixes of SaveDirs' directories (utils/sharded.py names)


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
            "adascale": cfg.lr_scaling == "adascale", "zero": cfg.zero,
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
    """The checkpoint at path, checked against this run, with the strategy's
    state from the save directory it names merged in (collective: every rank
    reads them and every rank raises ConfigError if any rank could not)."""
    error, state = None, None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        error = _mismatch(path, state, meta_of(cfg, model))
    except FileNotFoundError:
        error = "checkpoint %s does not exist" % path
    except Exception as e:  # torch/zip/pickle errors of a damaged file
        error = ("checkpoint %s cannot be read (truncated, corrupted or not written by hpcdl "
                 "train; %s); delete it or resume from another" % (path, type(e).__name__))
    if error is None and STATE in state:
        try:
            state = dict(state, **sharded.read_single(beside(path, state[STATE]["dir"]),
                                                      KIND)[STATE])
        except ValueError as e:  # missing, cut short, damaged: sharded.py's one line
            error = str(e)
    comm.raise_if_any(error, ConfigError)
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
    stage)."""

    def __init__(self, cfg, prefix):
        self.cfg, self.prefix = cfg, prefix
        self.current = None  # the directory of this run's latest save

    def save(self, write):
        """Collective: write(path) into a fresh directory (the same name on
        every rank); returns its name. An OSError on any rank (a full disk) is
        a ConfigError on every rank, and the partial directory is removed."""
        name = comm.bcast_object(sharded.new_dir_name(self.prefix))
        path = os.path.join(self.cfg.checkpoint_dir, name)
        try:
            write(path)
        except OSError as e:
            if comm.rank() == 0:
                shutil.rmtree(path, ignore_errors=True)
            raise ConfigError("could not write the sharded checkpoint (%s); the previous "
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
        resumed; a ConfigError on every rank when it is not there."""
        error, path = None, None
        try:
            path = beside(resumed_path(self.cfg), name)
        except ValueError as e:
            error = str(e)
        comm.raise_if_any(error, ConfigError)
        return path

    def load(self, name, read):
        """Collective: read(path of directory `name`); the loaders' ValueError
        (raised on every rank alike) becomes the trainer's ConfigError."""
        try:
            read(self.path_of(name))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _mismatch(path, state, meta):
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return "%s is not an hpcdl train checkpoint (format %d)" % (path, FORMAT)
    old = state["meta"]
    was = old.get("mode", meta["mode"])  # checkpoints before the mode was recorded
    if _family(was) != _family(meta["mode"]):
        return ("checkpoint %s was written by a run with --mode %s, this run has --mode %s; "
                "%s checkpoints are not resumed by %s runs: resume with --mode %s"
                % (path, was, meta["mode"], _family(was), _family(meta["mode"]), was))
    stage = stage_mismatch(path, state, meta["zero"])
    if stage:
        return stage
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


# the --zero stages whose checkpoints each stage resumes: 1 and 2 shard the
# optimizer alike and take a whole one too; 3 shards the model itself
RESUMES = {0: (0,), 1: (0, 1, 2), 2: (0, 1, 2), 3: (3,)}


def saved_stage(state):
    """The --zero stage checkpoint.pt's state was written at (any hpcdl's:
    read from the entries that name its shard directory)."""
    if "zero3" in state:
        return 3
    return state["zero12"]["stage"] if "zero12" in state else 0


def stage_mismatch(path, state, stage):
    """None when a run at --zero `stage` can resume state (checkpoint.pt's),
    else the one line that says which stage can."""
    was = saved_stage(state)
    if was in RESUMES[stage]:
        return None
    if was == 3:
        return ("checkpoint %s holds a model sharded by --zero 3; resume it with --zero 3 (on "
                "any rank count)" % path)
    if stage == 3:
        return ("checkpoint %s holds an unsharded model (written with --zero %d); --zero 3 "
                "resumes only its own sharded checkpoints: resume it with --zero %s"
                % (path, was, "1 or 2" if was else "0, 1 or 2"))
    return ("checkpoint %s holds an optimizer sharded by --zero %d; resume it with --zero 1 "
            "or 2 (on any rank count)" % (path, was))


def _family(mode):
    """The kind of state a --mode checkpoints: hpcdl's replicas, DDP's (either
    backend: they resume each other's) or a parameter server's."""
    if mode == "allreduce":
        return "all-reduce"
    return "DDP" if mode.startswith("ddp-") else "parameter-server"


def _show(v):
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)
