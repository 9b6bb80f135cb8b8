"""zero_bench.py - ZeRO stages 0, 1, 2 of hpcdl's DistributedOptimizer against
PyTorch's DDP and ZeroRedundancyOptimizer (over gloo), Adam, on the same ranks
in one run: samples/s (steps interleaved, each timed alone from a barrier, as
`hpcdl bench train` does) and what each rank holds between steps (optimizer
state and gradient bytes). Correctness in the same run: every implementation
starts from the same weights and sees the same batches, so each must end at
the same parameters as hpcdl stage 0 (max |diff| reported, #wrong counts those
above 1e-4 relative).

    mpirun -n 2 python benchmarks/zero/zero_bench.py [STEPS] [BATCH]
"""
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import hpcdl.torch as hvd
from hpcdl.bench.allreduce import describe_job, start_gloo
from hpcdl.bench.train import batches, build_model

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 32
WARMUP = 2


def tensor_bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def state_bytes(opt):
    return tensor_bytes(v for st in opt.state.values() for v in st.values()
                        if torch.is_tensor(v))


def make_hpcdl(stage):
    model, _, _ = build_model("mlp")
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters(), zero_stage=stage)

    def grads():  # what holds gradients between steps
        held = [p.grad for p in model.parameters()]
        if stage == 2:
            held += [s.grad for s in opt._zero.shards]
        return held
    return "hpcdl-zero%d" % stage, model, opt, grads


def make_torch(sharded):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    model, _, _ = build_model("mlp")
    ddp = DDP(model)
    if sharded:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=1e-4)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    return ("torch-zero1-gloo" if sharded else "torch-ddp-gloo"), ddp, opt, \
        (lambda: [p.grad for p in model.parameters()])


def main():
    hvd.init()
    mpi = MPI.COMM_WORLD
    job = describe_job(mpi)
    torch.set_num_threads(1)
    impls = [make_hpcdl(s) for s in (0, 1, 2)]
    gloo_err = start_gloo(mpi, job)
    if gloo_err is None:
        impls += [make_torch(False), make_torch(True)]
    _, shape, classes = build_model("mlp")
    data = batches(type("O", (), {"batch": BATCH}), shape, classes, mpi.rank, WARMUP + STEPS)
    times = {name: [] for name, *_ in impls}
    for k, (x, y) in enumerate(data):
        for j in range(len(impls)):
            name, model, opt, _ = impls[(k + j) % len(impls)]
            mpi.Barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if k >= WARMUP:
                times[name].append(time.perf_counter() - t0)
    ref = impls[0][1]
    rows = []
    for name, model, opt, grads in impls:
        mine = np.array(times[name])
        slow = np.empty_like(mine)
        mpi.Allreduce(mine, slow, op=MPI.MAX)
        diff = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
                   for p, q in zip(model.parameters(), ref.parameters()))
        # this rank's state: ZeRO's pieces; ZeroRedundancyOptimizer's local optimizer
        sb = opt._zero.state_bytes() if getattr(opt, "_zero", None) else \
            state_bytes(getattr(opt, "optim", opt))
        rows.append((name, BATCH * mpi.size / np.median(slow), mpi.allreduce(sb, op=MPI.MAX),
                     mpi.allreduce(tensor_bytes(grads()), op=MPI.MAX), diff))
    rss = mpi.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, op=MPI.MAX)
    if mpi.rank == 0:
        n_params = sum(p.numel() for p in ref.parameters())
        print("# ZeRO bench: MLP 1024-4096-2048-10 (%.1f M parameters), Adam, %d ranks on %s, "
              "batch %d per rank, %d timed steps (median, slowest rank), 1 torch thread per "
              "rank%s" % (n_params / 1e6, mpi.size, ",".join(sorted(set(job["hosts"]))), BATCH,
                          STEPS, "" if gloo_err is None else "; gloo: " + gloo_err))
        print("# %-18s %12s %10s %18s %18s %12s" % ("impl", "samples/s", "vs zero0",
                                                     "opt state MiB/rank", "grads MiB/rank",
                                                     "max rel diff"))
        base = rows[0][1]
        wrong = 0
        for name, sps, sb, gb, diff in rows:
            wrong += diff > 1e-4
            print("  %-18s %12.1f %10.2f %18.1f %18.1f %12.3g"
                  % (name, sps, sps / base, sb / 2**20, gb / 2**20, diff))
        print("# peak RSS of the process (all implementations together): %.0f MiB; #wrong %d"
              % (rss / 1024, wrong))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
