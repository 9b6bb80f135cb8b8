"""test_exit.py - how a job ends when a script ends: process sets left
registered at exit must not crash MPI_Finalize (issue 32, item 1), and a rank
that finishes while the others wait in a collective it never ran ends the job
at once, naming that rank, instead of at the stall shutdown time (item 2)."""
import os
import re

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "exit_check.py")
FAST_HEARTBEAT = {"HPCDL_STALL_CHECK_TIME_SECONDS": "0.2"}  # a heartbeat every 50 ms


@pytest.mark.mpi
@pytest.mark.parametrize("n,sets,mode", [(4, ["0,2"], "sets"), (3, ["0,1", "1,2"], "sets"),
                                         (3, ["0,2"], "finalize")])
def test_process_sets_left_at_exit(n, sets, mode):
    """No hvd.shutdown(): the sets' engine and stall threads must stop before
    MPI_Finalize. Before the fix, with this heartbeat, 5 of 5 launches of the
    4-rank case failed ('MPI_Allgather() ... called after MPI_FINALIZE', or a
    segfault, rc 139). Three launches each, so a rare race still shows.
    "finalize": the script calls MPI.Finalize() itself (failed 2 of 2 ranks)."""
    for _ in range(3):
        r = run_python(n, SCRIPT, args=[mode, *sets], check=False, timeout=90,
                       env=FAST_HEARTBEAT)
        assert r.returncode == 0, r.stdout
        assert r.stdout.count("EXIT OK") == n, r.stdout
        assert "MPI_FINALIZE" not in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n,leaver,mode", [(2, 1, "early"), (3, 2, "early_async"),
                                           (3, 0, "early"), (2, 1, "early_barrier")])
def test_rank_leaving_early_ends_the_job(n, leaver, mode):
    """The leaving rank is named, and the verdict is the finished rank's, not
    the stall shutdown's: with the default 600 s shutdown time the launch
    would otherwise outlive the harness timeout."""
    r = run_python(n, SCRIPT, args=[mode, str(leaver)], check=False, timeout=120,
                   env={"HPCDL_STALL_SHUTDOWN_TIME_SECONDS": "600"})
    assert r.returncode != 0, r.stdout
    assert "NOT REACHED" not in r.stdout, r.stdout
    what = "barrier" if mode == "early_barrier" else r"grad\.skipped"
    m = re.search(r"error: rank (\d+) finished .* rank (\d+) is missing [^;]*" + what, r.stdout)
    assert m and int(m.group(1)) == leaver == int(m.group(2)), r.stdout
    assert "HPCDL_STALL_SHUTDOWN_TIME_SECONDS" not in r.stdout, r.stdout
