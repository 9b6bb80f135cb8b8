"""train.py - `hpcdl train`: the built-in trainer (synchronous data-parallel SGD).

    hpcdl train -n 4              # relaunches itself on 4 ranks through mpirun
    mpirun -n 4 hpcdl train       # or srun: trains on the ranks it was given

With -n outside an MPI or Slurm job, the command starts
`python -m hpcdl train ...` on N ranks (same options, without -n) and returns
its exit code; otherwise it trains in this process and its peers.
"""
import argparse
import sys

from ..train.config import ConfigError, TrainConfig
from .main import UsageError
from .run import add_launch_args

# flag, TrainConfig field, argparse type, help (defaults come from TrainConfig)
OPTIONS = (
    ("--model", "model", str, "model to train"),
    ("--hidden", "hidden", None, "hidden layer widths, comma-separated"),
    ("--data", "data", str, "data set (built in: no download)"),
    ("--epochs", "epochs", int, "passes over the training set"),
    ("--global-batch", "global_batch", int, "samples per step over all ranks; a multiple "
                                            "of the rank count"),
    ("--base-lr", "base_lr", float, "learning rate"),
    ("--optimizer", "optimizer", str, "optimizer"),
    ("--momentum", "momentum", float, "SGD momentum"),
    ("--seed", "seed", int, "seed for weights, data split and shuffles"),
    ("--out", "out", str, "directory for metrics.jsonl (written by rank 0)"),
)


def _widths(text):
    try:
        return tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("%r: give comma-separated integers like 256,128"
                                         % text)


def register(sub):
    p = sub.add_parser(
        "train", help="train a model with synchronous data-parallel SGD",
        description="Train a model on a built-in data set: every rank computes gradients "
                    "on its slice of each global batch, hpcdl all-reduces their average, "
                    "every rank takes the same step. Rank 0 prints one line per epoch and "
                    "a summary.",
        epilog="example: hpcdl train -n 4 --epochs 30 --global-batch 128 --out runs/digits")
    add_launch_args(p)
    for flag, field, kind, text in OPTIONS:
        default = getattr(TrainConfig, field)
        if field == "hidden":
            kind, default = _widths, ",".join(map(str, default))
        p.add_argument(flag, dest=field, type=kind, default=default,
                       help=text + " (default: %(default)s)")
    p.set_defaults(func=run)


def config_from_args(args):
    return TrainConfig(**{field: getattr(args, field) for _, field, _, _ in OPTIONS})


def forwarded_args(args):
    """The options again as strings, for the relaunched ranks (everything but -n, -H)."""
    out = []
    for flag, field, _, _ in OPTIONS:
        value = getattr(args, field)
        if value is None:
            continue
        out += [flag, ",".join(map(str, value)) if field == "hidden" else str(value)]
    return out


def run(args):
    cfg = config_from_args(args)
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    from .run import inside_parallel_job, launch
    if args.n is not None and not inside_parallel_job():
        _check(cfg, args.n)  # fail once here rather than once per rank
        cmd = [sys.executable, "-m", "hpcdl", "train"] + forwarded_args(args)
        return launch(args.n, cmd, args.hosts)
    from .. import comm, train
    if args.n is not None and args.n != comm.size():
        comm.warn("-n %d ignored: this job has %d rank(s)" % (args.n, comm.size()))
    try:
        train.train(cfg)  # checks cfg against this job's ranks first
    except ConfigError as e:
        raise UsageError(str(e))
    return 0


def _check(cfg, size):
    try:
        cfg.check(size)
    except ConfigError as e:
        raise UsageError(str(e))
