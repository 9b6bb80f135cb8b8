"""test_sharded_embedding.py - hpcdl.torch.distributed.ShardedEmbeddingBag
(table-wise sharded embedding tables over all-to-all, issue 30 item 5).

One launch each on 2 and 3 ranks of tests/mpi_scripts/sharded_embedding_check.py:
forward rows, the owners' table gradients, the tables after an SGD step and a
second forward against one process holding every table as torch.nn.EmbeddingBag
on the global batch (uneven tables, empty bags, B differing between ranks, a rank
with no table, sum and mean, a given placement); bad ids, bad offsets and tables
that differ between ranks -> the same ValueError on every rank. In one process:
the initial tables do not depend on the owner, and bad construction arguments."""
import os

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
def test_sharded_embedding_bag_matches_one_process(n):
    r = run_python(n, SCRIPT, timeout=120, env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    lines = [l for l in r.stdout.splitlines() if " checks " in l]
    assert len(lines) == n and all("FAILED 0" in l for l in lines), r.stdout
