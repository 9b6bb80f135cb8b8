"""log.py - printing in a multi-rank job: print0 for rank 0 only, warnings and
errors prefixed with the rank, a logger whose records carry the rank."""
import logging
import sys


def _rank():
    # the rank from MPI once hpcdl.comm is up; from the launcher before that
    from .. import comm
    if comm.is_initialized():
        return comm.rank()
    return comm.env_rank()


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
    import os
    log = logging.getLogger(name)
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
        h.addFilter(_RankFilter())
        log.addHandler(h)
        log.setLevel(os.environ.get("HPCDL_LOG_LEVEL", "WARNING").upper())
        log.propagate = False
    return log
