"""log.py - printing in a multi-rank job: print0 for rank 0 only, warnings and
errors prefixed with the rank, a logger whose records carry the rank.

The one rank-0 printer for all of hpcdl. It imports no MPI: hpcdl.comm.init()
tells it the rank (set_rank); before that, and in a plain process, the rank
is the launcher's (utils/launch.env_rank), so it works for hpcdl.data and the
CLI without starting MPI.
"""
import logging
import sys

from . import settings
from .launch import env_rank

_rank_from_comm = None  # set by hpcdl.comm.init(), cleared by its shutdown()


def set_rank(rank):
    """The rank that print0 / warn / error use from now on (None: the launcher's)."""
    global _rank_from_comm
    _rank_from_comm = rank


def _rank():
    return _rank_from_comm if _rank_from_comm is not None else env_rank()


def print0(*args, **kwargs):
    """print() on rank 0 only, flushed (so mpirun shows lines as they come)."""
    if _rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def warn(msg):
    print("[rank %d] warning: %s" % (_rank(), msg), file=sys.stderr, flush=True)


def error(msg):
    print("[rank %d] error: %s" % (_rank(), msg), file=sys.stderr, flush=True)


class _RankFilter(logging.Filter):
    def filter(self, record):
        record.rank = _rank()
        return True


def get_logger(name="hpcdl"):
    """A logger whose lines start with '[rank R]'; level from HPCDL_LOG_LEVEL."""
    log = logging.getLogger(name)
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
        h.addFilter(_RankFilter())
        log.addHandler(h)
        log.setLevel(settings.get("HPCDL_LOG_LEVEL"))
        log.propagate = False
    return log
