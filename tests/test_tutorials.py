"""test_tutorials.py - every tutorial runs to its final check under mpirun, has an
exercise, and tutorial 02's check fails when its ring is broken."""
import glob
import os

import pytest

from mpi_harness import run_python

TUTORIALS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "tutorials",
                                          "[0-9][0-9]_*.py")))


# rank counts each tutorial runs with in CI (default: 2 and 4); the
# large-batch study trains five models and says "run it with 4 ranks"
RANKS = {"05_large_batch.py": (4,), "06_slurm.py": (),  # 06: test_slurm_tutorial
         "08_multinode.py": (),  # 08: test_multinode_tutorial (one process, root)
         "09_sharded.py": (4,),  # uneven blocks on 4 (7210 parameters)
         "10_three_parallelisms.py": (4,)}  # 4 pipeline stages (2 also works)
TIMEOUT = {"05_large_batch.py": 300}  # 05: five MNIST-1D runs (~2 min quiet)


def _cases():
    for path in TUTORIALS:
        name = os.path.basename(path)
        for n in RANKS.get(name, (2, 4)):
            yield pytest.param(path, n, id="%s-%d" % (name, n))


@pytest.mark.mpi
@pytest.mark.parametrize("path,n", list(_cases()))
def test_tutorial_runs(path, n):
    r = run_python(n, path, timeout=TIMEOUT.get(os.path.basename(path), 90))
    assert "all checks passed" in r.stdout, r.stdout


def test_every_tutorial_has_an_exercise():
    for path in TUTORIALS:
        with open(path) as f:
            assert "Exercise" in f.read().split('"""')[1], path


@pytest.mark.mpi
def test_ring_tutorial_catches_a_broken_ring(tmp_path):
    # exercise b's bug: every rank sends its own block in the all-gather, on
    # lengths that are multiples of N (so MPI sees no size mismatch): only
    # tutorial 02's own check can notice, and it must exit non-zero
    path = [p for p in TUTORIALS if os.path.basename(p) == "02_ring_allreduce.py"][0]
    with open(path) as f:
        src = f.read()
    swaps = [("block(buf, r - s, N), block(buf, r - s - 1, N)",
              "block(buf, r, N), block(buf, r - s - 1, N)"),
             ("(0, 1, size - 1, size + 1, 1031, 100003)", "(0, 4 * size, 1028 * size)")]
    for old, new in swaps:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    broken = tmp_path / "02_broken.py"
    broken.write_text(src)
    r = run_python(4, str(broken), timeout=90, check=False)
    assert r.returncode != 0 and "FAILED" in r.stdout and "elements differ" in r.stdout, r.stdout


@pytest.mark.mpi
def test_slurm_tutorial_submits_a_real_job(slurm_cluster):
    # one process, as on a login node; the suite's own Slurm runs the job
    import subprocess
    import sys
    path = [p for p in TUTORIALS if os.path.basename(p) == "06_slurm.py"][0]
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=240,
                       env=slurm_cluster.env)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout + r.stderr
    assert "COMPLETED" in r.stdout and "step 4 skipped" not in r.stdout, r.stdout


@pytest.mark.mpi
def test_multinode_tutorial_runs_a_two_host_slurm_job():
    # one process as root: it brings up its own vcluster with Slurm, and downs it
    import subprocess
    import sys
    from vcluster_harness import REQUIRED, why_not
    if why_not():
        if REQUIRED:
            pytest.fail("HPCDL_REQUIRE_VCLUSTER=1 but " + why_not(), pytrace=False)
        pytest.skip(why_not())
    path = [p for p in TUTORIALS if os.path.basename(p) == "08_multinode.py"][0]
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout + r.stderr
    assert "job 1 COMPLETED" in r.stdout and "vcluster down:" in r.stdout, r.stdout
