"""vcluster_harness.py - what the tests across vcluster hosts share
(tests/test_vcluster.py, tests/test_vcluster_slurm.py): whether this machine
can run a vcluster (skip, or fail where HPCDL_REQUIRE_VCLUSTER=1, as in CI),
`hpcdl vcluster` and `exec` with hard timeouts, processes left on the hosts,
a snapshot of what down must give back, and run folders every host sees."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import hang_guard
from hpcdl import vcluster
from mpi_harness import REPO, mpi_env

HPCDL = [sys.executable, "-m", "hpcdl"]
REQUIRED = os.environ.get("HPCDL_REQUIRE_VCLUSTER") == "1"


def why_not():
    """Why this machine cannot run a vcluster, or None."""
    if os.geteuid() != 0:
        return "hpcdl vcluster needs root (network namespaces); run the tests as root"
    missing = [t for t in ("ip", "tc", "nsenter", "unshare") if not shutil.which(t)]
    if missing:
        return "missing %s (apt-get install iproute2 util-linux)" % ", ".join(missing)
    return None


def skip_module_unless_possible(why=None):
    """At a test module's top: skips it (fails it where required), saying why."""
    why = why or why_not()
    if why:
        if REQUIRED:
            pytest.fail("HPCDL_REQUIRE_VCLUSTER=1 but " + why, pytrace=False)
        pytest.skip(why, allow_module_level=True)


def cli(*args, timeout=60):
    """`hpcdl ARGS` in this namespace; CompletedProcess, output merged."""
    return subprocess.run(HPCDL + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, cwd=REPO, env=mpi_env())


def leftovers():
    """{host: pids} of processes still running on the hosts (holders and
    Slurm daemons aside)."""
    return {h: p for h, p in vcluster.processes().items() if p}


def wait_no_leftovers(timeout=10):
    clock = hang_guard.Clock(timeout)  # full-speed seconds (tests/hang_guard.py)
    while leftovers() and not clock.expired():
        time.sleep(0.2)
    return leftovers()


def vexec(host, cmd, timeout=90, env=None, check=False, cwd=REPO):
    """`hpcdl vcluster exec HOST -- CMD` with a hard timeout; on timeout every
    process on every host is killed and the test fails with the output."""
    proc = subprocess.Popen(HPCDL + ["vcluster", "exec", host, "--"] + list(cmd),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, env=mpi_env(env), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        vcluster.kill_processes()
        out, _ = proc.communicate()
        pytest.fail("launch timed out after %ss: %s\n%s" % (timeout, cmd, out), pytrace=False)
    if check and proc.returncode != 0:
        pytest.fail("exit %d: %s\n%s" % (proc.returncode, cmd, out), pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def shared_dir(name):
    """A run folder every host sees: pytest's tmp_path is under /tmp, which is
    node-local in a vcluster, so use a folder in the repository's build area
    (emptied first: a previous session's run)."""
    base = os.path.join(REPO, "build", "test_vcluster", name)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    return base


def namespace_inodes(pid):
    return {kind: os.stat("/proc/%d/ns/%s" % (pid, kind)).st_ino
            for kind in ("net", "mnt", "uts", "ipc")}


def processes_in_namespaces(inodes):
    """Pids of processes in any of the given namespace inodes."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if set(namespace_inodes(int(p)).values()) & inodes:
                out.append(int(p))
        except OSError:
            pass
    return out


def host_inodes():
    """The namespace inodes of every host that is up (to check later that no
    process is left in them)."""
    inodes = set()
    for h in (vcluster.status() or {"hosts": []})["hosts"]:
        inodes |= set(namespace_inodes(h["holder"]).values())
    return inodes


def machine_snapshot():
    """What down must give back: netns names, links, /etc/hosts, mounts."""
    return {"netns": subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout,
            "links": sorted(re.findall(r"^\d+: ([^:@]+)", subprocess.run(
                ["ip", "-o", "link"], capture_output=True, text=True).stdout, re.M)),
            "etc_hosts": open("/etc/hosts").read(),
            "mounts": sorted(l.split()[4] for l in open("/proc/self/mountinfo"))}


def assert_nothing_left(before, inodes):
    """down gave back the machine as `before` and no process runs in the
    hosts' namespaces (inodes)."""
    now = machine_snapshot()
    assert now == before, (now, before)
    assert vcluster.status() is None and not os.path.exists(vcluster.state_dir())
    assert not processes_in_namespaces(inodes)
