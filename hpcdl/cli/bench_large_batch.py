"""bench_large_batch.py - `hpcdl bench large-batch`: the options of
hpcdl/bench/large_batch.py (accuracy, steps and time to a target accuracy
against the global batch, per recipe, and the gradient noise scale).

    hpcdl bench large-batch -n 4 --batches 64,2048,8192 --recipes goyal,lars,plain \
        --epochs 10 --seeds 0,1,2 --json lb.json --plot lb.png
    hpcdl bench large-batch -n 4 --batches auto,64,1024,4096 --recipes plain   # + auto
    hpcdl bench large-batch -n 4 --batches 2048 --recipes lamb --modes allreduce,ddp-gloo
"""
from ..bench.large_batch import ALLREDUCE, AUTO, Options, run_values
from ..train import ConfigError, TrainConfig
from ..train.config import with_recipe
from .bench_common import run_or_launch
from .errors import UsageError
from .run import add_launch_args
from .train import prepare_data


def register(sub):
    p = sub.add_parser(
        "large-batch", help="accuracy and time to accuracy against the global batch",
        description="Trains the same model for the same epoch budget at every global "
                    "batch with every recipe and seed (one run after another on the job's "
                    "ranks), then prints per recipe x batch the final and best test accuracy "
                    "(mean over seeds), steps and training seconds to the target (read at "
                    "epoch ends), the gradient noise scale B_simple, and per recipe "
                    "McCandlish's fit S = S_min (1 + B_noise/B) with the measured critical "
                    "batch. The target is the baseline's accuracy (first recipe, smallest "
                    "batch) minus --target-drop, unless --target is given. The word auto "
                    "in --batches adds per recipe and seed a run with --global-batch auto "
                    "(docs/goodput.md: --lr-scaling adascale forced, the recipe's base batch, "
                    "the largest fixed batch the ceiling), its row's batch 'auto', compared "
                    "by its time to the target (docs/large_batch.md). --modes runs every "
                    "recipe x batch x seed once per way the gradients meet (hpcdl train "
                    "--mode) and compares their times to the target, e.g. hpcdl against "
                    "PyTorch DDP over gloo.",
        epilog="example: hpcdl bench large-batch -n 4 --batches 64,2048,8192 "
               "--recipes goyal,lars,plain --epochs 10 --plot lb.png")
    add_launch_args(p)
    p.add_argument("--batches", default="64,256,1024,2048,4096,8192",
                   help="global batch sizes, comma-separated (default 64,...,8192); the "
                        "word auto (anywhere) adds a --global-batch auto run per recipe, "
                        "next to at least one fixed batch")
    p.add_argument("--recipes", default="goyal,lars,lamb,plain",
                   help="recipes (configs/recipes/), the first is the baseline's "
                        "(default goyal,lars,lamb,plain)")
    p.add_argument("--seeds", default="0", help="seeds, comma-separated (default 0)")
    p.add_argument("--epochs", type=int, default=10, help="epoch budget of every run")
    p.add_argument("--data", default="mnist1d", help="as hpcdl train --data (default mnist1d)")
    p.add_argument("--model", default="cnn1d", help="as hpcdl train --model (default cnn1d)")
    p.add_argument("--warmup-epochs", type=float, default=None,
                   help="warmup of the recipes that warm up (goyal, lars, lamb; plain keeps "
                        "none); default: each recipe's own, capped at half of --epochs as hpcdl "
                        "train caps it")
    p.add_argument("--target", type=float, default=None,
                   help="target test accuracy (default: baseline's minus --target-drop)")
    p.add_argument("--target-drop", type=float, default=0.01,
                   help="target = baseline accuracy minus this (default 0.01: one point)")
    p.add_argument("--offline-noise-scale", type=int, default=16384, metavar="SAMPLES",
                   help="after each run that did not diverge, estimate B_simple offline at "
                        "its final weights from this many training samples, to check the "
                        "online value (default 16384; 0: no check)")
    p.add_argument("--modes", default="allreduce",
                   help="hpcdl train --mode of the runs, comma-separated (default allreduce); "
                        "e.g. allreduce,ddp-gloo adds PyTorch DDP over gloo with the same "
                        "recipes, batches and seeds, and a time-to-target comparison against "
                        "the first mode (auto runs: allreduce only)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="keep every run's metrics.jsonl and curves here")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write rows and runs as JSON (a value that is not finite, such as "
                        "a B_simple of inf, as the string \"inf\")")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="accuracy vs batch and steps-to-target vs batch")
    p.set_defaults(func=run)


def _batches(text):
    """(fixed batches ascending, whether auto was asked) from --batches."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    auto = "auto" in words
    fixed = [w for w in words if w != "auto"]
    if auto and not fixed:
        raise UsageError("--batches %r: give at least one fixed batch beside auto, e.g. "
                         "auto,64,1024 (the baseline and auto's ceiling are fixed batches)"
                         % text)
    if auto and words.count("auto") > 1:
        raise UsageError("--batches %r: give auto once" % text)
    try:
        values = [int(w) for w in fixed]
    except ValueError:
        raise UsageError("--batches %r: give integers (or the word auto) separated by commas, "
                         "e.g. auto,64,2048" % text)
    if not values or min(values) < 1:
        raise UsageError("--batches %r: give at least one value, each at least 1" % text)
    return sorted(set(values)), auto


def options(args):
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not recipes:
        raise UsageError("--recipes: give at least one recipe, e.g. goyal,lars")
    if args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if args.target is not None and not 0 < args.target <= 1:
        raise UsageError("--target %r: give an accuracy in (0, 1]" % args.target)
    if args.offline_noise_scale < 0:
        raise UsageError("--offline-noise-scale %d: give a sample count, or 0 for no check"
                         % args.offline_noise_scale)
    if not 0 <= args.target_drop < 1:
        raise UsageError("--target-drop %r: give a value in [0, 1)" % args.target_drop)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else [0]
    batches, auto = _batches(args.batches)
    modes = list(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))
    if not modes:
        raise UsageError("--modes: give at least one hpcdl train --mode, e.g. "
                         "allreduce,ddp-gloo")
    if auto and "allreduce" not in modes:  # auto runs only with hpcdl's own all-reduce
        raise UsageError("--batches auto runs with --mode allreduce only: add allreduce to "
                         "--modes (e.g. --modes allreduce,%s)" % modes[0])
    return Options(batches=batches, auto=auto, recipes=recipes, modes=modes,
                   seeds=seeds, epochs=args.epochs, data=args.data, model=args.model,
                   target=args.target, target_drop=args.target_drop,
                   warmup_epochs=args.warmup_epochs, out=args.out,
                   offline_samples=args.offline_noise_scale,
                   json=args.json, plot=args.plot)


def check_configs(opts, ranks=None):
    """Every run's config checked before any rank starts: a bad recipe, batch
    or data name is one line here, not an error on every rank later. An auto
    run is checked on `ranks` (default 2: AdaScale needs 2 or more)."""
    for recipe in opts.recipes:
        for batch in list(opts.batches) + [AUTO] * bool(opts.auto):
            size = (ranks or 2) if batch == AUTO else 1
            for mode in opts.modes if batch != AUTO else [ALLREDUCE]:
                values = run_values(opts, recipe, batch, 0, None, mode)
                try:
                    with_recipe(TrainConfig(**values)).check(size)
                except ConfigError as e:
                    raise UsageError("recipe %s, batch %s%s: %s" % (
                        recipe, batch, "" if mode == ALLREDUCE else ", mode " + mode, e))


def run(args):
    opts = options(args)
    check_configs(opts, args.n)
    return run_or_launch(args, "large-batch", (
        "batches", "recipes", "seeds", "epochs", "data", "model", "warmup_epochs", "target",
        "target_drop", "offline_noise_scale", "modes", "out", "json", "plot"), opts,
        before_launch=lambda: prepare_data(opts.data))  # generated data: once, with every CPU
