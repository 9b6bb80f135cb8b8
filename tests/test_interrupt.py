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
