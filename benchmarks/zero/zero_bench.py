"""zero_bench.py - ZeRO stages 0, 1, 2 of hpcdl's DistributedOptimizer and
stage 3 (hvd.shard_model) against PyTorch's DDP, ZeroRedundancyOptimizer and
FSDP2 (fully_shard per Linear and on the model; reshard_after_forward True,
the default, as stage 3's counterpart, and False, stage 2's), over gloo, Adam,
on the same ranks in one run: samples/s (steps interleaved, each timed alone
from a barrier, as `hpcdl bench train` does) and what each rank holds between
steps (optimizer state, gradient and parameter bytes; for hpcdl stage 3 also
the most gathered parameter bytes alive at once). Correctness in the same run: every implementation
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
    """This rank's optimizer-state bytes (FSDP2's DTensors: their local shards)."""
    return tensor_bytes(getattr(v, "to_local", lambda: v)() for st in opt.state.values()
                        for v in st.values() if torch.is_tensor(v))


def make_hpcdl(stage):
    model, _, _ = build_model("mlp")
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters(), zero_stage=stage)

    def grads():  # what holds gradients between steps
        held = [p.grad for p in model.parameters()]
        if stage == 2:
            held += [s.grad for s in opt._zero.shards]
        return held
    return Row("hpcdl-zero%d" % stage, model, opt, grads, model.parameters)


def make_hpcdl3():
    model, _, _ = build_model("mlp")
    shards = hvd.shard_model(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def whole():  # the gathered parameters, for the correctness column
        shards.unshard()
        out = [p.detach().clone() for p in model.parameters()]
        shards.reshard()
        return out
    return Row("hpcdl-zero3", model, opt, lambda: [p.grad for p in model.parameters()],
               lambda: list(model.parameters()), whole,
               lambda: shards.param_bytes()["peak_gathered"])


def make_fsdp(reshard):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model, _, _ = build_model("mlp")
    mesh = init_device_mesh("cpu", (MPI.COMM_WORLD.size,))
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    local = lambda ts: [t.to_local() if t is not None else None for t in ts]  # noqa: E731
    return Row("torch-fsdp2-gloo" + ("" if reshard else "-noreshard"), model, opt,
               lambda: local(p.grad for p in model.parameters()),
               lambda: local(model.parameters()),
               lambda: [p.full_tensor() for p in model.parameters()], None)


class Row:
    """One implementation: its model and optimizer, and what to measure."""

    def __init__(self, name, model, opt, grads, params, whole=None, peak=None):
        self.name, self.model, self.opt = name, model, opt
        self.grads, self.params, self.peak = grads, params, peak
        self.whole = whole or (lambda: list(model.parameters()))


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
    return Row("torch-zero1-gloo" if sharded else "torch-ddp-gloo", ddp, opt,
               lambda: [p.grad for p in model.parameters()], model.parameters)


def main():
    hvd.init()
    mpi = MPI.COMM_WORLD
    job = describe_job(mpi)
    torch.set_num_threads(1)
    impls = [make_hpcdl(s) for s in (0, 1, 2)] + [make_hpcdl3()]
    gloo_err = start_gloo(mpi, job)
    if gloo_err is None:
        impls += [make_torch(False), make_torch(True), make_fsdp(False), make_fsdp(True)]
    _, shape, classes = build_model("mlp")
    data = batches(type("O", (), {"batch": BATCH}), shape, classes, mpi.rank, WARMUP + STEPS)
    times = {r.name: [] for r in impls}
    for k, (x, y) in enumerate(data):
        for j in range(len(impls)):
            r = impls[(k + j) % len(impls)]
            mpi.Barrier()
            t0 = time.perf_counter()
            r.opt.zero_grad()
            F.cross_entropy(r.model(x), y).backward()
            r.opt.step()
            if k >= WARMUP:
                times[r.name].append(time.perf_counter() - t0)
    ref = impls[0].whole()
    rows = []
    for r in impls:
        mine = np.array(times[r.name])
        slow = np.empty_like(mine)
        mpi.Allreduce(mine, slow, op=MPI.MAX)
        diff = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
                   for p, q in zip(r.whole(), ref))
        # this rank's state: ZeRO's pieces; ZeroRedundancyOptimizer's local optimizer
        sb = r.opt._zero.state_bytes() if getattr(r.opt, "_zero", None) else \
            state_bytes(getattr(r.opt, "optim", r.opt))
        peak = mpi.allreduce(r.peak(), op=MPI.MAX) if r.peak else None
        rows.append((r.name, BATCH * mpi.size / np.median(slow), mpi.allreduce(sb, op=MPI.MAX),
                     mpi.allreduce(tensor_bytes(r.grads()), op=MPI.MAX),
                     mpi.allreduce(tensor_bytes(r.params()), op=MPI.MAX), peak, diff))
    rss = mpi.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, op=MPI.MAX)
    if mpi.rank == 0:
        n_params = sum(p.numel() for p in ref)
        print("# ZeRO bench: MLP 1024-4096-2048-10 (%.1f M parameters), Adam, %d ranks on %s, "
              "batch %d per rank, %d timed steps (median, slowest rank), 1 torch thread per "
              "rank%s" % (n_params / 1e6, mpi.size, ",".join(sorted(set(job["hosts"]))), BATCH,
                          STEPS, "" if gloo_err is None else "; gloo: " + gloo_err))
        print("# %-26s %10s %9s %15s %15s %15s %15s %12s"
              % ("impl", "samples/s", "vs zero0", "opt state MiB", "grads MiB", "params MiB",
                 "peak gath. MiB", "max rel diff"))
        base = rows[0][1]
        wrong = 0
        for name, sps, sb, gb, pb, peak, diff in rows:
            wrong += diff > 1e-4
            print("  %-26s %10.1f %9.2f %15.1f %15.1f %15.1f %15s %12.3g"
                  % (name, sps, sps / base, sb / 2**20, gb / 2**20, pb / 2**20,
                     "-" if peak is None else "%.1f" % (peak / 2**20), diff))
        print("# MiB per rank, the largest rank's, between steps; peak gath.: hpcdl stage 3's "
              "most gathered parameter bytes alive at once during a step")
        print("# peak RSS of the process (all implementations together): %.0f MiB; #wrong %d"
              % (rss / 1024, wrong))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
