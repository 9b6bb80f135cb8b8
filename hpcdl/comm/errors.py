"""errors.py - the errors hpcdl's collectives raise, defined in Python so that
naming them (`except hpcdl.comm.MismatchError`, hpcdl.torch's Horovod forms
that subclass them) loads neither the C core nor MPI. The core raises these
very classes: its module init takes them from here."""


class CoreError(RuntimeError):
    """hpcdl's core failed an operation (MPI error, closed context, ...)."""


class MismatchError(CoreError):
    """Ranks disagree on a collective: its count, dtype, op, root, name or order."""
