"""net.py - the network of a vcluster: one bridge, one veth pair per host
(the bridge end `vc-nodeK` in this namespace, the other end renamed eth0 in
the host's network namespace `nodeK`), addresses in one private /24, and
optional tbf shaping of each link in both directions. Only the hosts' own
addresses are ever configured; the bridge has none, so no traffic leaves
the hosts' subnet."""
import re
import subprocess

SUBNET = "10.213.0.0/24"
BRIDGE = "hpcdl-vc0"
MAX_HOSTS = 200

# tc's rate units, in bits per second (tc: a bare number is bits per second)
_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "kibit": 1024, "mibit": 1024 ** 2, "gibit": 1024 ** 3, "tibit": 1024 ** 4,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
          "kibps": 8 * 1024, "mibps": 8 * 1024 ** 2, "gibps": 8 * 1024 ** 3,
          "tibps": 8 * 1024 ** 4}


class NetError(Exception):
    """A network step failed or was asked for with bad values (one line)."""


def host_name(k):
    return "node%d" % k


def address(k):
    """Host k's address (node1 = 10.213.0.11)."""
    return "10.213.0.%d" % (10 + k)


def veth_name(host):
    return "vc-" + host  # at most 15 characters for up to node200


def parse_rate(rate):
    """'1gbit' -> 1e9 (bits/s) in tc's units; NetError on anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", rate or "")
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise NetError("bad link rate %r; give a rate in tc's units, e.g. 500mbit, "
                       "1gbit, 10gbit" % rate)
    bits = float(m.group(1)) * _UNITS[unit]
    if bits < 8e3:
        raise NetError("link rate %r is below 8kbit; give e.g. 100mbit or 1gbit" % rate)
    return bits


def sh(*argv, ok_codes=(0,)):
    """Runs one ip/tc command; NetError naming it and its message on failure."""
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode not in ok_codes:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise NetError("`%s` failed: %s" % (" ".join(argv), msg[-1] if msg else
                                             "exit %d" % r.returncode))
    return r.stdout


def existing_names():
    """Names of network namespaces and links that exist now."""
    netns = {line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line}
    links = {line.split()[1].rstrip(":").split("@")[0]
             for line in sh("ip", "-o", "link", "show").splitlines() if line}
    return netns, links


def check_free(hosts):
    """NetError if a namespace or link that up would make exists already."""
    netns, links = existing_names()
    taken = sorted(set(hosts) & netns) + sorted(
        ({BRIDGE} | {veth_name(h) for h in hosts}) & links)
    if taken:
        raise NetError("%s already exist%s on this machine (not made by a vcluster that "
                       "is up); remove them (ip netns del / ip link del) or pick fewer "
                       "hosts" % (", ".join(taken), "s" if len(taken) == 1 else ""))


# ---------------------------------------------------------------- making
def make_bridge():
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")


def make_netns(host):
    sh("ip", "netns", "add", host)
    sh("ip", "-n", host, "link", "set", "lo", "up")


def make_link(host, addr):
    """A veth pair: vc-HOST on the bridge, eth0 with addr/24 in HOST."""
    outside, inside = veth_name(host), veth_name(host) + "-h"
    sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
    sh("ip", "link", "set", inside, "netns", host)
    sh("ip", "-n", host, "link", "set", inside, "name", "eth0")
    sh("ip", "-n", host, "addr", "add", addr + "/24", "dev", "eth0")
    sh("ip", "-n", host, "link", "set", "eth0", "up")
    sh("ip", "link", "set", outside, "master", BRIDGE)
    sh("ip", "link", "set", outside, "up")


def tbf_args(bits):
    """tbf parameters for a rate: burst of 1 ms at the rate, at least 128 KiB
    (a GSO packet of 64 KiB must fit), queue of 50 ms."""
    burst = max(128 * 1024, int(bits / 8 / 1000))
    return ["tbf", "rate", "%dbit" % bits, "burst", str(burst), "latency", "50ms"]


def shape_link(host, bits):
    """Full duplex at `bits`/s: the host's sending side (eth0 in the host) and
    its receiving side (vc-HOST's egress toward the host)."""
    sh("ip", "netns", "exec", host, "tc", "qdisc", "replace", "dev", "eth0", "root",
       *tbf_args(bits))
    sh("tc", "qdisc", "replace", "dev", veth_name(host), "root", *tbf_args(bits))


# ---------------------------------------------------------------- undoing
def remove_link(name):
    """Deletes a link (a veth's peer goes with it); absent is fine."""
    sh("ip", "link", "del", name, ok_codes=(0, 1, 2))


def remove_netns(host):
    sh("ip", "netns", "del", host, ok_codes=(0, 1, 2))


def hosts_file(hosts):
    """The /etc/hosts every host sees: localhost and every host's name."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += ["%s\t%s" % (addr, h) for h, addr in hosts]
    return "# written by hpcdl vcluster up\n" + "\n".join(lines) + "\n"
