"""agent.py - MPI across the hosts of a vcluster. `up` writes a launch agent,
a shell script `AGENT HOST CMD...` that runs CMD inside HOST as ssh would
(the words joined, run by sh); `exec` sets Open MPI's parameters so that a
plain `mpirun -H node1:2,node2:2` (or `hpcdl run -H`) inside a host starts its
daemons through the agent and moves bytes over the hosts' subnet only:

    OMPI_MCA_plm_rsh_agent      the agent (instead of ssh)
    OMPI_MCA_oob_tcp_if_include, OMPI_MCA_btl_tcp_if_include   10.213.0.0/24
    OMPI_MCA_btl                self,vader,tcp: shared memory between the ranks
                                of one host, TCP between hosts (each host's
                                /dev/shm is its own, so vader cannot cross)
    OMPI_MCA_oob_tcp_keepalive_* a lost host (link down) is noticed in ~11 s
    HPCDL_WAIT=yield, OMPI_MCA_mpi_yield_when_idle=1
                                waiting ranks yield their core: the hosts share
                                the machine's cores, so 2 hosts x 2 ranks on 2
                                cores are crowded although no host is (hpcdl and
                                MPI only count a host's ranks), and a spinning
                                rank starves the TCP work its peer waits for

On a real cluster the same commands run with ssh as the agent (or srun)."""
import os
import shlex

from . import net, slurm, state

AGENT_NAME = "agent"

_AGENT = """#!/bin/sh
# hpcdl vcluster launch agent (written by `hpcdl vcluster up`): AGENT HOST CMD...
# runs CMD inside HOST's namespaces, its words joined and run by sh, as ssh would.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "hpcdl vcluster agent: no host '$host' in this vcluster (hosts: {names})" >&2
     exit 255 ;;
esac
exec {enter} sh -c "$*"
"""


def write_agent(st):
    """Writes the agent for the hosts in st (their holder pids); returns its path."""
    cases = "\n".join("  %s) pid=%d ;;" % (h["name"], h["holder"]) for h in st["hosts"])
    enter = " ".join(shlex.quote(a) for a in
                     ["nsenter", "-t", "$pid", "--net", "--uts", "--ipc", "--mount", "--"])
    text = _AGENT.format(cases=cases, names=" ".join(h["name"] for h in st["hosts"]),
                         enter=enter.replace("'$pid'", '"$pid"'))
    path = state.path(AGENT_NAME)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def mpi_env(agent):
    """Open MPI (and MPICH hydra) parameters for launches across the hosts."""
    return {
        "OMPI_MCA_plm_rsh_agent": agent,
        "OMPI_MCA_oob_tcp_if_include": net.SUBNET,
        "OMPI_MCA_btl_tcp_if_include": net.SUBNET,
        "OMPI_MCA_btl": "self,vader,tcp",
        "OMPI_MCA_oob_tcp_keepalive_time": "5",
        "OMPI_MCA_oob_tcp_keepalive_intvl": "2",
        "OMPI_MCA_oob_tcp_keepalive_probes": "3",
        # the hosts share the machine's cores: wait politely (measured on 3 hosts x
        # 1 rank, 1gbit, 64 MiB: hpcdl auto 3146 -> 852 ms, MPI_Allreduce 2894 -> 2397)
        "HPCDL_WAIT": "yield",
        "OMPI_MCA_mpi_yield_when_idle": "1",
        "HYDRA_LAUNCHER": "rsh",
        "HYDRA_LAUNCHER_EXEC": agent,
    }


def host_env(st, host, base=None):
    """The environment of a command run in host: the caller's, plus the MPI
    parameters it does not set itself, plus HPCDL_VCLUSTER (the state folder)
    and HPCDL_VCLUSTER_HOST, and SLURM_CONF when up made Slurm."""
    env = dict(os.environ if base is None else base)
    env.pop("HOSTNAME", None)  # the caller's; the host's own comes from uname
    for key, value in mpi_env(state.path(AGENT_NAME)).items():
        env.setdefault(key, value)  # the caller's own settings win (a test, a tuning)
    env.update(slurm.env(st))  # this cluster's Slurm, not one the caller knew
    env["HPCDL_VCLUSTER"] = state.state_dir()
    env["HPCDL_VCLUSTER_HOST"] = host
    if st.get("link"):
        env["HPCDL_VCLUSTER_LINK"] = st["link"]
    return env


def launch_hosts_problem(host_list):
    """Inside a vcluster host (HPCDL_VCLUSTER set by exec): a one-line message
    if a host of a launch (`-H a:2,b:2` as [(name, slots)]) is not one of its
    hosts, else None. Outside a vcluster: None (names are the launcher's
    business; looking them up could reach a name server)."""
    if not host_list or not os.environ.get("HPCDL_VCLUSTER"):
        return None
    st = state.load()
    names = [h["name"] for h in st["hosts"]] if st else []
    unknown = [name for name, _ in host_list if name not in names]
    if not unknown:
        return None
    return ("-H names %s, not a host of this vcluster (hosts: %s); use those names, or "
            "`hpcdl vcluster down` and `up --hosts N` for more"
            % (", ".join(unknown), ", ".join(names) or "none: it is down"))


def ranks_by_host(host_list, n):
    """Which ranks mpirun -H places on which host, by slot (Open MPI's default
    and hydra's): [('a', 2), ('b', 2)], 4 -> 'a 0-1, b 2-3'. After a failure,
    this line plus mpirun's 'lost ... daemon on node b' names the lost ranks."""
    parts, first = [], 0
    for name, slots in host_list:
        last = min(first + slots, n) - 1
        if last < first:
            break
        parts.append("%s %s" % (name, first if last == first else "%d-%d" % (first, last)))
        first = last + 1
    more = " (ranks %d.. placed by mpirun beyond the slots)" % first if first < n else ""
    return "ranks by host: " + ", ".join(parts) + more
