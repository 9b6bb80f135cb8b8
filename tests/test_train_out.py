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


def _train_n2(*args):
    from mpi_harness import mpi_env
    r = subprocess.run([sys.executable, "-m", "hpcdl", "train", "-n", "2", "--data", "digits"]
                       + list(args), capture_output=True, text=True, timeout=300, env=mpi_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_summary_says_where_time_went_and_a_complete_run_is_not_resumed(tmp_path):
    """Issue 38 item 9: 'wall time (s) 23.02' beside epoch times adding up to 1 s
    said nothing of the rest; B_simple had no legend and was not in
    summary.json; resuming a finished run said 'resumed ... at epoch 31 step 0'
    and evaluated again. Now the wall time is split (training, evaluation,
    checkpoints, start-up and other), B_simple is explained once and kept, and
    a complete run says so, trains nothing and exits 0."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    text = _train_n2("--epochs", "2", "--out", str(out), "--checkpoint-dir", str(ckpt))
    assert text.count("hpcdl train: B_simple below is the gradient noise scale (samples)") == 1
    summary = json.loads((out / "summary.json").read_text())
    parts = summary["wall_parts_s"]
    assert sorted(parts) == ["checkpoints", "evaluation", "start_up_and_other", "training"]
    assert abs(sum(parts.values()) - summary["wall_s"]) < 1e-6 and parts["checkpoints"] > 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert abs(parts["training"] - sum(r["epoch_time_s"] for r in recs)) < 1e-6
    assert "wall time (s)  %.2f  (training %.2f, evaluation" % (summary["wall_s"],
                                                                parts["training"]) in text, text
    assert summary["b_simple"] == recs[-1]["b_simple"] and summary["b_simple"] > 0
    assert "noise scale    %.4g samples (gradient noise scale B_simple, last epoch)" \
        % summary["b_simple"] in text, text
    before = (out / "summary.json").stat().st_mtime_ns
    again = _train_n2("--epochs", "2", "--out", str(out), "--checkpoint-dir", str(ckpt),
                      "--resume")
    assert "hpcdl train: %s holds a complete run (22 steps, up to epoch 2 of 2): nothing left " \
           "to train" % (ckpt / "checkpoint.pt") in again, again
    assert "resumed from" not in again and "epoch " not in again.split("nothing left")[1]
    assert (out / "summary.json").stat().st_mtime_ns == before


def test_adascale_epochs_are_not_counted_out_of_epochs(tmp_path):
    """With AdaScale (and so --global-batch auto) the run ends at its
    progress, after more passes over the data than --epochs: the lines said
    'epoch 6/2'; now 'epoch 6 (progress 44/44 steps of batch 64)'."""
    text = _train_n2("--epochs", "2", "--lr-scaling", "adascale", "--global-batch", "256",
                     "--base-batch", "64")
    lines = [l for l in text.splitlines() if l.startswith("epoch ")]
    assert len(lines) > 2 and not any("/2 " in l for l in lines), text
    assert all(" (progress " in l and " steps of batch 64)" in l for l in lines), lines
    assert lines[-1].split(" (progress ")[1].startswith("44/44 "), lines
