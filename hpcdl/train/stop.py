"""stop.py - a clean stop on SIGUSR1 or SIGTERM (Slurm's warning before a time
limit or preemption): the handler only records the signal; at the next step
boundary the ranks agree (one tiny all-reduce), so all of them stop after the
same step, save one checkpoint and exit 0, wherever the signal landed.
A signal after the last step (during the summary, at exit) changes nothing:
late_signals_noted() keeps it from killing a rank whose run is complete."""
import os
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


def late_signals_noted():
    """For a process whose whole job is one train() call (hpcdl train): a stop
    signal outside train() - after its last step, when the summary is written
    and MPI finalizes - prints one line instead of killing the rank with 138
    (Slurm's warning can land in that second). StopRequest restores this."""
    def note(signum, frame):
        os.write(2, ("hpcdl train: %s arrived outside the training loop (after its "
                     "last step); nothing to stop\n" % signal.Signals(signum).name).encode())
    for s in SIGNALS:
        signal.signal(s, note)
