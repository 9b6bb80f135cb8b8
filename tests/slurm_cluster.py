"""slurm_cluster.py - a real single-node Slurm for the tests: munged,
slurmctld and slurmd started as daemons on localhost from a temporary folder
(its own munge key and socket, slurm.conf, state, spool, logs and free ports),
stopped by their pid files when the session ends.

    def test_x(slurm_cluster):            # session fixture (tests/conftest.py)
        job = slurm_cluster.sbatch_text(script)   # or hpcdl slurm submit, env=...env
        rec = slurm_cluster.wait(job)             # [{'JobState': 'COMPLETED', ...}]

Where Slurm cannot start (not root, slurm-wlm/munge missing, a daemon that
dies) the tests skip with the reason, except where CI=true or
HPCDL_REQUIRE_SLURM=1: there they fail. `make test` installs the packages
when it may (root with apt-get). HPCDL_KEEP_SLURM=1 keeps the folder.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
               "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
CPUS = 4           # declared CPUs: two 2-rank jobs fit at once, even on a 2-core machine
CRED_EXPIRE = 10   # seconds; also how long a requeued job waits (default 120)


def required():
    return os.environ.get("CI") == "true" or os.environ.get("HPCDL_REQUIRE_SLURM") == "1"


def unavailable(reason):
    """Skips, or fails where Slurm is required, naming the reason."""
    if required():
        pytest.fail("a real Slurm is required here (CI=true or HPCDL_REQUIRE_SLURM=1) but "
                    "cannot start: " + reason, pytrace=False)
    pytest.skip("no Slurm: " + reason)


def missing_prerequisite():
    """Why this machine cannot run the test cluster, or None."""
    if os.geteuid() != 0:
        return ("the test cluster runs slurmd as root (it starts jobs for any user); run "
                "the tests as root")
    absent = [b for b in DAEMONS + CLIENTS if not binary(b)]
    if absent:
        return ("%s not on PATH; install with `apt-get install slurm-wlm munge` (make test "
                "does this when run as root)" % ", ".join(absent))
    return None


def binary(name):
    """The path of a Slurm or munge program; daemons live in sbin, which a
    user's PATH may lack."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, root):
        self.root = root
        self.conf = os.path.join(root, "slurm.conf")
        self.socket = os.path.join(root, "munge", "munge.socket")
        self.node = socket.gethostname().split(".")[0]
        self.failed = False

    # ------------------------------------------------------------ environment
    @property
    def env(self):
        """The environment for Slurm commands: this cluster's slurm.conf, none of
        the SLURM_ or launcher variables of a job pytest itself may run in."""
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "PMI_",
                                  "OMPI_COMM_WORLD"))}
        e.update(SLURM_CONF=self.conf, PYTHONUNBUFFERED="1")
        return e

    def run(self, *cmd, timeout=60, check=True):
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd), out.returncode,
                                                            out.stderr.strip()))
        return out

    # ------------------------------------------------------------ start / stop
    def start(self):
        for sub in ("munge", "state", "spool", "log", "tmp"):
            os.makedirs(os.path.join(self.root, sub), mode=0o755)
        os.chmod(self.root, 0o755)  # munged wants its socket's folders open to all
        key = os.path.join(self.root, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(128))
        self._daemon("munged", [binary("munged"), "--socket", self.socket, "--key-file", key,
                                "--log-file", self._path("log/munged.log"),
                                "--pid-file", self._path("munged.pid"),
                                "--seed-file", self._path("munged.seed")])
        with open(self.conf, "w") as f:
            f.write(self.slurm_conf())
        self._daemon("slurmctld", [binary("slurmctld"), "-f", self.conf])
        self._daemon("slurmd", [binary("slurmd"), "-f", self.conf])
        self._wait_idle(30)

    def slurm_conf(self):
        r = self.root
        return "\n".join([
            "ClusterName=hpcdltest",
            "SlurmctldHost=%s(127.0.0.1)" % self.node,
            "SlurmctldPort=%d" % free_port(), "SlurmdPort=%d" % free_port(),
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire is also the wait before a requeued job may run again
            "AuthInfo=socket=%s,cred_expire=%d" % (self.socket, CRED_EXPIRE),
            "StateSaveLocation=%s/state" % r, "SlurmdSpoolDir=%s/spool" % r,
            "TmpFS=%s/tmp" % r,
            "SlurmctldPidFile=%s/slurmctld.pid" % r, "SlurmdPidFile=%s/slurmd.pid" % r,
            "SlurmctldLogFile=%s/log/slurmctld.log" % r, "SlurmdLogFile=%s/log/slurmd.log" % r,
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "MpiDefault=pmix",
            "MailProg=/bin/true", "ReturnToService=2", "KillWait=10",
            # start jobs at once, and look at the queue every second
            "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=1",
            # the node as declared here, whatever the hardware (CPUS on any machine)
            "SlurmdParameters=config_overrides",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d Sockets=1 CoresPerSocket=%d "
            "ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN" % (self.node, CPUS, CPUS),
            "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP" % self.node,
            ""])

    def _path(self, rel):
        return os.path.join(self.root, rel)

    def _daemon(self, name, cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("%s did not start (exit %d): %s\n%s" % (
                name, out.returncode, out.stderr.strip(), self.log_tail()))

    def _wait_idle(self, timeout):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-o", "%T", check=False)
            state = (out.stdout + out.stderr).strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError("the node is not idle after %d s (sinfo: %r)\n%s"
                           % (timeout, state, self.log_tail()))

    def stop(self):
        """Cancels what is left, then stops slurmd, slurmctld and munged by pid."""
        try:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=20).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False, timeout=20)
                self._wait_gone(jobs, 30)
        except (OSError, subprocess.TimeoutExpired):
            pass  # slurmctld is down already: stop what runs
        for name in reversed(DAEMONS):
            stop_pid_file(self._path("%s.pid" % name))
        if self.failed or os.environ.get("HPCDL_KEEP_SLURM") == "1":
            print("slurm test cluster kept in %s" % self.root)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def _wait_gone(self, jobs, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
                return
            time.sleep(0.3)

    # ------------------------------------------------------------ jobs
    def sbatch_text(self, script, cwd=None):
        """Submits script text; returns the job id."""
        out = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True,
                             text=True, env=self.env, cwd=cwd, timeout=60)
        if out.returncode != 0:
            self.fail("sbatch refused the test job: " + out.stderr.strip())
        return out.stdout.strip().split(";")[0]

    def jobs(self, job):
        """scontrol's records of job (one per array task) as dicts."""
        out = self.run("scontrol", "-o", "show", "job", str(job), check=False)
        records = []
        for line in out.stdout.splitlines():
            rec = {}
            for field in line.split():
                key, _, value = field.partition("=")
                rec.setdefault(key, value)
            records.append(rec)
        return records

    def wait(self, job, timeout=120, states=DONE_STATES):
        """Waits until every record of job is in one of states; returns them.
        Fails the test on timeout with the job's records and the daemons' logs."""
        deadline = time.monotonic() + timeout
        recs = []
        while time.monotonic() < deadline:
            recs = self.jobs(job)
            if recs and all(r.get("JobState") in states for r in recs):
                return recs
            time.sleep(0.3)
        self.run("scancel", str(job), check=False)
        self.fail("job %s not done after %d s: %s" % (
            job, timeout, [(r.get("JobId"), r.get("JobState"), r.get("Reason")) for r in recs]))

    def fail(self, message):
        self.failed = True  # keep the folder for a look at the logs
        pytest.fail("%s\n%s" % (message, self.log_tail()), pytrace=False)

    def log_tail(self, lines=15):
        out = []
        for name in DAEMONS:
            path = self._path("log/%s.log" % name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append("--- %s (last %d lines)\n%s" % (path, len(tail), "\n".join(tail)))
        return "\n".join(out)


def stop_pid_file(path, timeout=10):
    """SIGTERM to the pid in path, then SIGKILL if it has not ended in timeout
    seconds. A daemon nobody reaps stays a zombie: state Z counts as ended."""
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.1)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = missing_prerequisite()
    if reason:
        unavailable(reason)
    cluster = SlurmCluster(tempfile.mkdtemp(prefix="hpcdl-slurm-"))
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        cluster.failed = True
        cluster.stop()
        unavailable(str(e))
    yield cluster
    cluster.stop()
