"""server.py - one parameter server: holds shard j of the flat parameters,
applies the workers' pushes to it and answers their pulls (protocol.py).

The loop of a round: one header receive is posted per worker; whichever
completes is handled (a push's gradient is received next, into that worker's
own buffer); then every held-back pull whose condition now holds is answered.
The round ends when every worker has sent ROUND_END. If the pulls still held
can never be answered (the workers they wait for have ended the round), the
server raises instead of waiting forever.
"""
import time

import numpy as np
from mpi4py import MPI

from . import protocol as P
from .clock import VectorClock
from .rules import ShardSGD
from .wait import wait_all, wait_some


class Server:
    """Server `index` of the job: shard = flat[lo:hi] (a float32 array it owns).
    mpi: the private communicator; layout (config.Layout): the roles and the
    rule; workers are ranks layout.num_servers.. on."""

    def __init__(self, mpi, index, shard, layout):
        self.mpi, self.index, self.mode = mpi, index, layout.mode
        self.shard = shard
        self.first_worker, W = layout.num_servers, layout.num_workers
        self.rule = ShardSGD(shard, W, layout.momentum, layout.weight_decay)
        self.clock = VectorClock(W, layout.staleness, layout.record)
        n = len(shard)
        self.grads = np.zeros((W, n), np.float32)      # the latest push of each worker
        self.push_of = [None] * W                      # (clock, lr) of a push being received
        self.step_lrs = {}                             # BSP: worker -> lr of its push this step
        self.headers = [P.header() for _ in range(W)]
        self.replies = [P.header() for _ in range(W)]
        self.snapshots = np.zeros((W, n), np.float32)  # what each worker is being sent
        self.sending = [[] for _ in range(W)]          # requests of the reply in flight
        self.held = {}                                 # worker -> clock of a held-back pull
        self.held_pulls, self.apply_s = 0, 0.0

    # ------------------------------------------------------------------ round
    def serve_round(self):
        """Serves until every worker has ended the round."""
        W = len(self.headers)
        reqs = [self._recv_header(w) for w in range(W)]
        ended = {}
        while True:
            done = wait_some(reqs)
            if done is None:  # every worker has sent ROUND_END
                break
            for w in done:
                reqs[w] = self._handle(w, ended)
            self._answer_held()
            self._check_progress(ended)
        for w in range(W):
            wait_all(self.sending[w])

    def _recv_header(self, w):
        return self.mpi.Irecv(self.headers[w], source=self.first_worker + w, tag=P.TAG_REQUEST)

    def _handle(self, w, ended):
        """Acts on the message that just arrived from worker w; returns the
        next receive to post for w (REQUEST_NULL once it ended the round)."""
        if self.push_of[w] is not None:  # the gradient of a push is in
            clock, lr = self.push_of[w]
            self.push_of[w] = None
            self._apply(w, clock, lr)
            return self._recv_header(w)
        kind, clock, lr = P.read_header(self.headers[w])
        if kind == P.PUSH:
            self.push_of[w] = (clock, lr)
            return self.mpi.Irecv(self.grads[w], source=self.first_worker + w, tag=P.TAG_GRAD)
        if kind == P.PULL:
            if self.clock.ready(clock):
                self._reply(w, clock)
            else:
                self.held[w], self.held_pulls = clock, self.held_pulls + 1
            return self._recv_header(w)
        if kind == P.ROUND_END:
            ended[w] = clock
            return MPI.REQUEST_NULL
        raise RuntimeError("parameter server %d: unknown message kind %d from worker %d"
                           % (self.index, kind, w))

    # ---------------------------------------------------------------- updates
    def _apply(self, w, clock, lr):
        t0 = time.perf_counter()
        self.clock.push(w, clock)
        if self.mode != "bsp":
            self.rule.push(self.grads[w], lr)  # ASP / SSP: now, as 1/W of a step
        else:
            self.step_lrs[w] = lr
            if len(self.step_lrs) == len(self.headers):
                self._bsp_step(clock)
        self.apply_s += time.perf_counter() - t0

    def _bsp_step(self, clock):
        """Every worker's step `clock` is in: one SGD step on their mean, summed
        in worker order and scaled by 1/W like hpcdl's average all-reduce."""
        lrs = set(self.step_lrs.values())
        if len(lrs) != 1:
            raise RuntimeError("parameter server %d: the workers sent different learning rates "
                               "for step %d: %s; every worker must use the same schedule in "
                               "BSP" % (self.index, clock, self.step_lrs))
        mean = self.grads[0].copy()
        for g in self.grads[1:]:
            mean += g
        mean *= np.float32(1.0 / len(self.grads))
        self.rule.step(mean, lrs.pop())
        self.step_lrs = {}

    # ------------------------------------------------------------------ pulls
    def _reply(self, w, clock, kind=P.PARAMS):
        wait_all(self.sending[w])  # the previous answer to w has left its buffer
        self.snapshots[w] = self.shard  # later updates must not change what is in flight
        hdr = P.set_header(self.replies[w], kind, self.rule.updates, self.clock.min_clock())
        dest = self.first_worker + w
        self.sending[w] = [self.mpi.Isend(hdr, dest=dest, tag=P.TAG_REPLY),
                           self.mpi.Isend(self.snapshots[w], dest=dest, tag=P.TAG_PARAMS)]
        self.clock.answered(w, clock)

    def _answer_held(self):
        for w, clock in list(self.held.items()):
            if self.clock.ready(clock):
                del self.held[w]
                self._reply(w, clock)

    def _check_progress(self, ended):
        """Raises if the held pulls can never be answered: every worker has
        either ended the round or is itself waiting on a held pull."""
        if not self.held or any(w not in ended and w not in self.held
                                for w in range(len(self.headers))):
            return
        for w, clock in self.held.items():  # they would wait forever: make them fail too
            self._reply(w, clock, kind=P.ERROR)
        for w in self.held:
            wait_all(self.sending[w])
        raise RuntimeError(
            "parameter server %d: worker(s) %s wait for the parameters of step(s) %s, but "
            "worker(s) %s ended the round after %s step(s) and will push nothing more; every "
            "worker must make the same number of steps in a round"
            % (self.index, sorted(self.held), [self.held[w] for w in sorted(self.held)],
               sorted(ended), [ended[w] for w in sorted(ended)]))

    def stats(self):
        return dict(role="server", server=self.index, updates=self.rule.updates,
                    pushes=list(self.clock.pushes), held_pulls=self.held_pulls,
                    apply_s=self.apply_s, events=self.clock.events)
