"""hang_guard.py - timeouts that catch hangs, not slowness: a test's timeout
counts seconds of full-speed time, so that it stretches while other programs
share the cores and stays as short as written on a quiet machine.

Every poll (a second) adds dt / slowdown to the clock, where slowdown is
how much slower the guarded job (the process and everything below it:
mpirun and every rank it started) runs now than it would alone. The kernel
counts, per thread, the time it ran and the time it sat runnable waiting
for a core (/proc/PID/task/TID/schedstat); over the last second, summed
over the job's threads:

    slowdown = (ran + waited) / ran

Other programs on the cores make the job wait, and stretch the clock; a
job alone on the machine never waits, and its clock runs at full speed.
While the job hardly asks for a core (it sleeps: waits on something outside
it, a Slurm job or a vcluster host, or hangs in a receive), the machine's
runnable tasks per core (/proc/stat's procs_running) stand in. Busy-polling
ranks count their polling as work, so the clock errs towards patience. The
stretch is capped at MAX_SLOWDOWN, so a hang fails within MAX_SLOWDOWN x the
timeout even on a saturated machine.

Used three ways: tests/conftest.py makes every subprocess timeout of the
pytest process count this way (Popen.communicate / wait, so subprocess.run
too); tests/mpi_harness.py waits for mpirun with it and kills mpirun and
every rank on expiry; and src_c's Makefile runs each C test launch under it:

    python3 tests/hang_guard.py SECONDS command [args...]

which exits with the command's status, or 124 after killing the command and
everything it started (mpirun and all its ranks) when SECONDS of full-speed
time pass.
Standard library only: src_c's tests use it without the venv.
"""
import os
import signal
import subprocess
import sys
import threading
import time

MAX_SLOWDOWN = 10.0  # a hang fails within 10x its timeout, however busy the machine
POLL = 1.0           # seconds between samples (a sample reads /proc: ~5 ms)


def cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _procs_running():
    """Runnable tasks on the machine now (None where /proc/stat has no such line)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1]) - 1  # less the reader itself
    except OSError:
        pass
    return None


def _stat_fields(path):
    """Fields of a /proc/.../stat file after the command name (state first)."""
    with open(path) as f:
        return f.read().rpartition(")")[2].split()


def job_pids(root):
    """Pids of root and of every process below it (by parent), plus those in
    the session root leads (start_new_session=True): mpirun and its ranks,
    which Open MPI puts in process groups of their own."""
    parent, session = {}, []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = _stat_fields("/proc/%s/stat" % name)
                parent[int(name)] = int(fields[1])
                if int(fields[3]) == root:
                    session.append(int(name))
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    children = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root] + session
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return sorted(found)


def job_sched(root):
    """{tid: (ns ran, ns waited for a core)} of every thread of root's job."""
    out = {}
    for pid in job_pids(root):
        try:
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    ran, waited = f.read().split()[:2]
                out[int(tid)] = (int(ran), int(waited))
        except (OSError, ValueError):
            pass  # gone meanwhile, or no schedstat in this kernel
    return out


def machine_slowdown():
    """Runnable tasks per core, at least 1 (None without /proc/stat)."""
    total = _procs_running()
    return None if total is None else max(1.0, total / cpus())


class Clock:
    """Full-speed seconds spent since it was made, against a timeout of them;
    tick() samples the machine. root: the pid whose job is measured (default
    this process: the test and everything it started).

        clock = Clock(120)
        while not done():
            assert not clock.expired(), "not done after " + clock.describe()
            time.sleep(0.5)
    """

    def __init__(self, timeout, root=None):
        self.timeout, self.root = timeout, root if root is not None else os.getpid()
        self.start = self.last = time.monotonic()
        self.used, self.worst = 0.0, 1.0
        self.sched = job_sched(self.root)

    def slowdown(self, dt):
        """How many times slower than alone the job ran over the last dt s."""
        sched = job_sched(self.root)
        ran = waited = 0
        for tid, (r, w) in sched.items():
            r0, w0 = self.sched.get(tid, (0, 0))
            ran, waited = ran + r - r0, waited + w - w0
        self.sched = sched
        if sched and (ran + waited) / 1e9 >= 0.1 * dt:  # the job asked for a core
            s = (ran + waited) / ran if ran > 0 else MAX_SLOWDOWN
        else:  # the job waits on something outside it (or no schedstat here)
            s = machine_slowdown() or max(1.0, os.getloadavg()[0] / cpus())
        return min(MAX_SLOWDOWN, max(1.0, s))

    def tick(self):
        now = time.monotonic()
        s = self.slowdown(now - self.last)
        self.worst = max(self.worst, s)
        self.used += (now - self.last) / s
        self.last = now

    def left(self):
        return self.timeout - self.used

    def expired(self):
        """True once the timeout is spent; samples the machine at most every POLL s,
        so a loop may call it often."""
        if time.monotonic() - self.last >= POLL:
            self.tick()
        return self.left() <= 0

    def wall(self):
        return time.monotonic() - self.start

    def describe(self):
        return ("%.0f s of full-speed time (%.0f s on the clock; other programs slowed it "
                "up to %.1fx)" % (self.timeout, self.wall(), self.worst))


class HangTimeout(subprocess.TimeoutExpired):
    """TimeoutExpired after a timeout of full-speed time; says how long it was."""

    def __init__(self, cmd, clock, output=None, stderr=None):
        super().__init__(cmd, clock.timeout, output, stderr)
        self.clock_text = clock.describe()

    def __str__(self):
        return "Command '%s' timed out after %s" % (self.cmd, self.clock_text)


def kill_job(pid):
    """SIGKILL pid and its job (see job_pids): mpirun and the ranks in their
    own process groups alike."""
    for p in job_pids(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# ------------------------------------------------- Popen with full-speed timeouts
_real_communicate = subprocess.Popen.communicate
_real_wait = subprocess.Popen.wait
_inside = threading.local()  # communicate() calls wait() itself: one clock at a time


def _with_clock(proc, timeout, call):
    """call(seconds) until it returns, each try at most POLL s of the clock's;
    HangTimeout once timeout full-speed seconds have passed."""
    clock = Clock(timeout, proc.pid)
    _inside.on = True
    try:
        while True:
            try:
                return call(max(0.01, min(POLL, clock.left())))
            except subprocess.TimeoutExpired as e:
                clock.tick()
                if clock.left() <= 0:
                    raise HangTimeout(proc.args, clock, e.output, e.stderr) from None
    finally:
        _inside.on = False


def communicate(proc, input=None, timeout=None):
    """Popen.communicate with a timeout of full-speed seconds."""
    if timeout is None or getattr(_inside, "on", False):
        return _real_communicate(proc, input, timeout)
    first = [input]  # the input goes with the first try; the later ones resume

    def call(seconds):
        data, first[0] = first[0], None
        return _real_communicate(proc, data, seconds)
    return _with_clock(proc, timeout, call)


def wait(proc, timeout=None):
    """Popen.wait with a timeout of full-speed seconds."""
    if timeout is None or getattr(_inside, "on", False):
        return _real_wait(proc, timeout)
    return _with_clock(proc, timeout, lambda seconds: _real_wait(proc, seconds))


def install():
    """Makes every Popen.communicate / wait timeout of this process (and so
    subprocess.run's) count full-speed seconds. tests/conftest.py calls it."""
    subprocess.Popen.communicate = communicate
    subprocess.Popen.wait = wait


# --------------------------------------------------------------------- command line
def main(argv):
    if len(argv) < 3:
        sys.exit("usage: hang_guard.py SECONDS command [args...]")
    timeout = float(argv[1])
    proc = subprocess.Popen(argv[2:], start_new_session=True)
    clock = Clock(timeout, proc.pid)
    try:
        while True:
            try:
                return _real_wait(proc, timeout=max(0.01, min(POLL, clock.left())))
            except subprocess.TimeoutExpired:
                clock.tick()
                if clock.left() <= 0:
                    kill_job(proc.pid)
                    _real_wait(proc)
                    sys.stderr.write("hang_guard: killed after %s (a hang?): %s\n"
                                     % (clock.describe(), " ".join(argv[2:])))
                    return 124
    except KeyboardInterrupt:
        kill_job(proc.pid)
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv))
