"""stop.py - a clean stop on SIGUSR1 or SIGTERM (Slurm's warning before a time
limit or preemption): the handler only records the signal; at the next step
boundary the ranks agree (one tiny all-reduce), so all of them stop after the
same step, save one checkpoint and exit 0, wherever the signal landed."""
import signal

from .. import comm

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    """Install on every rank before training; ask agreed() once per step."""

    def __init__(self):
        self.signum = 0
        self._previous = {s: signal.signal(s, self._handler) for s in SIGNALS}

    def _handler(self, signum, frame):
        self.signum = signum  # Python runs this in the main thread, between bytecodes

    def agreed(self):
        """The signal number if any rank got one (the largest), else 0. Collective."""
        return comm.any_rank(self.signum)

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @staticmethod
    def name(signum):
        return signal.Signals(signum).name
