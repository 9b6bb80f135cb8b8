"""procs.py - stopping processes by pid and telling whether one still runs,
for everything that starts daemons or holders of its own (hpcdl.vcluster's
hosts, hpcdl.slurm.local's Slurm daemons). Standard library only.

A stopped process whose parent does not reap it stays a zombie (state Z in
/proc/PID/stat) for a while: it counts as ended here, and when it is our own
child it is reaped on the spot."""
import os
import signal
import time


def running(pid):
    """True if pid runs (a zombie does not; our own zombie child is reaped)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def kill_pids(pids, grace_s=3.0):
    """SIGTERM, then SIGKILL after grace_s to what is left; waits (5 s at
    most after SIGKILL) until every one has ended."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in pids if running(p)]
            if not pids:
                return
            time.sleep(0.05)
