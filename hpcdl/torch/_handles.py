"""_handles.py - Horovod's integer handles over hpcdl.comm's handles.

Every *_async call registers one _Pending: the hpcdl.comm handles in flight
(keeping the buffers they use alive) and a finish() that turns them into the
result the user sees (post-scale, dtype cast back, copy into an in-place
output). poll(h) asks the comm handles; synchronize(h) waits for them, runs
finish() once and forgets h.

start(kind, ...) is the one place that starts an all-gather, broadcast or
reduce-scatter without waiting: it uses Communicator.<kind>_async (the
engine thread), or, on a Communicator without one, runs the blocking call
and hands back a finished handle.
"""
import itertools

from .. import comm

_pending = {}                 # int handle -> _Pending
_next_id = itertools.count(1)


class Done:
    """A comm-style handle for work already finished."""

    def __init__(self, result=None):
        self._result = result

    def poll(self):
        return True

    def wait(self):
        return self._result


class _Pending:
    def __init__(self, handles, finish, name):
        self.handles, self.finish, self.name = handles, finish, name


def world():
    """The hpcdl Communicator; hpcdl.torch never starts MPI behind your back."""
    if not comm.is_initialized():
        raise ValueError("hpcdl.torch has not been initialized; call hvd.init() first")
    return comm.world()


def register(handles, finish, name):
    """A new integer handle for comm handles in flight plus their finish()."""
    h = next(_next_id)
    _pending[h] = _Pending(list(handles), finish, name)
    return h


def combine(handles, name):
    """One integer handle for several: its result is the list of theirs, in
    order (the grouped_* calls). The parts are spent."""
    parts = [_get(h) for h in handles]
    for h in handles:
        del _pending[h]
    comm_handles = [c for p in parts for c in p.handles]
    return register(comm_handles, lambda: [p.finish() for p in parts], name)


def poll(handle):
    """True once the operation behind handle has finished (synchronize won't block)."""
    return all(h.poll() for h in _get(handle).handles)


def synchronize(handle):
    """Waits for handle's operation and returns its result; the handle is then spent."""
    p = _get(handle)
    del _pending[handle]
    error = None
    for h in p.handles:  # wait for all, even after an error: they use our buffers
        try:
            h.wait()
        except Exception as e:  # noqa: BLE001 - re-raised below
            error = error or e
    if error is not None:
        raise error
    return p.finish()


def clear():
    _pending.clear()


def _get(handle):
    try:
        return _pending[handle]
    except (KeyError, TypeError):
        raise ValueError("unknown handle %r: already synchronized, or not made by an "
                         "hpcdl.torch *_async call" % (handle,)) from None


def start(kind, *args, **kwargs):
    """Starts world().<kind>(*args, **kwargs) without waiting where hpcdl.comm can;
    kind is 'allgather', 'broadcast' or 'reduce_scatter'."""
    w = world()
    async_call = getattr(w, kind + "_async", None)
    if async_call is not None:
        return async_call(*args, **kwargs)
    kwargs.pop("name", None)
    return Done(getattr(w, kind)(*args, **kwargs))
