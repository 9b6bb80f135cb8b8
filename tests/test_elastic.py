"""test_elastic.py - hvd.elastic (restart-based) and horovodrun's flags of
`hpcdl run`: ElasticSampler's re-dealing against its definition, a rank
SIGKILLed mid-training and the job restarted from the last commit ending
with the uninterrupted run's parameters bit for bit, a resume on fewer
ranks, and every bad input (counts, hostfiles, a damaged commit)."""
import json
import math
import os
import subprocess
import sys

import pytest

from hpcdl.cli.elastic_run import check_counts
from hpcdl.cli.run import read_hostfile
from hpcdl.cli.errors import UsageError
from hpcdl.torch.elastic import sampler as sampler_mod
from hpcdl.checkpoint import files as sharded

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "mpi_scripts", "elastic_train.py")
HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl_run(args, tmp_path, env=None, timeout=180):
    e = dict(os.environ, ELASTIC_OUT=str(tmp_path / "out.json"), PYTHONUNBUFFERED="1")
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID",
                "HPCDL_ELASTIC_DIR", "HPCDL_ELASTIC_ATTEMPT"):
        e.pop(var, None)
    e.update(env or {})
    try:
        return subprocess.run(HPCDL + ["run"] + args, capture_output=True, text=True,
                              timeout=timeout, env=e, cwd=tmp_path)
    except subprocess.TimeoutExpired as t:
        pytest.fail("hpcdl run timed out after %ss: %s\n%s" % (timeout, args, t.output))


def result(tmp_path):
    return json.loads((tmp_path / "out.json").read_text())


# ------------------------------------------------------------------ sampler
def dealt(n_items, size, epoch=0, processed=0, seed=3):
    """Every rank's indices of an ElasticSampler as the given world would deal them."""
    out = []
    for r in range(size):
        sampler_mod.mpi_ops.size, sampler_mod.mpi_ops.rank = (lambda: size), (lambda: r)
        s = sampler_mod.ElasticSampler(list(range(n_items)), seed=seed)
        s.load_state_dict({"epoch": epoch, "processed_num": processed})
        out.append(list(s))
    return out


@pytest.fixture
def fake_world(monkeypatch):
    monkeypatch.setattr(sampler_mod.mpi_ops, "size", None)
    monkeypatch.setattr(sampler_mod.mpi_ops, "rank", None)


@pytest.mark.parametrize("n_items,size", [(10, 1), (10, 3), (12, 4), (7, 2), (3, 5)])
def test_sampler_deals_every_index_once_padded(fake_world, n_items, size):
    ranks = dealt(n_items, size)
    assert len({len(r) for r in ranks}) == 1
    flat = [i for r in ranks for i in r]
    assert set(flat) == set(range(n_items))
    assert len(flat) == -(-n_items // size) * size  # padded to equal shards


def test_sampler_resumes_with_the_unseen_rest_on_fewer_ranks(fake_world):
    first = dealt(24, 3, epoch=2)
    seen = {i for r in first for i in r[:2]}  # two samples a rank (one batch of 2)
    rest = dealt(24, 2, epoch=2, processed=6)
    flat = [i for r in rest for i in r]
    assert set(flat) == set(range(24)) - seen and len(flat) == 18


def test_sampler_epochs_shuffle_differently(fake_world):
    assert dealt(50, 1, epoch=0) != dealt(50, 1, epoch=1)


# ------------------------------------------------------------ flags, input
def test_hostfile_formats(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\nnode2:2\n\nnode3 slots=1 max_slots=8\nnode4\n")
    assert read_hostfile(str(f)) == "node1:4,node2:2,node3:1,node4:1"


@pytest.mark.parametrize("text,words", [("node1 cpus=4\n", "line 1"), ("# none\n", "no host")])
def test_hostfile_bad(tmp_path, text, words):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(UsageError, match=words):
        read_hostfile(str(f))


@pytest.mark.parametrize("n,lo,hi,words", [(2, 3, 2, "more than --max-np"),
                                           (4, 1, 2, "outside"), (0, None, None, "-np"),
                                           (None, 0, 2, "--min-np must")])
def test_counts_refused(n, lo, hi, words):
    with pytest.raises(UsageError, match=words):
        check_counts(n, lo, hi)


@pytest.mark.parametrize("args,words", [
    (["--min-np", "3", "--max-np", "2", "--", "true"], "--min-np 3 is more than --max-np 2"),
    (["-H", "a:1", "--hostfile", "x", "--", "true"], "not both"),
    (["--hostfile", "/nonexistent/h", "--", "true"], "--hostfile /nonexistent/h"),
    (["--max-restarts", "-1", "--", "true"], "--max-restarts must be 0 or more")])
def test_cli_bad_flags_one_line_status_2(tmp_path, args, words):
    r = hpcdl_run(args, tmp_path, timeout=60)
    assert r.returncode == 2 and words in r.stderr, r.stderr


# ----------------------------------------------------------- restarts
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    r = hpcdl_run(["-n", "2", "--", "python", SCRIPT], tmp)
    assert r.returncode == 0, r.stderr
    return result(tmp)


@pytest.mark.mpi
def test_lost_rank_restart_resumes_to_the_same_parameters(tmp_path, uninterrupted):
    r = hpcdl_run(["-n", "2", "--max-restarts", "1", "--", "python", SCRIPT], tmp_path,
                  env={"ELASTIC_KILL_AT": "1:5"})
    assert r.returncode == 0, r.stderr
    assert "attempt 0 failed (status 137); restart 1 of 1 with 2 rank(s)" in r.stderr
    assert "resumes from the last commit (2 ranks then, 2 now)" in r.stderr
    got = result(tmp_path)
    assert got["attempt"] == 1 and got["resets"] == [2]
    assert got["steps"] == 36 - 12 - 5  # the rest of epoch 1 and epoch 2
    assert got["sha256"] == uninterrupted["sha256"]
    assert not (tmp_path / ".hpcdl-elastic").exists() or \
        not os.listdir(tmp_path / ".hpcdl-elastic")  # its own folder, removed on success


@pytest.mark.mpi
def test_no_restart_left_keeps_the_commit_then_resumes_on_fewer_ranks(tmp_path):
    keep = tmp_path / "elastic"
    env = {"ELASTIC_KILL_AT": "1:5", "HPCDL_ELASTIC_DIR": str(keep)}
    r = hpcdl_run(["-n", "3", "--", "python", SCRIPT], tmp_path, env=env)
    assert r.returncode != 0
    assert sharded.latest(str(keep), "commit")  # the last commit, complete
    r = hpcdl_run(["-n", "2", "--max-restarts", "0", "--", "python", SCRIPT], tmp_path,
                  env={"HPCDL_ELASTIC_DIR": str(keep)})
    assert r.returncode == 0, r.stderr
    assert "resumes from the last commit (3 ranks then, 2 now)" in r.stderr
    got = result(tmp_path)
    # 96 samples, batch 4: 3 ranks did 5 of epoch 1's 8 batches (60 samples);
    # the 36 left on 2 ranks are 5 batches, then epoch 2 is 12
    assert got["resets"] == [2] and got["steps"] == 5 + 12, got


@pytest.mark.mpi
def test_damaged_commit_fails_on_every_rank(tmp_path):
    keep = tmp_path / "elastic"
    keep.mkdir()
    (keep / "state.pt").write_bytes(b"not a checkpoint")
    r = hpcdl_run(["-n", "2", "--", "python", SCRIPT], tmp_path,
                  env={"HPCDL_ELASTIC_DIR": str(keep)}, timeout=120)
    assert r.returncode != 0
    assert r.stderr.count("cannot read the last commit") >= 2, r.stderr
    assert (keep / "state.pt").read_bytes() == b"not a checkpoint"  # left as it was


# ------------------------------------------------------------ BatchScaling
SCALING = os.path.join(REPO, "tests", "mpi_scripts", "elastic_scaling.py")


def goodput_target_by_hand(b, n, comm):
    """The goodput rule of elastic_scaling.py (base 4, ceiling 32, t = 0.01 +
    0.002 L + comm s) for n ranks: the target of the largest goodput."""
    best, pick = -1.0, None
    for target in (4, 8, 16, 32):
        local = -(-target // n)
        m = n * local
        g = m / (0.01 + 0.002 * local + comm) * ((b or 0.0) + 4) / ((b or 0.0) + m)
        if g > best * (1 + 1e-12):
            best, pick = g, target
    return pick


@pytest.mark.mpi
def test_batch_scaling_follows_the_rule_on_more_then_fewer_ranks(tmp_path):
    """2 ranks (killed before step 4) -> 3 ranks (killed before step 8) -> 2 ranks
    to step 12, from the commits: after each reset the batch and lr are the
    rule's, worked here by hand, the AdaScale progress and noise estimates
    carry on, and training continues at the new batch. The goodput rule's
    comm (30 ms given on 2 ranks) is stale after each restart: the pick uses
    the ring's estimate x 2(N-1)/N over the old N's until the next end_epoch
    re-fits it from the ranks' mean step time; every rank holds the same."""
    keep = str(tmp_path / "elastic")
    for n, kill in (("2", "4"), ("3", "8"), ("2", None)):
        env = {"HPCDL_ELASTIC_DIR": keep, "ELASTIC_OUT": str(tmp_path / "log.jsonl")}
        if kill:
            env["ELASTIC_KILL_AT"] = kill
        r = hpcdl_run(["-n", n, "--", "python", SCALING], tmp_path, env=env)
        assert (r.returncode != 0) == bool(kill), r.stderr
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x.get("step", "reset %d" % x.get("reset", 0)) for x in log] == \
        [0, 1, 2, 3, "reset 3", 4, 5, 6, 7, "reset 2", 8, 9, 10, 11]
    assert "3 ranks -> 2: global batch 24 -> 16 (local 8 -> 8), lr x 0.666667" in r.stderr
    assert "3 ranks -> 2: global batch 21 -> 20 (local 7 -> 10), AdaScale scale 2.5" in r.stderr
    for i in (4, 9):
        reset, before, after = log[i], log[i - 1], log[i + 1]
        n = reset["reset"]  # the user's own reset callback ran, with the new size
        lin, ada, gpt = reset["linear"], reset["ada"], reset["goodput"]
        # linear, keep local: 8 a rank, lr 0.1 x N 8 / 8
        assert (lin["ranks"], lin["local"], lin["global_batch"]) == (n, 8, 8 * n)
        assert lin["lr"] == pytest.approx(0.1 * n)
        # AdaScale, global 20 kept: 10 a rank on 2 (20), 7 on 3 (21); S = G / 8
        local, g = {2: (10, 20), 3: (7, 21)}[n]
        assert (ada["local"], ada["global_batch"], ada["scale"]) == (local, g, g / 8)
        assert ada["lr"] == 0.05
        assert ada["progress"] == before["ada"]["progress"]          # carried on
        assert ada["noise_steps"] == before["ada"]["noise_steps"]
        assert ada["b_noise"] == pytest.approx(before["ada"]["b_noise"], rel=1e-9)
        # goodput: re-picked for N from the running B_noise and the step-time model,
        # its comm measured on the old N moved by the ring's bytes 2(N-1)/N
        old_n = before["goodput"]["ranks"]
        comm = before["goodput"]["measured_comm"] * (n - 1) / n * old_n / (old_n - 1)
        assert gpt["stale"] and gpt["comm_at"][0] == old_n
        assert gpt["comm"] == pytest.approx(comm, rel=1e-12)
        target = goodput_target_by_hand(before["goodput"]["b_noise"], n, comm)
        assert gpt["target"] == target and gpt["global_batch"] == n * -(-target // n)
        assert gpt["scale"] == gpt["global_batch"] / 4 and gpt["lr"] == 0.05
        assert gpt["progress"] == before["goodput"]["progress"]
        # training continues at the new values
        for name in ("linear", "ada", "goodput"):
            assert after[name]["ranks"] == n and after[name]["local"] == reset[name]["local"]
            assert math.isfinite(after["loss"][name])
        assert 1.0 <= after["ada"]["gain"] <= g / 8
        assert after["ada"]["progress"] == pytest.approx(ada["progress"] + after["ada"]["gain"])
    assert log[-1]["ada"]["progress"] > log[9]["ada"]["progress"]
    assert log[4]["goodput"]["comm"] == pytest.approx(0.04)  # 30 ms x (4/3) / 1
    # the first end_epoch after each restart (steps 5 and 8) re-fits comm from the
    # ranks' mean step_s, 0.05 + 0.012 x rank: 0.062 s on 3 ranks, 0.056 s on 2, less
    # the compute at the local batch, and re-picks with it
    for i, n, mean in ((6, 3, 0.062), (10, 2, 0.056)):
        before, after = log[i]["goodput"], log[i + 1]["goodput"]
        comm = mean - (0.01 + 0.002 * before["local"])
        assert before["stale"] and not after["stale"] and after["comm_at"][0] == n
        assert after["comm"] == after["measured_comm"] == pytest.approx(comm, rel=1e-12)
        assert after["target"] == goodput_target_by_hand(before["b_noise"], n, comm)
    assert not any(x["goodput"]["stale"] for x in log[:4] + log[11:])
    assert all(x["goodput"]["agree"] for x in log)  # target, local batch, comm
    assert "measured on 3 ranks, 1 host(s); now 2 ranks, 1 host(s): the ring's" in r.stderr
    assert "comm re-measured on 2 ranks, 1 host(s)" in r.stderr
