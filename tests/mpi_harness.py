"""mpi_harness.py - the one way tests start ranks: run_mpi(n, cmd) under the
project's own launcher logic (hpcdl.cli.run.mpirun_command: $HPCDL_MPIRUN, else
the launcher of the MPI the core was built against, Open MPI's or MPICH's
hydra, each with its own flags), with a hard
timeout on every launch. A hang fails the test within the timeout and shows
every rank's output (tagged [job,rank]) so the stuck rank can be seen.

Timeouts are for hangs, and count full-speed seconds (tests/hang_guard.py):
they stretch while other programs share the cores, up to 10x, so a slow
machine does not fail a test; on a quiet one they are as written."""
import os
import subprocess
import sys

import pytest

import hang_guard
from hpcdl.cli.run import mpirun_command
from hpcdl.utils.launch import MPI_ENV_VARS
from hpcdl.utils.mpi_info import launcher_flavour

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MPIRunTimeout(AssertionError):
    pass


def mpi_env(env=None):
    e = dict(os.environ)
    # a test launch must not think it is inside the pytest's own job
    for var in MPI_ENV_VARS + ("SLURM_STEP_ID",):
        e.pop(var, None)
    e["PYTHONUNBUFFERED"] = "1"
    e.update(env or {})
    return e


def run_mpi(n, cmd, timeout=60, env=None, check=False, tag_output=False):
    """Runs cmd (list) on n ranks; returns CompletedProcess (stdout+stderr merged
    in .stdout). Fails the test on timeout (seconds of full-speed time) with
    everything the ranks printed."""
    line = mpirun_command(n, cmd)
    if tag_output:  # prefix each line with its rank, in the launcher's own words
        flag = {"openmpi": "--tag-output", "mpich": "-prepend-rank"}.get(launcher_flavour(line[0]))
        if flag:
            line.insert(3, flag)
    proc = subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=mpi_env(env), cwd=REPO, start_new_session=True)
    try:
        out, _ = hang_guard.communicate(proc, timeout=timeout)
    except hang_guard.HangTimeout as e:
        hang_guard.kill_job(proc.pid)  # mpirun and every rank it started
        out, _ = proc.communicate()
        pytest.fail("MPI launch timed out after %s (a hang?): %s\n--- output of all "
                    "ranks ---\n%s" % (e.clock_text, " ".join(cmd), out), pytrace=False)
    result = subprocess.CompletedProcess(line, proc.returncode, out, "")
    if check and proc.returncode != 0:
        pytest.fail("MPI launch failed (exit %d): %s\n--- output ---\n%s"
                    % (proc.returncode, " ".join(cmd), out), pytrace=False)
    return result


def run_python(n, script, timeout=60, env=None, check=True, args=()):
    """Runs a Python script file (path) or source text on n ranks."""
    if os.path.exists(script):
        cmd = [sys.executable, script, *args]
    else:
        cmd = [sys.executable, "-c", script, *args]
    return run_mpi(n, cmd, timeout=timeout, env=env, check=check)
