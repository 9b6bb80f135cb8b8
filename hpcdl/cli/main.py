"""main.py - the `hpcdl` command (also `python -m hpcdl`).

Each subcommand lives in its own module with register(subparsers), which adds
a parser whose default `func(args) -> int` runs it. Errors a user can fix are
raised as UsageError and printed as one line per problem ('hpcdl: error: ...',
all in one write, so ranks' lines never interleave), with exit status 2. A
bad option value shows the usage of the (sub)command it was given to; an
unknown option is one line naming the closest options (unknown_options).
No option may be abbreviated: a prefix is an unknown option whose line names
the options it begins (no_abbreviations).
"""
import argparse
import difflib
import importlib
import os
import re
import sys

from .._version import __version__
from ..utils import causes
from ..utils.rankenv import torchrun_env
from .errors import UsageError, print_errors

SUBCOMMANDS = ["info", "run", "train", "bench", "data", "slurm", "sim", "vcluster"]


def sieved_rank():
    """This rank's number (a str) when hpcdl's launcher started it and sieves
    its stderr (HPCDL_CAUSES=1, utils/causes.py), else None."""
    return torchrun_env().get("RANK") if os.environ.get(causes.ENV) == "1" else None


def rank_labelled(lines):
    """lines, each starting with '[rank R] ' on a sieved rank: the launcher
    groups the ranks' 'hpcdl: error: [rank R] ...' lines into one and keeps
    mpiexec's banner in its log, whatever the job's size (a 1-rank job's line
    went unlabelled, so the banner was shown around it). Lines already
    labelled stay as they are."""
    rank = sieved_rank()
    if rank is None:
        return lines
    return [l if l.startswith("[rank ") else "[rank %s] %s" % (rank, l) for l in lines]


def chosen_parser(parser, args):
    """The innermost (sub)parser that args were parsed by (`hpcdl bench
    allreduce` -> allreduce's parser), for its usage line."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, actions[0].dest, None) if actions else None
        if name not in (actions[0].choices if actions else ()):
            return parser
        parser = actions[0].choices[name]


def closest_choice(message):
    """argparse's message, with the closest choice added to an 'invalid
    choice' one ('hpcdl tran': '...; did you mean train?')."""
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not m:
        return message
    choices = [c.strip().strip("'") for c in m.group(2).split(",")]
    close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
    return message + ("; did you mean %s?" % close[0] if close else "")


class Parser(argparse.ArgumentParser):
    """hpcdl's parsers (subparsers take their parent's class): argparse's,
    with the closest choice named when a (sub)command is misspelled."""

    def error(self, message):
        super().error(closest_choice(message))


def build_parser():
    p = Parser(
        prog="hpcdl",
        description="MPI-based data-parallel deep learning for HPC clusters.",
        allow_abbrev=False,
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
    no_abbreviations(p)
    return p


def parsers(parser):
    """parser and every subparser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                yield from parsers(child)


def no_abbreviations(parser):
    """allow_abbrev=False on parser and every subparser below it: argparse
    would otherwise take `hpcdl train --lr 0.05` as --lr-scaling 0.05, and a
    prefix that means one option today means another when an option is added."""
    for p in parsers(parser):
        p.allow_abbrev = False


def closest_options(parser, word):
    """The options of parser that word (an unknown '--name' or '--name=value')
    was likely meant as: those it begins (an abbreviation, up to 3), else the
    nearest spellings (difflib, on the names without their dashes)."""
    name = word.split("=", 1)[0]
    known = {s.lstrip("-"): s for a in parser._actions for s in a.option_strings
             if s.startswith("--")}
    begun = [s for s in known.values() if s.startswith(name)]
    if begun:
        return begun[:3]
    return [known[k] for k in difflib.get_close_matches(name.lstrip("-"), list(known), n=2,
                                                        cutoff=0.65)]  # alfa: alpha


def unknown_options(parser, extra):
    """The one line for arguments parser did not take (extra): argparse's
    'unrecognized arguments: ...', for each unknown option the options it was
    likely meant as ('--lr-sc linear' -> --lr-scaling), and where to look."""
    guesses = [(w, closest_options(parser, w)) for w in extra
               if w.startswith("--") and w != "--"]
    guesses = [(w, close) for w, close in guesses if close]
    text = "unrecognized arguments: %s" % " ".join(extra)
    if len(guesses) == 1:
        text += "; did you mean %s?" % " or ".join(guesses[0][1])
    elif guesses:
        text += "; did you mean %s?" % ", ".join("%s (for %s)" % (" or ".join(close), w)
                                                  for w, close in guesses)
    prefix = any(c.startswith(w.split("=", 1)[0]) for w, close in guesses for c in close)
    return "%s (%s`%s -h` shows the options)" % (
        text, "no option may be abbreviated; " if prefix else "", parser.prog)


def one_line_option_errors(parser):
    """A bad option on a sieved rank raises UsageError (one labelled line,
    which the launcher groups) instead of argparse's usage block on every
    rank around mpiexec's banner."""
    def refuse(p, message):
        raise UsageError("%s: %s (`%s -h` shows the options)" % (p.prog, closest_choice(message),
                                                               p.prog))
    for p in parsers(parser):
        p.error = lambda message, p=p: refuse(p, message)


def main(argv=None):
    parser = build_parser()
    if sieved_rank() is not None:
        one_line_option_errors(parser)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # one line, for the subcommand they were given to (not the top level)
            sub = chosen_parser(parser, args)
            line = unknown_options(sub, extra)
            if sieved_rank() is not None:  # one labelled line, as one_line_option_errors'
                raise UsageError("%s: %s" % (sub.prog, line))
            sub.exit(2, "%s: error: %s\n" % (sub.prog, line))
        if not getattr(args, "func", None):
            chosen_parser(parser, args).print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as e:
        print_errors(rank_labelled(str(e).splitlines() or ["(no message)"]))
        return 2
    except KeyboardInterrupt:
        print("hpcdl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
