"""test_train_resume.py - the trainer's checkpoints on 2 real ranks: a run
stopped by SIGUSR1 or SIGTERM (to a rank, or to `hpcdl train -n 2` itself,
which passes it on) checkpoints and exits 0, and --resume ends with
exactly the parameters of a run that never stopped (LARS, warmup + poly decay,
fp16 with loss scaling, top-k compression: every piece of state matters);
damaged or foreign checkpoints fail on every rank; a kill during a save
leaves the previous checkpoint whole; config files are strict."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import hang_guard
from mpi_harness import REPO, mpi_env, run_mpi
from hpcdl.cli.run import mpirun_command
from hpcdl.utils.atomic import TMP_MARK

TRAIN = [sys.executable, "-m", "hpcdl", "train"]
RECIPE = ["--epochs", "8", "--global-batch", "64", "--optimizer", "lars", "--base-lr", "2",
          "--warmup-epochs", "2", "--schedule", "poly", "--precision", "fp16",
          "--compression", "topk:0.5", "--hidden", "64,32"]


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def _epochs(out):
    return [json.loads(l)["epoch"] for l in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    run_mpi(2, TRAIN + RECIPE + ["--out", str(out)], timeout=180, check=True)
    return _summary(out)


def _start_then_signal(out, ckpt, signum, rank_index, recipe=RECIPE):
    """Starts the recipe on 2 ranks; once epoch 1 is reported, sends signum to
    one rank process, or (rank_index None) to `hpcdl train -n 2` itself, the
    launching process. Returns (exit code, output). On a busy machine the 8
    short epochs can end before the signal lands (then the rank says so and
    exits 0): the ranks are held with SIGSTOP while it is sent, and a run that
    still completed first is tried once more."""
    for attempt in (1, 2):
        code, text = _one_signalled_run(out, ckpt, signum, rank_index, recipe)
        if "arrived outside the training loop" not in text or attempt == 2:
            return code, text
        for path in (out, ckpt):  # the run completed before the signal: start afresh
            subprocess.run(["rm", "-rf", str(path)], check=True)


def _children(pid):
    return sorted(map(int, subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                          text=True).stdout.split()))


def _rank_pids(launcher, via_hpcdl):
    """The rank processes: mpirun's children (mpirun is `hpcdl train -n`'s child)."""
    mpiruns = _children(launcher.pid) if via_hpcdl else [launcher.pid]
    return _children(mpiruns[0]) if mpiruns else []


def _one_signalled_run(out, ckpt, signum, rank_index, recipe):
    args = recipe + ["--out", str(out), "--checkpoint-dir", str(ckpt)]
    line = mpirun_command(2, TRAIN + args) if rank_index is not None else \
        TRAIN + ["-n", "2"] + args
    proc = subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=mpi_env(), cwd=REPO, start_new_session=True)
    try:
        clock = hang_guard.Clock(120)
        ranks = []
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
            assert not clock.expired() and proc.poll() is None, "no epoch reported"
            if len(ranks) != 2:  # found during setup, so that holding them below is instant
                ranks = _rank_pids(proc, rank_index is None)
            time.sleep(0.05)
        assert len(ranks) == 2, ranks
        _each(ranks, signal.SIGSTOP)
        try:
            os.kill(proc.pid if rank_index is None else ranks[rank_index], signum)
            if rank_index is None:  # the launcher passes it on to the held ranks
                time.sleep(0.5)
        finally:
            _each(ranks, signal.SIGCONT)
        out_text, _ = proc.communicate(timeout=120)
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True,
                              text=True).stdout.split()
        assert not left, "processes of the job outlived it: %s" % left
    finally:
        try:  # whatever of the job is left, the launcher gone or not
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.communicate()
    return proc.returncode, out_text


def _each(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # that rank has already exited
            pass


@pytest.mark.mpi
@pytest.mark.parametrize("signum,rank_index", [(signal.SIGUSR1, 1), (signal.SIGTERM, 0),
                                               (signal.SIGTERM, None)])
def test_signal_checkpoints_and_resume_matches_uninterrupted(tmp_path, uninterrupted,
                                                             signum, rank_index):
    # a rank signalled (as Slurm does), or `hpcdl train -n 2` itself (kill PID): its
    # SIGTERM reaches the ranks as SIGUSR1, since mpirun would end the job on SIGTERM
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    code, text = _start_then_signal(out, ckpt, signum, rank_index)
    name = signal.Signals(signum if rank_index is not None else signal.SIGUSR1).name
    assert code == 0 and "stopped by %s at epoch" % name in text, text
    if rank_index is None:
        assert "SIGTERM passed on to the ranks as SIGUSR1" in text, text
    assert (ckpt / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    # checkpoint.pt and the one save directory it names (earlier saves' removed): the
    # replica's state as one file and its manifest; no temporary files left
    named = torch.load(ckpt / "checkpoint.pt", weights_only=True)["state"]["dir"]
    assert sorted(os.listdir(ckpt)) == sorted(["checkpoint.pt", named]), os.listdir(ckpt)
    assert sorted(os.listdir(ckpt / named)) == ["manifest.json", "rank-00000-of-00001.pt"]
    r = run_mpi(2, TRAIN + RECIPE + ["--out", str(out), "--checkpoint-dir", str(ckpt),
                                     "--resume"], timeout=180, check=True)
    assert "resumed from" in r.stdout, r.stdout
    resumed = _summary(out)
    assert resumed["params_sha256"] == uninterrupted["params_sha256"], r.stdout
    assert resumed["steps"] == uninterrupted["steps"] == 8 * (1437 // 64)
    assert _epochs(out) == list(range(1, 9))  # metrics continue; no epoch twice or missing


@pytest.mark.mpi
def test_bad_checkpoints_fail_on_every_rank(tmp_path):
    ckpt = tmp_path / "ckpt"
    base = TRAIN + ["--epochs", "1", "--global-batch", "64", "--hidden", "32",
                    "--checkpoint-dir", str(ckpt)]
    run_mpi(2, base, timeout=120, check=True)
    good = (ckpt / "checkpoint.pt").read_bytes()
    named = torch.load(ckpt / "checkpoint.pt", weights_only=True)["state"]["dir"]

    def cut_short(d):  # the state's file cut to half, the manifest as it was
        f = d / "rank-00000-of-00001.pt"
        f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    cases = [  # (how to damage or mismatch, flags of the resuming run, expected message,
               #  what to do to a copy of the save directory beside it: None, no copy)
        (good[:len(good) // 2], [], "cannot be read (truncated, corrupted or not written", None),
        (b"not a checkpoint at all", [], "is not a checkpoint (not a file torch.save wrote)",
         None),
        (good, ["--hidden", "64"], "run with --hidden 32, this run has 64", None),
        (good, ["--global-batch", "32"], "--global-batch 64, this run has 32", None),
        (good, ["--mode", "ps-bsp"], "--mode allreduce, this run has --mode ps-bsp", None),
        (good, [], "%s, which does not exist: a checkpoint is checkpoint.pt and the "
                   "directory it names together" % named, None),
        (good, [], "rank-00000-of-00001.pt cannot be read (damaged or cut short? size:",
         cut_short),
    ]
    def resume_from(i, data, flags, damage):
        case = tmp_path / ("case%d" % i)
        case.mkdir()
        bad = case / "checkpoint.pt"
        bad.write_bytes(data)
        if damage is not None:
            shutil.copytree(ckpt / named, case / named)
            damage(case / named)
        return bad, run_mpi(2, base + ["--resume", str(bad)] + flags, timeout=120)

    # the launches at once: each is mostly start-up (imports), not CPU
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(pool.map(lambda c: resume_from(c[0], c[1][0], c[1][1], c[1][3]),
                             enumerate(cases)))
    for (data, flags, message, _), (bad, r) in zip(cases, runs):
        assert r.returncode != 0, r.stdout
        errors = [l for l in r.stdout.splitlines() if l.startswith("hpcdl: error: ")]
        if data.startswith(b"PK"):  # a zip: read collectively, every rank says so
            # naming the file at fault: checkpoint.pt or the save directory's
            assert len(errors) == 2 and all(str(bad.parent) in l for l in errors), r.stdout
            # each line says whose it is (docs/training.md): one of each rank
            assert sorted(l[:len("hpcdl: error: [rank 0] ")] for l in errors) == [
                "hpcdl: error: [rank 0] ", "hpcdl: error: [rank 1] "], r.stdout
        else:  # caught before MPI starts; mpirun may end the other rank first
            assert 1 <= len(errors) <= 2, r.stdout
            assert all(l.startswith("hpcdl: error: [rank ") for l in errors), r.stdout
        assert all(message in l for l in errors), (message, r.stdout)


def test_kill_during_save_leaves_the_previous_checkpoint(tmp_path):
    # a real SIGKILL while torch.save writes a large state: checkpoint.pt must
    # still be the earlier, small one, complete and loadable
    path = tmp_path / "checkpoint.pt"
    code = """if 1:
        import sys, torch
        from hpcdl.train import checkpoint
        checkpoint.save(sys.argv[1], {"step": 1, "w": torch.arange(10.0)})
        print("saved small", flush=True)
        big = {"step": 2, "w": torch.ones(256 * 2**20 // 4)}
        while True:
            checkpoint.save(sys.argv[1], big)
    """
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                            text=True, env=mpi_env())
    assert proc.stdout.readline().strip() == "saved small"
    clock = hang_guard.Clock(60)
    while not [p for p in os.listdir(tmp_path) if TMP_MARK in p]:
        assert not clock.expired(), "the large save never started"
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    state = torch.load(path, weights_only=True)
    if state["step"] == 2:  # the big save may have finished before the kill: fine,
        assert state["w"].numel() == 256 * 2**20 // 4  # as long as it is whole
    else:
        assert state["step"] == 1 and state["w"].tolist() == list(range(10))


# ---------------------------------------------------------------- config files
def test_config_file_values_flags_win_and_unknown_keys_fail(tmp_path, monkeypatch, capsys):
    from hpcdl.cli import main as cli_main
    from hpcdl.cli.train import config_from_args
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("model: mlp\nglobal-batch: 96\noptimizer: lars\nmilestones: [3, 6]\n"
                         "warmup_epochs: 2\n")
    args = cli_main.build_parser().parse_args(["train", "--config", str(yaml_file),
                                               "--global-batch", "48"])
    cfg = config_from_args(args)
    assert (cfg.global_batch, cfg.optimizer, cfg.milestones, cfg.warmup_epochs) == \
        (48, "lars", (3, 6), 2.0)
    toml_file = tmp_path / "c.toml"
    toml_file.write_text('schedule = "cosine"\nepochs = 12\nhidden = [16, 8]\n')
    cfg = config_from_args(cli_main.build_parser().parse_args(["train", "--config",
                                                               str(toml_file)]))
    assert (cfg.schedule, cfg.epochs, cfg.hidden) == ("cosine", 12, (16, 8))
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    for text, message in (("learning_rate: 0.1\n", "unknown key 'learning_rate'"),
                          ("epochs: ten\n", "epochs = 'ten' is not an int"),
                          ("epochs: 2.5\n", "epochs = 2.5 is not an int"),
                          ("[unclosed\n", "does not parse")):
        yaml_file.write_text(text)
        assert cli_main.main(["train", "-n", "2", "--config", str(yaml_file)]) == 2
        assert message in capsys.readouterr().err


# ---------------------------------------------------------------- precision
@pytest.mark.mpi
def test_loss_scaler_skips_on_every_rank_when_one_overflows():
    script = os.path.join(os.path.dirname(__file__), "mpi_scripts",
                          "train_loss_scale_check.py")
    r = run_mpi(2, [sys.executable, script], timeout=60, check=True)
    assert r.stdout.count(" OK") == 2, r.stdout


@pytest.mark.mpi
def test_bf16_training_learns(tmp_path):
    run_mpi(2, TRAIN + ["--epochs", "3", "--global-batch", "64", "--precision", "bf16",
                        "--out", str(tmp_path)], timeout=180, check=True)
    assert _summary(tmp_path)["test_accuracy"] > 0.85


# ---------------------------------------------------------------- older checkpoints
OLD = os.path.join(REPO, "tests", "data", "checkpoints-72df3c7")


def _model(out):
    return torch.load(out / "model.pt", weights_only=True)


def _gap(a, b):
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.mpi
def test_checkpoints_of_72df3c7_resume(tmp_path):
    # written by `hpcdl train --epochs 1 --global-batch 64 --hidden 32 --zero Z
    # --checkpoint-dir ...` on 2 ranks at commit 72df3c7 (Intel Xeon, AVX-512
    # kernels), before the Reducer, the noise scale and one atomic-write
    # helper: the trainer, ZeRO-2's optimizer shards and ZeRO-3's model shards
    # each resume for a second epoch. The files hold epoch 1 as computed on
    # that CPU; torch's kernels round differently on another (AVX2 on older
    # AMD/Intel, ATEN_CPU_CAPABILITY), so a 2-epoch run computed here is the
    # same only to rounding. Compared like with like: the three stages resume
    # the same stored state, so their results, all computed here, are equal
    # bit for bit; against the 2-epoch run of this machine they differ by
    # rounding only, under 1e-3 of what epoch 2 moved the parameters (a lost
    # momentum buffer, schedule or RNG state moves them by a large part of it).
    base = TRAIN + ["--epochs", "2", "--global-batch", "64", "--hidden", "32"]
    run_mpi(2, base + ["--out", str(tmp_path / "fresh")], timeout=120, check=True)
    fresh = _model(tmp_path / "fresh")
    epoch1 = torch.load(os.path.join(OLD, "zero0", "checkpoint.pt"), weights_only=False)["model"]
    moved = _gap(fresh, epoch1)
    assert moved > 1e-3, moved  # epoch 2 trained: the bound below is not vacuous
    digests = {}
    for stage in ("0", "2", "3"):
        ckpt = tmp_path / ("zero" + stage)
        subprocess.run(["cp", "-r", os.path.join(OLD, "zero" + stage), str(ckpt)], check=True)
        out = tmp_path / ("out" + stage)
        r = run_mpi(2, base + ["--zero", stage, "--checkpoint-dir", str(ckpt), "--resume",
                               "--out", str(out)], timeout=120, check=True)
        assert "resumed from %s at epoch 2 step 0" % (ckpt / "checkpoint.pt") in r.stdout, \
            r.stdout
        digests[stage] = _summary(out)["params_sha256"]
        gap = _gap(_model(out), fresh)
        assert gap <= 1e-3 * moved, (stage, gap, moved, r.stdout)
    assert len(set(digests.values())) == 1, digests


# ---------------------------------------------------------------- resume checks
def test_resume_checks_auto_batch_and_adascale_from_one_read():
    # checkpoint._mismatch judges --global-batch auto and --lr-scaling adascale
    # from the state read once (its goodput and adascale parts, which older
    # checkpoints have too); an auto run adopts the checkpoint's batch
    from hpcdl.checkpoint import root as checkpoint
    meta = {"model": "mlp", "mode": "allreduce", "hidden": [32], "data": "digits",
            "global_batch": 64, "optimizer": "sgd", "seed": 0, "epochs": 2,
            "auto_batch": False, "adascale": False, "zero": 0, "shapes": {"w": [2, 2]}}

    def state(goodput=None, adascale=None, **old):
        return {"format": checkpoint.FORMAT, "meta": dict(meta, **old), "goodput": goodput,
                "adascale": adascale}
    def rooted(adascale=False):  # checkpoint.pt naming a save directory: AdaScale's state
        st = dict(state(), state={"dir": "state-1-1"})  # is there, its meta says if any
        del st["adascale"]
        st["meta"]["adascale"] = adascale
        return st
    auto = {"global_batch": 128, "changes": 1, "model": None}
    cases = [
        (state(), {}, None),
        (state(goodput=auto), {}, "with --global-batch auto; resume it with --global-batch auto"),
        (state(), {"auto_batch": True}, "with a fixed --global-batch; resume it with that batch"),
        (state(goodput=auto, global_batch=128), {"auto_batch": True}, None),
        (state(adascale={"x": 1}), {}, "with --lr-scaling adascale, this run is without it"),
        (state(), {"adascale": True}, "without --lr-scaling adascale, this run is with it"),
        (rooted(adascale=True), {}, "with --lr-scaling adascale, this run is without it"),
        (rooted(), {"adascale": True}, "without --lr-scaling adascale, this run is with it"),
        (rooted(adascale=True), {"adascale": True}, None),
        (state(global_batch=128), {}, "--global-batch 128, this run has 64"),
        (state(mode="ddp-gloo"), {"mode": "ddp-hpcdl"}, None),  # DDP's, either backend
        (state(mode="ddp-gloo"), {}, "DDP checkpoints are not resumed by all-reduce runs"),
        (state(), {"mode": "ddp-gloo"}, "all-reduce checkpoints are not resumed by DDP runs"),
        (state(mode="ps-sync"), {"mode": "ddp-hpcdl"}, "parameter-server checkpoints are not"),
        # any --zero stage resumes any other (test_zero3, test_checkpoint_matrix)
        (dict(state(), zero3={"dir": "zero3-1-1"}), {}, None),
        (dict(state(), zero12={"dir": "zero2-1-1", "stage": 2}), {"zero": 1}, None),
    ]
    for st, run, want in cases:
        got = checkpoint._mismatch("c.pt", st, dict(meta, **run))
        assert (got is None) if want is None else (want in got and "c.pt" in got), (run, got)
