"""bench_calibrate.py - `hpcdl bench calibrate`: measure alpha, beta (and
gamma) on this machine or allocation for the cost model (hpcdl.sim).
Relaunches itself on -n ranks like the other benchmarks; the measurement is
hpcdl/sim/calibrate.py.

    hpcdl bench calibrate -n 2 --json calibration.json
"""
import sys

from .errors import UsageError
from .run import add_launch_args
from . import run as launcher
from .bench_common import abort_on_error


def register(sub):
    p = sub.add_parser(
        "calibrate", help="measure alpha and beta for the cost model (hpcdl sim)",
        description="Times MPI point-to-point ping-pong between rank 0 and a rank on the "
                    "same host (and one on another host, when the job spans hosts) over "
                    "sizes 0..64 MiB, fits t = alpha + beta*m by least squares and prints "
                    "the table, the fit's R^2 and each size's error; also fits gamma, the "
                    "reduction's time per byte. --allreduce also times hpcdl's ring "
                    "all-reduce and prints it against the model's prediction. Needs at "
                    "least 2 ranks. The JSON feeds 'hpcdl sim scaling --calibration'.",
        epilog="examples: hpcdl bench calibrate -n 2 --allreduce --json cal.json; then "
               "hpcdl bench calibrate -n 4 --predict-from cal.json (the 4-rank ring "
               "against the 2-rank calibration)")
    add_launch_args(p)
    p.add_argument("--min-bytes", default="0", help="smallest message (default 0)")
    p.add_argument("--max-bytes", default="64M", help="largest message (default 64M)")
    p.add_argument("--factor", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("--iters", type=int, default=50,
                   help="most timed iterations per size (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="most warm-up iterations (default 5)")
    p.add_argument("--time-budget", type=float, default=0.25, metavar="SECONDS",
                   help="about how long one size's timed loop may take (default 0.25)")
    p.add_argument("--allreduce", action="store_true",
                   help="also time hpcdl's ring all-reduce on all ranks against the model")
    p.add_argument("--predict-from", default=None, metavar="FILE",
                   help="skip the ping-pong: time the ring all-reduce on these ranks "
                        "against the calibration in FILE (e.g. made with -n 2)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write the calibration (alpha, beta, gamma, tables) as JSON")
    p.set_defaults(func=run_calibrate)


def calibrate_options(args):
    """The parsed arguments as hpcdl.sim.calibrate.Options; UsageError if bad."""
    from ..bench.allreduce import parse_size  # on use: loads numpy
    from ..sim import calibrate  # on use: loads numpy
    try:
        if args.n is not None:
            calibrate.check_ranks(args.n)
        opts = calibrate.Options(
            min_bytes=parse_size(args.min_bytes), max_bytes=parse_size(args.max_bytes),
            factor=args.factor, iters=args.iters, warmup=args.warmup,
            budget_s=args.time_budget, allreduce=args.allreduce or bool(args.predict_from),
            predict_from=args.predict_from, json=args.json, expect_ranks=args.n)
        calibrate.validate(opts)
    except ValueError as e:
        raise UsageError(str(e))
    return opts


def calibrate_argv(args):
    """The command line that repeats this calibration on the launched ranks."""
    argv = ["--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
            "--factor", str(args.factor), "--iters", str(args.iters),
            "--warmup", str(args.warmup), "--time-budget", repr(args.time_budget)]
    argv += ["--allreduce"] if args.allreduce else []
    argv += ["--predict-from", args.predict_from] if args.predict_from else []
    argv += ["--json", args.json] if args.json else []
    return [sys.executable, "-m", "hpcdl", "bench", "calibrate"] + argv


def run_calibrate(args):
    opts = calibrate_options(args)
    if args.n is not None and not launcher.inside_parallel_job():
        return launcher.launch(args.n, calibrate_argv(args),
                               **launcher.launch_options(args))
    from mpi4py import MPI  # on use: loads MPI
    from ..sim import calibrate  # on use: loads numpy
    try:  # a single rank (no -n, or mpirun -n 1) has nobody to send to
        calibrate.check_ranks(MPI.COMM_WORLD.size)
    except ValueError as e:
        raise UsageError(str(e))
    return abort_on_error(calibrate.run, opts)
