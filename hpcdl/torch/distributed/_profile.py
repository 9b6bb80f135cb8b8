"""_profile.py - where the time of backend "hpcdl"'s all-reduces goes, for
`hpcdl bench train --backend ... --profile`.

enable() wraps the backend's all-reduce path in timers; disable() puts the
plain functions back, so with profiling off the hot path is the code as
written (nothing checked, nothing counted). The one place that reaches into
the backend's own functions for this: process_group.py's
ProcessGroupHpcdl.allreduce, _tensors.core_view and _work's Work.get_future,
Work._finish and _deliver.

Counters (perf_counter_ns sums, taken and reset by take()):
- call:        ProcessGroupHpcdl.allreduce on the caller's thread (DDP's
               reducer during backward): torch's trampoline is outside it,
               everything from the op's checks to the queued Work inside
- submit:      of call, the Communicator's allreduce_async (argument checks
               and the hand-off to the engine's queue)
- view:        of call, core_view (a copy in only for a staged tensor)
- get_future:  Work.get_future on the caller's thread (hand-off to the finisher)
- finish:      Work._finish on the thread that completes it (the finisher for
               DDP): the handles' wait, the copy out, the future's delivery
- copy_out:    of finish, the staged tensors' copy back
- deliver:     of finish, Future.set_result and the callbacks it runs (DDP's)
and, for each engine handle, the MPI_Wtime at which its Work started to
finish (picked), to set against the engine's own end time (finisher lag).
"""
import time

from . import _tensors, _work, process_group
from ...comm.communicator import wtime

_ns = time.perf_counter_ns
KEYS = ("call", "submit", "view", "get_future", "finish", "copy_out", "deliver")
_state = None  # while enabled: dict(counts={key: ns}, calls=n, staged=n, picked={h: t}, comms)


def enabled():
    return _state is not None


def enable():
    """Wraps the all-reduce path in timers (idempotent)."""
    global _state
    if _state is not None:
        return
    _state = dict(counts=dict.fromkeys(KEYS, 0), calls=0, staged=0, picked={}, comms={},
                  inflight=0,
                  plain=(process_group.ProcessGroupHpcdl.allreduce, _tensors.core_view,
                         _work.Work.get_future, _work.Work._finish, _work._deliver))
    allreduce, core_view, get_future, finish, deliver = _state["plain"]
    counts, picked, comms = _state["counts"], _state["picked"], _state["comms"]

    def timed(key, fn):
        def run(*args, **kwargs):
            t0 = _ns()
            try:
                return fn(*args, **kwargs)
            finally:
                counts[key] += _ns() - t0
        return run

    def allreduce_timed(self, tensors, opts=None):
        c = self._comm
        if id(c) not in comms:  # the submit timer sits on this group's Communicator
            comms[id(c)] = c
            c.allreduce_async = timed("submit", c.allreduce_async)
        _state["calls"] += 1
        return timed("call", allreduce)(self, tensors, opts)

    def core_view_timed(t, op=None, device_ok=False):
        t0 = _ns()
        view, then = core_view(t, op, device_ok)
        counts["view"] += _ns() - t0
        if then is None:
            return view, None
        _state["staged"] += 1
        return view, timed("copy_out", then)

    def finish_timed(self):
        now = wtime()
        for h in self._handles:
            picked.setdefault(getattr(h, "_h", None), now)
        _state["inflight"] += 1  # take() waits for it: the future's waiter may run first
        try:
            return timed("finish", finish)(self)
        finally:
            _state["inflight"] -= 1

    process_group.ProcessGroupHpcdl.allreduce = allreduce_timed
    _tensors.core_view = core_view_timed
    _work.Work.get_future = timed("get_future", get_future)
    _work.Work._finish = finish_timed
    _work._deliver = timed("deliver", deliver)


def disable():
    """The plain functions back; the counters are dropped."""
    global _state
    if _state is None:
        return
    (process_group.ProcessGroupHpcdl.allreduce, _tensors.core_view, _work.Work.get_future,
     _work.Work._finish, _work._deliver) = _state["plain"]
    for c in _state["comms"].values():
        del c.allreduce_async  # the instance's timer; the class's method shows again
    _state = None


def take():
    """The counters since the last take() (ms), then reset (after any Work
    being finished on the finisher thread is through): dict of the
    KEYS plus calls, staged, and picked {engine handle: MPI_Wtime}."""
    s = _state
    deadline = time.monotonic() + 1.0  # a finish running on the finisher thread: microseconds
    while s["inflight"] and time.monotonic() < deadline:
        time.sleep(0)
    out = {k: v / 1e6 for k, v in s["counts"].items()}
    out.update(calls=s["calls"], staged=s["staged"], picked=dict(s["picked"]))
    for k in s["counts"]:
        s["counts"][k] = 0
    s["calls"] = s["staged"] = 0
    s["picked"].clear()
    return out


def communicators():
    """The Communicators whose all-reduces were timed (their engines' records)."""
    return list(_state["comms"].values()) if _state else []
