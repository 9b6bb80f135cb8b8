"""errors.py - the errors hpcdl's collectives raise, defined in Python so that
naming them (`except hpcdl.comm.MismatchError`, hpcdl.torch's Horovod forms
that subclass them) loads neither the C core nor MPI. The core raises these
very classes: its module init takes them from here."""
import re


class CoreError(RuntimeError):
    """hpcdl's core failed an operation (MPI error, closed context, ...)."""


class MismatchError(CoreError):
    """Ranks disagree on a collective: its count, dtype, op, root, name or order."""


class RanksLostError(CoreError):
    """A peer rank died during a collective (MPI's fault tolerance, ULFM: Open
    MPI 5 under `hpcdl run --fault-tolerant`). Every surviving rank raises it,
    for the collective that was running and for every one after it (queued
    async handles too): 'rank 3 (node2) lost during allreduce 'grad.bucket.4''.
    ranks: the lost ranks of the communicator, as far as this rank knows them
    (Communicator.shrink() returns the full list). The survivors go on with
    Communicator.shrink() (docs/fault-tolerance.md)."""

    def __init__(self, message="", ranks=None):
        super().__init__(message)
        self.ranks = list(ranks) if ranks is not None else _ranks_in(str(message))


def _ranks_in(message):
    """[3] from 'rank 3 (node2) lost during ...', [1, 3] from 'ranks 1 (a), 3 (b) lost
    ...' (the core's wording, fault.c); [] when it names none."""
    head = message.split(" lost", 1)[0]
    if not re.match(r"ranks? \d", head):
        return []
    return [int(r) for r in re.findall(r"\d+", re.sub(r"\([^)]*\)", "", head))]
