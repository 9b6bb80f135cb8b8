"""hpcdl.vcluster - one machine made into several hosts, so that multi-node
paths cross a real (veth, TCP) network: `hpcdl vcluster up/exec/status/down`.

    bridge hpcdl-vc0 (no address: the machine itself is not on the network)
      |-- vc-node1 <veth> eth0 10.213.0.11 in host node1
      |-- vc-node2 <veth> eth0 10.213.0.12 in host node2  ...

A host is a network namespace (ip netns nodeK) plus one holder process that
owns its UTS (hostname), IPC and mount namespaces; in the mount namespace the
host has its own /tmp, /dev/shm and /etc/hosts, the rest of the file system
is shared, as a cluster's shared file system is. Everything a host runs
(`exec`, the MPI launch agent, the Slurm daemons) enters the holder's namespaces
through one function, hostns.enter_argv. Everything `up` makes is written to
a state file before it is made, so `down` undoes it, also after a failed up.

Layers: net (links, names, rates), hostns (holders, entering, processes),
state (the record, and the lock: one up at a time), cluster (up/down/status),
agent (MPI launch), slurm (`up --slurm`: the daemons, on hpcdl.slurm.local);
the CLI is hpcdl/cli/vcluster.py.
"""
from .cluster import down, holder_of, kill_processes, processes, status, up  # noqa: F401
from .errors import VclusterError  # noqa: F401
from .state import state_dir  # noqa: F401
from .hostns import exec_host  # noqa: F401
from . import floor  # noqa: F401
from .agent import launch_hosts_problem  # noqa: F401
