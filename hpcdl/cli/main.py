"""main.py - the `hpcdl` command (also `python -m hpcdl`).

Each subcommand lives in its own module with register(subparsers), which adds
a parser whose default `func(args) -> int` runs it. Errors a user can fix are
raised as UsageError and printed as one line, with a non-zero exit.
"""
import argparse
import importlib
import sys

from .._version import __version__

SUBCOMMANDS = ["info", "run", "train", "bench", "data", "slurm", "sim"]


class UsageError(Exception):
    """Something the user can fix: printed as 'hpcdl: error: ...', exit 2."""


def build_parser():
    p = argparse.ArgumentParser(
        prog="hpcdl",
        description="MPI-based data-parallel deep learning for HPC clusters.",
        epilog="Run 'hpcdl COMMAND --help' for a command's options. "
               "Docs: README.md and docs/ in the source tree.")
    p.add_argument("--version", action="version", version="hpcdl " + __version__)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module("hpcdl.cli." + name)
        except ImportError as e:  # a subcommand whose dependencies are missing
            if e.name and e.name.startswith("hpcdl.cli." + name):
                continue
            raise
        mod.register(sub)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print("hpcdl: error: %s" % e, file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("hpcdl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
