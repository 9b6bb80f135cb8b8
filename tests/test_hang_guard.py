"""test_hang_guard.py - the suite's timeouts (tests/hang_guard.py): a command's
exit status passes through; a hung command and everything it started (a
child in a process group of its own, as Open MPI gives each rank) are
killed once its timeout of full-speed seconds is spent, exit status 124;
subprocess timeouts in this process raise TimeoutExpired as before."""
import os
import subprocess
import sys

import pytest

import hang_guard

GUARD = [sys.executable, hang_guard.__file__]


def test_status_passes_through():
    assert subprocess.run(GUARD + ["30", "sh", "-c", "exit 3"], timeout=60).returncode == 3


def test_a_hang_is_killed_with_all_it_started(tmp_path):
    pids = tmp_path / "pids"
    # the child leaves the shell's process group (setsid), as mpirun's ranks do
    script = "setsid sleep 300 & echo $! > %s; sleep 300" % pids
    r = subprocess.run(GUARD + ["1", "sh", "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 124 and "killed after 1 s of full-speed time" in r.stderr, r.stderr
    child = int(pids.read_text())
    assert not os.path.exists("/proc/%d" % child) or \
        open("/proc/%d/stat" % child).read().split(")")[1].split()[0] == "Z"


def test_subprocess_timeouts_still_raise():
    with pytest.raises(subprocess.TimeoutExpired, match="full-speed time"):
        subprocess.run(["sleep", "300"], timeout=1)
    proc = subprocess.Popen(["sleep", "300"])
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(1)
    proc.kill()
    proc.wait()


def test_clock_counts_full_speed_seconds():
    clock = hang_guard.Clock(1.0)
    while not clock.expired():
        pass  # this process is the job: alone it runs at full speed
    assert 1.0 <= clock.wall() <= 1.0 * hang_guard.MAX_SLOWDOWN + 2
    assert 1.0 <= clock.worst <= hang_guard.MAX_SLOWDOWN
