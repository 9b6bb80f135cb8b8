"""test_slurm_jobs.py - the templates and launch logic against a real Slurm
(tests/slurm_cluster.py: munged, slurmctld and slurmd on localhost, one node).

Every template is submitted through `hpcdl slurm submit` with 2 ranks and runs
to completion: single-node trains exactly as the same training under mpirun
(same parameter hash), multi-node-gpu runs an all-reduce checked against
MPI's own under srun and under mpirun, the scaling sweep's array runs every
task and `hpcdl slurm summary` reads them, and the preemptible job gets
SIGUSR1, checkpoints, requeues itself and ends with the parameters of an
uninterrupted run. `hpcdl run` and `hpcdl train` inside an allocation start
their ranks with srun, and inside a step never start a second layer."""
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import hang_guard
from mpi_harness import run_mpi
from slurm_cluster import CHECK, HPCDL, VENV, checks, finished, output, submit

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# long enough (several seconds of steps) for a signal to land mid-run
TRAIN = ["hpcdl", "train", "--data", "digits", "--hidden", "1024,1024", "--epochs", "8",
         "--global-batch", "16", "--base-lr", "0.02", "--seed", "1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The TRAIN run on 2 ranks under mpirun, uninterrupted, started in the
    background (it overlaps the first Slurm job); result() waits and returns
    its summary.json plus out_dir."""
    out = tmp_path_factory.mktemp("reference")

    def train():
        run_mpi(2, [sys.executable, "-m"] + TRAIN + ["--out", str(out)], timeout=300,
                check=True)
        return dict(json.loads((out / "summary.json").read_text()), out_dir=str(out))
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(train)


# ---------------------------------------------------------------- templates
def test_single_node_template_trains_as_under_mpirun(slurm_cluster, tmp_path, reference):
    job = submit(slurm_cluster, tmp_path, "single-node", "--ntasks-per-node", "2",
                 "--job-name", "t-single", cmd=TRAIN + ["--out", str(tmp_path / "out")])
    finished(slurm_cluster, job)
    log = output(tmp_path / ("hpcdl-%s.out" % job))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["ranks"], summary["nodes"]) == (2, 1), log
    assert summary["params_sha256"] == reference.result()["params_sha256"], log


def test_multi_node_gpu_template_under_srun_and_mpirun(slurm_cluster, tmp_path):
    jobs = {}
    for launcher in ("srun", "mpirun"):
        # the test node has no GPUs: the --gpus-per-node line is switched off
        jobs[launcher] = submit(slurm_cluster, tmp_path, "multi-node-gpu", "--nodes", "1",
                                "--ntasks-per-node", "2", "--set", "GPUS_PER_NODE=",
                                "--set", "CPUS_PER_TASK=1", "--set", "LAUNCHER=" + launcher,
                                cmd=[sys.executable, "-c", CHECK])
    for launcher, job in jobs.items():
        finished(slurm_cluster, job)
        log = output(tmp_path / ("hpcdl-%s.out" % job))
        assert checks(log) == [(0, 2, "ok"), (1, 2, "ok")], (launcher, log)
    srun_log = output(tmp_path / ("hpcdl-%s.out" % jobs["srun"]))
    assert "slurm_localid 0" in srun_log and "slurm_localid 1" in srun_log


def test_scaling_sweep_runs_every_task_and_summary_reads_them(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    job = submit(slurm_cluster, tmp_path, "scaling-sweep", "--nodes", "1",
                 "--ntasks-per-node", "2", "--set", "SWEEP=ranks", "--set", "SWEEP_VALUES=1 2",
                 "--set", "SWEEP_DIR=%s" % sweep,
                 cmd=["hpcdl", "train", "--data", "digits", "--epochs", "2",
                      "--global-batch", "64"])
    recs = finished(slurm_cluster, job)
    assert sorted(r["ArrayTaskId"] for r in recs) == ["0", "1"]
    runs = {}
    for name in ("ranks-1", "ranks-2"):
        runs[name] = json.loads((sweep / name / "summary.json").read_text())
        assert runs[name]["ranks"] == int(name[-1])
    r = subprocess.run(HPCDL + ["slurm", "summary", str(sweep), "--plot", "--json",
                                str(tmp_path / "rows.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [row["ranks"] for row in rows] == [1, 2]
    rate = [runs[n]["samples_per_s"] for n in ("ranks-1", "ranks-2")]
    assert rows[1]["speed_up"] == pytest.approx(rate[1] / rate[0])
    assert rows[1]["efficiency"] == pytest.approx(rate[1] / rate[0] / 2)
    assert (sweep / "scaling.png").stat().st_size > 0


def test_submit_reports_slurms_own_message(slurm_cluster, tmp_path):
    r = subprocess.run(HPCDL + ["slurm", "submit", "single-node", "--partition", "nosuch",
                                "--", "true"],
                       capture_output=True, text=True, cwd=tmp_path, env=slurm_cluster.env,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert "sbatch refused the job" in r.stderr and "partition" in r.stderr.lower(), r.stderr


# ---------------------------------------------------------------- launch in allocations
ALLOCATION_SCRIPT = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --output={out}/job.out
{activate}
echo "=== A hpcdl run, no -n"
hpcdl run -- {python} -c '{check}'
echo "=== A rc=$?"
echo "=== B hpcdl run -n 3"
hpcdl run -n 3 -- true
echo "=== B rc=$?"
echo "=== C hpcdl run inside an srun step"
srun --mpi=pmix hpcdl run -n 2 -- {python} -c '{check}'
echo "=== C rc=$?"
echo "=== D hpcdl train -n 2"
hpcdl train -n 2 --data digits --epochs 1 --global-batch 64 --out {out}/train
echo "=== D rc=$?"
"""


def test_run_and_train_inside_an_allocation(slurm_cluster, tmp_path):
    script = ALLOCATION_SCRIPT.format(
        out=tmp_path, python=sys.executable, check=CHECK.replace("'", '"'),
        activate='source "%s/bin/activate"' % VENV if VENV else "")
    job = slurm_cluster.sbatch_text(script, cwd=tmp_path)
    finished(slurm_cluster, job)
    log = output(tmp_path / "job.out")
    part, rc = {}, {}
    for k in "ABCD":  # the output between '=== K ' and '=== K rc=N'
        assert "=== %s rc=" % k in log, log
        part[k], tail = log.split("=== %s " % k, 1)[1].split("=== %s rc=" % k, 1)
        rc[k] = int(tail.split()[0])
    assert rc == {"A": 0, "B": 2, "C": 0, "D": 0}, log
    # A: the whole allocation, through srun
    assert "hpcdl run: " in part["A"] and "srun --mpi=pmix --ntasks=2" in part["A"], log
    assert checks(part["A"]) == [(0, 2, "ok"), (1, 2, "ok")], log
    assert "Slurm job %s has 2 task(s)" % job in part["B"], log
    # C: each of srun's 2 tasks runs the command once, as one rank of 2
    assert part["C"].count("already inside") == 2, log
    assert checks(part["C"]) == [(0, 2, "ok"), (1, 2, "ok")], log
    assert "srun --mpi=pmix --ntasks=2" in part["D"], log
    assert json.loads((tmp_path / "train" / "summary.json").read_text())["ranks"] == 2


# ---------------------------------------------------------------- torch.distributed under srun
TORCHRUN_SCRIPT = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --time=00:05:00
#SBATCH --output={out}/job.out
{activate}
unset MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE
export OMP_NUM_THREADS=1
srun --mpi=pmix --ntasks=2 --kill-on-bad-exit=1 {python} -m hpcdl run -- {python} {script} \\
    --save {out}/two.pt
echo "=== rc=$?"
"""


def test_torchrun_script_on_backend_hpcdl_under_srun(slurm_cluster, tmp_path):
    """examples/torchrun_ddp.py (DDP, init_process_group("hpcdl")) as 2 srun
    tasks: `hpcdl run` in each task only sets RANK/LOCAL_RANK/WORLD_SIZE from
    Slurm's variables, no MASTER_ADDR/PORT, so MPI is the rendezvous; the
    weights are one process's on the same global batches (tests/test_examples.py)."""
    from mpi_harness import mpi_env
    from test_examples import TORCHRUN, assert_same_weights
    env = mpi_env({"OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    one = subprocess.Popen([sys.executable, TORCHRUN, "--save", str(tmp_path / "one.pt")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, cwd=tmp_path)  # overlaps the job
    script = TORCHRUN_SCRIPT.format(out=tmp_path, python=sys.executable, script=TORCHRUN,
                                    activate='source "%s/bin/activate"' % VENV if VENV else "")
    job = slurm_cluster.sbatch_text(script, cwd=tmp_path)
    try:
        finished(slurm_cluster, job)
        one_out = one.communicate(timeout=120)[0]  # full-speed seconds (hang_guard)
    finally:
        one.kill()
    log = output(tmp_path / "job.out")
    assert "=== rc=0" in log and log.count("already inside") == 2, log
    assert "epoch 2: mean loss" in log and "(2 ranks, backend hpcdl)" in log, log
    assert one.returncode == 0, one_out
    assert_same_weights(tmp_path / "two.pt", tmp_path / "one.pt")


# ---------------------------------------------------------------- preemption
def test_preemptible_job_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path, reference):
    run_dir = tmp_path / "run"
    job = submit(slurm_cluster, tmp_path, "preemptible", "--ntasks-per-node", "2",
                 "--set", "RUN_DIR=%s" % run_dir, "--set", "MAX_RESTARTS=2", cmd=TRAIN)
    log_path = tmp_path / ("hpcdl-%s.out" % job)
    # the trainer prints its set-up line once every rank's handler is installed
    clock = hang_guard.Clock(180)
    while not (log_path.exists() and "hpcdl train: mlp" in output(log_path)):
        assert not clock.expired(), "the trainer did not start in " + clock.describe()
        assert slurm_cluster.jobs(job)[0]["JobState"] in ("PENDING", "RUNNING"), \
            slurm_cluster.jobs(job)
        time.sleep(0.2)
    # what --signal=B:USR1@N does near the time limit, now: USR1 to the batch shell
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    rec = finished(slurm_cluster, job, timeout=240)[0]
    log = output(log_path)
    assert rec["Restarts"] == "1", (rec, log)
    assert "stopped by SIGUSR1 at epoch" in log, log
    stop_epoch = int(log.split("stopped by SIGUSR1 at epoch ")[1].split()[0])
    assert stop_epoch < 8, "the signal came after training had ended:\n" + log
    assert "requeueing job %s" % job in log and "run 2" in log, log
    assert (run_dir / "checkpoints" / "checkpoint.pt").exists()
    summary = json.loads((run_dir / "out" / "summary.json").read_text())
    assert summary["params_sha256"] == reference.result()["params_sha256"], log
    _same_model(run_dir / "out" / "model.pt", reference.result())


def _same_model(path, reference):
    import torch
    got = torch.load(path, map_location="cpu")
    want = torch.load(os.path.join(reference["out_dir"], "model.pt"), map_location="cpu")
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k
