"""device.py - `hpcdl bench allreduce --device cuda`: the benchmark's buffers
as CUDA tensors, one GPU per local rank (ranks share GPUs when there are
fewer). hpcdl's algorithms then take the core's CUDA path (GPU-direct when MPI
is CUDA-aware, else staged through pinned host memory), gloo takes the same
tensors, and MPI_Allreduce through mpi4py runs only on a CUDA-aware MPI.

Every timed iteration ends with torch.cuda.synchronize(), so each
implementation is timed until its result is in device memory. The floor
column is the staging floor: one rank's buffer down to pinned host memory and
back up, what any host-staged all-reduce must move over PCIe."""
import time

import numpy as np


def unavailable(device):
    """Why --device cannot run here (None when it can). Local: the same
    answer on every rank of a uniform job."""
    if device == "cpu":
        return None
    if device != "cuda":
        return "unknown --device %r; use cpu or cuda" % device
    try:
        import torch
    except ImportError:
        return "--device cuda needs torch with CUDA; torch is not installed"
    if not torch.cuda.is_available():
        return "--device cuda: torch sees no GPU here (run on a GPU node, or use --device cpu)"
    from .. import _core  # on use: loads hpcdl._core
    if not _core.built_with_cuda():
        return ("--device cuda: hpcdl's core was built without CUDA (no nvcc at build "
                "time); rebuild with nvcc on PATH (HPCDL_WITH_CUDA=1 pip install -e .)")
    return None


def select_gpu(local_rank):
    import torch  # on use: loads torch
    torch.cuda.set_device(local_rank % torch.cuda.device_count())


def skipped_impls(impls):
    """(implementations that run on device buffers, notes on the others)."""
    from .. import _core  # on use: loads hpcdl._core
    keep, notes = [], []
    for name in impls:
        if name == "shared":
            notes.append("shared skipped: node shared memory is host memory")
        elif name == "mpi4py" and not _core.mpi_cuda_aware():
            notes.append("mpi4py skipped: this MPI is not CUDA-aware (it cannot read "
                         "device memory); hpcdl's rows take the staged path")
        else:
            keep.append(name)
    return keep, notes


def buffers(send_host):
    """(send, work) on the current GPU: send holds send_host's values."""
    import torch  # on use: loads torch
    send = torch.from_numpy(send_host).cuda()
    return send, torch.empty_like(send)


def reset(buf, send):
    """buf = send, finished before the timed call starts."""
    import torch  # on use: loads torch
    buf.copy_(send)
    torch.cuda.synchronize()


def synced(run):
    """run() timed until its result is in device memory."""
    import torch  # on use: loads torch

    def op():
        run()
        torch.cuda.synchronize()
    return op


def wrong(buf, expected):
    """Elements of buf (a CUDA tensor) that differ from expected (numpy)."""
    return int(np.count_nonzero(buf.cpu().numpy() != expected))


def staging_floor_us(nbytes, iters=5):
    """Microseconds for one D2H + H2D copy of nbytes through pinned memory."""
    import torch  # on use: loads torch
    d = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device="cuda")
    h = torch.empty(d.numel(), dtype=torch.float32).pin_memory()
    best = float("inf")
    for _ in range(iters + 1):  # the first warms up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h.copy_(d, non_blocking=True)
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6
