"""interrupt.py - Ctrl-C and leftovers for the commands that start ranks
(`hpcdl run`, `hpcdl train -n`, ...).

For a command with a clean stop (hpcdl train: SIGUSR1, a stop at the next
step boundary with a checkpoint when --checkpoint-dir is set) the launcher
(mpirun, mpiexec, srun) runs in a process group of its own, so the
terminal's Ctrl-C reaches hpcdl alone, which passes the first on as that
signal; the second ends the job (SIGTERM to the launcher), a third kills the
launcher and its ranks. That launcher dies with hpcdl (PR_SET_PDEATHSIG), as
it did when it shared hpcdl's process group. `hpcdl run` keeps the launcher
in the terminal's process group (so mpirun still forwards the terminal's
input to rank 0): Ctrl-C ends the job as mpirun does, and hpcdl says it was
interrupted (status 130). After the job, Open MPI's shared-memory segments
of this job (/dev/shm/vader_segment.*, 4 MiB a rank) that ranks killed
before MPI_Finalize left behind are removed.

A stop signal (SIGTERM: kill, a batch system's preemption or time limit)
ends the job within seconds whatever the rank count (Deadline): the ranks
get STOP_GRACE_S to stop cleanly, then the launcher is told to end the job,
and KILL_AFTER_S later it and its ranks are killed (issue 38: 64 ranks on 2
cores, still starting, took 280 s to stop after SIGTERM).
"""
import ctypes
import glob
import os
import re
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn of the launcher: its own process group, SIGTERM when hpcdl dies."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: the process group alone
        pass


def popen_options(detach):
    """Popen keyword arguments for the launcher (detach: its own process group)."""
    if not detach:
        return {}
    return {"preexec_fn": _die_with_parent} if sys.platform.startswith("linux") else \
        {"start_new_session": True}


def _children(pid):
    """Process ids whose parent is pid (the launcher's local ranks)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid):
            out.append(int(stat.split("/")[2]))
    return out


class Interrupts:
    """SIGINT handler while the launcher runs; count: Ctrl-Cs received."""

    def __init__(self, proc, first_as, who):
        """first_as: the signal a first Ctrl-C becomes (the launcher runs
        detached), or None (it shares the terminal's Ctrl-C and ends the job)."""
        self.proc, self.first_as, self.who, self.count = proc, first_as, who, 0

    def _say(self, text):
        os.write(2, ("\n%s: %s\n" % (self.who, text)).encode())

    def __call__(self, signum, frame):
        self.count += 1
        try:
            if self.count == 1 and self.first_as is None:  # the launcher got it too
                self._say("interrupted (Ctrl-C): the launcher ends the job")
            elif self.count == 1:
                self._say("interrupted (Ctrl-C): the ranks stop after the current step, with "
                          "a checkpoint when --checkpoint-dir is set; Ctrl-C again ends the "
                          "job at once")
                self.proc.send_signal(self.first_as)
            elif self.count == 2 and self.first_as is None:
                pass  # mpirun's own second Ctrl-C
            elif self.count == 2:
                self._say("Ctrl-C again: ending the job (SIGTERM to the launcher); once "
                          "more kills it")
                self.proc.send_signal(signal.SIGTERM)
            else:
                for pid in _children(self.proc.pid) + [self.proc.pid]:
                    os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------- a stop signal's deadline
# A clean stop (hpcdl train: the ranks stop at their next step boundary and
# checkpoint) gets STOP_GRACE_S: below Slurm's default KillWait (30 s between
# its SIGTERM and its SIGKILL), so the checkpoint is not cut short by Slurm
# either. Ranks far from a step boundary (many ranks a core, still starting)
# are then ended as the launcher ends a job on SIGTERM.
STOP_GRACE_S = 20
KILL_AFTER_S = 5


class Deadline:
    """Started by the first stop signal while the launcher runs; `done` is set
    when the launcher has exited."""

    def __init__(self, proc, who):
        self.proc, self.who, self.done, self.started = proc, who, threading.Event(), False

    def _say(self, text):
        os.write(2, ("%s: %s\n" % (self.who, text)).encode())

    def start(self, grace, end_first=True):
        """grace: seconds the job has to end by itself; then SIGTERM to the
        launcher (end_first) and, KILL_AFTER_S later, SIGKILL to it and its ranks."""
        if self.started:
            return
        self.started = True
        threading.Thread(target=self._run, args=(grace, end_first), daemon=True).start()

    def _run(self, grace, end_first):
        if self.done.wait(grace):
            return
        try:
            if end_first:
                self._say("the ranks have not stopped %g s after the signal; ending the job "
                          "(SIGTERM to the launcher)" % grace)
                self.proc.send_signal(signal.SIGTERM)
                if self.done.wait(KILL_AFTER_S):
                    return
            self._say("the job has not ended %g s after the signal; killing the launcher "
                      "and its ranks" % (grace + (KILL_AFTER_S if end_first else 0)))
            for pid in _children(self.proc.pid) + [self.proc.pid]:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------- Open MPI's /dev/shm leftovers
def _session_jobfam(pid):
    """The job family of the mpirun with this pid, from its session directory
    (<tmp>/ompi.<host>.<uid>/pid.<pid>/contact.txt: '<jobid>.0;tcp://...'), or None."""
    bases = {os.environ.get("TMPDIR") or "/tmp", "/tmp"}
    for base in bases:
        for path in glob.glob(os.path.join(base, "ompi.*.%d" % os.getuid(), "pid.%d" % pid,
                                           "contact.txt")):
            try:
                head = open(path).read().split(".", 1)[0]
            except OSError:
                continue
            if head.isdigit():
                return int(head) >> 16
    return None


class Leftovers:
    """Learns the job family of an Open MPI launcher while it runs (its
    session directory goes with it), then removes that job's segments."""

    def __init__(self, proc):
        self.proc, self.jobfam = proc, None
        self._thread = threading.Thread(target=self._learn, daemon=True)
        self._thread.start()

    def _learn(self):
        stop = threading.Event()
        while self.jobfam is None and self.proc.poll() is None:
            self.jobfam = _session_jobfam(self.proc.pid)
            stop.wait(0.2)

    def remove(self):
        """Removes this job's segments on this host; returns how many."""
        self._thread.join(timeout=1)
        if self.jobfam is None:
            return 0
        pattern = re.compile(r"^vader_segment\..+\.%d\.([0-9a-f]+)\.\d+$" % os.getuid())
        names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
        ours = [n for n in names if pattern.match(n)
                and int(pattern.match(n).group(1), 16) >> 16 == self.jobfam]
        busy = _mapped("/dev/shm/") if ours else set()  # the job family is a 16-bit hash
        removed = 0
        for name in ours:
            path = os.path.join("/dev/shm", name)
            if path in busy:
                continue
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
        return removed


def _mapped(prefix):
    """Paths under prefix that some process has mapped now."""
    out = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    i = line.find(prefix)
                    if i >= 0:
                        out.add(line[i:].split(" (deleted)")[0].strip())
        except OSError:
            continue
    return out
