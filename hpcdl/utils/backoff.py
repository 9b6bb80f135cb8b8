"""backoff.py - polling without holding a core: a few tries back to back,
then sleeps that double up to a ceiling.

MPI's blocking waits spin, and when ranks share cores (4 ranks on a 2-core
laptop) a spinning waiter steals the core that the rank it waits for needs.
So a waiter polls, and between polls calls pause():

    backoff = Backoff(spins=64, first_s=2e-5, max_s=1e-3)
    while not done():
        backoff.pause()

The first `spins` pauses only yield the GIL (time.sleep(0): another thread
of this process may run, and a short wait costs microseconds); after that
each pause sleeps, first_s, then twice as long, up to max_s (the latency
the waiter may add once a wait has lasted a while).
"""
import time


class Backoff:
    def __init__(self, spins, first_s, max_s):
        self.spins, self.delay, self.max_s = spins, first_s, max_s
        self.tries = 0

    def pause(self):
        self.tries += 1
        if self.tries <= self.spins:
            time.sleep(0)
            return
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.max_s)

    def poll_until(self, done, deadline):
        """Pauses until done() is True or time.monotonic() passes deadline;
        returns done()'s last answer."""
        while not done():
            if time.monotonic() >= deadline:
                return False
            self.pause()
        return True
