"""exceptions.py - Horovod's HorovodInternalError, and the forms hpcdl's own
errors take when they come out of an hpcdl.torch operation.

Horovod raises HorovodInternalError (a RuntimeError) when a collective fails
(synchronize of a failed operation). hpcdl raises hpcdl.comm.MismatchError
and CoreError there; out of hpcdl.torch they come as the classes below, which
are both, so `except hvd.HorovodInternalError` (Horovod scripts) and
`except hpcdl.comm.MismatchError` (hpcdl scripts) catch the same error.
"""
from .. import comm


class HorovodInternalError(RuntimeError):
    """A collective failed (as Horovod's: a RuntimeError)."""


class NotInitializedError(ValueError):
    """An hpcdl.torch call before hvd.init() (a ValueError, as Horovod's). Its
    own class, so hpcdl's launcher sums it up as one line (utils/causes.py)."""


class MismatchError(comm.MismatchError, HorovodInternalError):
    """Ranks disagree on a collective (count, dtype, op, shape, name...)."""


class CoreError(comm.CoreError, HorovodInternalError):
    """hpcdl's core failed an operation."""


def as_internal(error):
    """error as a HorovodInternalError (the same object when it already is one)."""
    if isinstance(error, HorovodInternalError) or not isinstance(error, RuntimeError):
        return error
    if isinstance(error, comm.MismatchError):
        return MismatchError(str(error))
    if isinstance(error, comm.CoreError):
        return CoreError(str(error))
    return HorovodInternalError(str(error))
