"""test_ulfm.py - a lost rank under MPI's fault tolerance (ULFM, Open MPI 5): the
survivors get one RanksLostError naming it, for the collective that was running
and every queued one, shrink to the others and all-reduce correctly again, with
no hang and no abort (tests/mpi_scripts/ulfm_lost_rank.py does the work).

The multi-rank cases need a core built against Open MPI 5 with ULFM and its
launcher: they run in `make test-ompi5` (scripts/ompi5-setup.sh's checkout and
venv) and skip elsewhere, unless HPCDL_REQUIRE_ULFM=1 (that stage sets it) makes
the skip a failure. The one-process cases run everywhere: the error's ranks,
`hpcdl run --fault-tolerant` (refused in one line on an MPI without ULFM, the
launcher's ULFM flags on Open MPI 5), the log line of the path in force.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import hang_guard
from hpcdl.cli.run import find_launcher
from hpcdl.comm import fault
from hpcdl.comm.errors import CoreError, RanksLostError
from mpi_harness import mpi_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "mpi_scripts", "ulfm_lost_rank.py")


def _ulfm_launcher():
    """None when this hpcdl's launcher has ULFM, else why not."""
    try:
        return fault.launcher_ulfm(find_launcher()[0])
    except Exception as e:  # no launcher at all
        return str(e)


WHY_NOT = _ulfm_launcher()
needs_ulfm = pytest.mark.skipif(
    WHY_NOT is not None and os.environ.get("HPCDL_REQUIRE_ULFM") != "1",
    reason="needs Open MPI 5 with ULFM (make test-ompi5): %s" % WHY_NOT)


def hpcdl_cmd(*args):
    return [sys.executable, "-m", "hpcdl", *args]


# ---------------------------------------------------------------- one process
def test_ranks_lost_error_names_the_ranks_of_the_cores_message():
    e = RanksLostError("rank 3 (node2) lost during allreduce 'grad.bucket.4' on rank 1")
    assert e.ranks == [3] and isinstance(e, CoreError)
    assert RanksLostError("ranks 1 (a-1), 12 (b2) lost during allreduce").ranks == [1, 12]
    assert RanksLostError("a peer rank (not yet named by MPI) lost during x").ranks == []
    assert RanksLostError("anything", ranks=[5]).ranks == [5]


def test_path_line_says_which_path_is_in_force():
    assert fault.in_force({"OMPI_MCA_mpi_ft_enable": "1"})
    assert not fault.in_force({})
    if not fault.in_force():
        line = fault.path_line(4)
        assert line.startswith("fault tolerance: restart path") and "\n" not in line


def test_run_fault_tolerant_flag():
    """On an MPI without ULFM: one line, status 2, nothing started. With ULFM:
    the launcher line carries --with-ft ulfm and the job runs."""
    out = subprocess.run(hpcdl_cmd("run", "-n", "1", "--fault-tolerant", "--", "true"),
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=mpi_env())
    if WHY_NOT is None:
        assert out.returncode == 0, out.stderr
        assert re.search(r"hpcdl run: \S*mpiexec .*--with-ft ulfm", out.stderr), out.stderr
    else:
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert "--fault-tolerant needs an MPI with ULFM" in lines[0], lines[0]


def test_info_says_whether_the_mpi_has_ulfm():
    out = subprocess.run(hpcdl_cmd("info", "--json"), capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=mpi_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ulfm"] is (WHY_NOT is None), out.stdout


def test_shrink_without_ulfm_in_force_is_one_clear_error():
    """Outside a job started with ULFM (any MPI), shrink() refuses before it
    touches anything."""
    code = ("from hpcdl import comm\nc = comm.init()\ntry:\n    c.shrink()\n"
            "except comm.CoreError as e:\n    print('REFUSED', e)\n")
    env = {k: v for k, v in mpi_env().items() if k != "OMPI_MCA_mpi_ft_enable"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    assert "REFUSED shrink() needs MPI's fault tolerance (ULFM" in out.stdout, out.stdout


def test_exit_watchdog_ends_a_process_stuck_at_exit():
    """After a lost rank, Open MPI 5's MPI_Finalize may wait for the dead process
    (open-mpi/ompi#11404): hpcdl.comm's exit hook then gives it 10 s and ends the
    process with status 0 (src_c/fault.c). Here a sleep stands in for the stuck
    MPI_Finalize."""
    code = "from hpcdl import _core; import time; _core.exit_watchdog(0.5); time.sleep(60)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "MPI_Finalize did not return within 0.5 s after a lost rank" in out.stderr


def launch_kill_case(tmp_path, victim, step, mode, algo, local, after="shrink"):
    """hpcdl run -n 4 --fault-tolerant of ulfm_lost_rank.py; (returncode, output)."""
    env = mpi_env(dict(HPCDL_LOCAL_SIZE=str(local),
                       OMPI_MCA_osc="^ucx"))  # the wheel's osc/ucx finds no device: noise only
    cmd = hpcdl_cmd("run", "-n", "4", "--fault-tolerant", "--tracebacks", "--", sys.executable,
                    SCRIPT, victim, str(step), mode, algo, str(tmp_path / "killed"), after)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO, start_new_session=True)
    try:
        out, _ = hang_guard.communicate(proc, timeout=90)
    except hang_guard.HangTimeout as e:
        hang_guard.kill_job(proc.pid)
        out, _ = proc.communicate()
        pytest.fail("the survivors hung (%s):\n%s" % (e.clock_text, out), pytrace=False)
    return proc.returncode, out


# ---------------------------------------------------------------- 4 ranks, one killed
# (victim, step of the kill, mode, algorithm, HPCDL_LOCAL_SIZE): each path a survivor
# can be waiting in when the victim dies: the ring, MPI's own collective, the
# hierarchical path across 2x2 virtual nodes (cross ring + shared memory), the
# engine's queue (async), node shared buffers (work stealing in shared memory on
# one node; shared memory and the cross ring on 2x2), an
# object collective (mpi4py's, through hpcdl.comm), all-gather / broadcast /
# reduce-scatter (ring and MPI's); and two ranks killed at once
CASES = [("3", 2, "blocking", "ring", 0), ("0", 3, "blocking", "ring", 0),
         ("0", 2, "blocking", "mpi", 0), ("3", 2, "blocking", "hier", 2),
         ("0", 2, "async", "ring", 0), ("2", 2, "async", "auto", 0),
         ("1", 2, "shared", "auto", 0), ("3", 2, "shared", "auto", 2), ("3", 2, "object", "ring", 0),
         ("2", 2, "others", "ring", 0), ("1", 2, "others", "mpi", 0),
         ("1,3", 2, "blocking", "ring", 0), ("0,2", 2, "async", "hier", 2)]  # two at once


@needs_ulfm
@pytest.mark.mpi
@pytest.mark.parametrize("victim,step,mode,algo,local", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_survivors_of_a_killed_rank_shrink_and_allreduce_again(tmp_path, victim, step, mode,
                                                               algo, local):
    victims = [int(v) for v in victim.split(",")]
    returncode, out = launch_kill_case(tmp_path, victim, step, mode, algo, local)
    survived = re.findall(r"SURVIVED world (\d+): lost \[([\d, ]+)\] .*shrink ([\d.]+) s; "
                          r"kill->next allreduce ([\d.]+) s", out)
    assert returncode == 0, out
    assert sorted(int(w) for w, *_ in survived) == [r for r in range(4) if r not in victims], out
    assert all(lost == ", ".join(map(str, victims)) for _, lost, *_ in survived), out
    # each survivor's error names lost ranks (all of them: one victim; some: two at once)
    errors = re.findall(r"rank \d+: \d+ error\(s\): (ranks? [^|]*?) lost during "
                        r"(?:allreduce|allgather_object|allgather)", out)
    named = [RanksLostError(e + " lost").ranks for e in errors]
    assert len(named) == 4 - len(victims), out
    assert all(n and set(n) <= set(victims) for n in named), out
    if len(victims) == 1:
        assert all(n == victims for n in named), out
    print("%s: shrink %s s, kill -> next all-reduce %s s" % (
        "-".join(map(str, (victim, step, mode, algo, local))),
        max(float(s) for *_, s, _ in survived), max(float(k) for *_, k in survived)))


@needs_ulfm
@pytest.mark.mpi
@pytest.mark.parametrize("mode,algo,local", [("blocking", "hier", 2), ("async", "ring", 0)])
def test_survivors_that_do_not_shrink_still_exit(tmp_path, mode, algo, local):
    """After the error the survivors end their script without a shrink: hpcdl's
    shutdown at exit frees the lost core locally (no collective on revoked
    communicators; the collective free happened to return here too, so this
    guards the outcome, not that choice) and the job ends with status 0."""
    returncode, out = launch_kill_case(tmp_path, "3", 2, mode, algo, local, after="exit")
    assert returncode == 0, out
    assert sorted(re.findall(r"LEFT world (\d+): lost \[3\]", out)) == ["0", "1", "2"], out


@needs_ulfm
@pytest.mark.mpi
def test_a_second_loss_after_the_first_shrink(tmp_path):
    """Rank 3 dies, the others shrink to 3 and all-reduce; then world rank 2 (the
    last of them) dies too, and ranks 0 and 1 shrink again and go on."""
    returncode, out = launch_kill_case(tmp_path, "3", 2, "blocking", "ring", 0, after="twice")
    assert returncode == 0, out
    assert sorted(re.findall(r"SURVIVED world (\d+): lost \[3\]", out)) == ["0", "1", "2"], out
    assert sorted(re.findall(r"SURVIVED-2 world (\d+): lost \[2\]", out)) == ["0", "1"], out
