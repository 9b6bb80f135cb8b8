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

Deferred data (all-gather): an all-gather's counts come from its
descriptor round (_shapes.py), so its data can be queued only once that
round is done. Later holds it; it is queued at the next point that is the
same on every rank: this communicator's next claim() (any hpcdl.torch
operation), or a poll / synchronize of its handle. So *_async never waits
for the other ranks, and every engine still runs the same items in the same
order.

Names: as in Horovod, a name may be in flight only once per communicator
(process set) at a time; claim(name) refuses a second one at once with
Horovod's message, before anything is queued. Errors that come out of
synchronize are HorovodInternalError (exceptions.py), as in Horovod.
"""
import itertools

from .. import comm
from .exceptions import NotInitializedError, as_internal

_pending = {}                 # int handle -> _Pending
_in_flight = set()            # (id of the Communicator, name) of every _Pending
_next_id = itertools.count(1)
_deferred = []                # Later items not queued yet, in submission order


class Done:
    """A comm-style handle for work already finished."""

    def __init__(self, result=None):
        self._result = result

    def poll(self):
        return True

    def wait(self):
        return self._result


class _Pending:
    def __init__(self, handles, finish, name, key, check):
        self.handles, self.finish, self.name = handles, finish, name
        self.key = key        # (id(communicator), name): the name is in flight there
        self.check = check    # None, or a callable that raises when ranks disagreed


class Later:
    """A comm-style handle for data that is queued once round (a comm
    handle) is done: launch() then returns the comm handle of the data, or
    None when there is nothing to send (the ranks disagreed: the check says
    why, on every rank alike)."""

    def __init__(self, on, round_handle, launch):
        self.on, self._round, self._launch, self._h = on, round_handle, launch, None
        self.queued = False
        _deferred.append(self)

    def queue(self):
        """Queues every deferred item of this communicator up to this one, in
        submission order (the same on every rank)."""
        while not self.queued:
            first = next((d for d in _deferred if d.on is self.on), None)
            if first is None:  # self was dropped by clear() (shutdown)
                self.queued = True
                break
            _deferred.remove(first)
            first.queued = True
            try:
                first._round.wait()
            except Exception:  # noqa: BLE001 - synchronize reports the round's error
                continue
            first._h = first._launch()

    def poll(self):
        self.queue()
        return self._h is None or self._h.poll()

    def wait(self):
        self.queue()
        return None if self._h is None else self._h.wait()


def flush(on):
    """Queues the deferred data of Communicator on (waits for their rounds)."""
    mine = [d for d in _deferred if d.on is on]
    if mine:
        mine[-1].queue()


def world():
    """The hpcdl Communicator; hpcdl.torch never starts MPI behind your back."""
    if not comm.is_initialized():
        raise NotInitializedError("hpcdl.torch has not been initialized: call hvd.init() "
                                  "first, before any other hvd call")
    return comm.world()


def claim(name, on, kind, flush_first=True):
    """Raises ValueError (Horovod's words) when name is already in flight on
    Communicator `on`: call before queuing anything. Then queues on's
    deferred data, which must come before what the caller queues (unless
    flush_first is False: the parts of one grouped call, whose data may
    follow all of their rounds)."""
    if (id(on), name) in _in_flight:
        raise ValueError("Requested to %s a tensor with the same name as another tensor that "
                         "is currently being processed. If you want to request another "
                         "tensor, use a different tensor name. (name %r; synchronize the "
                         "first handle before reusing it)" % (kind, name))
    if flush_first:
        flush(on)


def register(handles, finish, name, on=None, check=None):
    """A new integer handle for comm handles in flight plus their finish();
    on: the Communicator they run on (default the world); check: called
    before a failure is reported, to raise a better error (shape mismatch)."""
    h = next(_next_id)
    key = (id(on if on is not None else world()), name)
    _pending[h] = _Pending(list(handles), finish, name, key, check)
    _in_flight.add(key)
    return h


def combine(handles, name, on=None):
    """One integer handle for several: its result is the list of theirs, in
    order (the grouped_* calls). The parts are spent."""
    parts = [_get(h) for h in handles]
    for h in handles:
        _in_flight.discard(_pending.pop(h).key)
    comm_handles = [c for p in parts for c in p.handles]
    checks = [p.check for p in parts if p.check is not None]

    def check():
        for c in checks:
            c()
    return register(comm_handles, lambda: [p.finish() for p in parts], name, on,
                    check if checks else None)


def poll(handle):
    """True once the operation behind handle has finished (synchronize won't block)."""
    return all(h.poll() for h in _get(handle).handles)


def synchronize(handle):
    """Waits for handle's operation and returns its result; the handle is then spent."""
    p = _get(handle)
    del _pending[handle]
    _in_flight.discard(p.key)
    error = None
    for h in p.handles:  # wait for all, even after an error: they use our buffers
        try:
            h.wait()
        except Exception as e:  # noqa: BLE001 - re-raised below
            error = error or e
    try:
        if p.check is not None:
            p.check()  # ranks disagreed on shapes: say so (on every rank alike)
    except Exception as e:  # noqa: BLE001 - the clearer error wins
        error = e
    if error is not None:
        wrapped = as_internal(error)
        if wrapped is error:
            raise error
        raise wrapped from error
    return p.finish()


def clear():
    _pending.clear()
    _in_flight.clear()
    _deferred.clear()


def _get(handle):
    try:
        return _pending[handle]
    except (KeyError, TypeError):
        raise ValueError("unknown handle %r: already synchronized, or not made by an "
                         "hpcdl.torch *_async call" % (handle,)) from None


def start(kind, *args, on=None, **kwargs):
    """Starts on.<kind>(*args, **kwargs) (on: a Communicator, default the
    world) without waiting where hpcdl.comm can; kind is 'allgather',
    'broadcast' or 'reduce_scatter'."""
    w = on if on is not None else world()
    async_call = getattr(w, kind + "_async", None)
    if async_call is not None:
        return async_call(*args, **kwargs)
    kwargs.pop("name", None)
    return Done(getattr(w, kind)(*args, **kwargs))
