"""test_torch_backend.py - hpcdl as a torch.distributed backend ("hpcdl").

In one process: importing hpcdl.torch registers the backend without starting
MPI's collectives, op and dtype mapping, a one-rank group. Under mpirun (2
and 3 ranks, no MASTER_ADDR/PORT): every collective against single-process
math (tests/mpi_scripts/torch_backend_check.py, one launch for all cases:
bitwise ReduceOps, recv from any source and monitored_barrier among them),
sub-groups, a count mismatch raising hpcdl's MismatchError; DDP (plain,
comm hooks, no_sync accumulation, unused parameters), FSDP2 fully_shard
(reshard on and off), DTensor tensor parallelism, a 2-D mesh (FSDP2 x TP) and pipelining (GPipe,
1F1B) against one process on the same global batch, DCP save on N ranks and
load on N/2 and back (torch_backend_models.py, torch_backend_dcp.py)."""
import os
import socket
import subprocess
import sys

import pytest
import torch

import hpcdl.torch  # noqa: F401 - registers the backend
from hpcdl.torch.distributed import _tensors
from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- one process
def test_import_registers_backend():
    import torch.distributed as dist
    assert "hpcdl" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["hpcdl"] == ["cpu", "cuda"]
    assert dist.Backend("hpcdl") == "hpcdl"


def test_registering_starts_no_hpcdl_core():
    code = ("import hpcdl.torch, torch.distributed as dist, hpcdl.comm as c; "
            "assert 'hpcdl' in dist.Backend.backend_list; "
            "assert not c.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_reduce_op_mapping():
    op = torch.distributed.ReduceOp
    assert [_tensors.reduce_op(o) for o in (op.SUM, op.AVG, op.MIN, op.MAX, op.PRODUCT)] == \
        ["sum", "average", "min", "max", "prod"]
    for bad in (op.BAND, op.BOR, op.BXOR):
        with pytest.raises(ValueError, match="cannot reduce with ReduceOp.B"):
            _tensors.reduce_op(bad)


def test_bitwise_ops_fold_with_torch_and_the_rest_are_named():
    op = torch.distributed.ReduceOp
    assert _tensors.bitwise_fold(op.BXOR) is torch.bitwise_xor
    assert _tensors.bitwise_fold(op.SUM) is None
    with pytest.raises(ValueError, match="PREMUL_SUM is not in hpcdl's core"):
        _tensors.reduce_op(torch.distributed._make_nccl_premul_sum(2.0))


def test_monitored_barrier_names_the_missing_ranks():
    from hpcdl.comm.p2p import _missing_text
    assert _missing_text([1, 3], 2.0, 4, True) == \
        "monitored_barrier: ranks [1, 3] of 4 did not reach the barrier within 2 s"
    assert _missing_text([1], 0.5, 4, False).endswith(
        "rank 1 of 4 did not reach the barrier within 0.5 s (the first one missing; "
        "wait_all_ranks=True names all)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8, torch.bool,
                                   torch.complex64, torch.float64])
def test_core_view_moves_any_dtype_bit_exactly(dtype):
    t = (torch.arange(10) % 3).to(dtype)
    view, finish = _tensors.core_view(t)
    assert view.dtype in _tensors.CORE_DTYPES
    back = _tensors.unword(view.clone(), t)
    assert torch.equal(back, t)
    if finish is None:  # a view: same memory
        assert view.data_ptr() == t.data_ptr()


def test_core_view_refuses_what_cannot_be_reduced():
    with pytest.raises(TypeError, match="cannot reduce torch.complex64 tensors with max"):
        _tensors.core_view(torch.zeros(3, dtype=torch.complex64), "max")
    wide, finish = _tensors.core_view(torch.ones(3, dtype=torch.uint8), "sum")
    assert wide.dtype == torch.int64 and finish is not None


def test_non_contiguous_is_staged_and_copied_back():
    base = torch.arange(12.).reshape(3, 4)
    t = base.t()
    view, finish = _tensors.core_view(t, "sum")
    assert view.is_contiguous() and finish is not None
    view.mul_(2)
    finish()
    assert torch.equal(base, torch.arange(12.).reshape(3, 4) * 2)


# ---------------------------------------------------------------- multi-rank
def _check(n, script, *args, timeout=120):
    r = run_python(n, os.path.join(SCRIPTS, script), args=args, timeout=timeout,
                   env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    assert "FAILED 0" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_match_single_process_math(n):
    _check(n, "torch_backend_check.py", "all")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_ddp_fsdp2_tensor_parallel_pipelining_match_one_process(n):
    out = _check(n, "torch_backend_models.py", timeout=180)
    assert out.count("max relative difference") == 11, out
    assert out.count("entries equal to the saved ones") == 3, out


RAISES = """
import torch.distributed as dist
import hpcdl.torch
dist.init_process_group("hpcdl")
dist.barrier()
if dist.get_rank() == 1:
    raise KeyError("boom on rank 1")
dist.barrier()
"""


@pytest.mark.mpi
def test_uncaught_error_shows_its_traceback_and_ends_the_job():
    # torch's excepthook buffers the previous hook's output; hpcdl's ends the
    # job inside it, so without care the traceback was never printed
    r = run_python(2, RAISES, check=False, env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    assert r.returncode != 0
    assert "KeyError: 'boom on rank 1'" in r.stdout, r.stdout
    assert "[rank 1] error: uncaught KeyError" in r.stdout, r.stdout


WRONG_RANK = """
import torch.distributed as dist
import hpcdl.torch
try:
    dist.init_process_group("hpcdl", store=dist.HashStore(), rank=0, world_size=5)
except ValueError as e:
    print("refused:", e)
"""


@pytest.mark.mpi
def test_rank_and_size_must_be_mpis():
    r = run_python(1, WRONG_RANK)
    assert "refused: init_process_group('hpcdl'): torch was given rank 0 of 5 but MPI says " \
        "rank 0 of 1" in r.stdout, r.stdout


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["hpcdl", "gloo"])
def test_with_master_addr_the_tcp_store_is_built_only_for_gloo(backend):
    # as under hpcdl run: RANK, WORLD_SIZE, MASTER_ADDR/PORT set (for gloo users);
    # the hpcdl backend never opens the store, so it makes no TCP connection
    r = run_python(2, os.path.join(SCRIPTS, "torch_backend_rendezvous.py"),
                   args=(backend, "torchrun-env"),
                   env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    built = "True" if backend == "gloo" else "False"
    for rank in (0, 1):
        line = "rank %d %s sum [3.0, 3.0, 3.0] store deferred built %s" % (rank, backend, built)
        assert line in r.stdout, r.stdout


@pytest.mark.mpi
def test_gloo_without_master_addr_says_how_instead_of_waiting():
    r = run_python(2, os.path.join(SCRIPTS, "torch_backend_rendezvous.py"), args=("gloo",),
                   env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    assert r.stdout.count("refused:") == 2, r.stdout
    assert "export MASTER_ADDR and MASTER_PORT" in r.stdout, r.stdout
