"""conftest.py - makes tests/ importable (mpi_harness) and sets Open MPI's
root permission for launches when the suite runs as root (CI does)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if os.geteuid() == 0:
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

# the session's one real Slurm for tests/test_slurm*.py (started on first use)
from slurm_cluster import slurm_cluster  # noqa: E402,F401
