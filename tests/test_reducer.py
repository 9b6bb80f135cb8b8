"""test_reducer.py - the Reducer's seams (hpcdl/torch/reducer.py): user comm
hooks (sum, fp16 through a torch Future, an hvd int handle, adasum_hook) and the
statistics hooks (before/after/end, a tail element riding the last bucket's
all-reduce, at ZeRO 0 and 1), against one-process math on 2 and 3 ranks."""
import os

import pytest

from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_comm_and_stats_hooks(n):
    r = run_python(n, os.path.join(SCRIPTS, "reducer_check.py"), timeout=120)
    assert "FAILED 0" in r.stdout, r.stdout
