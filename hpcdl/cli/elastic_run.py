"""elastic_run.py - horovodrun's elastic flags for `hpcdl run`, restart-based:

    hpcdl run -np 4 --min-np 2 --max-np 4 -H node1:2,node2:2 -- python train.py

runs the job; when it fails (a rank or a host lost), probes each host with a
one-rank launch, drops those that do not answer within --start-timeout, and
starts the job again on the rest (as many ranks as their slots give, at most
--max-np, at least --min-np), up to --max-restarts times. Every attempt gets
the same HPCDL_ELASTIC_DIR, where rank 0 keeps the last state.commit(), and
HPCDL_ELASTIC_ATTEMPT (0, 1, ...); hvd.elastic.run resumes from there.

The restart policy only: run.py hands in how to start the job and how to
probe a host, so imports run one way (run -> elastic_run)."""
import os
import shutil
import signal
import subprocess
import sys
import time

from .errors import UsageError


def wants_elastic(args):
    return args.min_np is not None or args.max_np is not None or args.max_restarts


def check_counts(n, min_np, max_np):
    for flag, v in (("-np", n), ("--min-np", min_np), ("--max-np", max_np)):
        if v is not None and v < 1:
            raise UsageError("%s must be at least 1 (got %d)" % (flag, v))
    if min_np is not None and max_np is not None and min_np > max_np:
        raise UsageError("--min-np %d is more than --max-np %d" % (min_np, max_np))
    if n is not None and ((min_np and n < min_np) or (max_np and n > max_np)):
        raise UsageError("-np %d is outside --min-np %s .. --max-np %s"
                         % (n, min_np or 1, max_np or "any"))


def live_hosts(hosts, probe_line, timeout, verbose):
    """The (name, slots) of hosts that start one rank within timeout seconds;
    probe_line(name) is the launcher line that starts `true` there. The
    probes run at once (a dead host costs one timeout, not one per host);
    a probe still running at the deadline is killed with everything it
    started (its own session), so no half-started daemon is left behind."""
    probes = [(name, slots, _start_probe(probe_line(name))) for name, slots in hosts]
    deadline = time.time() + timeout
    alive = []
    for name, slots, proc in probes:
        rc = _wait_probe(proc, deadline) if proc is not None else "not started"
        ok = rc == 0
        if verbose or not ok:
            say("host %s %s" % (name, "answers" if ok else
                                "does not answer within --start-timeout %gs: left out"
                                % timeout if rc is None else
                                "cannot start a rank (probe status %s): left out" % rc))
        if ok:
            alive.append((name, slots))
    return alive


def _start_probe(line):
    try:
        return subprocess.Popen(line, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def _wait_probe(proc, deadline):
    """The probe's exit status, or None when it ran past deadline (then killed)."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return None


def say(text):
    print("hpcdl run: " + text, file=sys.stderr, flush=True)


def launch_elastic(start, probe_line, n, host_list, min_np, max_np, max_restarts,
                   start_timeout=30, verbose=False, export=()):
    """Runs the job (start(n, hosts, export) -> exit code), restarting it after
    a failure as described above; the exit code. host_list: [(name, slots)]
    or None (this host)."""
    check_counts(n, min_np, max_np)
    if n is None:
        n = max_np or (sum(s for _, s in host_list) if host_list else min_np or 1)
    elastic_dir, made = _elastic_dir()
    export = list(export) + ["HPCDL_ELASTIC_DIR=" + elastic_dir]
    for attempt in range(max_restarts + 1):
        rc = start(n, _hosts_arg(host_list), export + ["HPCDL_ELASTIC_ATTEMPT=%d" % attempt])
        if rc == 0:
            _cleanup(elastic_dir, made)
            return 0
        if attempt == max_restarts:
            say("attempt %d failed (status %d); no restart left (--max-restarts %d). The "
                "last commit stays in %s" % (attempt, rc, max_restarts, elastic_dir))
            return rc
        if host_list:
            host_list = live_hosts(host_list, probe_line, start_timeout, verbose)
            slots = sum(s for _, s in host_list)
            n = min(max_np or slots, slots)
        if n < (min_np or 1):
            say("only %d slot(s) left on the hosts that answer; --min-np %d needs more. "
                "Giving up; the last commit stays in %s" % (n, min_np or 1, elastic_dir))
            return rc
        say("attempt %d failed (status %d); restart %d of %d with %d rank(s)%s from the "
            "last commit" % (attempt, rc, attempt + 1, max_restarts, n,
                             " on " + _hosts_arg(host_list) if host_list else ""))
        time.sleep(1)  # let the lost ranks' ports and files go
    return rc


def _hosts_arg(host_list):
    return ",".join("%s:%d" % h for h in host_list) if host_list else None


def _elastic_dir():
    """(dir, made): $HPCDL_ELASTIC_DIR (kept: a later launch, e.g. after a Slurm
    requeue, resumes from it), else a new folder under the working directory
    (removed after success), which every host sees on a shared file system."""
    given = os.environ.get("HPCDL_ELASTIC_DIR")
    if given:
        return os.path.abspath(given), False
    path = os.path.join(os.getcwd(), ".hpcdl-elastic", "%d-%d" % (time.time(), os.getpid()))
    os.makedirs(path)
    return path, True


def _cleanup(path, made):
    if not made:
        return
    shutil.rmtree(path, ignore_errors=True)  # the commits (torch/elastic/_store.py)
    try:
        os.rmdir(os.path.dirname(path))  # the parent, when no other job uses it
    except OSError:
        pass
