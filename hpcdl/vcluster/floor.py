"""floor.py - the network floor of an all-reduce across vcluster hosts, for
`hpcdl bench allreduce`. Over H hosts whose links carry R bits/s each way,
every host must send (and receive) at least 2(H-1)/H x M bytes of an M-byte
all-reduce (reduce-scatter then all-gather between hosts; ranks within a host
add in shared memory), so no algorithm beats

    floor = 2(H-1)/H * M * 8 / R   seconds.

Known only inside a vcluster with shaped links (exec sets HPCDL_VCLUSTER_LINK);
elsewhere (one host, unshaped veth, a real cluster) callers keep their own.
Also what a benchmark header says inside any vcluster: the link rate, and the
machine's cores counted once (the hosts share them; a sum per host overstates)."""
import os

from .net import NetError, parse_rate


def link_bits():
    """The shaped link rate (bits/s) of the vcluster this process runs in, or None."""
    try:
        return parse_rate(os.environ["HPCDL_VCLUSTER_LINK"])
    except (KeyError, NetError):
        return None


def network_floor_us(nbytes, hosts):
    """The floor above in microseconds, or None (one host, virtual nodes, no
    shaped link): then the memory floor applies."""
    bits = link_bits()
    if hosts < 2 or bits is None or os.environ.get("HPCDL_LOCAL_SIZE"):
        return None
    return 2 * (hosts - 1) / hosts * nbytes * 8 / bits * 1e6


def header_line(hosts):
    """The bench header's line on the network floor, or None when it does not apply."""
    if network_floor_us(1, hosts) is None:
        return None
    return ("floor across these %d hosts = the network floor 2(H-1)/H*size / link rate "
            "(links shaped to %s each way by hpcdl vcluster), not the memory floor"
            % (hosts, os.environ["HPCDL_VCLUSTER_LINK"]))


def machine_cores():
    """Inside a vcluster (exec sets HPCDL_VCLUSTER) every host is a namespace
    of this one machine, so all hosts share its cores: their count, not a sum
    over hosts. None outside a vcluster."""
    return (os.cpu_count() or 1) if os.environ.get("HPCDL_VCLUSTER") else None


def vcluster_line():
    """A benchmark header's line on where the hosts are (None outside a vcluster)."""
    if machine_cores() is None:
        return None
    link = os.environ.get("HPCDL_VCLUSTER_LINK")
    return ("vcluster: the hosts are network namespaces of one machine; links %s; they "
            "share its %d cores (and TCP's CPU cost)"
            % ("shaped to %s each way (tbf)" % link if link else "unshaped (veth)",
               machine_cores()))
