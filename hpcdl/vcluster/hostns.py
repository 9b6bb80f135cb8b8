"""hostns.py - a host's namespaces and what runs in them. Each host has one
holder process (`sleep infinity`, started through `ip netns exec HOST unshare
--uts --ipc --mount`) that owns its hostname, IPC and mount namespaces; the
holder mounts the host's own /etc/hosts, /dev/shm (a fresh tmpfs) and /tmp
(a folder in the state dir) before it sleeps. Every process of a host enters
the holder's namespaces through enter_argv (nsenter), so all processes of one
host share /dev/shm and System V IPC, as MPI's shared memory needs."""
import os
import subprocess
import time
import sys

from ..utils.procs import kill_pids, running as _running  # noqa: F401 (cluster: kill_pids)

READY_TIMEOUT_S = 15


class HostError(Exception):
    """A host cannot be started or entered (one line)."""


def shared_under_tmp():
    """Folders under /tmp that every host must still see: hpcdl's own
    checkout and the Python it runs in (a clone or venv made in /tmp, as a
    CI job may do). On a real cluster they would sit on the shared file
    system; everything else under /tmp stays private to each host."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = []
    for path in (here, os.path.realpath(sys.prefix)):
        parts = os.path.realpath(path).split(os.sep)
        if len(parts) > 2 and parts[1] == "tmp":
            top = os.sep.join(parts[:3])  # /tmp/NAME: the whole clone
            if top not in out:
                out.append(top)
    return out


def holder_script(host, hosts_file, tmp_dir, ready_file):
    """The holder's shell: mounts, then a ready mark, then sleep (same pid).
    /tmp is mounted last: the state folder stays reachable until then; the
    shared folders under /tmp are bound into the private one first."""
    keep = "".join("mkdir -p {t}{r}; mount --bind {d} {t}{r}; ".format(t=tmp_dir, d=d, r=d[4:])
                   for d in shared_under_tmp())
    return ("set -e; hostname {h}; mount --bind {hf} /etc/hosts; "
            "mount -t tmpfs -o mode=1777 tmpfs /dev/shm; {k}mount --rbind {t} /tmp; "
            ": > {r}; exec sleep infinity").format(h=host, hf=hosts_file, t=tmp_dir,
                                                  k=keep, r=ready_file)


def start_holder(host, hosts_file, tmp_dir, ready_file, log_file):
    """Starts host's holder (detached, its own session); returns its pid
    once its mounts are made, HostError with its log if it dies first."""
    argv = ["ip", "netns", "exec", host, "unshare", "--uts", "--ipc", "--mount",
            "--propagation", "slave", "sh", "-c",
            holder_script(host, hosts_file, tmp_dir, ready_file)]
    with open(log_file, "w") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    deadline = time.time() + READY_TIMEOUT_S
    while not os.path.exists(ready_file):
        if proc.poll() is not None or time.time() > deadline:
            with open(log_file) as f:
                why = f.read().strip().replace("\n", "; ") or "no output"
            raise HostError("host %s did not start: %s" % (host, why))
        time.sleep(0.02)
    return proc.pid


def netns_inode(host):
    """The inode of host's network namespace (/run/netns/HOST), or None."""
    try:
        return os.stat(os.path.join("/run/netns", host)).st_ino
    except OSError:
        return None


def _pid_netns_inode(pid):
    try:
        return os.stat("/proc/%d/ns/net" % pid).st_ino
    except OSError:
        return None


def runs_in(host, pid):
    """True if pid runs in host's network namespace (so it is not a pid
    recycled by some other process since it was recorded)."""
    ino = netns_inode(host)
    return ino is not None and _pid_netns_inode(pid) == ino and _running(pid)


def holder_alive(host, pid):
    """True if pid is still the holder of host."""
    return runs_in(host, pid)


def processes_in(host, skip=()):
    """Pids of every process in host's network namespace, except skip."""
    ino = netns_inode(host)
    if ino is None:
        return []
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if p not in skip and p != os.getpid()
            and _pid_netns_inode(p) == ino]


def enter_argv(holder_pid):
    """The argv prefix that runs a command inside a host: its network, UTS,
    IPC and mount namespaces (the holder's). The one way into a host."""
    return ["nsenter", "-t", str(holder_pid), "--net", "--uts", "--ipc", "--mount", "--"]


# cd to the caller's folder if the host has it (not under the host's own /tmp)
_CD = ('cd "$1" 2>/dev/null || { echo "hpcdl vcluster exec: $1 is not on $2; '
       'running in /" >&2; cd /; }; shift 2; exec "$@"')


def exec_argv(holder_pid, host, cmd, cwd):
    """argv that runs cmd in host, in the folder cwd, with this environment."""
    return enter_argv(holder_pid) + ["sh", "-c", _CD, "vcluster-exec", cwd, host] + list(cmd)


def exec_host(holder_pid, host, cmd, env):
    """Replaces this process with cmd running in host (exit code, signals and
    the process group pass straight through)."""
    argv = exec_argv(holder_pid, host, cmd, os.getcwd())
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        raise HostError("cannot run nsenter (util-linux): %s" % e)


def start_daemon(holder_pid, argv, log_file):
    """Starts a long-running process inside a host (detached); returns its
    pid. For per-host daemons (slurmd); the caller records it in the state."""
    with open(log_file, "a") as log:
        proc = subprocess.Popen(enter_argv(holder_pid) + list(argv), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, cwd="/")
    return proc.pid
