"""test_torch_api.py - hpcdl.torch, the Horovod-compatible surface.

In one process: the names Horovod scripts use exist, ops and the legacy
average= rule, compression round trips, top-k error feedback, the wire
dtypes, the optimizer-state packing. Under mpirun (2, 3, 4 ranks, and 2
virtual nodes x 2 ranks): every collective against single-process math
(tests/mpi_scripts/torch_*_check.py), gradients, broadcast_parameters /
optimizer state / objects, SyncBatchNorm against nn.BatchNorm on the
concatenated batch, init on sub-communicators, and a Horovod-style training
script run unchanged but for its import line."""
import os
import re

import pytest
import torch

import hpcdl.torch as hvd
from hpcdl.torch import _wire
from hpcdl.torch import functions as hvd_functions
from mpi_harness import run_python

SCRIPTS = os.path.join(os.path.dirname(__file__), "mpi_scripts")

HOROVOD_NAMES = """init shutdown is_initialized size local_size cross_size rank local_rank
    cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
    ddl_built ccl_built cuda_built rocm_built Average Sum Adasum Min Max Product allreduce
    allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
    grouped_allreduce_async grouped_allreduce_async_ allgather allgather_async broadcast
    broadcast_ broadcast_async broadcast_async_ alltoall alltoall_async reducescatter
    reducescatter_async poll synchronize barrier join broadcast_parameters
    broadcast_optimizer_state broadcast_object allgather_object Compression SyncBatchNorm
    DistributedOptimizer is_homogeneous grouped_allgather grouped_allgather_async
    grouped_reducescatter grouped_reducescatter_async start_timeline stop_timeline
    ProcessSet add_process_set remove_process_set global_process_set HorovodInternalError
    sparse_allreduce sparse_allreduce_async""".split()


# ---------------------------------------------------------------- one process
def test_horovod_names_exist():
    missing = [n for n in HOROVOD_NAMES if not hasattr(hvd, n)]
    assert not missing, missing
    assert set(hvd.__all__) <= set(dir(hvd))


def test_ops_have_horovod_values_and_names():
    assert [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product] == [0, 1, 2, 3, 4, 5]
    assert hvd.Product.name == "Product"
    assert hvd.comm_op(hvd.Average) == "average" and hvd.comm_op(hvd.Product) == "prod"
    with pytest.raises(ValueError, match="not an element-wise reduction"):
        hvd.comm_op(hvd.Adasum)  # Adasum has its own path (adasum_ops.py)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.comm_op(17)


def test_average_argument_backwards_compatibility():
    rule = hvd.handle_average_backwards_compatibility
    assert rule(None, None) == hvd.Average
    assert rule(hvd.Max, None) == hvd.Max
    with pytest.warns(DeprecationWarning):
        assert rule(None, False) == hvd.Sum
    with pytest.raises(ValueError, match="supersedes"):
        rule(hvd.Sum, True)


def test_collectives_need_init():
    if hvd.is_initialized():
        pytest.skip("this process initialized hpcdl already")
    with pytest.raises(ValueError, match=r"hvd.init\(\)"):
        hvd.rank()
    with pytest.raises(ValueError, match=r"hvd.init\(\)"):
        hvd.allreduce(torch.ones(3))


@pytest.mark.parametrize("comp, wire", [(hvd.Compression.fp16, torch.float16),
                                        (hvd.Compression.bf16, torch.bfloat16)])
def test_cast_compression_round_trip(comp, wire):
    x = torch.arange(-8, 8, dtype=torch.float32) * 0.25  # exact in both wire types
    sent, ctx = comp.compress(x)
    assert sent.dtype == wire
    back = comp.decompress(sent, ctx)
    assert back.dtype == torch.float32 and torch.equal(back, x)
    i = torch.arange(5)
    assert comp.compress(i)[0] is i  # integers pass through
    assert comp.decompress(*comp.compress(i)) is i


def test_none_compression_is_identity():
    x = torch.randn(4)
    sent, ctx = hvd.Compression.none.compress(x)
    assert sent is x and hvd.Compression.none.decompress(sent, ctx) is x


def test_topk_error_feedback_keeps_every_value():
    gen = torch.Generator().manual_seed(3)
    topk = hvd.Compression.topk(0.1)
    total_in = torch.zeros(7, 9, dtype=torch.float64)
    total_sent = torch.zeros_like(total_in)
    for step in range(20):
        g = torch.randn(7, 9, generator=gen, dtype=torch.float64) * (step + 1)
        acc = g + (topk.residual("w") if step else 0)
        sent, ctx = topk.compress(g, name="w")
        sent = topk.decompress(sent, ctx)
        k = 7  # ceil(0.1 * 63)
        assert int((sent != 0).sum()) <= k
        kept = sent != 0  # the sent entries are the largest of gradient + residual
        assert acc.abs()[kept].min() >= acc.abs()[~kept].max()
        total_in += g
        total_sent += sent
        # what was sent plus what is still held back equals everything put in
        assert torch.allclose(total_sent + topk.residual("w"), total_in, atol=1e-9)
    assert topk.residual("b") is None


def test_topk_state_dict_carries_the_residuals():
    # a compressor restored from state_dict() sends what the original would
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(4, 6, generator=gen) for _ in range(4)]
    a = hvd.Compression.topk(0.25)
    for g in grads[:2]:
        a.compress(g, name="w")
    b = hvd.Compression.topk(0.25)
    b.load_state_dict(a.state_dict())
    assert set(b.state_dict()) == {"w"} and torch.equal(b.residual("w"), a.residual("w"))
    for g in grads[2:]:
        assert torch.equal(a.compress(g, name="w")[0], b.compress(g, name="w")[0])
    # only stateful compressors have state: the trainer checkpoints by that
    assert not hasattr(hvd.Compression.none, "state_dict")
    assert not hasattr(hvd.Compression.fp16, "state_dict")


def test_topk_rules():
    with pytest.raises(ValueError, match="ratio"):
        hvd.Compression.topk(0.0)
    topk = hvd.Compression.topk(1.0)
    with pytest.raises(ValueError, match="name="):
        topk.compress(torch.ones(3))
    x = torch.randn(5)
    sent, _ = topk.compress(x, name="x")
    assert torch.equal(sent, x) and not topk.residual("x").any()
    with pytest.raises(ValueError, match="changed shape"):
        topk.compress(torch.ones(6), name="x")
    i = torch.arange(4)
    assert topk.compress(i, name="i")[0] is i
    topk.reset()
    assert topk.residual("x") is None


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16,
                                   torch.complex64, torch.complex128, torch.float16])
def test_wire_round_trip(dtype):
    t = (torch.arange(12).view(3, 4) % 5).to(dtype)
    if dtype.is_complex:
        t = t + 1j * torch.arange(12).view(3, 4).to(dtype)
    w = _wire.owned_wire(t)
    assert w.dtype in _wire.CORE_DTYPES and w.is_contiguous()
    assert w.data_ptr() != t.data_ptr()
    assert tuple(w.shape) == _wire.wire_shape(t)
    assert torch.equal(_wire.from_wire(w, dtype).view(t.shape), t)


def test_optimizer_state_packing_round_trip():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    found = []
    skeleton = hvd_functions._take_tensors(opt.state_dict(), found)
    assert len(found) == 6 and all(isinstance(t, torch.Tensor) for t in found)
    back = hvd_functions._put_tensors(skeleton, found)
    assert back["param_groups"][0]["betas"] == (0.8, 0.9)
    for pid, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            assert torch.equal(back["state"][pid][key], value)


def test_buckets_split_by_dtype_and_size(monkeypatch):
    monkeypatch.setattr(hvd_functions, "BUCKET_BYTES", 40)
    ts = [torch.zeros(4), torch.zeros(4, dtype=torch.int64), torch.zeros(6), torch.zeros(20),
          torch.zeros(2, dtype=torch.bool)]
    groups = [[tuple(t.shape) + (t.dtype,) for t in g] for g in hvd_functions._buckets(ts)]
    assert groups == [[(4, torch.float32), (6, torch.float32)],
                      [(4, torch.int64)], [(20, torch.float32)], [(2, torch.bool)]]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17])
def test_object_words_round_trip(n):
    payload = bytes(range(n))
    words = hvd_functions._to_words(payload)
    assert words.dtype == torch.int64 and words.numel() == -(-n // 8)
    assert hvd_functions._from_words(words, n) == payload


def test_sync_batch_norm_rejects_1d_input():
    with pytest.raises(ValueError, match="at least 2-D"):
        hvd.SyncBatchNorm(3)(torch.zeros(3))


# ---------------------------------------------------------------- multi-rank
def _check(n, script, *args, env=None):
    r = run_python(n, os.path.join(SCRIPTS, script), args=args, env=env, timeout=120)
    assert "FAILED 0" in r.stdout, r.stdout


# one launch per rank count runs every part of a script (`quick`: in make check too)
@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 3, 4])
def test_collectives_match_single_process_math(n):
    _check(n, "torch_ops_check.py", "all")


@pytest.mark.mpi
def test_collectives_two_virtual_nodes():
    # local_size 2 x cross_size 2: the hierarchical all-reduce path runs too
    _check(4, "torch_ops_check.py", "all", env={"HPCDL_LOCAL_SIZE": "2"})


@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 3, 4])
def test_gradients_match_single_process_autograd(n):
    _check(n, "torch_autograd_check.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [pytest.param(2, marks=pytest.mark.quick), 4])
def test_functions_and_sync_batch_norm(n):
    _check(n, "torch_functions_check.py", "all")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_process_sets_names_shapes_sparse(n):
    # process sets (even / odd / overlapping), bad input on every rank, names
    # in flight (an allgather_async queued while the others wait in barrier),
    # shape agreement, sparse all-reduce and sparse embeddings, join() (each
    # rank joining first, ranks running different numbers of steps)
    r = run_python(n, os.path.join(SCRIPTS, "torch_process_sets_check.py"), timeout=300)
    assert "FAILED 0" in r.stdout, r.stdout


def test_horovod_internal_error_is_both():
    from hpcdl.comm import MismatchError
    from hpcdl.torch.exceptions import as_internal
    e = as_internal(MismatchError("x"))
    assert isinstance(e, hvd.HorovodInternalError) and isinstance(e, MismatchError)
    assert isinstance(as_internal(RuntimeError("y")), hvd.HorovodInternalError)
    v = ValueError("z")
    assert as_internal(v) is v


def test_process_set_objects():
    ps = hvd.ProcessSet([3, 1])
    assert ps.ranks == [1, 3] and ps.size() is None and ps.rank() is None
    with pytest.raises(ValueError, match="list of process ranks"):
        hvd.ProcessSet([0, "1"])
    with pytest.raises(TypeError, match="list of ranks"):
        hvd.ProcessSet(7)
    assert hvd.global_process_set.process_set_id == 0


@pytest.mark.mpi
def test_init_on_rank_lists_and_communicators():
    r = run_python(4, os.path.join(SCRIPTS, "torch_init_check.py"))
    # ranks' lines may run together in mpirun's output: pick the records out
    lines = re.findall(r"INIT \w+ world \d+ (?:rank \d+ size \d+ sum \d+|outside)", r.stdout)
    for w in (0, 2):
        assert "INIT list world %d rank %d size 2 sum 2" % (w, w // 2) in lines, r.stdout
    for w in (1, 3):
        assert "INIT list world %d outside" % w in lines, r.stdout
    for w in range(4):
        want = "rank %d size 2 sum %d" % (w // 2, 2 if w % 2 == 0 else 4)
        assert "INIT split world %d %s" % (w, want) in lines, r.stdout
        assert "INIT again world %d %s" % (w, want) in lines, r.stdout
        assert "INIT world world %d rank %d size 4 sum 6" % (w, w) in lines, r.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 4])
def test_horovod_style_example_trains(n):
    if not hasattr(hvd, "DistributedOptimizer"):
        pytest.skip("hpcdl.torch.optimizer is not there yet")
    r = run_python(n, os.path.join(SCRIPTS, "torch_example_horovod.py"))
    assert "EXAMPLE OK" in r.stdout, r.stdout
