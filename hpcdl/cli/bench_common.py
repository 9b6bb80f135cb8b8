"""bench_common.py - what `hpcdl bench` and the benchmarks in
hpcdl/cli/bench_<name>.py share: run_or_launch (launch -n ranks of the same
command, or run the hpcdl/bench module here) and abort_on_error (one rank's
exception ends the job). Its own module, so that the bench_<name> modules
bench.py loads do not import back from it."""
import importlib
import sys
import traceback

from .errors import UsageError
from . import run as launcher
from ..bench import EveryRankError


def run_or_launch(args, name, flags, opts, before_launch=None):
    """`hpcdl bench NAME` (module hpcdl/bench/NAME.py, '-' read as '_'): with
    -n outside an MPI or Slurm job, launches that many ranks of the same
    command (each of flags passed on as --flag VALUE when not None) after
    before_launch(); else runs the module's run(opts) here (abort_on_error)."""
    if args.n is not None and not launcher.inside_parallel_job():
        if before_launch is not None:
            before_launch()
        argv = [sys.executable, "-m", "hpcdl", "bench", name]
        for flag in flags:
            value = getattr(args, flag)
            argv += ["--" + flag.replace("_", "-"), str(value)] if value is not None else []
        return launcher.launch(args.n, argv, **launcher.launch_options(args))
    bench = importlib.import_module("hpcdl.bench." + name.replace("-", "_"))
    return abort_on_error(bench.run, opts)


def abort_on_error(run, opts):
    """run(opts), but an exception on one rank aborts the whole job (with the
    traceback, prefixed by the rank) instead of leaving the others waiting in
    a collective."""
    try:
        return run(opts)
    except EveryRankError as e:  # every rank has it: one line, no abort
        raise UsageError(str(e))
    except Exception:
        from mpi4py import MPI  # here: the CLI imports no MPI until a benchmark runs
        if MPI.COMM_WORLD.size == 1:
            raise
        print("[rank %d] error: bench failed, aborting all ranks:\n%s"
              % (MPI.COMM_WORLD.rank, traceback.format_exc()), file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
