"""test_bench.py - `hpcdl bench allreduce` (and bench train): size parsing, the test data and
option checks in one process, then one small 2-rank run whose table must have
the header, a row per size and implementation, and an OK verdict."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcdl.bench import allreduce as ar
from hpcdl.bench import device as dev
from mpi_harness import run_mpi

BENCH = [sys.executable, "-m", "hpcdl", "bench", "allreduce"]


@pytest.mark.parametrize("text, nbytes", [
    ("4", 4), ("0", 0), ("4K", 4096), ("4k", 4096), ("64KiB", 65536), ("256M", 256 << 20),
    ("256mb", 256 << 20), ("1G", 1 << 30), (" 8 ", 8), ("12B", 12)])
def test_parse_size(text, nbytes):
    assert ar.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "4X", "1.5M", "-4", "4 K B", "M4"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="bad size"):
        ar.parse_size(text)


def test_size_list_rounds_to_whole_elements():
    assert ar.size_list(4, 256, 4, 4) == [4, 16, 64, 256]
    assert ar.size_list(4, 64, 4, 8) == [8, 16, 64]      # 4 B -> one float64
    assert ar.size_list(6, 100, 2, 4) == [4, 12, 24, 48, 96]


def test_expected_sum_matches_formula():
    n, count = 3, 50
    i = np.arange(count)
    want = sum((i * 7 + r * 13) % 17 - 8 for r in range(n))
    send = np.empty(count, np.float32)
    ar.fill_send(send, 2)
    assert np.array_equal(send, (i * 7 + 2 * 13) % 17 - 8)
    assert np.array_equal(ar.expected_sum(count, np.float32, n), want)


def test_busbw():
    assert ar.busbw(3.0, 1) == 0
    assert ar.busbw(3.0, 2) == 3.0
    assert ar.busbw(4.0, 4) == 6.0


def test_summary_of_the_torch_path_alone():
    """--algorithms torch,async: no hpcdl algorithm or peer row, still a summary."""
    rows = [dict(impl=i, bytes=4096, time_us=t, min_us=m, floor_us=0.5)
            for i, t, m in (("torch", 30.0, 20.0), ("async", 20.0, 16.0))]
    (s,) = ar.summarize(rows)
    assert s["torch_over_async"] == 1.5 and s["torch_over_async_min"] == 1.25
    assert s["floor_us"] == 0.5 and "best" not in s and "torch_over_hvd" not in s


@pytest.mark.parametrize("args, message", [
    (["--min-bytes", "4X"], "bad size"), (["--min-bytes", "1M", "--max-bytes", "4K"],
                                          "larger than"),
    (["--factor", "1"], "factor"), (["--algorithms", "ring,nccl"], "unknown algorithm"),
    (["--dtype", "float16"], "unknown --dtype"), (["-n", "0"], "-n must be")])
def test_usage_errors(args, message):
    r = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.mpi
def test_two_rank_run(tmp_path):
    out = tmp_path / "bench.json"
    # every implementation, the torch path's (async, hvd, torch; not in the default list) too
    r = run_mpi(2, BENCH + ["--max-bytes", "64K", "--iters", "2", "--warmup", "1",
                            "--time-budget", "0.2", "--json", str(out),
                            "--algorithms", ",".join(ar.IMPLS)], timeout=180)
    assert r.returncode == 0, r.stdout
    text = r.stdout
    assert "# hpcdl bench allreduce" in text and "oversubscribed: no" in text
    assert "agreement check: on" in text and "aggregate copy bandwidth" in text
    assert "# Out of bounds values : 0 OK" in text
    doc = json.loads(out.read_text())
    assert doc["ranks"] == 2 and doc["copy_bw_GBps"] > 0
    sizes = [4 << (2 * k) for k in range(8)]             # 4 B .. 64 KiB, x4
    got = {(row["impl"], row["bytes"]) for row in doc["rows"]}
    assert got == {(impl, b) for impl in ar.IMPLS for b in sizes}
    for impl in ar.IMPLS:  # every implementation has a table row
        assert any(impl in l.split() for l in text.splitlines() if " 65536 " in l), impl
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in doc["rows"])
    assert "torch/async" in text  # the torch path's overhead table: a ratio per size
    assert [s["bytes"] for s in doc["summary"]] == sizes
    assert all(s["torch_over_async"] > 0 and s["torch_over_hvd_min"] > 0 for s in doc["summary"])


@pytest.mark.parametrize("args, message", [
    (["--backend", "nccl"], "--backend: unknown 'nccl'"), (["--backend", ","], "nothing given"),
    (["--wrap", "ddp"], "--wrap needs --backend"),
    (["--backend", "gloo", "--wrap", "ddp,zero"], "--wrap: unknown 'zero'"),
    (["--backend", "hpcdl", "--zero", "1"], "--zero is not taken with --backend"),
    (["--backend", "hpcdl", "--fusion-mb", "4"], "--fusion-mb is not taken"),
    (["--profile"], "--profile needs --backend")])
def test_train_backend_usage_errors(args, message):
    r = subprocess.run([sys.executable, "-m", "hpcdl", "bench", "train"] + args,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.mpi
def test_bench_train_backends(tmp_path):
    """--backend hpcdl,gloo --wrap ddp,fsdp2: a row per wrap and backend (and
    the floors ddp-none, no-comm), a ratio per wrap, parameters of both backends equal."""
    out = tmp_path / "backends.json"
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "bench", "train", "--backend", "hpcdl,gloo",
                    "--wrap", "ddp,fsdp2", "--model", "tiny", "--steps", "2", "--warmup", "1",
                    "--batch", "4", "--repeats", "2", "--json", str(out)], timeout=120)
    assert r.returncode == 0, r.stdout
    assert "ddp: hpcdl / gloo samples/s" in r.stdout and "fsdp2: hpcdl / gloo" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["backends"] == ["hpcdl", "gloo"] and doc["wraps"] == ["ddp", "fsdp2"]
    got = [(row["impl"], row["wrap"], row["backend"]) for row in doc["rows"]]
    assert got == [("ddp-hpcdl", "ddp", "hpcdl"), ("ddp-gloo", "ddp", "gloo"),
                   ("fsdp2-hpcdl", "fsdp2", "hpcdl"), ("fsdp2-gloo", "fsdp2", "gloo"),
                   ("ddp-none", "ddp", "none"), ("no-comm", None, None)]
    assert all(row["min"] > 0 and row["samples_per_s"] > 0 for row in doc["rows"])
    for wrap in ("ddp", "fsdp2"):  # 2 ranks: both backends' sums are exact
        s = doc["summary"][wrap]
        assert len(s["ratios"]) == 2 and s["ratio"] > 0 and not s["wrong"], s
        assert s["first_step_param_diff"] == 0 and s["max_param_diff"] == 0, s
    assert doc["summary"]["ddp"]["bound"] > 0 and "ddp-none / ddp-gloo" in r.stdout


def test_engine_phases_from_records():
    """Engine records (MPI_Wtime seconds) to ms per phase: two buckets, the
    second queued behind the first; the finisher picked only the first."""
    recs = [dict(handle=7, t_submit=1.000, t_start=1.001, t_agreed=1.003, t_end=1.010,
                 bytes=4000),
            dict(handle=8, t_submit=1.002, t_start=1.010, t_agreed=1.010, t_end=1.014,
                 bytes=1000)]
    from hpcdl.bench import ddp
    got = ddp.engine_phases(recs, backward_end=1.020, picked={7: 1.0125})
    want = dict(queue=1 + 8, negotiate=2 + 0, communicate=7 + 4, last_collective=12,
                past_backward=0,
                before_backward_end=6, lag=2.5, collectives=2, mbytes=0.005)
    assert got == pytest.approx(want, abs=1e-6)
    late = ddp.engine_phases(recs, backward_end=1.011, picked={})  # comm outlasts backward
    assert late["past_backward"] == pytest.approx(3) and late["before_backward_end"] == 0
    assert ddp.engine_phases([], 1.0, {})["collectives"] == 0


def test_profile_timers_come_off():
    """--profile's timers wrap the backend's functions only while enabled:
    disable() puts back the very functions that were there."""
    from hpcdl.torch.distributed import _profile, _tensors, _work, process_group as pg

    def current():
        return (pg.ProcessGroupHpcdl.allreduce, _tensors.core_view, _work.Work.get_future,
                _work.Work._finish, _work._deliver)
    plain = current()
    _profile.enable()
    try:
        assert all(a is not b for a, b in zip(current(), plain)) and _profile.enabled()
        assert _profile.take()["calls"] == 0
    finally:
        _profile.disable()
    assert all(a is b for a, b in zip(current(), plain)) and not _profile.enabled()


@pytest.mark.mpi
def test_bench_train_backend_profile(tmp_path):
    """--profile: the where-the-time-goes table for every implementation
    (hpcdl-opt added); per implementation the caller's phases are
    non-negative and add up to no more than the step, the backend's calls fit
    in backward, the engine's serial phases in the step; DDP on hpcdl made
    backend calls and engine collectives, gloo none; the CPU model is named."""
    out = tmp_path / "profile.json"
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "bench", "train", "--backend", "hpcdl,gloo",
                    "--model", "tiny", "--steps", "3", "--warmup", "2", "--batch", "4",
                    "--repeats", "1", "--profile", "--json", str(out)], timeout=180)
    assert r.returncode == 0, r.stdout
    assert "# where the time goes (--profile)" in r.stdout and "#  CPU: " in r.stdout
    doc = json.loads(out.read_text())
    assert doc["cpu_model"] and doc["cpu_model"] in r.stdout
    prof = doc["profile"]
    assert list(prof) == ["ddp-hpcdl", "ddp-gloo", "ddp-none", "hpcdl-opt", "no-comm"]
    assert all(n == 2 * 3 for n in doc["profile_steps"].values())  # ranks x timed steps
    eps = 0.01  # ms: rounding of the sums
    for name, p in prof.items():
        assert all(v >= 0 for v in p.values()), (name, p)
        assert p["step"] > 0 and p["forward"] + p["backward"] + p["optimizer"] <= p["step"] + eps
        assert p["call"] + p["get_future"] <= p["backward"] + eps, (name, p)
        assert p["view"] <= p["call"] + eps and p["deliver"] + p["copy_out"] <= p["finish"] + eps
        assert p["negotiate"] + p["communicate"] <= p["step"] + eps, (name, p)
        assert p["last_collective"] <= p["step"] + eps, (name, p)
    hp, gloo = prof["ddp-hpcdl"], prof["ddp-gloo"]
    assert hp["calls"] >= 1 and hp["collectives"] >= 1 and hp["mbytes"] > 0, hp
    assert hp["submit"] <= hp["call"] + eps and hp["finish"] > 0, hp
    assert gloo["calls"] == 0 and gloo["collectives"] == 0, gloo
    assert prof["hpcdl-opt"]["collectives"] >= 1 and prof["hpcdl-opt"]["calls"] == 0
    rows = [row["impl"] for row in doc["rows"]]
    assert "hpcdl-opt" in rows and doc["summary"]["ddp"]["max_param_diff"] == 0


@pytest.mark.mpi
def test_device_cuda(tmp_path):
    """--device cuda: without a usable GPU one line on every rank and exit 2;
    with one (a GPU machine), the rows run on CUDA tensors and check out."""
    r = run_mpi(2, BENCH + ["--device", "cuda", "--max-bytes", "4K", "--iters", "2",
                            "--warmup", "1", "--time-budget", "0.2"], timeout=120)
    if dev.unavailable("cuda"):
        assert r.returncode != 0 and r.stdout.count("hpcdl: error: --device cuda") == 2, \
            r.stdout
    else:
        assert r.returncode == 0 and "# Out of bounds values : 0 OK" in r.stdout, r.stdout
        assert "buffers: CUDA tensors" in r.stdout


@pytest.mark.mpi
def test_bench_train_runs_and_checks_parameters(tmp_path):
    out = tmp_path / "train.json"
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "bench", "train", "--steps", "2",
                    "--warmup", "1", "--batch", "8", "--repeats", "2", "--json", str(out),
                    "--noise-scale"], timeout=120)
    assert r.returncode == 0, r.stdout
    for word in ("hpcdl", "ddp-gloo", "no-comm", "hpcdl / DDP samples/s", "OK",
                 "repeat 2/2", "hpcdl+noise", "parameters equal to hpcdl's: OK"):
        assert word in r.stdout, r.stdout
    data = json.loads(out.read_text())
    assert data["params"] > 10_000_000 and data["cpu_model"] in r.stdout
    assert data["first_step_param_diff"] < 1e-4 and data["max_param_diff"] < 1e-4
    assert len(data["repeats"]) == 2 and len(data["ratios"]) == 2
    noise = data["noise_scale"]  # --noise-scale: timed beside hpcdl, 3 steps measured
    assert noise["steps"] == 3 and noise["own_ms_per_step"] > 0, noise
    row = data["rows"][0]
    assert row["impl"] == "hpcdl" and row["min"] <= row["samples_per_s"] <= row["max"]
    # shares of time: in [0, 1], and the job's backward window contains this rank's
    assert 0 <= row["hidden"] <= row["hidden_job"] + 1e-9 <= 1 + 1e-9, row
