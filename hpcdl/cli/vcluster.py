"""vcluster.py - `hpcdl vcluster up|exec|status|down`: this machine as several
hosts with their own network stacks (hpcdl/vcluster), so that multi-node runs
cross a real network. Needs root (namespaces, links, mounts).

    hpcdl vcluster up --hosts 2 --slots 2 --link 1gbit [--slurm]
    hpcdl vcluster exec node1 -- hpcdl run -H node1:2,node2:2 -- python train.py
    hpcdl vcluster exec node1 -- sbatch --nodes 2 job.sbatch      (with --slurm)
    hpcdl vcluster status
    hpcdl vcluster down
"""
import argparse
import os

from .. import vcluster
from .errors import UsageError


def _need_root():
    if os.geteuid() != 0:
        raise UsageError("hpcdl vcluster needs root (it makes network namespaces, links "
                         "and mounts); run it with sudo, or as root in a VM or container")


def _up(args):
    _need_root()
    try:
        st = vcluster.up(args.hosts, slots=args.slots, link=args.link, with_slurm=args.slurm)
    except vcluster.VclusterError as e:
        raise UsageError(str(e))
    print("vcluster up: %s on %s%s, %d slot(s) each"
          % (", ".join("%s %s" % (h["name"], h["addr"]) for h in st["hosts"]),
             st["subnet"], ", links shaped to " + st["link"] if st["link"] else "",
             st["slots"]))
    first = st["hosts"][0]["name"]
    if st.get("slurm"):
        print("Slurm: slurmctld on %s, one slurmd per host (%d CPUs each), all %d idle; "
              "SLURM_CONF=%s (exec sets it)" % (st["slurm"]["controller"], st["slots"],
                                                len(st["hosts"]), st["slurm"]["conf"]))
        print("next: hpcdl vcluster exec %s -- sinfo   (or sbatch, srun --mpi=pmix, scontrol; "
              "hpcdl vcluster down when done)" % first)
        return 0
    print("next: hpcdl vcluster exec %s -- hpcdl run -H %s -- CMD ...   (hpcdl vcluster "
          "down when done)" % (first, ",".join("%s:%d" % (h["name"], st["slots"])
                                                for h in st["hosts"])))
    return 0


def _exec(args):
    _need_root()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command; usage: hpcdl vcluster exec HOST -- CMD ...")
    try:
        st, pid = vcluster.holder_of(args.host)
        vcluster.exec_host(pid, args.host, cmd, vcluster.agent.host_env(st, args.host))
    except (vcluster.VclusterError, vcluster.hostns.HostError) as e:
        raise UsageError(str(e))


def _status(args):
    _need_root()
    st = vcluster.status()
    if st is None:
        print("no vcluster is up (hpcdl vcluster up --hosts N)")
        return 1
    print("vcluster: %d host(s) on %s, link %s, %d slot(s) each, state in %s"
          % (len(st["hosts"]), st["subnet"], st["link"] or "unshaped (veth speed)",
             st["slots"], vcluster.state.state_dir()))
    print("%-8s %-14s %-8s %s" % ("host", "address", "holder", "other processes"))
    for h in st["hosts"]:
        print("%-8s %-14s %-8s %d" % (h["name"], h["addr"], h["holder"] if h["alive"]
                                      else "GONE", h["processes"]))
    print("MPI: Open MPI's launch agent %s (set by `exec`); hostfile %s"
          % (vcluster.state.path("agent"), vcluster.state.path("hostfile")))
    if st.get("slurm"):
        print("Slurm: %s; SLURM_CONF=%s (set by `exec`)" % (", ".join(
            "%s@%s %s" % (d["name"], d["host"], d["pid"] if d["alive"] else "GONE")
            for d in st["daemons"]), st["slurm"]["conf"]))
    alive = [h["alive"] for h in st["hosts"]] + [d["alive"] for d in st["daemons"]]
    return 0 if all(alive) else 1


def _down(args):
    _need_root()
    if vcluster.down():
        print("vcluster down: hosts, links, bridge, mounts and processes removed")
    else:
        print("no vcluster is up; nothing to remove")
    return 0


def register(sub):
    p = sub.add_parser(
        "vcluster", help="this machine as several hosts on a real network (root)",
        description="Make this machine into hosts node1..nodeN, each with its own network "
                    "namespace (an address on a bridge, names of all hosts resolvable), "
                    "hostname, /tmp, /dev/shm and IPC; the rest of the file system is "
                    "shared. MPI runs started inside a host cross the hosts' links (TCP). "
                    "Needs root. See docs/vcluster.md.",
        epilog="example: hpcdl vcluster up --hosts 2 --slots 2 && hpcdl vcluster exec node1 "
               "-- hpcdl run -H node1:2,node2:2 -- python -c \"from hpcdl import comm; "
               "comm.init(); print(comm.rank(), comm.cross_size())\"")
    sub2 = p.add_subparsers(dest="vcluster_command", metavar="ACTION")
    sub2.required = True
    u = sub2.add_parser("up", help="make the hosts",
                        description="Make hosts node1..nodeN (addresses 10.213.0.11..) on a "
                                    "bridge. Says so and changes nothing when one is up; "
                                    "a failed up removes what it made.")
    u.add_argument("--hosts", type=int, required=True, metavar="N", help="number of hosts")
    u.add_argument("--slots", type=int, default=1, metavar="K",
                   help="MPI slots per host written to the hostfile (default 1)")
    u.add_argument("--link", metavar="RATE", default=None,
                   help="shape every host's link to RATE each way (tc units: 500mbit, "
                        "1gbit, 10gbit); default: unshaped")
    u.add_argument("--slurm", action="store_true",
                   help="also start Slurm: munged and slurmctld on node1, one slurmd per "
                        "host (NodeName=nodeK, CPUs = --slots); sbatch, srun --mpi=pmix and "
                        "scontrol then work through exec on every host")
    u.set_defaults(func=_up)
    e = sub2.add_parser("exec", help="run a command on a host",
                        description="Run CMD inside HOST (its network, hostname, /tmp, "
                                    "/dev/shm, IPC) in the current folder with the current "
                                    "environment, plus Open MPI settings that make mpirun "
                                    "-H / hpcdl run -H start ranks on other hosts over "
                                    "their links. The exit status is CMD's.",
                        epilog="example: hpcdl vcluster exec node1 -- mpirun -H "
                               "node1:2,node2:2 -n 4 hostname")
    e.add_argument("host", metavar="HOST", help="node1 .. nodeN")
    # REMAINDER: the command's own `--` (hpcdl run ... -- CMD) must survive
    e.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command and its arguments")
    e.set_defaults(func=_exec)
    s = sub2.add_parser("status", help="show the hosts (exit 1 when none is up)",
                        description="Hosts, addresses, link rate and processes per host, "
                                    "and the Slurm daemons; exit 0 when up and every host "
                                    "(and daemon) runs, else 1.")
    s.set_defaults(func=_status)
    d = sub2.add_parser("down", help="remove everything up made",
                        description="Stop every process on the hosts, remove their "
                                    "namespaces, links, bridge, mounts and state; also after "
                                    "a failed up. Nothing to remove is not an error.")
    d.set_defaults(func=_down)
