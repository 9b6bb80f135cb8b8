"""test_vcluster.py - multi-node paths across a real network: `hpcdl vcluster`
makes 3 hosts (network namespaces on a bridge, own hostname, /tmp, /dev/shm),
once for the module, and every launch starts in node1 and crosses the hosts'
veth links over TCP. Topology comes from MPI's own node split (no
HPCDL_LOCAL_SIZE). Needs root: as an ordinary user the module skips, saying
why; with HPCDL_REQUIRE_VCLUSTER=1 (CI) it fails instead. Every launch has a
hard timeout; the cluster is always taken down, and the last tests check that
down leaves nothing behind."""
import json
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
from vcluster_harness import (HPCDL, assert_nothing_left, cli, host_inodes, leftovers,
                              machine_snapshot, shared_dir, skip_module_unless_possible,
                              vexec, wait_no_leftovers)

skip_module_unless_possible()

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")
PY = sys.executable
HOSTS = ["node1", "node2", "node3"]
LAYOUTS = {"2x2": (4, "node1:2,node2:2"), "3x1": (3, "node1:1,node2:1,node3:1"),
           "2x1": (2, "node1:1,node2:1")}


# ---------------------------------------------------------------- helpers
def hrun(layout, cmd, timeout=90, env=None, check=True):
    """`hpcdl run -n N -H LAYOUT -- CMD` started in node1; asserts that no
    process of it is left on any host afterwards."""
    n, hosts = LAYOUTS[layout]
    r = vexec("node1", HPCDL + ["run", "-n", str(n), "-H", hosts, "--"] + list(cmd),
              timeout=timeout, env=env, check=check)
    assert not wait_no_leftovers(), "processes left on the hosts: %s" % leftovers()
    return r


def said(out, word):
    """How often the ranks printed word (hpcdl run's echo of the command aside)."""
    return sum(l.count(word) for l in out.splitlines() if not l.startswith("hpcdl run:"))


@pytest.fixture(scope="module")
def vc():
    """3 hosts x 2 slots for the module; always down at the end. Yields the
    machine before up and the namespace inodes of the hosts."""
    before = machine_snapshot()
    r = cli("vcluster", "up", "--hosts", "3", "--slots", "2")
    if r.returncode != 0:  # a failed up undoes itself; one already up is not ours
        pytest.fail("vcluster up failed:\n" + r.stdout, pytrace=False)
    try:
        yield {"before": before, "inodes": host_inodes(), "state": vcluster.status()}
    finally:
        cli("vcluster", "down")


# ---------------------------------------------------------------- the hosts
def test_hosts_have_own_names_scratch_and_links(vc):
    marker = "vc-%d" % os.getpid()
    r = vexec("node2", ["sh", "-c", "hostname; pwd; echo $MARK; getent hosts node3; "
                        "echo 2 > /tmp/%s; echo 2 > /dev/shm/%s; ls /tmp /dev/shm; "
                        "ip -o -4 addr show eth0" % (marker, marker)],
              env={"MARK": marker}, check=True)
    lines = r.stdout.split()
    assert lines[:3] == ["node2", REPO, marker], r.stdout          # name, folder, env
    assert "10.213.0.13" in r.stdout and "10.213.0.12/24" in r.stdout, r.stdout
    # node-local scratch: node2's files are seen on node2 only
    r = vexec("node1", ["sh", "-c", "ls /tmp /dev/shm"], check=True)
    assert marker not in r.stdout and not os.path.exists("/tmp/" + marker)
    assert not os.path.exists("/dev/shm/" + marker)
    r = vexec("node2", ["cat", "/tmp/" + marker, "/dev/shm/" + marker], check=True)
    assert r.stdout.split() == ["2", "2"], r.stdout


def test_exit_status_passes_through(vc):
    assert vexec("node3", ["sh", "-c", "exit 7"]).returncode == 7


@pytest.mark.parametrize("layout", ["2x2", "3x1"])
def test_topology_from_the_real_node_split(vc, layout):
    r = hrun(layout, [PY, os.path.join(SCRIPTS, "hosts_topology.py")])
    rows = sorted(l.split()[1:] for l in r.stdout.splitlines() if l.startswith("HOST "))
    n, local, cross = (4, 2, 2) if layout == "2x2" else (3, 1, 3)
    assert len(rows) == n and "TOPOLOGY OK" in r.stdout, r.stdout
    for rank, size, lrank, lsize, crank, csize, host in rows:
        assert (int(size), int(lsize), int(csize)) == (n, local, cross), rows
        assert host == "node%d" % (int(crank) + 1), rows  # by slot: node1 first


def test_shared_memory_within_a_host_tcp_across(vc):
    # each host's /dev/shm is its own: shared memory alone cannot join two hosts
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "[c.sendrecv(c.rank, dest=p, source=p) for p in range(c.size)]; print('JOINED')")
    r = hrun("2x2", [PY, "-c", code], env={"OMPI_MCA_btl": "self,vader"}, check=False)
    assert r.returncode != 0 and "unable to reach each other" in r.stdout, r.stdout
    assert said(r.stdout, "JOINED") == 0, r.stdout
    r = vexec("node1", HPCDL + ["run", "-n", "2", "-H", "node1:2", "--", PY, "-c", code],
              env={"OMPI_MCA_btl": "self,vader"}, check=True)
    assert said(r.stdout, "JOINED") == 2, r.stdout
    # and the bytes of a cross-host all-reduce go over node2's link
    rx = "/sys/class/net/eth0/statistics/rx_bytes"
    before = int(vexec("node2", ["cat", rx], check=True).stdout)
    code = ("import numpy as np; from hpcdl import comm; c = comm.init(); "
            "x = np.ones(4 << 20, np.float32); c.allreduce(x, algorithm='ring'); "
            "assert x[0] == c.size; print('SUMMED')")
    r = hrun("2x2", [PY, "-c", code])
    after = int(vexec("node2", ["cat", rx], check=True).stdout)
    assert said(r.stdout, "SUMMED") == 4 and after - before > 16 << 20, (after - before)


# ---------------------------------------------------------------- collectives
@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["2x2", "3x1"])
def test_collectives_across_hosts(vc, layout):
    # one launch: sizes 0, 1, N-1, odd, 1 MiB+3; every op; float32 through every
    # algorithm, the other dtypes through auto, torch tensors and the other
    # collectives; against MPI's own (the dtype matrix: src_c's C tests)
    r = hrun(layout, [PY, os.path.join(SCRIPTS, "collectives_check.py"), "all"], timeout=300)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("layout,algo", [("2x1", "hier"), ("2x1", "ring"), ("2x2", "auto")])
def test_allreduce_64mib_across_hosts(vc, layout, algo):
    # 64 MiB every op: on 2 hosts x 1 rank (ranks <= cores), and 2 x 2 for auto;
    # on the loaded 2-core development machine 2x1 took 2 min, 4 ranks far longer
    r = hrun(layout, [PY, os.path.join(SCRIPTS, "collectives_check.py"), "big:" + algo,
                      str(64 << 20)], timeout=600)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
def test_shared_buffers_across_hosts(vc):
    # buffers in each host's own shared memory, the cross-host ring between
    # them (the script needs 2+ ranks per host: no 3x1 here)
    r = hrun("2x2", [PY, os.path.join(SCRIPTS, "shared_buffer_check.py")], timeout=300)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
def test_distributed_optimizer_exact_2x2(vc):
    r = hrun("2x2", [PY, os.path.join(SCRIPTS, "torch_optimizer_exact.py"),
                     "sgd", "2", "none", "2e-5"], timeout=300)
    assert r.stdout.count("EXACT") == 4, r.stdout


@pytest.mark.mpi
def test_zero_stages_exact_3x1(vc):
    # ZeRO's reduce-scatter and all-gather across three hosts, blocks cutting layers
    # at host boundaries: stages 1-2 == stage 0 and one process (fp16 gradients:
    # within 3e-3), stage 3 == one process (scripts as in test_zero / test_zero3)
    cases = ["1:adam:1", "2:lars:2:clip:buckets", "2:adam:1:fp16:buckets"]
    r = hrun("3x1", [PY, os.path.join(SCRIPTS, "zero_exact.py"), "1e-6"] + cases, timeout=300)
    assert said(r.stdout, "ZERO OK") == 3 * len(cases), r.stdout
    cases = ["adam:1", "sgd:2:units", "adam:1:bf16"]
    r = hrun("3x1", [PY, os.path.join(SCRIPTS, "zero3_exact.py"), "1e-6"] + cases, timeout=300)
    assert said(r.stdout, "ZERO3 OK") == 3 * len(cases), r.stdout


# ---------------------------------------------------------------- training
def _train(hosts, out, env=None, timeout=300):
    cmd = HPCDL + ["train", "-n", "2", "-H", hosts, "--epochs", "1", "--global-batch", "64",
                   "--seed", "3", "--out", str(out)]
    return vexec("node1", cmd, timeout=timeout, env=env)


@pytest.mark.mpi
def test_train_on_two_hosts_ends_like_one_host(vc, tmp_path):
    # the same run as 2 virtual nodes of one host (HPCDL_LOCAL_SIZE=1, what the
    # multi-node tests used before) and as 2 real hosts: bit-identical weights.
    # (1 host x 2 ranks as one node takes the shared-memory path: other bits.)
    base = shared_dir(tmp_path.name)  # a folder every host sees
    one = _train("node1:2", os.path.join(base, "one"), env={"HPCDL_LOCAL_SIZE": "1"})
    two = _train("node1:1,node2:1", os.path.join(base, "two"))
    assert one.returncode == 0 and two.returncode == 0, one.stdout + two.stdout
    sums = [json.load(open(os.path.join(base, d, "summary.json"))) for d in ("one", "two")]
    assert sums[0]["params_sha256"] == sums[1]["params_sha256"], sums
    assert sums[1]["test_accuracy"] > 0.85, sums
    assert not wait_no_leftovers()


def _fault(how):
    if how == "kill":  # every process of the job on node2, at once
        assert vcluster.processes()["node2"], "no process of the job on node2 to kill"
        vcluster.kill_processes("node2")
    else:
        subprocess.run(["ip", "-n", "node2", "link", "set", "eth0", "down"], check=True)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["kill", "link"])
def test_lost_host_ends_the_job_everywhere(vc, tmp_path, how):
    base = shared_dir(tmp_path.name)
    # short epochs (8 steps) of synthetic data: the fault comes after the first
    cmd = HPCDL + ["train", "-n", "2", "-H", "node1:1,node2:1", "--epochs", "1000",
                   "--data", "synthetic:64:10:640", "--global-batch", "64", "--out", base]
    proc = subprocess.Popen(HPCDL + ["vcluster", "exec", "node1", "--"] + cmd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env=mpi_env(), start_new_session=True)
    try:
        metrics = os.path.join(base, "metrics.jsonl")
        clock = hang_guard.Clock(120)
        while not (os.path.exists(metrics) and os.path.getsize(metrics)):  # training runs
            assert proc.poll() is None and not clock.expired(), proc.communicate()[0]
            time.sleep(0.2)
        # 30 s of full-speed time (tests/hang_guard.py): longer while other programs
        # share the cores
        clock = hang_guard.Clock(30)
        _fault(how)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = "(still running after 30 s)\n" + proc.communicate()[0]
        clock.tick()
        ended = clock.used
        left = wait_no_leftovers(timeout=max(1.0, clock.left()))
        clock.tick()
        gone = clock.used
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        vcluster.kill_processes()
        subprocess.run(["ip", "-n", "node2", "link", "set", "eth0", "up"])
    assert proc.returncode != 0 and ended < 30, (ended, out)
    assert not left and gone < 30, "left on the hosts after %.1f s: %s" % (gone, left)
    # mpirun names the lost host, hpcdl run its ranks
    assert re.search(r"node2", out) and "ranks by host: node1 0, node2 1" in out, out
    print("%s: job ended after %.1f s, every process gone after %.1f s" % (how, ended, gone))


@pytest.mark.mpi
def test_rank_on_another_host_leaving_early_ends_the_job(vc):
    """Issue 32 item 2 across hosts: rank 1, on node2, returns from its script
    while rank 0 on node1 waits in an all-reduce it never ran: the job ends
    at the next heartbeat, naming rank 1 (it hung for the 600 s shutdown time)."""
    r = hrun("2x1", [PY, os.path.join(SCRIPTS, "exit_check.py"), "early", "1"], timeout=120,
             check=False)
    assert r.returncode != 0 and said(r.stdout, "NOT REACHED") == 0, r.stdout
    assert re.search(r"rank 1 finished .* rank 1 is missing [^;]*grad\.skipped", r.stdout), \
        r.stdout


@pytest.mark.mpi
def test_torchrun_script_meets_at_the_first_host(vc):
    """Issue 32 item 5 across hosts: hpcdl run sets MASTER_ADDR to the first
    host listed (rank 0's) and a free MASTER_PORT for gloo's env:// rendezvous."""
    # Each rank writes its result to its own file, not stdout: mpirun forwards
    # the two ranks' stdout in pieces that interleaved in 2 of 9 runs. It then
    # leaves by os._exit: torch's gloo teardown at interpreter exit aborted
    # ("terminate called without an active exception") in about 1 of 5 runs
    # here, with or without destroy_process_group; that is torch's, not what
    # this test is about (the rendezvous hpcdl run sets up).
    base = shared_dir("torchrun_first_host")
    code = ("import torch, torch.distributed as dist, os; dist.init_process_group('gloo'); "
            "x = torch.ones(2) * (dist.get_rank() + 1); dist.all_reduce(x); "
            "open(os.path.join(%r, str(dist.get_rank())), 'w').write("
            "'%%d %%s %%s' %% (dist.get_rank(), x.tolist(), os.environ['MASTER_ADDR'])); "
            "os._exit(0)" % base)
    vexec("node1", HPCDL + ["run", "-H", "node1:1,node2:1", PY, "-c", code],
          timeout=120, check=True)
    assert not wait_no_leftovers(), "processes left on the hosts: %s" % leftovers()
    rows = [open(os.path.join(base, str(r))).read() for r in (0, 1)]
    assert rows == ["0 [3.0, 3.0] node1", "1 [3.0, 3.0] node1"], rows


@pytest.mark.mpi
def test_torch_backend_ddp_2x2_matches_one_process(vc):
    """Issue 30: examples/torchrun_ddp.py (DDP on backend "hpcdl") across 2
    hosts x 2 ranks, the same file as one process: the weights within 1e-6."""
    base = shared_dir("torch_backend_ddp")  # rank 0 saves; the test reads it here
    script = os.path.join(REPO, "examples", "torchrun_ddp.py")
    r = hrun("2x2", [PY, script, "--save", os.path.join(base, "four.pt")], timeout=300)
    assert said(r.stdout, "(4 ranks, backend hpcdl)") == 3, r.stdout
    env = mpi_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"})
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    subprocess.run([PY, script, "--save", os.path.join(base, "one.pt")], env=env, cwd=REPO,
                   timeout=120, check=True, capture_output=True)
    import torch
    got, want = (torch.load(os.path.join(base, f)) for f in ("four.pt", "one.pt"))
    for k in want:  # 24 SGD steps, sums in another order (hier across hosts)
        rel = ((got[k] - want[k]).abs().max() / want[k].abs().max()).item()
        assert rel <= 1e-6, (k, rel)


@pytest.mark.mpi
def test_bench_header_names_hosts_link_and_shared_cores(vc):
    # the hosts are namespaces of one machine: its cores, not a sum over hosts
    r = vexec("node1", HPCDL + ["bench", "allreduce", "-n", "2", "-H", "node1:1,node2:1",
                                "--min-bytes", "4K", "--max-bytes", "4K", "--algorithms",
                                "ring,mpi4py", "--iters", "3", "--warmup", "1",
                                "--time-budget", "0.1"], timeout=180, check=True)
    assert "hosts 2 (node1, node2)" in r.stdout, r.stdout
    assert "| cores %d |" % os.cpu_count() in r.stdout, r.stdout
    assert "vcluster: the hosts are network namespaces of one machine; links unshaped " \
           "(veth); they share its %d cores" % os.cpu_count() in r.stdout, r.stdout


# ---------------------------------------------------------------- bad input
def test_up_while_up_says_so_and_changes_nothing(vc):
    before = (vcluster.status(), machine_snapshot())
    r = cli("vcluster", "up", "--hosts", "2")
    assert r.returncode != 0 and "already up (node1, node2, node3)" in r.stdout, r.stdout
    assert (vcluster.status(), machine_snapshot()) == before


@pytest.mark.parametrize("args, words", [
    (["up", "--hosts", "0"], "--hosts must be 1 to"),
    (["up", "--hosts", "2", "--link", "fast"], "bad link rate 'fast'"),
    (["up", "--hosts", "2", "--link", "0mbit"], "bad link rate '0mbit'"),
    (["exec", "node7", "--", "true"], "no host 'node7' in this vcluster"),
])
def test_bad_input_is_one_line(vc, args, words):
    r = cli("vcluster", *args)
    assert r.returncode == 2 and words in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout


def test_run_naming_an_unknown_host_is_one_line(vc):
    r = vexec("node1", HPCDL + ["run", "-n", "2", "-H", "node1:1,node5:1", "--", "true"])
    assert r.returncode == 2 and "node5, not a host of this vcluster" in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout


def test_not_root_says_so():
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv to drop root")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
                       + HPCDL + ["vcluster", "status"], capture_output=True, text=True,
                       cwd="/", env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
    assert r.returncode == 2 and "needs root" in r.stderr, r.stderr


# ---------------------------------------------------------------- down
def test_down_leaves_nothing(vc):
    # last tests of the module: the module's cluster goes, then a shaped one
    # comes and goes, then a name that exists stops up before it makes anything
    assert cli("vcluster", "down").returncode == 0
    assert_nothing_left(vc["before"], vc["inodes"])
    r = cli("vcluster", "up", "--hosts", "2", "--link", "100mbit")
    try:
        assert r.returncode == 0, r.stdout
        for dev in (["ip", "netns", "exec", "node1", "tc", "qdisc", "show", "dev", "eth0"],
                    ["tc", "qdisc", "show", "dev", "vc-node1"]):
            assert "tbf" in subprocess.run(dev, capture_output=True, text=True).stdout
        assert 0.25 < transfer_seconds(4 << 20) < 5  # 4 MiB at 100 Mbit/s: 0.34 s
    finally:
        assert cli("vcluster", "down").returncode == 0
    assert_nothing_left(vc["before"], vc["inodes"])
    subprocess.run(["ip", "netns", "add", "node2"], check=True)
    try:
        r = cli("vcluster", "up", "--hosts", "2")
        assert r.returncode == 2 and "node2 already exists" in r.stdout, r.stdout
        assert vcluster.status() is None and "hpcdl-vc0" not in machine_snapshot()["links"]
    finally:
        subprocess.run(["ip", "netns", "del", "node2"], check=True)
    assert_nothing_left(vc["before"], vc["inodes"])


def transfer_seconds(nbytes):
    """Seconds to send nbytes from node1 to node2 over TCP (Python sockets)."""
    server = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
              "socket.SO_REUSEADDR, 1); s.bind(('node2', 5701)); s.listen(1); "
              "print('LISTEN', flush=True); c, _ = s.accept(); n = 0\n"
              "while n < %d:\n    n += len(c.recv(1 << 20))\nc.sendall(b'k')" % nbytes)
    client = ("import socket, time\nfor i in range(50):\n    try:\n        "
              "s = socket.create_connection(('node2', 5701)); break\n    except OSError:\n"
              "        time.sleep(0.1)\nt = time.time(); s.sendall(bytes(%d)); s.recv(1); "
              "print('SECONDS %%.3f' %% (time.time() - t))" % nbytes)
    srv = subprocess.Popen(HPCDL + ["vcluster", "exec", "node2", "--", PY, "-c", server],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "LISTEN"
        r = vexec("node1", [PY, "-c", client], timeout=30, check=True)
    finally:
        srv.wait(timeout=30)
    return float(r.stdout.split("SECONDS")[1])


def test_two_ups_at_once_build_one_cluster(vc):
    # the state file is the lock: of two concurrent ups one builds, the other
    # says a vcluster is up (or being made) and touches nothing
    before = machine_snapshot()
    procs = [subprocess.Popen(HPCDL + ["vcluster", "up", "--hosts", "2"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 2], outs
        assert any("a vcluster is already up" in o for o in outs), outs
        st = vcluster.status()
        assert [h["name"] for h in st["hosts"]] == ["node1", "node2"]
        assert all(h["alive"] for h in st["hosts"]), st
    finally:
        assert cli("vcluster", "down").returncode == 0
    assert_nothing_left(before, vc["inodes"])


def test_failed_up_leaves_nothing(vc, monkeypatch):
    # a step that fails half-way (here: shaping the first host's link, after
    # the bridge, a namespace and a link exist) undoes everything made so far
    def broken(host, bits):
        raise vcluster.net.NetError("tc broke on " + host)
    monkeypatch.setattr(vcluster.net, "shape_link", broken)
    with pytest.raises(vcluster.VclusterError, match="up failed and was undone: tc broke on "
                                                     "node1"):
        vcluster.up(2, link="1gbit")
    assert_nothing_left(vc["before"], vc["inodes"])
