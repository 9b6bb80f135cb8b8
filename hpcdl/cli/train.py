"""train.py - `hpcdl train`: the built-in trainer (synchronous data-parallel SGD,
or parameter-server modes), configured by flags and an optional config file.

    hpcdl train -n 4                        # relaunches itself on 4 ranks through mpirun
    mpirun -n 4 hpcdl train                 # or srun: trains on the ranks it was given
    hpcdl train -n 4 --config configs/digits-large-lars.yaml --out runs/lars

With -n outside an MPI or Slurm job step, the command starts
`python -m hpcdl train ...` on N ranks (the same options, without -n) and
returns its exit code; otherwise it trains in this process and its peers.
Every setting and path (--out, --checkpoint-dir, --resume, --data, --stage-to)
is checked before anything starts: in the launching shell, then on every rank
before its first collective (train/validate.py); each problem is one line
'hpcdl: error: ...' ('hpcdl: error: [rank R] ...' on each of several ranks,
also for what the ranks refuse together later, such as a checkpoint that
does not fit) and the status is 2.
"""
import argparse
import signal
import sys

from ..train.config import (LR_SCALING, MODES, OPTIMIZERS, PRECISIONS, RECIPES, SCHEDULES,
                            TRAIN_MODELS, ConfigError, TrainConfig, load_file, parse_bool,
                            resolve)
from ..utils.rankenv import torchrun_env
from .errors import UsageError
from .run import add_launch_args
from .. import comm, train
from ..train import validate
from ..train.stop import late_signals_noted

# other spellings of a flag: --lr is the learning rate people type (issue 32)
ALIASES = {"--base-lr": ("--lr",)}

# flag, TrainConfig field, parser, help (defaults come from TrainConfig)
OPTIONS = (
    ("--model", "model", str, "model: " + ", ".join(TRAIN_MODELS)),
    ("--hidden", "hidden", "ints", "MLP hidden layer widths, comma-separated"),
    ("--data", "data", str, "digits | mnist1d[:N] (N generated samples, default 1M, "
                            "cached; docs/data.md) | synthetic:CxHxW:CLASSES:SAMPLES | a "
                            "directory of HDF5 shards from `hpcdl data shard`"),
    ("--workers", "workers", int, "DataLoader worker processes per rank (shard data)"),
    ("--stage-to", "stage_to", str, "copy the shards to node-local storage first "
                                    "(e.g. /dev/shm or $TMPDIR)"),
    ("--recipe", "recipe", str, "named settings of optimizer, lr at a base batch, scaling, "
                                "warmup, decay (configs/recipes/NAME.yaml): "
                                + ", ".join(RECIPES)),
    ("--epochs", "epochs", int, "passes over the training set"),
    ("--global-batch", "global_batch", "batch", "samples per step over all ranks; a "
                                                "multiple of the rank count; auto: re-picked "
                                                "as it trains for goodput (docs/goodput.md)"),
    ("--max-global-batch", "max_global_batch", int, "the largest batch --global-batch auto "
                                                    "picks (default 16 x --base-batch)"),
    ("--repick-steps", "repick_steps", int, "--global-batch auto re-picks every this many "
                                            "steps within an epoch, and at its end (0: at "
                                            "epoch ends only; default 200)"),
    ("--optimizer", "optimizer", str, "optimizer: " + ", ".join(OPTIMIZERS)),
    ("--base-lr", "base_lr", float, "learning rate at --base-batch samples"),
    ("--base-batch", "base_batch", int, "the batch --base-lr is meant for"),
    ("--lr-scaling", "lr_scaling", str, "scale the lr to the global batch: "
                                        + ", ".join(LR_SCALING)),
    ("--momentum", "momentum", float, "momentum (SGD, LARS, LARC)"),
    ("--weight-decay", "weight_decay", float, "L2 weight decay"),
    ("--no-decay-bias-norm", "no_decay_bias_norm", "bool", "no weight decay on biases and "
                                                           "norm parameters (always with "
                                                           "lars, lamb)"),
    ("--label-smoothing", "label_smoothing", float, "training loss with smoothed targets, "
                                                    "0 <= EPS < 1"),
    ("--trust-coefficient", "trust_coefficient", float, "LARS / LARC trust coefficient "
                                                        "(default 0.001 / 0.02)"),
    ("--warmup-epochs", "warmup_epochs", float, "linear lr warmup over this many epochs"),
    ("--warmup-start-lr", "warmup_start_lr", float, "lr at the start of warmup (default "
                                                    "--base-lr)"),
    ("--schedule", "schedule", str, "lr after warmup: " + ", ".join(SCHEDULES)),
    ("--milestones", "milestones", "ints", "step schedule: epochs where lr *= 0.1, "
                                           "comma-separated"),
    ("--compression", "compression", str, "gradient compression: none, fp16, bf16, "
                                          "topk:RATIO"),
    ("--precision", "precision", str, "compute precision: " + ", ".join(PRECISIONS)),
    ("--mode", "mode", str, "how gradients meet: " + ", ".join(MODES)),
    ("--staleness", "staleness", int, "ps-ssp: steps a worker may run ahead"),
    ("--ps-ranks", "ps_ranks", int, "ps-*: ranks that serve parameters"),
    ("--zero", "zero", int, "ZeRO stage with --mode allreduce: 0 unsharded, 1 optimizer "
                            "state sharded, 2 also gradients, 3 also parameters (docs/zero.md)"),
    ("--seed", "seed", int, "seed for weights, data split and shuffles"),
    ("--target-accuracy", "target_accuracy", float, "record the time, steps and epochs until "
                                                    "the test accuracy first reaches this "
                                                    "(0 < A <= 1)"),
    ("--stop-at-target", "stop_at_target", "bool", "end the run at the epoch the test "
                                                   "accuracy first reaches --target-accuracy "
                                                   "(as MLPerf's time-to-train runs do)"),
    ("--checkpoint-dir", "checkpoint_dir", str, "write checkpoint.pt here"),
    ("--checkpoint-every", "checkpoint_every", int, "epochs between checkpoints"),
    ("--out", "out", str, "directory for metrics.jsonl, summary.json, curves.png, "
                          "model.pt (rank 0)"),
)

EPILOG = """\
examples:
  hpcdl train -n 4 --epochs 30 --global-batch 128 --out runs/digits
  hpcdl train -n 4 --config configs/digits-large-lars.yaml
  hpcdl train -n 4 --data mnist1d:200000 --model cnn1d --recipe lamb \\
      --global-batch 2048 --target-accuracy 0.98
  hpcdl train -n 2 --model resnet18 --data synthetic:3x32x32:10:2048 --precision bf16

checkpoints: with --checkpoint-dir, checkpoint.pt is replaced atomically every
--checkpoint-every epochs. SIGUSR1 or SIGTERM to any rank stops every rank
after the same step, saves a checkpoint and exits 0 (a finished run writes
summary.json, a stopped one does not). --resume continues from
--checkpoint-dir/checkpoint.pt when it exists (else starts fresh); --resume
PATH from that file. A resumed run ends with the parameters of a run that was
never stopped. checkpoint.pt names a save directory beside it that holds
the model and optimizer state (at --zero 1-3 one file per rank, each its
shard): keep them together."""


def _ints(example):
    """The parser of a comma-separated integer flag; its error shows example."""
    def parse(text):
        try:
            return tuple(int(w) for w in text.split(",") if w.strip())
        except ValueError:
            raise argparse.ArgumentTypeError("%r: give comma-separated integers like %s"
                                             % (text, example))
    return parse


INT_EXAMPLES = {"hidden": "256,128", "milestones": "10,20"}


def _bool(text):
    try:
        return parse_bool(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r: give true or false (or the flag alone for true)"
                                         % text)


def _batch(text):
    """--global-batch: an integer or auto."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r: give an integer like 128, or auto" % text)


def register(sub):
    p = sub.add_parser(
        "train", help="train a model with data-parallel SGD",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a model: every rank computes gradients on its slice of each "
                    "global batch, hpcdl all-reduces their average (or a parameter server "
                    "applies them), every rank takes the same step. Rank 0 shows progress, "
                    "one line per epoch and a summary.",
        epilog=EPILOG)
    add_launch_args(p)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="YAML or TOML file with the same keys as the flags (it overrides "
                        "the recipe; flags override both)")
    for flag, name, kind, text in OPTIONS:
        default = getattr(TrainConfig, name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        extra = dict(nargs="?", const=True) if kind == "bool" else {}
        p.add_argument(flag, *ALIASES.get(flag, ()), dest=name,
                       type=_ints(INT_EXAMPLES[name]) if kind == "ints"
                       else _bool if kind == "bool" else _batch if kind == "batch" else kind,
                       default=argparse.SUPPRESS, help="%s (default: %s)" % (text, shown),
                       **extra)
    p.add_argument("--resume", nargs="?", const="auto", default=argparse.SUPPRESS,
                   metavar="PATH", help="continue from a checkpoint (default: "
                                        "--checkpoint-dir/checkpoint.pt if it exists)")
    p.set_defaults(func=run)


def explicit(args):
    """{field: value} of the options given on the command line."""
    names = [name for _, name, _, _ in OPTIONS] + ["resume"]
    return {n: getattr(args, n) for n in names if hasattr(args, n)}


def config_from_args(args):
    """defaults < recipe < config file < flags (train/config.resolve)."""
    return resolve(load_file(args.config) if args.config else {}, explicit(args))


def forwarded_args(args):
    """The options again as strings, for the relaunched ranks (everything but -n, -H)."""
    out = ["--config", args.config] if args.config else []
    flags = {name: flag for flag, name, _, _ in OPTIONS}
    flags["resume"] = "--resume"
    for name, value in explicit(args).items():
        out += [flags[name], ",".join(map(str, value)) if isinstance(value, tuple)
                else str(value)]
    return out


def run(args):
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        raise UsageError(str(e))
    # looked up on use: tests replace hpcdl.cli.run's launch and inside_parallel_job
    from .run import default_ranks, inside_parallel_job, launch, launch_options
    n = default_ranks(args.n)  # no -n in an sbatch script: the allocation's tasks
    if n is not None and not inside_parallel_job():
        _check(cfg, n)  # fail once here, in one line per problem, rather than per rank
        prepare_data(cfg.data)
        cmd = [sys.executable, "-m", "hpcdl", "train"] + forwarded_args(args)
        # SIGTERM to this process reaches the ranks as SIGUSR1: the same clean stop
        # (checkpoint, exit 0), without mpirun ending the job under the checkpoint
        return launch(n, cmd, term_as=signal.SIGUSR1, **launch_options(args))
    _check(cfg, None, on_rank=True)  # before MPI starts: this rank's node may see other files
    late_signals_noted()
    if args.n is not None and args.n != comm.size():
        comm.warn("-n %d ignored: this job has %d rank(s)" % (args.n, comm.size()))
    try:
        train.train(cfg)  # checks cfg against this job's ranks first
    except ConfigError as e:  # raised on every rank alike: each line says whose it is
        lines = str(e).splitlines()
        if comm.size() > 1:
            lines = ["[rank %d] %s" % (comm.rank(), line) for line in lines]
        raise UsageError("\n".join(lines))
    return 0


def prepare_data(spec):
    """Generated data (MNIST-1D) is made here, once, before the ranks start
    (hpcdl train -n and hpcdl bench large-batch -n)."""
    from ..train.data import prepare  # on use: loads numpy
    try:
        prepare(spec)
    except ConfigError as e:
        raise UsageError(str(e))


def _check(cfg, size, on_rank=False):
    """UsageError naming every problem of cfg, one line each: its paths
    (validate.problems) and, given the rank count size, its values. on_rank:
    the lines start with the launcher's rank."""
    lines = []
    if size is not None:
        try:
            cfg.check(size)
        except ConfigError as e:
            lines.append(str(e))
    lines += [p for p in validate.problems(cfg) if p not in lines]
    if lines and on_rank and torchrun_env():
        rank = torchrun_env().get("RANK", "?")  # the launcher's: MPI is not up yet
        lines = ["[rank %s] %s" % (rank, line) for line in lines]
    if lines:
        raise UsageError("\n".join(lines))
