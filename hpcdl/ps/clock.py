"""clock.py - the SSP vector clock a server keeps, and the replay that checks
a recorded run against its staleness bound.

A worker's clock is the number of gradients it has pushed. A server counts the
pushes it has received from each worker; min_clock is the smallest count. A
worker that has pushed c gradients asks for the parameters of its step c, and
the server answers when

    BSP (s = 0):  min_clock >= c        every worker's step c-1 is in
    SSP (s):      min_clock >= c - s    nobody is more than s steps behind it
    ASP:          at once

so a worker never computes a step more than s steps ahead of the slowest one.
"""


class VectorClock:
    """Pushes per worker at one server; staleness None means ASP (never wait).
    With record=True every push and every answered pull goes into .events as
    ("push", worker, clock) / ("reply", worker, clock, min_clock), in order."""

    def __init__(self, num_workers, staleness, record=False):
        self.pushes = [0] * num_workers
        self.staleness = staleness
        self.events = [] if record else None

    def min_clock(self):
        return min(self.pushes)

    def push(self, worker, clock):
        """Counts worker's push of step clock; steps arrive in order, one each."""
        if clock != self.pushes[worker]:
            raise RuntimeError("parameter server: worker %d pushed step %d but its next step "
                               "is %d (a lost or repeated push)"
                               % (worker, clock, self.pushes[worker]))
        self.pushes[worker] += 1
        if self.events is not None:
            self.events.append(("push", worker, clock))

    def ready(self, clock):
        """May a pull for step clock be answered now?"""
        return self.staleness is None or self.min_clock() >= clock - self.staleness

    def answered(self, worker, clock):
        if self.events is not None:
            self.events.append(("reply", worker, clock, self.min_clock()))


def replay(events, num_workers):
    """Replays one server's recorded events, counting pushes itself. Returns the
    lag (clock - min pushes at that moment) of every answered pull, in order,
    as (worker, clock, lag) tuples. Independent of the server's own min_clock."""
    pushes, lags = [0] * num_workers, []
    for ev in events:
        if ev[0] == "push":
            _, w, c = ev
            if c != pushes[w]:
                raise ValueError("event log: worker %d pushed step %d after %d pushes"
                                 % (w, c, pushes[w]))
            pushes[w] += 1
        elif ev[0] == "reply":
            lags.append((ev[1], ev[2], ev[2] - min(pushes)))
    return lags
