"""worker.py - a worker's side of the protocol (protocol.py): push a flat
gradient to every server, pull the flat parameters back, end a round.

The buffers are the caller's flat float32 arrays: server j's slice [lo:hi]
goes out of / comes into them directly (non-blocking sends and receives, no
copies). push() returns at once; its sends complete in the next pull() or
end_round(), so the gradient buffer must stay unchanged until then.
"""
from . import protocol as P
from .wait import wait_all


class Worker:
    """Worker `index` (rank num_servers + index on mpi); params and grads are
    float32 arrays of all P elements, bounds the servers' (lo, hi)."""

    def __init__(self, mpi, index, params, grads, bounds):
        self.mpi, self.index = mpi, index
        self.params, self.grads, self.bounds = params, grads, bounds
        K = len(bounds)
        self.push_headers = [P.header() for _ in range(K)]
        self.pull_headers = [P.header() for _ in range(K)]
        self.replies = [P.header() for _ in range(K)]
        self.sending = []      # requests of pushes in flight
        self.clock = 0         # gradients pushed so far
        self.records = []      # (clock, min_clock seen) of every pull
        self.wait_s = 0.0      # time blocked waiting for pulls to be answered

    def push(self, lr):
        """Sends self.grads (the gradient of step self.clock) to the servers."""
        if self.sending:  # a push not yet followed by a pull: its buffers are still busy
            self.wait_s += wait_all(self.sending)
        for j, (lo, hi) in enumerate(self.bounds):
            hdr = P.set_header(self.push_headers[j], P.PUSH, self.clock, lr)
            self.sending += [self.mpi.Isend(hdr, dest=j, tag=P.TAG_REQUEST),
                             self.mpi.Isend(self.grads[lo:hi], dest=j, tag=P.TAG_GRAD)]
        self.clock += 1

    def pull(self):
        """Fills self.params with the parameters for step self.clock, as soon as
        every server allows (BSP / SSP may hold the answer). Returns min_clock:
        the fewest pushes any worker had made when the answers left."""
        reqs = self.sending
        for j, (lo, hi) in enumerate(self.bounds):
            hdr = P.set_header(self.pull_headers[j], P.PULL, self.clock)
            reqs += [self.mpi.Isend(hdr, dest=j, tag=P.TAG_REQUEST),
                     self.mpi.Irecv(self.replies[j], source=j, tag=P.TAG_REPLY),
                     self.mpi.Irecv(self.params[lo:hi], source=j, tag=P.TAG_PARAMS)]
        self.wait_s += wait_all(reqs)
        self.sending = []
        failed = [j for j, r in enumerate(self.replies) if P.read_header(r)[0] == P.ERROR]
        if failed:
            raise RuntimeError(
                "worker %d: parameter server(s) %s cannot answer the pull for step %d: the "
                "workers it waits for have ended the round; every worker must make the same "
                "number of steps in a round (see the server's error)"
                % (self.index, failed, self.clock))
        min_clock = min(int(P.read_header(r)[2]) for r in self.replies)  # (PARAMS, version, min)
        self.records.append((self.clock, min_clock))
        return min_clock

    def end_round(self):
        """Tells every server this worker sends nothing more this round."""
        reqs = self.sending
        for j in range(len(self.bounds)):
            hdr = P.set_header(self.pull_headers[j], P.ROUND_END, self.clock)
            reqs.append(self.mpi.Isend(hdr, dest=j, tag=P.TAG_REQUEST))
        self.wait_s += wait_all(reqs)
        self.sending = []

    def stats(self):
        lags = [c - m for c, m in self.records]
        return dict(role="worker", worker=self.index, clock=self.clock, wait_s=self.wait_s,
                    max_staleness=max(lags, default=0),
                    mean_staleness=sum(lags) / len(lags) if lags else 0.0,
                    records=list(self.records))
