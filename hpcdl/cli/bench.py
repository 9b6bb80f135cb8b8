"""bench.py - `hpcdl bench BENCHMARK`: the group of benchmarks (allreduce for
now; train, data and calibrate later). Each benchmark parses and checks its
options here, relaunches itself on -n ranks when not already inside an MPI or
Slurm job, and runs the module in hpcdl/bench/ on the ranks.

    hpcdl bench allreduce -n 2 --max-bytes 64M --json out.json --plot busbw.png
"""
import importlib
import sys

from .errors import UsageError
from .run import add_launch_args
from . import run as launcher
from .bench_common import abort_on_error, run_or_launch

# hpcdl/cli/bench_<name>.py with register(sub)
EXTRA_BENCHMARKS = ["calibrate", "data", "large_batch", "embedding"]
DEFAULT_ALGORITHMS = "ring,hier,auto,shared,mpi,mpi4py,gloo"


def register(subparsers):
    p = subparsers.add_parser(
        "bench", help="benchmarks (allreduce, train, calibrate, data, large-batch, "
                      "embedding)",
        description="Benchmarks that print nccl-tests-shaped tables and check "
                    "correctness in the same run.")
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    p.set_defaults(func=lambda args: _help(p))
    _register_allreduce(sub)
    _register_train(sub)
    # benchmarks that live beside their subsystem: hpcdl/cli/bench_<name>.py
    for name in EXTRA_BENCHMARKS:
        importlib.import_module("hpcdl.cli.bench_" + name).register(sub)


def _help(parser):
    parser.print_help()
    return 2


# ----------------------------------------------------------------------------
# bench allreduce

def _register_allreduce(sub):
    p = sub.add_parser(
        "allreduce", help="hpcdl's all-reduce against MPI_Allreduce and gloo",
        description="Times hpcdl's all-reduce algorithms (ring, hier, auto, shared: auto on a "
                    "buffer in node shared memory, mpi), "
                    "MPI_Allreduce through mpi4py and torch.distributed gloo on the same "
                    "buffers, one row per size and implementation, checks every result "
                    "and exits 1 on a wrong value.",
        epilog="example: hpcdl bench allreduce -n 2 --max-bytes 64M --plot busbw.png")
    add_launch_args(p)
    p.add_argument("--min-bytes", default="4", help="smallest message (4, 4K, 1M; default 4)")
    p.add_argument("--max-bytes", default="256M", help="largest message (default 256M)")
    p.add_argument("--factor", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("--dtype", default="float32", help="float32|float64|int32|int64")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                   help="comma-separated, of %s (default %s); also async,hvd,torch: the hpcdl "
                        "backend's cost per call (torch.distributed.all_reduce on backend hpcdl "
                        "against hpcdl's own async call and the Horovod API)"
                        % (DEFAULT_ALGORITHMS, DEFAULT_ALGORITHMS))
    p.add_argument("--iters", type=int, default=50,
                   help="most timed iterations per row; fewer for big sizes (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="most warm-up iterations (default 5)")
    p.add_argument("--time-budget", type=float, default=1.0, metavar="SECONDS",
                   help="about how long one row's timed loop may take (default 1.0)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: host buffers (default); cuda: CUDA tensors, one GPU per "
                        "local rank (the core's CUDA path; mpi4py only on a CUDA-aware MPI)")
    p.add_argument("--no-check", action="store_true",
                   help="turn hpcdl's cross-rank agreement check off (as HPCDL_CHECK=0)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the rows as CSV")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="busbw against size")
    p.set_defaults(func=run_allreduce)


def allreduce_options(args):
    """The parsed arguments as hpcdl.bench.allreduce.Options; UsageError if bad."""
    from ..bench import allreduce  # on use: loads numpy
    try:
        opts = allreduce.Options(
            min_bytes=allreduce.parse_size(args.min_bytes),
            max_bytes=allreduce.parse_size(args.max_bytes), factor=args.factor,
            dtype=args.dtype,
            impls=tuple(a.strip() for a in args.algorithms.split(",") if a.strip()),
            iters=args.iters, warmup=args.warmup, budget_s=args.time_budget,
            check=not args.no_check, json=args.json, csv=args.csv, plot=args.plot,
            expect_ranks=args.n, device=args.device)
        allreduce.validate(opts)
    except ValueError as e:
        raise UsageError(str(e))
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    return opts


def allreduce_argv(args):
    """The command line that repeats this benchmark on the launched ranks (no -n)."""
    argv = ["--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
            "--factor", str(args.factor), "--dtype", args.dtype,
            "--algorithms", args.algorithms, "--iters", str(args.iters),
            "--warmup", str(args.warmup), "--time-budget", repr(args.time_budget),
            "--device", args.device]
    argv += ["--no-check"] if args.no_check else []
    for flag in ("json", "csv", "plot"):
        if getattr(args, flag):
            argv += ["--" + flag, getattr(args, flag)]
    return [sys.executable, "-m", "hpcdl", "bench", "allreduce"] + argv


def run_allreduce(args):
    opts = allreduce_options(args)
    if args.n is not None and not launcher.inside_parallel_job():
        options = launcher.launch_options(args)
        if not options["hosts"] and not launcher.inside_slurm_allocation():
            from ..bench import device  # the ranks run here: refuse before launching
            problem = device.unavailable(args.device)
            if problem:
                raise UsageError(problem)
        return launcher.launch(args.n, allreduce_argv(args), **options)
    from ..bench import allreduce  # on use: loads numpy
    return abort_on_error(allreduce.run, opts)


# ----------------------------------------------------------------------------
# bench train

def _register_train(sub):
    p = sub.add_parser(
        "train", help="DistributedOptimizer against PyTorch DDP (gloo)",
        description="Trains the same model on the same data from the same seed under "
                    "hpcdl's DistributedOptimizer, under PyTorch DDP with gloo, and with no "
                    "communication at all (the compute floor); prints samples/s, the "
                    "hpcdl/DDP ratio and the share of hpcdl's communication hidden behind "
                    "backward, and checks that both end with the same parameters. "
                    "--backend hpcdl,gloo instead: DDP (and FSDP2 with --wrap) on each "
                    "torch.distributed backend; --zero: hpcdl's ZeRO stages.",
        epilog="examples: hpcdl bench train -n 2 --model mlp --steps 20; "
               "hpcdl bench train -n 2 --backend hpcdl,gloo --wrap ddp,fsdp2")
    add_launch_args(p)
    p.add_argument("--model", default="mlp", choices=["mlp", "resnet18", "resnet50", "tiny"],
                   help="mlp (1024-4096-2048-10), resnet18, resnet50 (32x32 input) or tiny "
                        "(32-48-24-10, for tests) (default mlp)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps (default 20; 5 with --backend on a ResNet)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first (default 3; 2 with --backend on a ResNet)")
    p.add_argument("--batch", type=int, default=None,
                   help="samples per rank per step (default 32; 8 with --backend on a ResNet)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: cores / ranks on the node)")
    p.add_argument("--repeats", type=int, default=None,
                   help="run every implementation this many times, interleaved, and "
                        "report medians and the range (default 3; 2 with --backend on a "
                        "ResNet): one run on a shared machine is not a measurement")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="hpcdl's fusion bucket size in MiB after the 1 MiB first one "
                        "(default: HPCDL_FUSION_THRESHOLD's, 25)")
    p.add_argument("--noise-scale", action="store_true",
                   help="also time DistributedOptimizer(noise_scale=True) (the gradient noise "
                        "scale measured every step) in the same rotation: its cost per step")
    p.add_argument("--zero", default=None, metavar="STAGES",
                   help="ZeRO instead: hpcdl's stages (comma-separated, of 0,1,2,3) with Adam "
                        "against DistributedOptimizer, ZeroRedundancyOptimizer and FSDP2 on "
                        "gloo; samples/s and bytes held per rank (docs/zero.md)")
    p.add_argument("--backend", default=None, metavar="LIST",
                   help="the same PyTorch code (DDP; FSDP2 with --wrap) on each "
                        "torch.distributed backend of the comma-separated list, of hpcdl,gloo "
                        "(docs/torch_distributed.md): samples/s per backend, hpcdl/gloo ratio")
    p.add_argument("--wrap", default=None, metavar="LIST",
                   help="with --backend: ddp, fsdp2 or ddp,fsdp2 (default ddp)")
    p.add_argument("--profile", action="store_true",
                   help="with --backend: also time hpcdl's DistributedOptimizer, and print "
                        "where each step's time goes (forward, backward, the backend's calls, "
                        "the engine's queue/negotiate/communicate, the finisher's hand-off)")
    p.set_defaults(func=run_train)


# bench train's sizes; with --backend a ResNet gets a run of under a minute on 2 cores
TRAIN_DEFAULTS = dict(steps=20, warmup=3, batch=32, repeats=3)
BACKEND_RESNET_DEFAULTS = dict(steps=5, warmup=2, batch=8, repeats=2)


def run_train(args):
    sizes = (BACKEND_RESNET_DEFAULTS if args.backend is not None and
             args.model.startswith("resnet") else TRAIN_DEFAULTS)
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("steps", "batch", "repeats"):
        if getattr(args, name) < 1:
            raise UsageError("--%s must be at least 1" % name)
    if args.fusion_mb is not None and args.fusion_mb < 0:
        raise UsageError("--fusion-mb must be >= 0 (got %g)" % args.fusion_mb)
    if args.warmup < 1:
        raise UsageError("--warmup must be at least 1 (the first steps build buffers)")
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    stages = _zero_stages(args.zero) if args.zero is not None else None
    backends, wraps = _backend_options(args)
    if stages is not None and args.fusion_mb is not None:
        raise UsageError("--fusion-mb is not taken with --zero (its runs use the default "
                         "fusion buckets); drop one of them")
    if stages is not None and args.noise_scale:
        raise UsageError("--noise-scale is not taken with --zero (it times "
                         "DistributedOptimizer at stage 0); drop one of them")
    if args.n is not None and not launcher.inside_parallel_job():
        argv = [sys.executable, "-m", "hpcdl", "bench", "train", "--model", args.model,
                "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--batch", str(args.batch), "--threads", str(args.threads),
                "--repeats", str(args.repeats)]
        argv += ["--json", args.json] if args.json else []
        argv += ["--fusion-mb", str(args.fusion_mb)] if args.fusion_mb is not None else []
        argv += ["--zero", args.zero] if args.zero is not None else []
        argv += ["--noise-scale"] if args.noise_scale else []
        argv += ["--backend", args.backend] if args.backend is not None else []
        argv += ["--wrap", args.wrap] if args.wrap is not None else []
        argv += ["--profile"] if args.profile else []
        return launcher.launch(args.n, argv, **launcher.launch_options(args))
    if args.zero is not None:
        return abort_on_error(*zero_options(args, stages))
    if backends is not None:
        from ..bench import ddp  # on use: loads MPI and numpy and torch and tqdm
        return abort_on_error(ddp.run, ddp.Options(
            model=args.model, backends=backends, wraps=wraps, steps=args.steps,
            warmup=args.warmup, batch=args.batch, threads=args.threads,
            repeats=args.repeats, json=args.json, profile=args.profile))
    from ..bench import train  # on use: loads MPI and numpy and torch and tqdm
    opts = train.Options(model=args.model, steps=args.steps, warmup=args.warmup,
                         batch=args.batch, threads=args.threads, repeats=args.repeats,
                         json=args.json, fusion_mb=args.fusion_mb,
                         noise_scale=args.noise_scale)
    return abort_on_error(train.run, opts)


def _listed(text, allowed, flag):
    """'a,b' -> ('a', 'b') in the given order, each one of allowed, or a UsageError."""
    items = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise UsageError("%s: %s; use a comma-separated list of %s"
                         % (flag, "unknown %s" % ", ".join(map(repr, bad)) if bad
                            else "nothing given", ",".join(allowed)))
    return items


def _backend_options(args):
    """(backends, wraps) of --backend/--wrap, or (None, None) without --backend;
    UsageError for a bad list or an option that bench train --backend does not take."""
    if args.backend is None:
        if args.wrap is not None:
            raise UsageError("--wrap needs --backend (e.g. --backend hpcdl,gloo --wrap ddp,fsdp2)")
        if args.profile:
            raise UsageError("--profile needs --backend (e.g. --backend hpcdl,gloo --profile)")
        return None, None
    from ..bench.ddp import BACKENDS, WRAPS  # on use: loads MPI and numpy and torch and tqdm
    for flag, given in (("--zero", args.zero is not None), ("--noise-scale", args.noise_scale),
                        ("--fusion-mb", args.fusion_mb is not None)):
        if given:
            raise UsageError("%s is not taken with --backend (it times hpcdl's own API; "
                             "--backend times DDP/FSDP2 per torch.distributed backend); drop "
                             "one of them" % flag)
    return (_listed(args.backend, BACKENDS, "--backend"),
            _listed(args.wrap or "ddp", WRAPS, "--wrap"))


def _zero_stages(text):
    """'0,1,2,3' -> (0, 1, 2, 3), or a one-line UsageError (parsed here, before
    the launch, so a bad list never starts ranks)."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UsageError("--zero needs a comma-separated list of stages of 0,1,2,3")
    for s in items:
        if not s.isdigit() or int(s) > 3:
            raise UsageError("--zero: stage %r is not one of 0, 1, 2, 3 (0 unsharded, 1 "
                             "optimizer state, 2 + gradients, 3 + parameters sharded)" % s)
    return tuple(sorted(set(int(s) for s in items)))


def zero_options(args, stages):
    """(hpcdl.bench.zero.run, its Options) for `bench train --zero`."""
    from ..bench import zero  # on use: loads MPI and numpy and torch and tqdm
    return zero.run, zero.Options(model=args.model, stages=stages, steps=args.steps,
                                  warmup=args.warmup, batch=args.batch, threads=args.threads,
                                  repeats=args.repeats, json=args.json)
