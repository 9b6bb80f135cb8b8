"""errors.py - what every subcommand raises and prints when the user can fix
the problem: UsageError (main.py prints it as 'hpcdl: error: ...', exit 2)
and print_errors, the one write(2) that keeps ranks' lines whole. Its own
module, below main.py and every subcommand, so that the subcommands main.py
loads do not import back from it."""
import os
import sys


class UsageError(Exception):
    """Something the user can fix: printed as 'hpcdl: error: ...', exit 2.
    A message of several lines is several problems, one line each."""


def print_errors(lines, prefix="hpcdl: error: "):
    """Writes prefix + line for each line to stderr in ONE write(2) call: under
    mpirun every rank's stderr goes to one stream, and lines written piecewise
    by two ranks can run together."""
    text = "".join("%s%s\n" % (prefix, line) for line in lines)
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream in memory (tests)
        sys.stderr.write(text)
        return
    sys.stderr.flush()
    os.write(fd, text.encode("utf-8", "replace"))
