"""cluster.py - up, down and status of the one vcluster of this machine.

up checks everything first (host count, rate, names free, none up), then makes
the bridge, per host a namespace, a link (shaped if asked) and a holder, and
last the MPI launch agent; each thing is recorded before it is made. Any
failure (or Ctrl-C) undoes the record and reports one line. down undoes the
record in reverse: daemons and every process left in a host, holders (their
mounts go with their namespaces), scratch folders, links, namespaces, bridge,
files; undoing what is already gone is fine."""
import os
import shutil

from . import agent, hostns, net, slurm, state
from .errors import VclusterError

HOSTFILE = "hostfile"


def up(n_hosts, slots=1, link=None, with_slurm=False):
    """Brings up hosts node1..nodeN (and Slurm over them if with_slurm);
    returns the state. VclusterError (one line) on bad input, when one is up
    or being made, or when a step fails (then nothing is left)."""
    if not 1 <= n_hosts <= net.MAX_HOSTS:
        raise VclusterError("--hosts must be 1 to %d (got %d)" % (net.MAX_HOSTS, n_hosts))
    if slots < 1:
        raise VclusterError("--slots must be at least 1 (got %d)" % slots)
    try:
        bits = net.parse_rate(link) if link else None
    except net.NetError as e:
        raise VclusterError(str(e))
    if with_slurm and slurm.missing():
        raise VclusterError(slurm.missing())
    names = [net.host_name(k) for k in range(1, n_hosts + 1)]
    st = {"hosts": [], "slots": slots, "link": link, "link_bits": bits,
          "subnet": net.SUBNET, "made": []}
    # the state file is the lock: claimed (atomically) before the names are
    # checked, so of two ups at once the second stops here and touches nothing
    if not state.claim(st):
        raise VclusterError(_already_up(state.load() or st))
    try:
        net.check_free(names)
    except net.NetError as e:
        _undo(st)  # nothing made yet: gives the claim back
        raise VclusterError(str(e))
    try:
        _make(st, names, bits)
        if with_slurm:
            slurm.start(st)
    except BaseException as e:
        _undo(st)
        if isinstance(e, (net.NetError, hostns.HostError, slurm.SlurmError, OSError)):
            raise VclusterError("up failed and was undone: %s" % e)
        raise
    return st


def _already_up(st):
    names = ", ".join(h["name"] for h in st["hosts"]) or "being made now, or half-made"
    return "a vcluster is already up (%s); use it, or `hpcdl vcluster down` first" % names


def _make(st, names, bits):
    hosts = [(h, net.address(k)) for k, h in enumerate(names, 1)]
    _write(st, "hosts", net.hosts_file(hosts))
    state.record(st, "bridge", name=net.BRIDGE)
    net.make_bridge()
    for h, addr in hosts:
        state.record(st, "netns", name=h)
        net.make_netns(h)
        state.record(st, "link", name=net.veth_name(h))
        net.make_link(h, addr)
        if bits:
            net.shape_link(h, bits)
    for h, addr in hosts:
        st["hosts"].append({"name": h, "addr": addr, "holder": _start_holder(st, h)})
        state.save(st)
    state.record(st, "file", path=agent.write_agent(st))
    _write(st, HOSTFILE, "".join("%s slots=%d\n" % (h, st["slots"]) for h, _ in hosts))


def _write(st, name, text):
    path = state.path(name)
    state.record(st, "file", path=path)
    with open(path, "w") as f:
        f.write(text)


def _start_holder(st, host):
    scratch = state.path(host)
    state.record(st, "dir", path=scratch)
    os.makedirs(os.path.join(scratch, "tmp"), exist_ok=True)
    os.chmod(os.path.join(scratch, "tmp"), 0o1777)
    state.record(st, "host-processes", host=host)
    return hostns.start_holder(host, state.path("hosts"), os.path.join(scratch, "tmp"),
                               os.path.join(scratch, "ready"), os.path.join(scratch, "log"))


# ---------------------------------------------------------------- down
def down():
    """Removes everything up made; False when no vcluster was up."""
    st = state.load()
    if st is None:
        return False
    _undo(st)
    return True


def _undo(st):
    """Undoes st['made'] in reverse order, then the state file (and the
    state folder if an up made it)."""
    for item in reversed(st["made"]):
        _undo_one(item)
    state.remove()


def _undo_one(item):
    kind = item["kind"]
    if kind == "daemon":
        hostns.kill_pids([item["pid"]])
    elif kind == "host-processes":  # the holder and anything still running there
        hostns.kill_pids(hostns.processes_in(item["host"]))
    elif kind == "dir" and _inside_state_dir(item["path"]):
        shutil.rmtree(item["path"], ignore_errors=True)
    elif kind == "file":
        try:
            os.unlink(item["path"])
        except FileNotFoundError:
            pass
    elif kind == "link":
        net.remove_link(item["name"])
    elif kind == "netns":
        net.remove_netns(item["name"])
    elif kind == "bridge":
        net.remove_link(item["name"])


def _inside_state_dir(path):
    root = os.path.realpath(state.state_dir())
    return os.path.realpath(path).startswith(root + os.sep)


# ---------------------------------------------------------------- status
def status():
    """None when down, else the state with, per host, 'alive' (its holder runs)
    and 'processes' (how many other processes run in it, daemons aside), and
    'daemons': the Slurm daemons, each with 'alive'."""
    st = state.load()
    if st is None:
        return None
    daemons = slurm.daemon_pids(st)
    for h in st["hosts"]:
        h["alive"] = hostns.holder_alive(h["name"], h["holder"])
        h["processes"] = len(hostns.processes_in(h["name"], skip=(h["holder"],)
                                                 + tuple(daemons)))
    st["daemons"] = [dict(m, alive=hostns.runs_in(m["host"], m["pid"])) for m in st["made"]
                     if m["kind"] == "daemon"]
    return st


def processes():
    """{host: pids} of the processes running on each host, holders and Slurm
    daemons aside (for tests and tools that check a job left nothing
    behind); {} when down."""
    st = state.load() or {"hosts": [], "made": []}
    daemons = tuple(slurm.daemon_pids(st))
    return {h["name"]: hostns.processes_in(h["name"], skip=(h["holder"],) + daemons)
            for h in st["hosts"]}


def kill_processes(host=None):
    """Kills every process on host (every host when None), holders and Slurm
    daemons aside (a job's own processes, slurmstepd included, go)."""
    for name, pids in processes().items():
        if host in (None, name):
            hostns.kill_pids(pids, grace_s=0)


def holder_of(host):
    """(state, holder pid) of host; VclusterError naming the hosts if unknown."""
    st = state.load()
    if st is None:
        raise VclusterError("no vcluster is up; start one with `hpcdl vcluster up --hosts N`")
    for h in st["hosts"]:
        if h["name"] == host:
            if not hostns.holder_alive(host, h["holder"]):
                raise VclusterError("host %s is not running (its holder %d is gone); "
                                    "`hpcdl vcluster down` and up again" % (host, h["holder"]))
            return st, h["holder"]
    raise VclusterError("no host %r in this vcluster (hosts: %s)"
                        % (host, ", ".join(h["name"] for h in st["hosts"])))
