"""gpu_allreduce_bench.py - the first measurements of hpcdl's CUDA path on a GPU
machine; scripts/gpu-first-run.sh runs it under mpirun (one rank per GPU, or
two ranks sharing one GPU):

    mpirun -n 2 python scripts/gpu_allreduce_bench.py --out results.md

1. all-reduce of CUDA tensors through hpcdl.comm: CUDA IPC between the ranks
   of the node (HPCDL_CUDA_IPC=1, issue #39), staged through host memory and
   (when MPI is CUDA-aware) GPU-direct, float32 sum, 4 KiB to 256 MiB.
   Correctness in the same run, outside the timed loop: rank- and
   position-dependent integers, compared with MPI_Allreduce (mpi4py) of the
   same data on the host. Peer row: MPI_Allreduce of host buffers of the
   same size (what staging has to beat, minus its copies). Floors: the
   staging copies (D2H + H2D), and the bytes the IPC path moves per rank
   (1 + 2(N-1)/N of the buffer, device to device) times the ranks sharing a
   GPU, at the device-to-device copy bandwidth measured here.
   Input is produced on a side stream that is torch's current stream at the
   call, so the ordering fix of #21 is exercised too.
2. a synthetic training step on the GPU: an MLP on random data through
   hpcdl.torch's DistributedOptimizer (steps/s, and whether it runs at all).

Tables are nccl-tests-shaped; rank 0 writes them as markdown to --out. The
exit status is non-zero when any result was wrong.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import hpcdl._core as _core
from hpcdl import comm


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4


def timed(fn, iters):
    torch.cuda.synchronize()
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def allreduce_rows(path, args, rank, n):
    """One row per size: (bytes, path, seconds, #wrong)."""
    rows, dev = [], torch.cuda.current_device()
    side = torch.cuda.Stream()
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        count = nbytes // 4
        host = ((np.arange(count, dtype=np.int64) * 7 + rank * 13) % 17 - 8).astype(np.float32)
        want = np.empty_like(host)
        MPI.COMM_WORLD.Allreduce(host, want, op=MPI.SUM)
        with torch.cuda.stream(side):  # the producer: torch's current stream at the call
            t = torch.from_numpy(host).to(dev, non_blocking=False).mul_(1)
            comm.allreduce(t)
        got = t.cpu().numpy()
        wrong = int(np.count_nonzero(got != want))
        buf = torch.empty(count, dtype=torch.float32, device=dev)
        iters = max(3, min(args.iters, int(2e8 // max(nbytes, 1))))
        sec = timed(lambda: comm.allreduce(buf), iters)
        rows.append((nbytes, path, sec, wrong))
    return rows


def mpi_host_rows(args):
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        a = np.ones(nbytes // 4, dtype=np.float32)
        b = np.empty_like(a)
        iters = max(3, min(args.iters, int(2e8 // max(nbytes, 1))))
        sec = timed(lambda: MPI.COMM_WORLD.Allreduce(a, b, op=MPI.SUM), iters)
        rows.append((nbytes, "MPI_Allreduce, host", sec, 0))
    return rows


def gloo_rows(args):
    """Peer in the same run: torch.distributed's gloo all-reduce of the same
    CUDA tensors (gloo stages device memory through the host, as hpcdl's
    staged path does; NCCL cannot run two ranks on one GPU). Started as
    `hpcdl bench allreduce` starts it."""
    import torch.distributed as dist
    from hpcdl.bench.allreduce import describe_job, start_gloo
    err = start_gloo(MPI.COMM_WORLD, describe_job(MPI.COMM_WORLD))
    if err:
        raise RuntimeError(err)
    rows, dev = [], torch.cuda.current_device()
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        iters = max(3, min(args.iters, int(2e8 // max(nbytes, 1))))
        sec = timed(lambda: dist.all_reduce(buf), iters)
        rows.append((nbytes, "gloo (torch.distributed)", sec, 0))
    dist.destroy_process_group()
    return rows


def copy_floor_rows(args):
    """The staging floor: the buffer down to pinned host memory and back up
    (what any host-staged all-reduce must move over PCIe), no reduction."""
    from hpcdl.bench.device import staging_floor_us
    return [(nbytes, "floor: D2H + H2D copy", staging_floor_us(nbytes) * 1e-6, 0)
            for nbytes in sizes(args.min_bytes, args.max_bytes)]


def d2d_bandwidth():
    """Bytes per second of one device-to-device copy of 256 MiB (a copy reads
    and writes each byte; this counts it once, as the algorithm's bytes do)."""
    dev = torch.cuda.current_device()
    a = torch.empty(64 << 20, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 10 * a.numel() * 4 / (time.perf_counter() - t0)


def ipc_floor_rows(args, n):
    """The IPC path's floor: what it must move per rank, for every rank
    sharing this GPU, at the measured copy bandwidth (all ranks on one GPU
    when there are more ranks than GPUs)."""
    sharing = max(1, n // max(1, torch.cuda.device_count()))
    MPI.COMM_WORLD.Barrier()  # rank 0 alone on the GPU while it measures
    bw = MPI.COMM_WORLD.bcast(d2d_bandwidth() if MPI.COMM_WORLD.rank == 0 else None)
    return [(nbytes, "floor: IPC bytes at %.0f GB/s D2D, %d rank(s) per GPU" % (bw / 1e9, sharing),
             nbytes * (1 + 2 * (n - 1) / n) * sharing / bw, 0)
            for nbytes in sizes(args.min_bytes, args.max_bytes)]


def table(rows, n):
    out = ["| size | count | type | path | time (ms) | algbw (GB/s) | busbw (GB/s) | #wrong |",
           "|---:|---:|---|---|---:|---:|---:|---:|"]
    for nbytes, path, sec, wrong in rows:
        algbw = nbytes / sec / 1e9
        out.append("| %d | %d | float32 | %s | %.3f | %.2f | %.2f | %d |" % (
            nbytes, nbytes // 4, path, sec * 1e3, algbw, algbw * 2 * (n - 1) / n, wrong))
    return "\n".join(out)


def train_rows(args):
    """Synthetic training: MLP, random data on the GPU, DistributedOptimizer."""
    import hpcdl.torch as hvd
    hvd.init()
    dev = torch.cuda.current_device()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).to(dev)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(args.batch, 1024, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(3):
        step()
    sec = timed(step, args.steps)
    params = sum(p.numel() for p in model.parameters())
    return "| MLP %.1f M params, batch %d per rank | %.2f ms/step | %.1f steps/s |" % (
        params / 1e6, args.batch, sec * 1e3, 1 / sec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    comm.init()
    rank, n = comm.rank(), comm.size()
    torch.cuda.set_device(comm.local_rank() % torch.cuda.device_count())
    aware = _core.mpi_cuda_aware()  # what the MPI says (or HPCDL_MPI_CUDA_AWARE)
    # HPCDL_BENCH_DIRECT=force: GPU-direct although the MPI says no, because
    # src_c/build/test_cuda_direct saw it move device memory (UCX's CUDA transports)
    force = os.environ.get("HPCDL_BENCH_DIRECT") == "force"
    rows = []
    os.environ["HPCDL_MPI_CUDA_AWARE"] = "0"
    os.environ["HPCDL_CUDA_IPC"] = "1"  # every rank on this node: IPC
    rows += allreduce_rows("hpcdl IPC", args, rank, n)
    os.environ["HPCDL_CUDA_IPC"] = "0"
    rows += allreduce_rows("hpcdl staged", args, rank, n)
    if aware or force:
        os.environ["HPCDL_MPI_CUDA_AWARE"] = "force" if force else "1"
        rows += allreduce_rows("hpcdl GPU-direct", args, rank, n)
        os.environ["HPCDL_MPI_CUDA_AWARE"] = "0"
    rows += mpi_host_rows(args)
    rows += copy_floor_rows(args)
    rows += ipc_floor_rows(args, n)
    try:
        rows += gloo_rows(args)
    except Exception as e:  # a peer that cannot run is reported, not fatal
        print("rank %d: gloo peer failed: %s: %s" % (rank, type(e).__name__, e), flush=True)
    try:
        train = train_rows(args)
    except Exception as e:  # the first GPU run is for finding out: say what broke
        train = "| synthetic training failed on rank %d: %s: %s |" % (rank, type(e).__name__, e)
    wrong = sum(r[3] for r in rows)
    total = MPI.COMM_WORLD.allreduce(wrong)
    if rank == 0:
        text = "\n".join([
            "%d ranks, %s, MPI CUDA-aware: %s, HPCDL_CUDA_STAGE_BYTES=%s" % (
                n, torch.cuda.get_device_name(), bool(aware),
                os.environ.get("HPCDL_CUDA_STAGE_BYTES", "8388608 (default)")),
            "", table(rows, n), "", "| training | time | rate |", "|---|---:|---:|", train, "",
            "Wrong results: %d %s" % (total, "OK" if total == 0 else "FAILED")])
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
