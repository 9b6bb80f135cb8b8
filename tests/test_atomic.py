"""test_atomic.py - hpcdl.utils.atomic, the one helper every checkpoint, data
cache, manifest, trace and state file is written through: the target
appears whole or not at all, a failed write leaves the old file and no
temporary file, and a writer killed mid-write leaves the old file whole."""
import json
import os
import signal
import subprocess
import sys

import pytest

from hpcdl.utils.atomic import TMP_MARK, atomic_open, copy_file, write_json


def test_write_replaces_whole(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"old")
    with atomic_open(str(p)) as f:
        f.write(b"new contents")
        assert p.read_bytes() == b"old"  # not visible before the block ends
    assert p.read_bytes() == b"new contents" and os.listdir(tmp_path) == ["f.bin"]


def test_failed_write_keeps_old_and_leaves_no_temp(tmp_path):
    p = tmp_path / "f.json"
    write_json(str(p), {"a": 1})
    with pytest.raises(TypeError):
        write_json(str(p), {"a": object()})  # not JSON: fails half-way through the dump
    assert json.loads(p.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["f.json"]


def test_copy_keeps_mtime(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"x" * 1000)
    os.utime(src, (1_000_000, 1_000_000))
    copy_file(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes() and os.stat(dst).st_mtime == 1_000_000


def test_kill_during_write_leaves_old_file_whole(tmp_path):
    p = tmp_path / "ckpt"
    p.write_bytes(b"previous checkpoint")
    code = ("import sys, time; from hpcdl.utils.atomic import atomic_open\n"
            "with atomic_open(sys.argv[1]) as f:\n"
            "    f.write(b'half'); f.flush(); print('writing', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert p.read_bytes() == b"previous checkpoint"
    assert [n for n in os.listdir(tmp_path) if TMP_MARK in n]  # what a clean-up looks for
