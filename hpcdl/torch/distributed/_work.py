"""_work.py - hpcdl's asynchronous collectives as torch.distributed Works.

A Work holds the hpcdl Handles of one torch call (several for a coalesced
call) and a `then` step run once they are done (copying out of staging
buffers). Two ways to finish it:

- wait() from the caller (dist.all_reduce(t), work.wait(), functional
  collectives' wait_tensor): the caller's thread waits on the handles
  itself; the engine sees a waiting caller and spins (its core is free).
- get_future() (DDP's reducer, comm hooks, fut.then chains): the future is
  completed by one finisher thread per process, which polls the handles in
  submission order (the engine runs them in that order) and sleeps between
  polls. Blocking it in Handle.wait() instead would tell the engine that a
  caller waits, and the engine would spin through the backward pass that
  it is meant to overlap, taking the core from the compute.

Both paths meet under one lock, so a Work finishes once; an error (e.g. the
core's MismatchError) is raised by wait() and set on the future.
"""
import collections
import threading

import torch.distributed as dist
from torch.futures import Future

from ...utils.backoff import Backoff

# finisher polling: first tries back to back (a small collective finishes in
# microseconds), then sleeps doubling from POLL_MIN_S to POLL_MAX_S
POLL_SPINS = 20
POLL_MIN_S = 20e-6
POLL_MAX_S = 200e-6


class Work(dist.Work):
    """One torch call's hpcdl handles; result is what the future carries
    (torch's convention: the list of output tensors)."""

    def __init__(self, handles, result, then=None, name="hpcdl"):
        super().__init__()
        self._handles, self._then, self._result = list(handles), then, result
        self._name = name
        self._lock = threading.Lock()
        self._done, self._error = False, None
        self._fut, self._fut_pending = None, None

    # -- finishing (either thread) ---------------------------------------
    def _ready(self):
        """True once every handle has finished (never blocks)."""
        if self._done:
            return True
        try:
            return all(h.poll() for h in self._handles)
        except Exception:  # noqa: BLE001 - the error comes out of _finish's wait
            return True

    def _finish(self):
        with self._lock:
            if not self._done:
                try:
                    for h in self._handles:
                        h.wait()
                    if self._then is not None:
                        self._then()
                except BaseException as e:  # noqa: BLE001 - re-raised by wait / the future
                    self._error = e
                self._handles, self._then, self._done = (), None, True
            fut, self._fut_pending = self._fut_pending, None
        if fut is not None:
            _deliver(fut, self._result, self._error)

    # -- torch's Work interface ----------------------------------------------
    def wait(self, timeout=None):
        """Blocks until done (the timeout is not honoured: hpcdl's stall
        inspector names and ends a stuck collective instead)."""
        self._finish()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done or self._ready()

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        with self._lock:
            fut, deliver = self._fut, False
            if fut is None:
                fut = self._fut = Future()
                if self._done:
                    deliver = True
                else:
                    self._fut_pending = fut
                    _finisher().submit(self)
        if deliver:
            _deliver(fut, self._result, self._error)
        return fut

    def __repr__(self):
        return "hpcdl.Work(%s, %s)" % (self._name, "done" if self._done else "pending")


def done_work(result, name="hpcdl"):
    """A Work for a call that already finished on the caller's thread."""
    return Work((), result, None, name)


def _deliver(fut, result, error):
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class _Finisher:
    """The thread that completes futures: Works in submission order."""

    def __init__(self):
        self._queue = collections.deque()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hpcdl-torch-finisher",
                                        daemon=True)
        self._thread.start()

    def submit(self, work):
        with self._cv:
            self._queue.append(work)
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                work = self._queue.popleft()
            backoff = Backoff(POLL_SPINS, POLL_MIN_S, POLL_MAX_S)  # spins yield the GIL
            while not work._ready():
                backoff.pause()
            work._finish()


_FINISHER = None
_FINISHER_LOCK = threading.Lock()


def _finisher():
    global _FINISHER
    with _FINISHER_LOCK:
        if _FINISHER is None:
            _FINISHER = _Finisher()
        return _FINISHER
