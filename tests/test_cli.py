"""test_cli.py - the `hpcdl` command: info, run (ranks, exit codes, bad input),
help texts, and `python -m hpcdl`."""
import os
import subprocess
import sys

import pytest

from hpcdl.cli.run import mpirun_command, parse_hosts
from hpcdl.cli.main import UsageError

HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl(*args, timeout=120, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True,
                          timeout=timeout, env=e)


def test_help_lists_commands():
    r = hpcdl("--help")
    assert r.returncode == 0
    for cmd in ("info", "run", "train"):
        assert cmd in r.stdout


def test_info_names_mpi_library():
    r = hpcdl("info")
    assert r.returncode == 0, r.stderr
    assert "MPI library" in r.stdout and ("Open MPI" in r.stdout or "MPICH" in r.stdout)
    assert "core built with CUDA" in r.stdout


@pytest.mark.mpi
def test_run_starts_four_distinct_ranks():
    # one write per line: print() writes text and newline separately, and
    # unbuffered ranks' pieces interleave in mpirun's merged output
    code = ("import sys; from hpcdl import comm; comm.init(); "
            "sys.stdout.write('RANK %d %d\\n' % (comm.rank(), comm.size()))")
    r = hpcdl("run", "-n", "4", "--", sys.executable, "-c", code, timeout=60)
    assert r.returncode == 0, r.stderr
    ranks = sorted(l.split()[1:] for l in r.stdout.splitlines() if l.startswith("RANK"))
    assert ranks == [["0", "4"], ["1", "4"], ["2", "4"], ["3", "4"]], r.stdout


@pytest.mark.mpi
def test_run_forwards_exit_code():
    r = hpcdl("run", "-n", "2", "--", sys.executable, "-c", "import sys; sys.exit(3)",
              timeout=60)
    assert r.returncode == 3
    assert "exited with status 3" in r.stderr


def test_run_rejects_zero_ranks():
    r = hpcdl("run", "-n", "0", "--", "true")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "-n must be at least 1" in lines[0]


def test_run_inside_job_runs_directly():
    r = hpcdl("run", "-n", "4", "--", sys.executable, "-c", "print('direct')",
              env={"OMPI_COMM_WORLD_SIZE": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "direct"
    assert "already inside" in r.stderr


def test_mpirun_flags():
    ompi = ("/usr/bin/mpirun", "openmpi")
    line = mpirun_command(64, ["x"], launcher=ompi)
    assert "--oversubscribe" in line and line[-1] == "x"
    assert ("--allow-run-as-root" in line) == (os.geteuid() == 0)
    line = mpirun_command(2, ["x"], hosts="a:1,b:1", launcher=ompi)
    assert "--host" in line and "a:1,b:1" in line and "--oversubscribe" not in line
    line = mpirun_command(2, ["x"], hosts="a:1,b:1", launcher=("/usr/bin/mpiexec", "mpich"))
    assert "-hosts" in line and "--bind-to" not in line
    with pytest.raises(UsageError):
        parse_hosts("a:0")
