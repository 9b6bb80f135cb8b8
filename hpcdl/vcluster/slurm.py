"""slurm.py - `hpcdl vcluster up --slurm`: a Slurm cluster over the hosts.
slurmctld runs on node1, one slurmd on every host (NodeName=nodeK, each at
its host's own address, in its host's namespaces, so the jobs it starts run
on that host: its hostname, /tmp, /dev/shm and link). One munged on node1
serves them all through its socket in the state folder, which every host
sees (a real cluster runs one munged per node with the same key).

    /run/hpcdl-vcluster/slurm/   slurm.conf, munge key and socket, state,
                                 spool/nodeK, log/ (hpcdl/slurm/local.py)

The daemons run in the foreground of their own sessions, so the pid up
records is the daemon's own, and down stops them by that pid. Ports are
Slurm's defaults: each host has a network stack of its own, so they clash
with no other Slurm on the machine (the test suite's runs on 127.0.0.1).
`exec` sets SLURM_CONF, so sbatch, srun and scontrol work on every host."""
import os
import time

from ..slurm import local
from . import hostns, state

CONTROLLER = "node1"
IDLE_TIMEOUT_S = 60


class SlurmError(Exception):
    """The Slurm daemons did not come up (one line, then the logs' tails)."""


def root():
    return state.path("slurm")


def conf_path():
    return local.path(root(), "slurm.conf")


def missing():
    """Why --slurm cannot work on this machine (one line), or None: asked
    before up makes anything."""
    why = local.missing_programs()
    return why and "--slurm: " + why


def start(st):
    """Starts munged, slurmctld and every slurmd (recording each once it
    runs) and waits until every host is an idle node; SlurmError otherwise."""
    r, hosts = root(), st["hosts"]
    holder = {h["name"]: h["holder"] for h in hosts}
    state.record(st, "dir", path=r)
    local.make_root(r, list(holder))
    with open(conf_path(), "w") as f:
        f.write(local.slurm_conf(r, (CONTROLLER, hosts[0]["addr"]),
                                 [(h["name"], h["addr"]) for h in hosts],
                                 cpus=st["slots"], tmpfs="/tmp", cluster="hpcdlvc"))
    # `ip netns exec` gives each host a fresh /sys without the cgroup mounts,
    # and slurmd's cgroup autodetection then refuses to start: name the plugin
    # (nothing here uses cgroups: proctrack/linuxproc, task/none)
    with open(local.path(r, "cgroup.conf"), "w") as f:
        f.write("CgroupPlugin=cgroup/v1\n")
    st["slurm"] = {"conf": conf_path(), "controller": CONTROLLER}
    _daemon(st, CONTROLLER, "munged", local.munged_argv(r, foreground=True))
    _wait_for(local.munge_socket(r), "munged")
    _daemon(st, CONTROLLER, "slurmctld", local.slurmctld_argv(r, foreground=True))
    for h in holder:
        _daemon(st, h, "slurmd", local.slurmd_argv(r, h, foreground=True))
    sinfo = hostns.enter_argv(holder[CONTROLLER]) + [local.binary("sinfo")]
    try:
        local.wait_idle(sinfo, dict(os.environ, SLURM_CONF=conf_path()), len(hosts),
                        IDLE_TIMEOUT_S)
    except RuntimeError as e:
        # up removes the folder with the logs: their last lines go into the error
        raise SlurmError("%s; the daemons' logs end:\n%s" % (e, local.log_tail(r, 5)))


def _daemon(st, host, name, argv):
    """One daemon in host, recorded by pid for down once it runs (should up
    die in between, the host's processes, recorded earlier, still go)."""
    holder = next(h["holder"] for h in st["hosts"] if h["name"] == host)
    log = local.path(root(), "log/%s-%s.out" % (name, host))  # what it says before its log
    pid = hostns.start_daemon(holder, argv, log)
    state.record(st, "daemon", name=name, host=host, pid=pid)


def _wait_for(path, name, timeout=10):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SlurmError("%s did not start in %d s: %s" % (name, timeout,
                                                               local.log_tail(root(), 5)))
        time.sleep(0.05)


def env(st):
    """What exec adds for Slurm's clients: {} without --slurm."""
    return {"SLURM_CONF": st["slurm"]["conf"]} if st.get("slurm") else {}


def daemon_pids(st):
    """{pid: 'name@host'} of the daemons up started, and of slurmctld's own
    helper (slurmscriptd, its child). slurmd's children are jobs, not daemons."""
    pids = {m["pid"]: "%s@%s" % (m["name"], m["host"]) for m in st["made"]
            if m["kind"] == "daemon"}
    ctld = [p for p, name in pids.items() if name.startswith("slurmctld@")]
    for p in ctld:
        for child in _children(p):
            pids[child] = "slurmscriptd@" + CONTROLLER
    return pids


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
