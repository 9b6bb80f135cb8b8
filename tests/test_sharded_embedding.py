"""test_sharded_embedding.py - hpcdl.torch.distributed.ShardedEmbeddingBag
(table-wise sharded embedding tables over all-to-all, issue 30 item 5).

One launch each on 2 and 3 ranks of tests/mpi_scripts/sharded_embedding_check.py:
forward rows, the owners' table gradients, the tables after an SGD step and a
second forward against one process holding every table as torch.nn.EmbeddingBag
on the global batch (uneven tables, empty bags, B differing between ranks, a rank
with no table, sum and mean, a given placement); bad ids, bad offsets and tables
that differ between ranks -> the same ValueError on every rank. `hpcdl bench
embedding` on 2 ranks (tiny: its three methods agree, JSON rows) and its usage
errors. In one process: the initial tables depend on seed and table only."""
import json
import os
import subprocess
import sys

import pytest
import torch

from hpcdl.torch.distributed.sharded_embedding import init_table
from mpi_harness import run_mpi, run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "sharded_embedding_check.py")


def test_initial_table_depends_on_seed_and_table_only():
    a = init_table((5, 3), 2, seed=1)
    assert torch.equal(a, init_table((5, 3), 2, seed=1))
    assert not torch.equal(a, init_table((5, 3), 3, seed=1))
    assert not torch.equal(a, init_table((5, 3), 2, seed=2))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_embedding_bag_matches_one_process(n):
    r = run_python(n, SCRIPT, timeout=120, env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    lines = [l for l in r.stdout.splitlines() if " checks " in l]
    assert len(lines) == n and all("FAILED 0" in l for l in lines), r.stdout


BENCH = [sys.executable, "-m", "hpcdl", "bench", "embedding"]


@pytest.mark.parametrize("args,words", [
    (["--methods", "sharded,gather"], "--methods 'sharded,gather': give some of"),
    (["--rows", "10,x"], "--rows '10,x'"),
    (["--tables", "0"], "--tables must be at least 1"),
])
def test_bench_usage_errors(args, words):
    r = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr, r.stderr


@pytest.mark.mpi
def test_bench_embedding_runs_and_checks(tmp_path):
    out = tmp_path / "emb.json"
    r = run_mpi(2, BENCH + ["--rows", "40,300", "--tables", "3", "--dim", "4", "--batch", "5",
                            "--steps", "1", "--warmup", "0", "--json", str(out)], timeout=120)
    assert r.returncode == 0 and "agree after one step within 0.0001: OK" in r.stdout, r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(x["rows"], x["method"]) for x in rows] == [
        (n, m) for n in (40, 300) for m in ("sharded", "replicated", "allgather")]
    assert not any(x["wrong"] for x in rows)
    replicated = [x for x in rows if x["method"] == "replicated"]
    assert [x["bytes_per_rank"] for x in replicated] == [3 * n * 4 * 4 for n in (40, 300)]
