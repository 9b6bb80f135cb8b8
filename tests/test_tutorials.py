"""test_tutorials.py - every tutorial runs to its final check under mpirun."""
import glob
import os

import pytest

from mpi_harness import run_python

TUTORIALS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "tutorials",
                                          "[0-9][0-9]_*.py")))


@pytest.mark.mpi
@pytest.mark.parametrize("path", TUTORIALS, ids=os.path.basename)
@pytest.mark.parametrize("n", [2, 4])
def test_tutorial_runs(path, n):
    r = run_python(n, path, timeout=90)
    assert "all checks passed" in r.stdout, r.stdout
