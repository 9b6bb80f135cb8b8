"""timeline.py - a Chrome trace (chrome://tracing, ui.perfetto.dev) of what the
ranks did: per fusion bucket its pack, queue, communicate and unpack phases
beside the backward pass, and every other asynchronous collective. Each
collective's engine time is split into negotiate (waiting for the slowest
rank to submit it) and communicate (moving data once all have).

    HPCDL_TIMELINE=trace.json python train.py    # from the first optimizer step
    hvd.start_timeline("trace.json"); ...; hvd.stop_timeline()

Times are MPI_Wtime() seconds (the clock the C engine stamps with), shown
relative to the timeline's start; pid = rank, one row (tid) per bucket.
stop_timeline() is collective and writes one file from rank 0; with
HPCDL_TIMELINE each rank writes its own events at exit (rank r > 0 to
trace.rank<r>.json), since exit is no place for collectives.
"""
import atexit
import contextlib
import json
import os

from .. import comm
from ..utils.atomic import atomic_open

_active = None


class Timeline:
    def __init__(self, path):
        self.path, self.rank = path, comm.rank()
        self.t0 = comm.wtime()
        self.events = []
        self._rows = {}

    def _tid(self, row):
        if row not in self._rows:
            self._rows[row] = len(self._rows) + 1
            self.events.append({"name": "thread_name", "ph": "M", "pid": self.rank,
                                "tid": self._rows[row], "args": {"name": row}})
        return self._rows[row]

    def span(self, row, name, t_begin, t_end, **args):
        """One complete event from t_begin to t_end (MPI_Wtime seconds)."""
        if t_end < t_begin:
            return
        self.events.append({"name": name, "cat": row, "ph": "X", "pid": self.rank,
                            "tid": self._tid(row), "ts": (t_begin - self.t0) * 1e6,
                            "dur": (t_end - t_begin) * 1e6, "args": args})

    def add_engine_records(self, records):
        """Records from Communicator.timeline(): queue (submitted, engine busy
        with earlier work), negotiate (engine waiting for the other ranks to
        arrive, as Horovod's NEGOTIATE_ALLREDUCE) and communicate (data moving,
        every rank present) phases."""
        for r in records:
            row = r["name"]
            agreed = r.get("t_agreed", r["t_start"])
            self.span(row, "queue", r["t_submit"], r["t_start"])
            if agreed > r["t_start"]:
                self.span(row, "negotiate", r["t_start"], agreed)
            self.span(row, "communicate", agreed, r["t_end"], bytes=r["bytes"],
                      algorithm=r["algorithm"])

    def write(self, path=None, events=None):
        path = path or self.path
        with atomic_open(path, "w", durable=False) as f:  # readers never see half a file
            json.dump({"traceEvents": events or self.events, "displayTimeUnit": "ms"}, f)


def active():
    """The running Timeline, started by start_timeline() or HPCDL_TIMELINE."""
    global _active
    if _active is None and os.environ.get("HPCDL_TIMELINE"):
        path = os.environ["HPCDL_TIMELINE"]
        _active = Timeline(path)
        atexit.register(_write_own, _active)
    return _active


def _write_own(tl):
    base, ext = os.path.splitext(tl.path)
    tl.write(tl.path if tl.rank == 0 else "%s.rank%d%s" % (base, tl.rank, ext or ".json"))


def start_timeline(path, mark_cycles=False):
    """Starts recording (every rank); events go to path at stop_timeline().
    mark_cycles is accepted for Horovod compatibility and ignored."""
    global _active
    _active = Timeline(path)
    return _active


def discard():
    """Stops recording without writing anything (not collective); the events
    stay in the Timeline object start_timeline() returned."""
    global _active
    _active = None


@contextlib.contextmanager
def paused():
    """Nothing is recorded inside (the active timeline is set aside, then put
    back): for steps a measurement wants out of it."""
    global _active
    tl, _active = _active, None
    try:
        yield
    finally:
        _active = tl


def stop_timeline():
    """Collective: gathers every rank's events to rank 0, which writes the file."""
    global _active
    tl, _active = _active, None
    if tl is None:
        return None
    tl.add_engine_records(comm.world().timeline())
    gathered = comm.gather_object(tl.events, root=0)
    if tl.rank == 0:
        tl.write(events=[e for evs in gathered for e in evs])
    return tl.path
