"""agree.py - the one rule for "did any rank fail": a failure on one rank
becomes an exception on every rank, instead of the others waiting for it in
their next collective.

It is written once, here in a bottom module that imports no MPI, because two
doors use it: hpcdl.comm's Communicator.raise_if_any (the trainer, its
checkpoints) and hpcdl.data's _mpi.agree (which must work without hpcdl.comm,
whose import starts MPI). Each passes its own object all-gather.
"""


def raise_on_every_rank(allgather, rank, error, exc_type=RuntimeError):
    """Collective: every rank passes error, None when it did fine.

    allgather: the communicator's object all-gather (obj -> list by rank);
    rank: this rank on it. error is an exception or a message string:
      - an exception travels as "rank R failed: <message>"; the rank that
        raised it raises it again, unchanged (its own traceback and type);
      - a message travels as it is and is raised as exc_type(message), on
        the rank that wrote it too (for messages every rank can read alike,
        such as "checkpoint X is unreadable").
    If any rank failed, every rank raises the failure of the lowest failing
    rank; otherwise it returns None on every rank.
    """
    if isinstance(error, BaseException):
        mine = "rank %d failed: %s" % (rank, error)
    else:
        mine = None if error is None else str(error)
    failed = [(r, m) for r, m in enumerate(allgather(mine)) if m is not None]
    if not failed:
        return
    first, msg = failed[0]
    if first == rank and isinstance(error, BaseException):
        raise error
    raise exc_type(msg)
