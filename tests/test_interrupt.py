"""test_interrupt.py - Ctrl-C on the commands that start ranks (issue 32,
item 6): the terminal's SIGINT reaches the whole foreground process group;
`hpcdl train -n 2` then stops at the next step boundary with a checkpoint and
says so (it used to end the job at once, no checkpoint, "exited with status
1"), and `hpcdl run` says it was interrupted (status 130). Open MPI's
shared-memory segments of the job are removed when ranks leave them."""
import os
import signal
import subprocess
import sys
import time

import pytest

import hang_guard
from mpi_harness import REPO, mpi_env
from hpcdl.cli import interrupt

HPCDL = [sys.executable, "-m", "hpcdl"]


def _ctrl_c_after(line, ready):
    """Starts line as a terminal would (its own process group), sends SIGINT
    to the whole group once ready() is true; returns (status, output)."""
    proc = subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=mpi_env(), cwd=REPO, start_new_session=True)
    try:
        clock = hang_guard.Clock(120)
        while not ready():
            assert not clock.expired() and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out


@pytest.mark.mpi
def test_ctrl_c_on_train_checkpoints_at_a_step(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    metrics = out / "metrics.jsonl"
    code, text = _ctrl_c_after(
        HPCDL + ["train", "-n", "2", "--epochs", "200", "--global-batch", "64", "--hidden",
                 "32", "--out", str(out), "--checkpoint-dir", str(ckpt)],
        lambda: metrics.exists() and metrics.read_text())
    assert code == 0, text
    assert "interrupted (Ctrl-C): the ranks stop after the current step" in text, text
    assert "stopped by SIGUSR1 at epoch" in text and (ckpt / "checkpoint.pt").exists(), text


@pytest.mark.mpi
def test_ctrl_c_on_run_says_interrupted(tmp_path):
    flag = tmp_path / "up"
    code = ("import sys, time; from hpcdl import comm; c = comm.init(); "
            "open(sys.argv[1] + str(c.rank), 'w').close(); time.sleep(300)")
    status, text = _ctrl_c_after(
        HPCDL + ["run", "-n", "2", "python", "-c", code, str(flag)],
        lambda: all(os.path.exists(str(flag) + r) for r in "01"))
    assert status == 130, text
    assert "was interrupted (Ctrl-C)" in text and "exited with status" not in text, text


def test_leftover_segments_of_the_job_only(tmp_path, monkeypatch):
    """Segments of this job's family go unless mapped; others' stay."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    uid, fam = os.getuid(), 0xfff1
    names = ["vader_segment.t32host.%d.%x.%d" % (uid, fam << 16 | 1, r) for r in (0, 1)]
    other = "vader_segment.t32host.%d.%x.0" % (uid, 0xfff2 << 16 | 1)
    for n in names + [other]:
        open(os.path.join("/dev/shm", n), "w").close()
    held = open(os.path.join("/dev/shm", names[1]), "r+b")
    held.write(b"\0" * 4096)
    held.flush()
    import mmap
    view = mmap.mmap(held.fileno(), 4096)  # in use: must stay
    try:
        left = interrupt.Leftovers.__new__(interrupt.Leftovers)
        left.jobfam = fam
        left._thread = type("T", (), {"join": lambda self, timeout=None: None})()
        assert left.remove() == 1
        now = set(os.listdir("/dev/shm"))
        assert names[0] not in now and names[1] in now and other in now
    finally:
        view.close()
        held.close()
        for n in names + [other]:
            if os.path.exists(os.path.join("/dev/shm", n)):
                os.unlink(os.path.join("/dev/shm", n))


def test_crowding_note_says_what_to_expect():
    """Issue 38: `hpcdl train -n 64` on 2 cores said nothing for 200 s. From 4
    ranks a core the launcher says how many of each and what to expect."""
    from hpcdl.cli import run
    assert run.crowding_note(7, 2) is None and run.crowding_note(4, 2) is None
    note = run.crowding_note(64, 2)
    assert note.startswith("64 ranks on 2 cores (32 a core): each rank needs about 2 "
                           "CPU-seconds to start, so expect 64 s or more before the first "
                           "output, then steps about 32x slower than with 2 ranks"), note
    assert note.endswith("a stop signal (SIGTERM) still ends the job within %d s"
                         % (interrupt.STOP_GRACE_S + interrupt.KILL_AFTER_S)), note


# a rank that records a stop and goes on (as train's StopRequest does during a
# long set-up), so that only the launcher's deadline can end the job
DEAF_RANK = ("import os, signal, sys, time\n"
             "for s in (signal.SIGUSR1, signal.SIGTERM): signal.signal(s, lambda *a: None)\n"
             "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').close()\n"
             "time.sleep(300)\n")


@pytest.mark.mpi
@pytest.mark.parametrize("clean_stop", [True, False])
def test_sigterm_ends_many_ranks_within_seconds(tmp_path, clean_stop):
    """16 ranks (on 2 cores: 8 a core) that do not stop by themselves: SIGTERM
    to the launcher ends the job within STOP_GRACE_S + KILL_AFTER_S, as a clean
    stop (hpcdl train: passed on as SIGUSR1) or plainly (hpcdl run). Before,
    the clean stop waited for the ranks' next step (280 s for 64 ranks)."""
    n = 16
    up = tmp_path / "up"
    up.mkdir()
    script = tmp_path / "deaf.py"
    script.write_text(DEAF_RANK)
    driver = ("import signal, sys; from hpcdl.cli import run\n"
              "sys.exit(run.launch(%d, ['python', %r, %r], term_as=%s))"
              % (n, str(script), str(up), "signal.SIGUSR1" if clean_stop else "None"))
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=REPO,
                            start_new_session=True)
    try:
        clock = hang_guard.Clock(240)  # 16 Python start-ups on a busy machine
        while len(os.listdir(up)) < n:
            assert not clock.expired() and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=interrupt.STOP_GRACE_S + interrupt.KILL_AFTER_S + 30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and took < interrupt.STOP_GRACE_S + interrupt.KILL_AFTER_S + 10, \
        (took, out)
    if clean_stop:
        assert "the ranks have not stopped %d s after the signal; ending the job" \
            % interrupt.STOP_GRACE_S in out, out
    if n >= 4 * os.cpu_count():
        assert "hpcdl run: warning: %d ranks on %d cores" % (n, os.cpu_count()) in out, out
