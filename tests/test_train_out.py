"""test_train_out.py - what `hpcdl train` writes where (issue 32 item 7): a
run without --out says that nothing is written; a fresh run into an --out
that holds an earlier run keeps the earlier files in earlier-<time>/ and says
so, instead of writing over them."""
import glob
import json
import os
import subprocess
import sys

TRAIN = [sys.executable, "-m", "hpcdl", "train", "--data", "digits", "--epochs", "1",
         "--global-batch", "256"]


def _train(*args):
    r = subprocess.run(TRAIN + list(args), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_no_out_says_nothing_is_written():
    assert "no --out given" in _train()


def test_second_fresh_run_keeps_the_first_in_an_earlier_directory(tmp_path):
    out = str(tmp_path / "run")
    first = _train("--out", out)
    assert "held an earlier run" not in first
    with open(os.path.join(out, "summary.json")) as f:
        one = json.load(f)
    second = _train("--out", out, "--seed", "1")
    assert "held an earlier run" in second
    kept = glob.glob(os.path.join(out, "earlier-*"))
    assert len(kept) == 1 and kept[0] in second
    with open(os.path.join(kept[0], "summary.json")) as f:
        assert json.load(f) == one
    assert sorted(os.listdir(kept[0])) == ["curves.png", "metrics.jsonl", "model.pt",
                                           "summary.json"]
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["params_sha256"] != one["params_sha256"]  # the new run's
