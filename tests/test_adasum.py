"""test_adasum.py - op=hvd.Adasum (hpcdl/comm/adasum.py) on 2, 3 and 4 ranks
against its definition in float64 (tests/mpi_scripts/adasum_check.py)."""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "adasum_check.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_adasum_matches_its_definition(n):
    r = run_python(n, SCRIPT, timeout=90, check=False)
    assert r.returncode == 0 and r.stdout.count("adasum OK") == n, r.stdout
