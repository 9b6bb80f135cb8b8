"""train.py - `hpcdl bench train`: the same model, data and seed trained
under hpcdl's DistributedOptimizer and under PyTorch DDP over gloo, in one
run on the same ranks.

    hpcdl bench train -n 2 --model mlp          (or mpirun -n 2 python -m hpcdl bench train)

Prints samples/s of each, their ratio, and for hpcdl the fraction of
communication time hidden behind backward (from its timeline: the part of
each bucket's all-reduce that ran before backward returned). Both runs start
from the same parameters and see the same batches, so they must end with the
same parameters; the difference is checked and reported (#wrong = 0 or not).
"""
import json
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from mpi4py import MPI

from .. import comm, models
from .allreduce import describe_job, start_gloo

MLP_HIDDEN = (4096, 2048)  # 1024-4096-2048-10: 12.6 M parameters


@dataclass
class Options:
    model: str = "mlp"
    steps: int = 20          # timed steps per implementation
    warmup: int = 3
    batch: int = 32          # samples per rank per step
    lr: float = 0.01
    threads: int = 0         # torch threads per rank; 0 = cores / local ranks
    json: str = None


def build_model(name):
    """(model, input shape per sample, classes); the same on every rank (seeded)."""
    torch.manual_seed(0)
    if name == "mlp":
        return models.build("mlp", 1024, 10, hidden=MLP_HIDDEN), (1024,), 10
    if name in ("resnet18", "resnet50"):
        return models.build(name, (3, 32, 32), 10), (3, 32, 32), 10
    raise ValueError("unknown model %r; use mlp, resnet18 or resnet50" % name)


def batches(opts, shape, classes, rank, n):
    """This rank's batches: the same global data whatever the implementation."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(opts.batch, *shape, generator=g),
             torch.randint(0, classes, (opts.batch,), generator=g)) for _ in range(n)]


# ----------------------------------------------------------------------------
# the two implementations, each returning (seconds for the timed steps, model,
# backward windows as (start, end) MPI_Wtime pairs)

def run_hpcdl(opts, data):
    import hpcdl.torch as hvd
    from ..trace import timeline
    model, _, _ = build_model(opts.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=opts.lr),
                                   named_parameters=model.named_parameters())
    windows, tl = [], None
    for i, (x, y) in enumerate(data):
        if i == opts.warmup:
            comm.barrier()
            tl = timeline.start_timeline(os.devnull)  # records; written nowhere
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        b0 = MPI.Wtime()
        loss.backward()
        windows.append((b0, MPI.Wtime()))
        opt.step()
    comm.barrier()
    seconds = time.perf_counter() - t0
    timeline._active = None
    return seconds, model, windows[opts.warmup:], tl


def timed_steps(opts, data, step, barrier):
    """Runs step(x, y) over data; seconds of the steps after the warm-up ones
    (a barrier before starting and before stopping the clock)."""
    for i, (x, y) in enumerate(data):
        if i == opts.warmup:
            barrier()
            t0 = time.perf_counter()
        step(x, y)
    barrier()
    return time.perf_counter() - t0


def sgd_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def run_local(opts, data):
    """No communication at all: every rank trains alone at the same time, the
    compute-only floor that no data-parallel step can beat."""
    model, _, _ = build_model(opts.model)
    opt = torch.optim.SGD(model.parameters(), lr=opts.lr)
    return timed_steps(opts, data, sgd_step(model, opt), comm.barrier), model


def run_ddp(opts, data):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    model, _, _ = build_model(opts.model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=opts.lr)
    return timed_steps(opts, data, sgd_step(ddp, opt), dist.barrier), model


# ----------------------------------------------------------------------------
# analysis

def hidden_fraction(tl, windows):
    """Share of all-reduce time that overlapped backward (summed over steps)."""
    if tl is None:
        return float("nan")
    comm_spans = [(e["ts"] / 1e6 + tl.t0, (e["ts"] + e["dur"]) / 1e6 + tl.t0)
                  for e in tl.events if e.get("name") == "communicate"]
    total = sum(b - a for a, b in comm_spans)
    hidden = 0.0
    for a, b in comm_spans:
        for w0, w1 in windows:
            hidden += max(0.0, min(b, w1) - max(a, w0))
    return hidden / total if total > 0 else float("nan")


def max_param_diff(m1, m2):
    return max((p - q).abs().max().item() for p, q in zip(m1.parameters(), m2.parameters()))


def run(opts):
    world = comm.init()
    mpi = world.mpi
    job = describe_job(mpi)
    threads = opts.threads or max(1, (os.cpu_count() or 1) // world.local_size)
    torch.set_num_threads(threads)
    data = batches(opts, build_model(opts.model)[1], 10, world.rank, opts.warmup + opts.steps)
    nparams = sum(p.numel() for p in build_model(opts.model)[0].parameters())
    err = start_gloo(mpi, job)
    say = comm.print0
    say("# hpcdl bench train: DistributedOptimizer vs DDP(gloo), same model, data and seed")
    say("#  ranks %d | hosts %d | MPI: %s | cores %s | torch threads per rank %d"
        % (world.size, len(job["hosts"]), job["mpi_library"], job["cores"], threads))
    say("#  model %s (%.1f M parameters) | batch %d per rank (%d global) | %d steps after "
        "%d warm-up | SGD lr %g" % (opts.model, nparams / 1e6, opts.batch,
                                    opts.batch * world.size, opts.steps, opts.warmup, opts.lr))
    t_l, _ = run_local(opts, data)
    t_l = mpi.allreduce(t_l, op=MPI.MAX)
    t_h, m_h, windows, tl = run_hpcdl(opts, data)
    hidden = hidden_fraction(tl, windows)
    hidden = mpi.allreduce(hidden) / world.size
    t_h = mpi.allreduce(t_h, op=MPI.MAX)
    per_s = lambda t: opts.steps * opts.batch * world.size / t
    rows = [dict(impl="hpcdl", seconds=t_h, samples_per_s=per_s(t_h), hidden=hidden)]
    if err is None:
        t_d, m_d = run_ddp(opts, data)
        t_d = mpi.allreduce(t_d, op=MPI.MAX)
        rows.append(dict(impl="ddp-gloo", seconds=t_d, samples_per_s=per_s(t_d), hidden=None))
        diff = mpi.allreduce(max_param_diff(m_h, m_d), op=MPI.MAX)
    else:
        say("# gloo unavailable: %s" % err)
        diff = None
    rows.append(dict(impl="no-comm", seconds=t_l, samples_per_s=per_s(t_l), hidden=None))
    say("#\n#     impl   samples/s   step(ms)   comm hidden behind backward")
    for r in rows:
        say("%10s %11.1f %10.1f   %s" % (r["impl"], r["samples_per_s"],
                                         1e3 * r["seconds"] / opts.steps,
                                         "-" if r["hidden"] is None else "%.0f%%" % (100 * r["hidden"])))
    ratio = rows[0]["samples_per_s"] / rows[1]["samples_per_s"] if err is None else None
    wrong = diff is not None and diff > 1e-4
    if ratio is not None:
        say("# hpcdl / DDP samples/s: %.2fx   (no-comm is the compute-only floor: every "
            "rank training alone)" % ratio)
        say("# parameters after both runs differ by at most %.2g: %s"
            % (diff, "FAILED" if wrong else "OK"))
    if opts.json and world.rank == 0:
        with open(opts.json, "w") as f:
            json.dump({"ranks": world.size, "model": opts.model, "params": nparams,
                       "batch_per_rank": opts.batch, "rows": rows, "ratio": ratio,
                       "max_param_diff": diff}, f, indent=1)
    return 1 if wrong else 0
