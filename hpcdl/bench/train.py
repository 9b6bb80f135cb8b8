"""train.py - `hpcdl bench train`: the same model, data and seed trained
under hpcdl's DistributedOptimizer and under PyTorch DDP over gloo, in one
run on the same ranks.

    hpcdl bench train -n 2 --model mlp          (or mpirun -n 2 python -m hpcdl bench train)

Prints samples/s of each, their ratio, and for hpcdl the fraction of
communication time hidden behind backward (from its timeline: the part of
each bucket's communicate phase that ran while this rank's backward ran, and
the part that ran before the slowest rank's backward returned). The three
take turns step by step (order rotating), each step timed alone from a
barrier, so drifting machine speed hits all alike; --repeats R does this R
times with fresh models and reports medians and ranges. Both runs start
from the same parameters and see the same batches. After the first step they
must agree to rounding (checked: the run fails beyond 1e-4); after the last
step the difference is reported. With 3 or more ranks the two sum gradients in
different orders, and a model that amplifies rounding (BatchNorm over a few
values: ResNet at small batch and 32x32 input) can drift far apart in a few
steps without anything being wrong, so there only the first step is checked
(with 2 ranks both sums are exact, and the last step is checked too).

--noise-scale adds a fourth, hpcdl+noise: DistributedOptimizer(noise_scale=True)
(the gradient noise scale measured every step), timed in the same rotation,
so its cost per step is the difference to hpcdl's; it must end with exactly
hpcdl's parameters (the measurement only reads gradients).
"""
import math
import os
import time
from dataclasses import dataclass
import statistics as st

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm, models
from .allreduce import describe_job, start_gloo
from ..torch.reducer import fusion_threshold
from ..trace import timeline
from ..utils.atomic import write_json
import hpcdl.torch as hvd

MLP_HIDDEN = (4096, 2048)  # 1024-4096-2048-10: 12.6 M parameters


@dataclass
class Options:
    model: str = "mlp"
    steps: int = 20          # timed steps per implementation
    warmup: int = 3
    batch: int = 32          # samples per rank per step
    lr: float = 0.01
    threads: int = 0         # torch threads per rank; 0 = cores / local ranks
    repeats: int = 1         # each implementation this many times, interleaved
    json: str = None
    fusion_mb: float = None  # hpcdl's fusion buckets (MiB); None: HPCDL_FUSION_THRESHOLD's
    noise_scale: bool = False  # also time DistributedOptimizer(noise_scale=True)


def build_model(name):
    """(model, input shape per sample, classes); the same on every rank (seeded)."""
    torch.manual_seed(0)
    if name == "mlp":
        return models.build("mlp", 1024, 10, hidden=MLP_HIDDEN), (1024,), 10
    if name in ("resnet18", "resnet50"):
        return models.build(name, (3, 32, 32), 10), (3, 32, 32), 10
    if name == "tiny":  # 32-48-24-10: what the tests run every implementation with
        return models.build("mlp", 32, 10, hidden=(48, 24)), (32,), 10
    raise ValueError("unknown model %r; use mlp, resnet18, resnet50 or tiny" % name)


def model_and_data(opts, rank):
    """(parameter count of opts.model, this rank's warm-up + timed batches)."""
    model, shape, classes = build_model(opts.model)
    return (sum(p.numel() for p in model.parameters()),
            batches(opts, shape, classes, rank, opts.warmup + opts.steps))


def batches(opts, shape, classes, rank, n):
    """This rank's batches: the same global data whatever the implementation."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(opts.batch, *shape, generator=g),
             torch.randint(0, classes, (opts.batch,), generator=g)) for _ in range(n)]


# ----------------------------------------------------------------------------
# the implementations: each a model and a step(x, y)

class Impl:
    def __init__(self, name, model, step, opt=None):
        self.name, self.model, self.step, self.opt = name, model, step, opt


def sgd_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def make_hpcdl(opts, windows, noise_scale=False):
    """DistributedOptimizer; each step appends its backward window (MPI_Wtime).
    noise_scale: hpcdl+noise, measuring the gradient noise scale (its buckets
    kept off the timeline, which describes hpcdl's)."""
    model, _, _ = build_model(opts.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=opts.lr),
                                   named_parameters=model.named_parameters(),
                                   noise_scale=noise_scale)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        b0 = MPI.Wtime()
        loss.backward()
        windows.append((b0, MPI.Wtime()))
        opt.step()

    def quiet_step(x, y):
        with timeline.paused():
            step(x, y)
    return Impl("hpcdl+noise" if noise_scale else "hpcdl", model,
                quiet_step if noise_scale else step, opt)


def make_ddp(opts):
    model, _, _ = build_model(opts.model)
    ddp = DDP(model)
    return Impl("ddp-gloo", model, sgd_step(ddp, torch.optim.SGD(ddp.parameters(), lr=opts.lr)))


def make_local(opts):
    """No communication at all: every rank trains alone at the same time, the
    compute-only floor that no data-parallel step can beat."""
    model, _, _ = build_model(opts.model)
    return Impl("no-comm", model, sgd_step(model, torch.optim.SGD(model.parameters(),
                                                                  lr=opts.lr)))


def interleaved(opts, impls, data, mpi, after_first=None):
    """Every step of the data runs under each implementation in turn (the
    order rotating step by step), each step timed alone from a barrier, so a
    machine that speeds up or slows down during the run affects all of them
    alike. Returns {name: [seconds of each timed step, slowest rank]}."""
    times = {i.name: [] for i in impls}
    for k, (x, y) in enumerate(data):
        for j in range(len(impls)):
            impl = impls[(k + j) % len(impls)]
            mpi.Barrier()
            t0 = time.perf_counter()
            impl.step(x, y)
            if k >= opts.warmup:
                times[impl.name].append(time.perf_counter() - t0)
        if k == 0 and after_first:
            after_first()
    for name in times:  # a step takes as long as its slowest rank
        mine = np.array(times[name])
        slowest = np.empty_like(mine)
        mpi.Allreduce(mine, slowest, op=MPI.MAX)
        times[name] = slowest.tolist()
    return times


# ----------------------------------------------------------------------------
# analysis

def comm_spans(tl):
    """(start, end) MPI_Wtime of every bucket's communicate phase: data moving
    with every rank present (the negotiate phase before it, waiting for a
    slower rank to finish its backward, is not communication)."""
    if tl is None:
        return []
    return [(e["ts"] / 1e6 + tl.t0, (e["ts"] + e["dur"]) / 1e6 + tl.t0)
            for e in tl.events if e.get("name") == "communicate"]


def overlap_share(spans, windows):
    """Share of the spans' total time that falls inside the windows."""
    total = sum(b - a for a, b in spans)
    hidden = sum(max(0.0, min(b, w1) - max(a, w0)) for a, b in spans for w0, w1 in windows)
    return hidden / total if total > 0 else float("nan")


def clock_offset(mpi):
    """This rank's MPI_Wtime minus rank 0's, from the exit of one barrier
    (a few microseconds of error on one node; spans here are milliseconds)."""
    mpi.Barrier()
    t = MPI.Wtime()
    return t - mpi.bcast(t, root=0)


def hidden_fractions(tl, windows, mpi):
    """(own, job): the share of hpcdl's communication that overlapped this
    rank's own backward pass, and the share that overlapped the job's backward
    (from the first rank entering to the last rank leaving it, step by step):
    communication that ends while any rank still computes its backward does not
    lengthen the step. Both averaged over ranks."""
    spans = comm_spans(tl)
    if windows:  # the warm-up steps' buckets do not count
        spans = [(a, b) for a, b in spans if b >= windows[0][0]]
    off = clock_offset(mpi)
    mine = [(a - off, b - off) for a, b in windows]
    every = mpi.allgather(mine)
    job = [(min(r[k][0] for r in every), max(r[k][1] for r in every))
           for k in range(len(mine))]
    own = overlap_share(spans, windows)
    glob = overlap_share([(a - off, b - off) for a, b in spans], job)
    return mpi.allreduce(own) / mpi.size, mpi.allreduce(glob) / mpi.size


def max_param_diff(m1, m2):
    return max((p - q).abs().max().item() for p, q in zip(m1.parameters(), m2.parameters()))


IMPLS = ("hpcdl", "hpcdl+noise", "ddp-gloo", "no-comm")


def one_pass(opts, data, gloo_ok, mpi):
    """Fresh models, warm-up steps, then opts.steps interleaved timed steps;
    ({impl: row}, (max parameter difference between hpcdl and DDP after the
    first step, after the last)), differences None without DDP."""
    windows = []
    impls = [make_hpcdl(opts, windows)] + ([make_ddp(opts)] if gloo_ok else [])
    if opts.noise_scale:
        impls.append(make_hpcdl(opts, [], noise_scale=True))
    impls.append(make_local(opts))
    tl = timeline.start_timeline(os.devnull)  # records hpcdl's buckets; written nowhere
    first = []

    def diff():
        return mpi.allreduce(max_param_diff(impls[0].model, impls[1].model), op=MPI.MAX)
    times = interleaved(opts, impls, data, mpi,
                        after_first=(lambda: first.append(diff())) if gloo_ok else None)
    timeline.discard()
    hidden = hidden_fractions(tl, windows[opts.warmup:], mpi)
    out = {}
    for impl in impls:
        t = sum(times[impl.name])
        out[impl.name] = dict(seconds=t, samples_per_s=opts.steps * opts.batch * mpi.size / t,
                              hidden=hidden[0] if impl.name == "hpcdl" else None,
                              hidden_job=hidden[1] if impl.name == "hpcdl" else None)
        if impl.name == "hpcdl+noise":  # the measurement only reads: hpcdl's parameters
            ns = impl.opt.noise_scale(batch_size=opts.batch)
            out[impl.name].update(
                b_simple=ns.b_simple if ns and math.isfinite(ns.b_simple) else None,
                noise_steps=ns.steps if ns else 0,
                meter_ms=1e3 * impl.opt.noise_meter.seconds / len(data),  # every step, warm-up too
                param_diff=mpi.allreduce(max_param_diff(impls[0].model, impl.model),
                                         op=MPI.MAX))
    return out, ((first[0], diff()) if gloo_ok else (None, None))


def noise_scale_cost(reps, steps):
    """hpcdl+noise against hpcdl within each repeat: (median extra ms per step,
    median ratio of step times, range of the ratio, median ms per step spent in
    the measurement's own callbacks)."""
    pairs = [(r["hpcdl+noise"]["seconds"], r["hpcdl"]["seconds"]) for r in reps]
    extra = st.median(1e3 * (a - b) / steps for a, b in pairs)
    ratios = [a / b for a, b in pairs]
    own = st.median(r["hpcdl+noise"]["meter_ms"] for r in reps)
    return extra, st.median(ratios), (min(ratios), max(ratios)), own


def summarize(reps):
    """Medians over repeats; the hpcdl/DDP ratio is taken within each repeat
    (the same minutes of machine noise) and then its median and range."""
    rows = []
    for impl in IMPLS:
        got = [r[impl] for r in reps if impl in r]
        if not got:
            continue
        rate = [g["samples_per_s"] for g in got]
        hid = [g["hidden"] for g in got if g["hidden"] is not None]
        job = [g["hidden_job"] for g in got if g["hidden_job"] is not None]
        rows.append(dict(impl=impl, samples_per_s=st.median(rate), min=min(rate),
                         max=max(rate), seconds=st.median(g["seconds"] for g in got),
                         hidden=st.median(hid) if hid else None,
                         hidden_job=st.median(job) if job else None,
                         hidden_range=(min(hid), max(hid)) if hid else None,
                         hidden_job_range=(min(job), max(job)) if job else None))
    ratios = [r["hpcdl"]["samples_per_s"] / r["ddp-gloo"]["samples_per_s"]
              for r in reps if "ddp-gloo" in r]
    return rows, ratios


def _pct(value, rng, repeats):
    if value is None:
        return "-"
    text = "%.0f%%" % (100 * value)
    return text + (" (%.0f..%.0f%%)" % tuple(100 * v for v in rng) if repeats > 1 else "")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo ('model name', else 'Processor'
    or 'cpu model'), or the platform's processor string where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("model name", "processor", "cpu model") \
                        and value.strip() and not value.strip().isdigit():
                    return value.strip()
    except OSError:
        pass
    import platform  # on use: only where /proc/cpuinfo says nothing
    return platform.processor() or platform.machine() or "unknown"


def start(opts):
    """(world, job, threads): MPI up, the job described, torch's threads set
    (bench train, its --zero and --backend, bench embedding)."""
    world = comm.init()
    job = describe_job(world.mpi)
    threads = opts.threads or max(1, (os.cpu_count() or 1) // world.local_size)
    torch.set_num_threads(threads)
    return world, job, threads


def run(opts):
    world, job, threads = start(opts)
    mpi = world.mpi
    if opts.fusion_mb is not None:  # read when DistributedOptimizer plans its buckets
        os.environ["HPCDL_FUSION_THRESHOLD"] = str(int(opts.fusion_mb * (1 << 20)))
    nparams, data = model_and_data(opts, world.rank)
    err = start_gloo(mpi, job)
    say = comm.print0
    say("# hpcdl bench train: DistributedOptimizer vs DDP(gloo), same model, data and seed")
    say("#  ranks %d | hosts %d | MPI: %s | cores %s | torch threads per rank %d"
        % (world.size, len(job["hosts"]), job["mpi_library"], job["cores"], threads))
    say("#  model %s (%.1f M parameters) | batch %d per rank (%d global) | %d steps after "
        "%d warm-up | SGD lr %g | %d repeat(s) | steps interleaved, each timed from a barrier"
        % (opts.model, nparams / 1e6, opts.batch, opts.batch * world.size, opts.steps,
           opts.warmup, opts.lr, opts.repeats))
    say("#  CPU: %s | load %.1f" % (cpu_model(), job["load_avg_1min"]))
    say("#  hpcdl's fusion buckets: first 1 MiB, then %.3g MiB" % (fusion_threshold() / (1 << 20)))
    if err is not None:
        say("# gloo unavailable: %s" % err)
    reps, diffs = [], []
    for k in range(opts.repeats):
        rep, diff = one_pass(opts, data, err is None, mpi)
        reps.append(rep)
        diffs.append(diff)
        if opts.repeats > 1:
            say("#  repeat %d/%d: %s" % (k + 1, opts.repeats, "  ".join(
                "%s %.1f/s" % (i, rep[i]["samples_per_s"]) for i in IMPLS if i in rep)))
    rows, ratios = summarize(reps)
    say("#\n#     impl   samples/s   step(ms)   min..max samples/s   comm hidden behind "
        "backward: own rank's | job's")
    for r in rows:
        say("%10s %11.1f %10.1f   %8.1f..%-8.1f   %s | %s"
            % (r["impl"], r["samples_per_s"], 1e3 * r["seconds"] / opts.steps, r["min"],
               r["max"], _pct(r["hidden"], r["hidden_range"], opts.repeats),
               _pct(r["hidden_job"], r["hidden_job_range"], opts.repeats)))
    say("#  comm = each bucket's communicate phase (all ranks present); own rank's = "
        "inside this rank's backward; job's = before the slowest rank's backward ended")
    ratio = None
    if ratios:
        ratio = st.median(ratios)
        say("# hpcdl / DDP samples/s: %.2fx median of %d repeat(s) (range %.2f..%.2fx; "
            "no-comm is the compute-only floor: every rank training alone)"
            % (ratio, len(ratios), min(ratios), max(ratios)))
    first = max(d[0] for d in diffs) if err is None else None
    diff = max(d[1] for d in diffs) if err is None else None
    # two ranks sum a + b in either order alike: there the last step must agree too
    wrong = first is not None and (first > 1e-4 or (world.size == 2 and diff > 1e-4))
    if first is not None:
        say("# parameters of hpcdl and DDP differ by at most %.2g after the first step: %s; "
            "after the last: %.2g" % (first, "FAILED" if wrong else "OK", diff))
    noise = None
    if opts.noise_scale:
        extra, rel, rng, own = noise_scale_cost(reps, opts.steps)
        last = reps[-1]["hpcdl+noise"]
        same = all(r["hpcdl+noise"]["param_diff"] == 0.0 for r in reps)
        wrong = wrong or not same
        noise = dict(extra_ms_per_step=extra, step_time_ratio=rel, ratio_range=rng,
                     own_ms_per_step=own, b_simple=last["b_simple"],
                     steps=last["noise_steps"])
        say("# noise scale: hpcdl+noise steps take %+.2f ms (%.3fx hpcdl's step, range "
            "%.3f..%.3fx; median of %d repeat(s)), %.2f ms of it in the measurement's own "
            "calls; B_simple %s after %d steps (batch %d per rank); parameters equal to "
            "hpcdl's: %s"
            % (extra, rel, rng[0], rng[1], len(reps), own,
               "%.4g" % last["b_simple"] if last["b_simple"] is not None else "-",
               last["noise_steps"], opts.batch, "OK" if same else "FAILED"))
    if opts.json and world.rank == 0:
        write_json(opts.json, {"ranks": world.size, "model": opts.model, "params": nparams,
                               "batch_per_rank": opts.batch, "threads": threads, "rows": rows,
                               "cpu_model": cpu_model(),
                               "load_avg_1min": job["load_avg_1min"],
                               "fusion_bytes": fusion_threshold(),
                               "repeats": reps, "ratio": ratio, "ratios": ratios,
                               "first_step_param_diff": first, "max_param_diff": diff,
                               "noise_scale": noise}, indent=1)
    return 1 if wrong else 0
