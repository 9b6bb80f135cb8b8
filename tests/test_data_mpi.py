"""test_data_mpi.py - hpcdl.data on several ranks under mpirun: the sampler's
index lists gathered with MPI's allgather (disjoint, equal counts, union = the
data set, equal to one-process math) and read through DataLoaders with 2
workers; node-local staging shared by the ranks of a node; `hpcdl data shard`
on 2-3 ranks writing the same shards as one process (collective MPI-IO with a
parallel h5py, whole files per rank without); and bad data seen by one rank
ending every rank's run instead of hanging them."""
import os
import sys

import h5py
import numpy as np
import pytest

import data_helpers as dh
from hpcdl.data import Manifest
from mpi_harness import run_mpi, run_python

pytestmark = pytest.mark.mpi
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_scripts")
HPCDL_DATA = [sys.executable, "-m", "hpcdl", "data"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpi")
    dh.make_npz(d / "a.npz", n=103, shape=(3, 4), classes=5, val=17)
    dh.write(str(d / "a.npz"), d / "out", shards=3, chunk_rows=8)
    return str(d / "out")


def test_sampler_and_dataloader_on_3_ranks(shards):
    r = run_python(3, os.path.join(SCRIPTS, "data_sampler_check.py"), args=[shards],
                   timeout=120)
    assert r.stdout.count("SAMPLER OK") == 3, r.stdout


def test_staging_shared_by_the_ranks_of_a_node(shards, tmp_path):
    r = run_python(2, os.path.join(SCRIPTS, "data_stage_check.py"),
                   args=[shards, str(tmp_path / "local")], timeout=90)
    assert r.stdout.count("STAGE OK") == 2, r.stdout
    # the node copied each of the 6 files once (not once per rank), then nothing
    assert "copied 6 of 6 file(s)" in r.stdout, r.stdout
    assert "all 6 file(s) were there already" in r.stdout
    assert "all 3 file(s) were there already" in r.stdout


def h5py_has_mpi():
    return bool(h5py.get_config().mpi)


@pytest.mark.parametrize("ranks, flags, io", [(3, [], "mpio-collective"),
                                              (2, ["--no-collective"], "per-file")])
def test_parallel_write_equals_one_process(tmp_path, ranks, flags, io):
    if io == "mpio-collective" and not h5py_has_mpi():
        if os.environ.get("HPCDL_H5PY_MPI") == "1":
            pytest.fail("HPCDL_H5PY_MPI=1 but this h5py has no MPI support: the collective "
                        "write path must be tested here (HPCDL_H5PY_MPI=1 make setup)")
        pytest.skip("h5py without MPI support: the collective write path (driver='mpio') "
                    "is tested after HPCDL_H5PY_MPI=1 make setup")
    # 53 + 11 samples, 4 shards of ~13 rows, chunks of 4: ragged blocks, and a rank
    # with no block of a shard still takes part in its collective writes
    dh.make_npz(tmp_path / "a.npz", n=53, shape=(3, 4), classes=4, val=11)
    dh.write(str(tmp_path / "a.npz"), tmp_path / "one", shards=4, chunk_rows=4)
    r = run_mpi(ranks, HPCDL_DATA + ["shard", str(tmp_path / "a.npz"), "--out",
                                     str(tmp_path / "par"), "--shards", "4",
                                     "--chunk-rows", "4"] + flags, timeout=120)
    assert r.returncode == 0, r.stdout
    one, par = Manifest(tmp_path / "one"), Manifest(tmp_path / "par")
    assert par.doc["written_by"] == {"io": io, "ranks": ranks}
    for split in ("train", "val"):
        a, b = one.split(split)["shards"], par.split(split)["shards"]
        assert [s["checksums"] for s in a] == [s["checksums"] for s in b]
        for sa, sb in zip(a, b):
            with h5py.File(one.shard_path(sa), "r") as fa, h5py.File(par.shard_path(sb)) as fb:
                for field in ("x", "y", "source_index"):
                    assert np.array_equal(fa[field][:], fb[field][:])
    r = run_mpi(1, HPCDL_DATA + ["verify", str(tmp_path / "par")])
    assert r.returncode == 0 and "bad shards: 0 of 8 OK" in r.stdout, r.stdout


def test_bad_shard_on_one_rank_ends_every_rank(tmp_path):
    dh.make_npz(tmp_path / "a.npz", n=40, shape=(3, 4), classes=5)
    out = str(tmp_path / "out")
    dh.write(str(tmp_path / "a.npz"), out, shards=2, chunk_rows=8, compression="none")
    # only the last rank reads the second shard
    dh.corrupt_chunk(os.path.join(out, "train-00001-of-00002.h5"), "x", 1, skip=3, count=3)
    r = run_python(2, os.path.join(SCRIPTS, "data_fail_one_rank.py"), args=[out],
                   timeout=90, check=False)
    assert r.returncode != 0, r.stdout
    assert "train-00001-of-00002.h5: field 'x', rows 8..15" in r.stdout, r.stdout
    assert "checksum differs" in r.stdout and "passed the all-reduce" not in r.stdout


def test_broken_image_seen_by_one_rank_fails_every_rank(tmp_path):
    files = dh.make_images(tmp_path / "imgs")
    with open(files[1][0], "r+b") as f:  # sample 1: scanned by rank 1 of 2
        f.truncate(40)
    r = run_mpi(2, HPCDL_DATA + ["shard", str(tmp_path / "imgs"), "--out",
                                 str(tmp_path / "out")], timeout=90)
    assert r.returncode != 0
    # both ranks say it: rank 1 found it, rank 0 learnt it from rank 1
    assert r.stdout.count("cat/img_1.png (sample 1 of") == 2, r.stdout
    assert "rank 1 failed" in r.stdout and "image does not decode" in r.stdout
    assert not os.path.exists(tmp_path / "out" / "manifest.json")
