"""test_stop.py - a stop signal that lands outside the training loop (after
the last step, while the summary is written or MPI finalizes) leaves a
complete run's exit code 0 with one line saying so, where it used to kill
the rank with 138 (the default action of SIGUSR1) and fail the job."""
import signal
import subprocess
import sys

import pytest

PROGRAM = """
import os, signal, sys
from hpcdl.train.stop import StopRequest, late_signals_noted
late_signals_noted()
stop = StopRequest()          # train() installs this for its loop ...
os.kill(os.getpid(), signal.SIGUSR1)
assert stop.signum == signal.SIGUSR1, stop.signum
stop.restore()                # ... and puts the late handler back after it
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
print("still running")
"""


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_late_signal_is_noted_not_fatal(name):
    r = subprocess.run([sys.executable, "-c", PROGRAM, name], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "still running"
    assert r.stderr.strip() == ("hpcdl train: %s arrived outside the training loop (after its "
                                "last step); nothing to stop" % name)


def test_without_it_the_signal_kills():  # the check above can fail
    r = subprocess.run([sys.executable, "-c", "import os, signal; "
                        "os.kill(os.getpid(), signal.SIGUSR1); print('x')"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGUSR1 and not r.stdout
