"""test_checkpoint_matrix.py - any --zero stage resumes any other on any
number of ranks (hpcdl/checkpoint/: each save re-sharded by parameter name).

The resume matrix: `hpcdl train` at --zero 0, 1, 2 and 3 on 2, 3 and 4
ranks each writes a checkpoint after epoch 1 (12 checkpoints); each is
resumed by each (stage, rank count) for epoch 2 (144 resumes) and compared
with that reader's uninterrupted 2-epoch run on this machine: bit for bit
where the sums cannot differ (the same stage and ranks, any stages on 2
ranks, stages 0 and 1 on the same ranks), else within 1e-5 relative (the
first epoch's gradients summed in another order; 2.8e-7 at worst when
written). All 168 runs in one 4-rank launch (each on a sub-communicator of
the job; tests/mpi_scripts/checkpoint_matrix.py), about 75 s on 2 cores.

Older checkpoints: tests/data/checkpoints-703d852 (written by 703d852's
hpcdl train on 2 ranks at --zero 0-3) and checkpoints-72df3c7 (--zero 0, 2,
3) are each resumed by every stage on 2 ranks in one launch: the resumes of
one set agree bit for bit, and with today's uninterrupted run within 1e-4
(their first epoch may come from another CPU).
"""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "checkpoint_matrix.py")
DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.mpi
@pytest.mark.slow
def test_every_stage_and_rank_count_resumes_every_other(tmp_path):
    r = run_python(4, SCRIPT, timeout=600, args=["matrix", str(tmp_path)])
    assert r.stdout.count("PAIR ") == 144 and "MATRIX OK" in r.stdout, r.stdout
    # exact(): 12 own checkpoints, 12 more on 2 ranks, stages 0 <-> 1 on 3 and on 4 ranks
    assert r.stdout.count(" exact") == 12 + 12 + 4, r.stdout


@pytest.mark.mpi
def test_older_checkpoints_resume_at_every_stage():
    sets = [os.path.join(DATA, d) for d in ("checkpoints-703d852", "checkpoints-72df3c7")]
    before = {d: _listing(d) for d in sets}
    r = run_python(2, SCRIPT, timeout=300, args=["older", *sets])
    assert r.stdout.count("PAIR ") == 4 * 4 + 3 * 4 and "MATRIX OK" in r.stdout, r.stdout
    assert {d: _listing(d) for d in sets} == before  # resumed without --checkpoint-dir


def _listing(directory):
    return sorted((root, sorted(files)) for root, _, files in os.walk(directory))
