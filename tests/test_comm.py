"""test_comm.py - hpcdl.comm: buffer validation in one process, then the
collectives under mpirun against MPI's own and float64 math (2, 3, 4 ranks,
and 2 virtual nodes x 2 ranks for the hierarchical inter-node path), small
all-reduces carried in the agreement check across virtual nodes, async
ordering, and every misuse raising on every rank within seconds."""
import os

import numpy as np
import pytest
import torch

from hpcdl.comm import buffers
from hpcdl.comm._types import algo_code, op_code
from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")


# ---------------------------------------------------------------- one process
def test_describe_numpy_and_torch_zero_copy():
    a = np.arange(10, dtype=np.float32)
    info = buffers.describe(a)
    assert (info.ptr, info.count, info.dtype) == (a.ctypes.data, 10, "float32")
    t = torch.zeros(3, 4, dtype=torch.bfloat16)
    info = buffers.describe(t)
    assert (info.ptr, info.count, info.dtype) == (t.data_ptr(), 12, "bfloat16")


@pytest.mark.parametrize("bad, exc, words", [
    (np.zeros((4, 4), np.float32)[:, 0], TypeError, "contiguous"),
    (np.zeros(4, np.uint8), TypeError, "uint8"),
    (torch.zeros(4, 4).t(), TypeError, "contiguous"),
    (torch.zeros(4, dtype=torch.complex64), TypeError, "complex64"),
    ([1.0, 2.0], TypeError, "numpy array or a torch tensor"),
])
def test_describe_rejects(bad, exc, words):
    with pytest.raises(exc, match=words):
        buffers.describe(bad)


def test_readonly_numpy_rejected():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        buffers.describe(a)


def test_op_and_algorithm_names():
    assert op_code("Average") == op_code("avg") == 1
    assert algo_code("HIER") == 2
    with pytest.raises(ValueError, match="unknown reduction op"):
        op_code("median")
    with pytest.raises(ValueError, match="unknown algorithm"):
        algo_code("tree")


# ---------------------------------------------------------------- multi-rank
# One launch per rank count runs every part (each dtype, torch tensors, the
# other collectives, async); the dtype x op x algorithm matrix itself is
# src_c/tests/test_collectives.c's. `quick`: also in make check.
@pytest.mark.mpi
@pytest.mark.parametrize("n,local", [pytest.param(2, None, marks=pytest.mark.quick), (3, None),
                                     (4, None), pytest.param(4, "2", marks=pytest.mark.quick)])
def test_collectives_match_mpi(n, local):
    # 4 ranks as 2 virtual nodes x 2: the inter-node ring of hier runs over real MPI
    r = run_python(n, os.path.join(SCRIPTS, "collectives_check.py"), args=["all"],
                   env={"HPCDL_LOCAL_SIZE": local} if local else None, timeout=120)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
def test_allreduce_64mib():
    # 64 MiB where ranks <= cores; sum and max through each algorithm, against MPI_Allreduce
    r = run_python(2, os.path.join(SCRIPTS, "collectives_check.py"),
                   args=["big:ring,big:hier,big:mpi,big:auto", str(64 << 20)], timeout=120)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n,local,mode", [(3, "1", "data"), (4, "2", "data"),
                                          (2, "1", "threshold")])
def test_small_allreduce_inline_across_nodes(n, local, mode):
    # virtual nodes (3 x 1, 2 x 2): auto all-reduces up to HPCDL_SMALL_BYTES ride in
    # the agreement check's exchange (small.c); sizes around the threshold, every
    # dtype and op against MPI_Allreduce, mismatches on that path
    r = run_python(n, os.path.join(SCRIPTS, "small_check.py"), args=[mode],
                   env={"HPCDL_LOCAL_SIZE": local}, timeout=90)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n,local", [(2, None), (3, None), (4, "2")])
def test_shared_buffers_allreduce_in_place(n, local):
    # zero-copy path for buffers in node shared memory (fusion buckets), against
    # MPI_Allreduce; 4 ranks as 2 virtual nodes x 2 adds the cross-node ring
    env = {"HPCDL_LOCAL_SIZE": local} if local else None
    r = run_python(n, os.path.join(SCRIPTS, "shared_buffer_check.py"), env=env, timeout=90)
    assert "FAILED 0" in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 4])
def test_errors_raise_on_every_rank(n):
    r = run_python(n, os.path.join(SCRIPTS, "errors_check.py"), timeout=60)
    assert "ERRORS OK" in r.stdout, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 3])
def test_object_collectives_and_agreements(n):
    # the one door's object calls, any_rank, raise_if_any, wtime and alltoall
    r = run_python(n, os.path.join(SCRIPTS, "comm_door_check.py"), timeout=60)
    assert r.stdout.count("DOOR OK") == n, r.stdout


@pytest.mark.mpi
def test_topology_from_mpi():
    # one write per line (print's separate newline write interleaves across ranks)
    src = ("import sys; from hpcdl import comm; comm.init(); "
           "sys.stdout.write('TOPO %d %d %d %d %d %d %s\\n' % (comm.rank(), comm.size(), "
           "comm.local_rank(), comm.local_size(), comm.cross_rank(), comm.cross_size(), "
           "comm.thread_level()))")
    r = run_python(4, src, env={"HPCDL_LOCAL_SIZE": "2"})
    rows = sorted(tuple(l.split("TOPO ")[1].split()) for l in r.stdout.splitlines()
                  if "TOPO " in l)
    assert rows == [("0", "4", "0", "2", "0", "2", "multiple"),
                    ("1", "4", "1", "2", "0", "2", "multiple"),
                    ("2", "4", "0", "2", "1", "2", "multiple"),
                    ("3", "4", "1", "2", "1", "2", "multiple")], r.stdout
    r = run_python(2, src.replace("comm.init()", "from mpi4py import MPI; comm.init()"))
    assert r.stdout.count("TOPO") == 2 and " 2 0 1 multiple" in r.stdout, r.stdout
