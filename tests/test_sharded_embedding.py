"""test_sharded_embedding.py - hpcdl.torch.distributed.ShardedEmbeddingBag
(table-wise sharded embedding tables over all-to-all, issue 30 item 5).

One launch each on 2 and 3 ranks of tests/mpi_scripts/sharded_embedding_check.py:
forward rows, the owners' table gradients, the tables after an SGD step and a
second forward against one process holding every table as torch.nn.EmbeddingBag
on the global batch (uneven tables, empty bags, B differing between ranks, a rank
with no table, sum and mean, a given placement); bad ids, bad offsets and tables
that differ between ranks -> the same ValueError on every rank. `hpcdl bench
embedding` (tiny, inside the 2-rank launch: its three ways agree, JSON rows) and its usage
errors. In one process: the initial tables depend on seed and table only."""
import json
import os
import re

import pytest
import torch

from hpcdl.torch.distributed.sharded_embedding import init_table
from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "sharded_embedding_check.py")


def test_initial_table_depends_on_seed_and_table_only():
    a = init_table((5, 3), 2, seed=1)
    assert torch.equal(a, init_table((5, 3), 2, seed=1))
    assert not torch.equal(a, init_table((5, 3), 3, seed=1))
    assert not torch.equal(a, init_table((5, 3), 2, seed=2))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_embedding_bag_matches_one_process(n, tmp_path):
    bench = tmp_path / "emb.json"          # 2 ranks: also a tiny bench embedding
    r = run_python(n, SCRIPT, timeout=120, env={"MASTER_ADDR": "", "MASTER_PORT": ""},
                   args=("hpcdl", str(bench)) if n == 2 else ())
    # ranks' lines may run together in the merged output: match, don't split
    found = re.findall(r"rank (\d+) checks (\d+) FAILED (\d+)", r.stdout)
    assert sorted(int(x[0]) for x in found) == list(range(n)), r.stdout
    assert all(int(c) > 20 and f == "0" for _, c, f in found), r.stdout
    if n == 2:
        assert "agree after one step within 0.0001: OK" in r.stdout, r.stdout
        rows = json.loads(bench.read_text())["rows"]
        assert [(x["rows"], x["method"]) for x in rows] == [
            (k, m) for k in (40, 300) for m in ("sharded", "replicated", "allgather")]
        assert not any(x["wrong"] for x in rows)
        replicated = [x["bytes_per_rank"] for x in rows if x["method"] == "replicated"]
        assert replicated == [3 * k * 4 * 4 for k in (40, 300)]  # ring: 2(N-1)/N x tables


@pytest.mark.parametrize("args,words", [
    (["--methods", "sharded,gather"], "--methods 'sharded,gather': give some of"),
    (["--rows", "10,x"], "--rows '10,x'"),
    (["--tables", "0"], "--tables must be at least 1"),
])
def test_bench_usage_errors(args, words, capsys):
    from hpcdl.cli.main import main
    assert main(["bench", "embedding"] + args) == 2
    assert words in capsys.readouterr().err
