"""test_vcluster_slurm.py - Slurm across hosts: `hpcdl vcluster up --slurm`
makes 3 hosts x 2 CPUs (slurmctld and munged on node1, a slurmd in every
host's namespaces), once for the module. Jobs are submitted from one host and
run on others over the hosts' links: the multi-node template on 2 nodes
(ranks on two hostnames, all-reduce against MPI's own), the sweep over 1..3
nodes, the preemptible job requeued and resumed exactly, node-local staging
into each host's own /tmp, and an HDF5 collective write (driver='mpio') from
2 hosts read back on each. The client side (submit, wait, scontrol records)
is tests/slurm_cluster.py's, run through `hpcdl vcluster exec`. Root only:
skips otherwise, fails where HPCDL_REQUIRE_VCLUSTER=1 (CI). The last tests
take the cluster down, check nothing is left, and that a failed `up
--slurm` leaves nothing either."""
import json
import os
import subprocess
import threading
import time

import pytest

import hang_guard
from hpcdl import vcluster
from hpcdl.slurm import local
from slurm_cluster import CHECK, HPCDL, SlurmCluster, checks, finished, output, submit
from vcluster_harness import (assert_nothing_left, cli, host_inodes, machine_snapshot,
                              shared_dir, skip_module_unless_possible, vexec,
                              wait_no_leftovers)

skip_module_unless_possible(local.missing_programs())

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

NODES = ["node1", "node2", "node3"]
# the preempted training: long enough (several seconds) for a signal to land mid-run
TRAIN = ["hpcdl", "train", "--data", "digits", "--hidden", "256,256", "--epochs", "3",
         "--global-batch", "32", "--base-lr", "0.02", "--seed", "1"]


def on(host):
    """Slurm's clients as seen from host (sbatch, scontrol ... through exec)."""
    cluster = SlurmCluster(vcluster.slurm.root(), prefix=HPCDL + ["vcluster", "exec", host,
                                                                  "--"])
    cluster.poll_s = 1.0  # each poll starts `hpcdl vcluster exec`: spare the 2 cores
    return cluster


@pytest.fixture(scope="module")
def vcs():
    """3 hosts x 2 CPUs with Slurm for the module; always down at the end."""
    before = machine_snapshot()
    r = cli("vcluster", "up", "--hosts", "3", "--slots", "2", "--slurm", timeout=180)
    if r.returncode != 0:  # a failed up undoes itself; one already up is not ours
        pytest.fail("vcluster up --slurm failed:\n" + r.stdout, pytrace=False)
    try:
        yield {"before": before, "inodes": host_inodes()}
    finally:
        cli("vcluster", "down")


def hosts_of(text):
    """{host: ranks} from the CHECK lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("CHECK "):
            host = line.split(" host ")[1].split()[0]
            out[host] = out.get(host, 0) + 1
    return out


# ---------------------------------------------------------------- the cluster
def test_every_host_is_an_idle_node_seen_from_every_host(vcs):
    for host in NODES:
        r = vexec(host, ["sinfo", "-h", "-N", "-o", "%N %T %c"], check=True)
        assert r.stdout.split("\n")[:3] == ["node1 idle 2", "node2 idle 2", "node3 idle 2"], \
            (host, r.stdout)
    r = vexec("node3", ["scontrol", "show", "node", "node2"], check=True)
    assert "NodeAddr=10.213.0.12" in r.stdout, r.stdout
    # each slurmd runs in its own host (its network namespace is the host's)
    st = vcluster.status()
    holders = {h["name"]: h["holder"] for h in st["hosts"]}
    slurmds = [d for d in st["daemons"] if d["name"] == "slurmd"]
    assert sorted(d["host"] for d in slurmds) == NODES and all(d["alive"] for d in slurmds)
    for d in slurmds:
        assert os.readlink("/proc/%d/ns/net" % d["pid"]) == \
            os.readlink("/proc/%d/ns/net" % holders[d["host"]])
    r = vexec("node2", ["srun", "--mpi=list"], check=True)
    assert "pmix" in r.stdout, r.stdout
    r = vexec("node2", ["srun", "-N3", "--ntasks-per-node=1", "hostname"], timeout=60,
              check=True)
    assert sorted(r.stdout.split()) == NODES, r.stdout


def test_multi_node_template_on_two_hosts(vcs):
    cwd = shared_dir("slurm-multi")
    cluster = on("node2")
    # no GPUs here: the --gpus-per-node line is switched off
    job = submit(cluster, cwd, "multi-node-gpu", "--nodes", "2", "--ntasks-per-node", "2",
                 "--set", "GPUS_PER_NODE=", "--set", "CPUS_PER_TASK=1",
                 cmd=["python", "-c", CHECK])
    rec = finished(cluster, job)[0]
    log = output(os.path.join(cwd, "hpcdl-%s.out" % job))
    assert checks(log) == [(r, 4, "ok") for r in range(4)], log
    hosts = hosts_of(log)
    assert len(hosts) == 2 and set(hosts.values()) == {2}, log  # 2 hosts x 2 ranks
    assert set(hosts) <= set(NODES) and rec["NodeList"] in ("node[1-2]", "node[1,3]",
                                                           "node[2-3]"), rec
    assert not wait_no_leftovers(), "the job left processes on the hosts"


def test_sweep_over_one_to_three_nodes(vcs):
    cwd = shared_dir("slurm-sweep")
    sweep = os.path.join(cwd, "sweep")
    cluster = on("node3")
    job = submit(cluster, cwd, "scaling-sweep", "--nodes", "3", "--ntasks-per-node", "1",
                 "--set", "SWEEP=nodes", "--set", "SWEEP_VALUES=1 2 3",
                 "--set", "SWEEP_DIR=" + sweep,
                 cmd=["hpcdl", "train", "--data", "digits", "--epochs", "1",
                      "--global-batch", "48"])  # 48: even over 1, 2 and 3 ranks
    recs = finished(cluster, job, timeout=300)
    assert sorted(r["ArrayTaskId"] for r in recs) == ["0", "1", "2"]
    for n in (1, 2, 3):
        summary = json.load(open(os.path.join(sweep, "nodes-%d" % n, "summary.json")))
        # the trainer's own node count: MPI's node split, one rank per host
        assert (summary["ranks"], summary["nodes"]) == (n, n), summary
    r = vexec("node1", HPCDL + ["slurm", "summary", sweep, "--json",
                                os.path.join(cwd, "rows.json")], timeout=120, check=True)
    rows = json.load(open(os.path.join(cwd, "rows.json")))
    assert [row["ranks"] for row in rows] == [1, 2, 3], r.stdout


def test_preemptible_job_requeued_and_resumed_exactly(vcs):
    cwd = shared_dir("slurm-preempt")
    run_dir = os.path.join(cwd, "run")
    reference = {}

    def uninterrupted():  # the same training on 2 hosts x 1 rank, outside Slurm
        reference["run"] = vexec("node3", HPCDL + TRAIN[1:] + [
            "-n", "2", "-H", "node2:1,node3:1", "--out", os.path.join(cwd, "ref")],
            timeout=400)
    thread = threading.Thread(target=uninterrupted)
    thread.start()
    cluster = on("node1")
    job = submit(cluster, cwd, "preemptible", "--nodes", "2", "--ntasks-per-node", "1",
                 "--set", "RUN_DIR=" + run_dir, "--set", "MAX_RESTARTS=2", cmd=TRAIN)
    log_path = os.path.join(cwd, "hpcdl-%s.out" % job)
    # the trainer prints its set-up line once every rank's handler is installed
    clock = hang_guard.Clock(240)
    while not (os.path.exists(log_path) and "hpcdl train: mlp" in output(log_path)):
        assert not clock.expired(), "the trainer did not start in " + clock.describe()
        time.sleep(0.5)
    # what --signal=B:USR1@N does near the time limit, now: USR1 to the batch shell
    cluster.run("scancel", "--signal=USR1", "--batch", job)
    rec = finished(cluster, job, timeout=400)[0]
    thread.join(timeout=400)
    log = output(log_path)
    assert rec["Restarts"] == "1", (rec, log)
    assert "stopped by SIGUSR1 at epoch" in log, log
    assert int(log.split("stopped by SIGUSR1 at epoch ")[1].split()[0]) < 3, log
    assert "requeueing job %s" % job in log and "run 2" in log, log
    assert reference["run"].returncode == 0, reference["run"].stdout
    got = json.load(open(os.path.join(run_dir, "out", "summary.json")))
    want = json.load(open(os.path.join(cwd, "ref", "summary.json")))
    assert (got["ranks"], got["nodes"]) == (2, 2), got
    assert got["params_sha256"] == want["params_sha256"], log


# ---------------------------------------------------------------- data on hosts
@pytest.fixture(scope="module")
def shards(vcs):
    """digits written as HDF5 shards by 2 ranks on 2 hosts (srun, PMIx), every
    shard one file that both write collectively (driver='mpio'); plus the
    same written by one process, to compare."""
    cwd = shared_dir("slurm-h5")
    par, one = os.path.join(cwd, "par"), os.path.join(cwd, "one")
    # chunks of 64 rows: each rank writes blocks of every shard
    args = ["data", "shard", "digits", "--shards", "2", "--chunk-rows", "64",
            "--val-fraction", "0.2", "--out"]
    r = vexec("node1", ["srun", "-N2", "-n2", "--mpi=pmix"] + HPCDL + args + [par],
              timeout=180)
    assert r.returncode == 0, r.stdout
    vexec("node3", HPCDL + args + [one], timeout=120, check=True)
    return par, one


def test_hdf5_collective_write_from_two_hosts_read_on_each(vcs, shards):
    par, one = shards
    doc = json.load(open(os.path.join(par, "manifest.json")))
    assert doc["written_by"] == {"io": "mpio-collective", "ranks": 2}, doc["written_by"]
    want = json.load(open(os.path.join(one, "manifest.json")))
    for split in ("train", "val"):
        assert [s["checksums"] for s in doc["splits"][split]["shards"]] == \
            [s["checksums"] for s in want["splits"][split]["shards"]]
    for host in NODES:  # every byte read back, on every host
        r = vexec(host, HPCDL + ["data", "verify", par], timeout=120)
        assert r.returncode == 0 and "bad shards: 0 of 4 OK" in r.stdout, (host, r.stdout)


def test_stage_to_each_hosts_own_tmp(vcs, shards):
    par, _ = shards
    cwd = shared_dir("slurm-stage")
    stage = "/tmp/hpcdl-test-stage-%d" % os.getpid()
    cluster = on("node2")
    job = submit(cluster, cwd, "multi-node-gpu", "--nodes", "2", "--ntasks-per-node", "1",
                 "--set", "GPUS_PER_NODE=", "--set", "CPUS_PER_TASK=1",
                 cmd=["hpcdl", "train", "--data", par, "--stage-to", stage, "--epochs", "1",
                      "--global-batch", "64", "--out", os.path.join(cwd, "out")])
    rec = finished(cluster, job)[0]
    summary = json.load(open(os.path.join(cwd, "out", "summary.json")))
    assert (summary["ranks"], summary["nodes"]) == (2, 2), summary
    used = {"node[1-2]": ["node1", "node2"], "node[1,3]": ["node1", "node3"],
            "node[2-3]": ["node2", "node3"]}[rec["NodeList"]]
    files = sorted(os.listdir(par))
    for host in NODES:
        r = vexec(host, ["sh", "-c", "ls %s/hpcdl-stage-par-*" % stage])
        if host in used:  # a whole copy on each of the job's hosts
            assert r.returncode == 0 and r.stdout.split() == files, (host, r.stdout)
        else:
            assert r.returncode != 0, (host, r.stdout)
    assert not os.path.exists(stage), "staged into the machine's /tmp, not the hosts'"


# ---------------------------------------------------------------- down
def test_down_removes_daemons_and_files(vcs):
    pids = [d["pid"] for d in vcluster.status()["daemons"]]
    assert len(pids) == 1 + 1 + len(NODES)  # munged, slurmctld, a slurmd per host
    r = cli("vcluster", "down", timeout=120)
    assert r.returncode == 0, r.stdout
    assert not [p for p in pids if local.alive(p)], "Slurm daemons left running"
    assert_nothing_left(vcs["before"], vcs["inodes"])


def test_failed_slurm_up_leaves_nothing(monkeypatch):
    # the daemons start, then the nodes never come up idle: up undoes all of it
    before, started = machine_snapshot(), []

    def never_idle(sinfo, env, n, timeout):
        started.extend(d["pid"] for d in vcluster.status()["daemons"])
        raise RuntimeError("nodes never idle (test)")
    monkeypatch.setattr(local, "wait_idle", never_idle)
    with pytest.raises(vcluster.VclusterError, match="up failed and was undone: nodes never"):
        vcluster.up(2, with_slurm=True)
    assert len(started) == 4 and not [p for p in started if local.alive(p)], started
    assert_nothing_left(before, set())


def test_slurm_missing_is_one_line_before_anything_is_made():
    # no Slurm clients on PATH (the daemons are still found: sbin is searched too)
    before = machine_snapshot()
    r = subprocess.run(HPCDL + ["vcluster", "up", "--hosts", "2", "--slurm"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PATH="/nonexistent"))
    assert r.returncode == 2 and "--slurm: sbatch, srun" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert machine_snapshot() == before and vcluster.status() is None
