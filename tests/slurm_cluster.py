"""slurm_cluster.py - a real Slurm for the tests, and the helpers that submit
to it. The session's single-node cluster: munged, slurmctld and slurmd started
as daemons on localhost from a temporary folder (its own munge key and socket,
slurm.conf, state, spool, logs and free ports; hpcdl/slurm/local.py writes
them), stopped by their pid files when the session ends. The same client side
(SlurmCluster with a prefix) talks to `hpcdl vcluster up --slurm`'s cluster
through `hpcdl vcluster exec` (tests/test_vcluster_slurm.py).

    def test_x(slurm_cluster):            # session fixture (tests/conftest.py)
        job = slurm_cluster.sbatch_text(script)   # or submit(cluster, ...)
        rec = slurm_cluster.wait(job)             # [{'JobState': 'COMPLETED', ...}]

Where Slurm cannot start (not root, slurm-wlm/munge missing, a daemon that
dies) the tests skip with the reason, except where CI=true or
HPCDL_REQUIRE_SLURM=1: there they fail. `make test` installs the packages
when it may (root with apt-get). HPCDL_KEEP_SLURM=1 keeps the folder.
"""
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import hang_guard
from hpcdl.slurm import local

DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
               "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
CPUS = 4           # declared CPUs: two 2-rank jobs fit at once, even on a 2-core machine
HPCDL = [sys.executable, "-m", "hpcdl"]
VENV = sys.prefix if sys.prefix != sys.base_prefix else ""  # jobs activate the tests' venv
# each rank: an all-reduce of rank- and position-dependent data by hpcdl and by mpi4py
CHECK = r"""
import os, sys, numpy as np
from mpi4py import MPI
from hpcdl import comm
comm.init()
r, n = comm.rank(), comm.size()
x = np.arange(1031, dtype=np.float64) * (r + 1) + r
want = np.empty_like(x); MPI.COMM_WORLD.Allreduce(x, want)
comm.allreduce(x)
ok = "ok" if np.array_equal(x, want) else "WRONG"
sys.stdout.write("CHECK rank %d size %d local %d slurm_localid %s host %s %s\n"
                 % (r, n, comm.local_rank(), os.environ.get("SLURM_LOCALID"),
                    MPI.Get_processor_name(), ok))
"""


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
    why = local.missing_programs()
    return why and why + " (make test does this when run as root)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """A Slurm whose files are in root. Clients run as prefix + command:
    nothing for the local cluster, `hpcdl vcluster exec node1 --` for one
    whose controller answers inside a vcluster host only."""

    def __init__(self, root, prefix=()):
        self.root = root
        self.conf = local.path(root, "slurm.conf")
        self.prefix = list(prefix)
        self.node = socket.gethostname().split(".")[0]
        self.failed = False
        self.poll_s = 0.3  # wait()'s interval between two looks at a job

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

    def argv(self, cmd):
        """cmd as run where this cluster answers."""
        return self.prefix + list(cmd)

    def run(self, *cmd, timeout=60, check=True):
        out = subprocess.run(self.argv(cmd), capture_output=True, text=True, env=self.env,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd), out.returncode,
                                                            out.stderr.strip()))
        return out

    # ------------------------------------------------------------ start / stop
    def start(self):
        """The single-node cluster on localhost (free ports on 127.0.0.1)."""
        local.make_root(self.root, [self.node])
        self._daemon("munged", local.munged_argv(self.root))
        with open(self.conf, "w") as f:
            f.write(local.slurm_conf(self.root, (self.node, "127.0.0.1"),
                                     [(self.node, "127.0.0.1")], CPUS,
                                     ports=(free_port(), free_port())))
        self._daemon("slurmctld", local.slurmctld_argv(self.root))
        self._daemon("slurmd", local.slurmd_argv(self.root, self.node))
        local.wait_idle(self.argv(["sinfo"]), self.env, 1, 30)

    def _daemon(self, name, cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("%s did not start (exit %d): %s\n%s" % (
                name, out.returncode, out.stderr.strip(), self.log_tail()))

    def stop(self):
        """Cancels what is left, then stops slurmd, slurmctld and munged by pid."""
        try:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=20).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False, timeout=20)
                self._wait_gone(jobs, 30)
        except (OSError, subprocess.TimeoutExpired):
            pass  # slurmctld is down already: stop what runs
        for pid_file in (glob.glob(local.path(self.root, "slurmd-*.pid"))
                         + [local.path(self.root, "slurmctld.pid"),
                            local.path(self.root, "munged.pid")]):
            local.stop_pid_file(pid_file)
        if self.failed or os.environ.get("HPCDL_KEEP_SLURM") == "1":
            print("slurm test cluster kept in %s" % self.root)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def _wait_gone(self, jobs, timeout):
        clock = hang_guard.Clock(timeout)  # full-speed seconds (tests/hang_guard.py)
        while not clock.expired():
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
                return
            time.sleep(0.3)

    # ------------------------------------------------------------ jobs
    def sbatch_text(self, script, cwd=None):
        """Submits script text; returns the job id."""
        out = subprocess.run(self.argv(["sbatch", "--parsable"]), input=script,
                             capture_output=True, text=True, env=self.env, cwd=cwd, timeout=60)
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
        clock = hang_guard.Clock(timeout)  # full-speed seconds (tests/hang_guard.py)
        recs = []
        while not clock.expired():
            recs = self.jobs(job)
            if recs and all(r.get("JobState") in states for r in recs):
                return recs
            time.sleep(self.poll_s)
        self.run("scancel", str(job), check=False)
        self.fail("job %s not done after %s: %s" % (
            job, clock.describe(), [(r.get("JobId"), r.get("JobState"), r.get("Reason")) for r in recs]))

    def fail(self, message):
        self.failed = True  # keep the folder for a look at the logs
        pytest.fail("%s\n%s" % (message, self.log_tail()), pytrace=False)

    def log_tail(self, lines=15):
        return local.log_tail(self.root, lines)


# ---------------------------------------------------------------- job helpers
def submit(cluster, cwd, template, *args, cmd):
    """`hpcdl slurm submit TEMPLATE ARGS -- CMD` from cwd; returns the job id."""
    r = subprocess.run(cluster.argv(HPCDL + ["slurm", "submit", template, "--time", "00:10:00",
                                             "--set", "VENV=" + VENV, *args, "--", *cmd]),
                       capture_output=True, text=True, cwd=cwd, env=cluster.env, timeout=60)
    if r.returncode != 0:
        cluster.fail("hpcdl slurm submit failed: " + r.stdout + r.stderr)
    return r.stdout.strip().splitlines()[-1]


def finished(cluster, job, timeout=180):
    """Waits for job; fails unless every record completed with exit code 0."""
    recs = cluster.wait(job, timeout)
    for rec in recs:
        assert (rec["JobState"], rec["ExitCode"]) == ("COMPLETED", "0:0"), rec
    return recs


def output(path):
    with open(path) as f:
        return f.read()


def checks(text):
    """(rank, size, ok) of every CHECK line."""
    rows = [l.split() for l in text.splitlines() if l.startswith("CHECK ")]
    return sorted((int(w[2]), int(w[4]), w[-1]) for w in rows)


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
