"""wait.py - waiting for MPI requests without holding a core.

MPI's blocking waits spin. A parameter server spends most of its time waiting
for the slowest worker, and when ranks share cores (4 ranks on a 2-core
laptop) a spinning server or waiting worker would steal the core the slow
worker needs. So we test, then sleep with an exponential back-off: at most
1 ms of added latency once a wait has lasted a while, a few microseconds for
short ones.
"""
import time

from mpi4py import MPI

from ..utils.backoff import Backoff

SPINS = 64                # tests before the first sleep
FIRST_SLEEP, MAX_SLEEP = 2e-5, 1e-3


def _backoff():
    return Backoff(SPINS, FIRST_SLEEP, MAX_SLEEP)


def wait_some(requests):
    """Indices of the requests that completed (at least one), like
    MPI_Waitsome; None when every request is inactive."""
    backoff = _backoff()
    while True:
        done = MPI.Request.Testsome(requests)
        if done is None or done:
            return done
        backoff.pause()


def wait_all(requests):
    """Like MPI_Waitall; returns the seconds spent waiting."""
    t0, backoff = time.perf_counter(), _backoff()
    while not MPI.Request.Testall(requests):
        backoff.pause()
    return time.perf_counter() - t0
