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


def pytest_collection_modifyitems(config, items):
    """HPCDL_TEST_MAX_RANKS=K leaves out the multi-rank (`mpi`) tests whose
    rank-count parameter `n` is above K. The MPICH stage of `make test` sets
    it: MPICH's ranks poll, so 4 ranks on 2 cores are slow there, and the
    MPI-specific paths are covered on 2 and 3 ranks and 2 virtual nodes."""
    limit = os.environ.get("HPCDL_TEST_MAX_RANKS")
    if not limit:
        return
    keep, drop = [], []
    for item in items:
        n = getattr(getattr(item, "callspec", None), "params", {}).get("n")
        too_many = item.get_closest_marker("mpi") and isinstance(n, int) and n > int(limit)
        (drop if too_many else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
