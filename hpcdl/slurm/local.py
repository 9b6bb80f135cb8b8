"""local.py - a real Slurm on this machine: the test suite's one-node cluster
(tests/slurm_cluster.py) and `hpcdl vcluster up --slurm` (one slurmd per
host) both start it from here, so what was learnt about Slurm 22.05 and munge
on these machines is written once: the munge key, slurm.conf, the daemons'
command lines, waiting until the nodes are idle, stopping a daemon by pid.

One folder (root) holds everything:

    root/munge.key, root/munge/munge.socket   munged (one for the cluster)
    root/slurm.conf                           every daemon and client reads it
    root/state/                               slurmctld's StateSaveLocation
    root/spool/NODE/, root/slurmd-NODE.pid    one slurmd per node (%n)
    root/log/{munged,slurmctld,slurmd-NODE}.log
"""
import os
import shutil
import subprocess
import time

from ..utils.procs import kill_pids, running

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
# seconds a credential lives; also how long a requeued job waits before it may
# run again (Slurm's default, 120 s, makes every requeue test wait 2 minutes)
CRED_EXPIRE = 10


def binary(name):
    """The path of a Slurm or munge program, or None; daemons live in sbin,
    which a user's PATH may lack."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def missing_programs():
    """Why Slurm cannot start here (one line), or None."""
    absent = [b for b in DAEMONS + CLIENTS if not binary(b)]
    if absent:
        return ("%s not on PATH; install with `apt-get install slurm-wlm munge`"
                % ", ".join(absent))
    return None


def path(root, name):
    return os.path.join(root, name)


def make_root(root, nodes):
    """The folders and a fresh munge key. munged wants its socket's folders
    open to all (0755) and its key readable by its owner only."""
    for sub in ["munge", "state", "log", "tmp"] + ["spool/" + n for n in nodes]:
        os.makedirs(path(root, sub), mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    with open(os.open(path(root, "munge.key"), os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(os.urandom(128))


def munge_socket(root):
    return path(root, "munge/munge.socket")


# ---------------------------------------------------------------- command lines
def munged_argv(root, foreground=False):
    return [binary("munged"), "--socket", munge_socket(root),
            "--key-file", path(root, "munge.key"), "--log-file", path(root, "log/munged.log"),
            "--pid-file", path(root, "munged.pid"), "--seed-file", path(root, "munged.seed")
            ] + (["--foreground"] if foreground else [])


def slurmctld_argv(root, foreground=False):
    return [binary("slurmctld"), "-f", path(root, "slurm.conf")] + (["-D"] if foreground
                                                                    else [])


def slurmd_argv(root, node, foreground=False):
    return [binary("slurmd"), "-f", path(root, "slurm.conf"), "-N", node] + (
        ["-D"] if foreground else [])


def slurm_conf(root, controller, nodes, cpus, ports=None, tmpfs=None, cluster="hpcdltest"):
    """slurm.conf text. controller: (name, address); nodes: [(name, address)];
    cpus: CPUs declared per node (whatever the hardware: hosts of a vcluster
    share the machine's cores); ports: (slurmctld, slurmd), None for Slurm's
    defaults; tmpfs: the nodes' TmpFS (default root/tmp)."""
    r = root
    lines = [
        "ClusterName=%s" % cluster,
        "SlurmctldHost=%s(%s)" % controller,
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire is also the wait before a requeued job may run again
        "AuthInfo=socket=%s,cred_expire=%d" % (munge_socket(r), CRED_EXPIRE),
        "StateSaveLocation=%s/state" % r, "SlurmdSpoolDir=%s/spool/%%n" % r,
        "TmpFS=%s" % (tmpfs or r + "/tmp"),
        "SlurmctldPidFile=%s/slurmctld.pid" % r, "SlurmdPidFile=%s/slurmd-%%n.pid" % r,
        "SlurmctldLogFile=%s/log/slurmctld.log" % r, "SlurmdLogFile=%s/log/slurmd-%%n.log" % r,
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none", "MpiDefault=pmix",
        "MailProg=/bin/true", "ReturnToService=2", "KillWait=10",
        # start jobs at once, and look at the queue every second
        "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=1",
        # the nodes as declared here, whatever the hardware
        "SlurmdParameters=config_overrides",
    ]
    if ports:
        lines += ["SlurmctldPort=%d" % ports[0], "SlurmdPort=%d" % ports[1]]
    lines += ["NodeName=%s NodeAddr=%s CPUs=%d Sockets=1 CoresPerSocket=%d ThreadsPerCore=1 "
              "RealMemory=1000 State=UNKNOWN" % (name, addr, cpus, cpus)
              for name, addr in nodes]
    lines.append("PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP"
                 % ",".join(name for name, _ in nodes))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- running
def idle_nodes(sinfo_argv, env, timeout=10):
    """How many nodes `sinfo` (run as sinfo_argv + its options) reports idle,
    and what it said (for the error when they never are)."""
    try:
        out = subprocess.run(list(sinfo_argv) + ["-h", "-N", "-o", "%N %T"],
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 0, "sinfo did not answer in %d s" % timeout
    said = (out.stdout + out.stderr).strip()
    return sum(1 for line in out.stdout.splitlines() if line.split()[1:] == ["idle"]), said


def wait_idle(sinfo_argv, env, n_nodes, timeout):
    """Waits until n_nodes are idle; RuntimeError with sinfo's last answer."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        idle, said = idle_nodes(sinfo_argv, env)
        if idle == n_nodes:
            return
        time.sleep(0.2)
    raise RuntimeError("%d Slurm node(s) not idle after %d s (sinfo: %r)"
                       % (n_nodes, timeout, said))


def log_tail(root, lines=15):
    """The last lines of every daemon's log, for an error message."""
    out = []
    logs = os.path.join(root, "log")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        with open(os.path.join(logs, name), errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
        out.append("--- %s (last %d lines)\n%s" % (os.path.join(logs, name), len(tail),
                                                   "\n".join(tail)))
    return "\n".join(out)


def stop_pid_file(pid_file, timeout=10):
    """Stops the daemon whose pid is in pid_file: SIGTERM, then SIGKILL if it
    has not ended in timeout seconds; a missing or empty file is fine."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return
    kill_pids([pid], grace_s=timeout)


def alive(pid):
    """True if pid runs (a zombie does not)."""
    return running(pid)
