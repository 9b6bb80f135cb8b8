"""zero.py - `hpcdl bench train --zero 0,1,2,3`: hpcdl's ZeRO stages against
the unsharded DistributedOptimizer and PyTorch's own sharding over gloo.

    hpcdl bench train -n 2 --zero 0,1,2,3 --model mlp      (or resnet18)

Every implementation trains the same model from the same weights on the same
batches with Adam, on the same ranks in one run:

    stage  hpcdl                                      PyTorch counterpart (gloo)
    0      DistributedOptimizer (unsharded)           DDP + Adam
    1      DistributedOptimizer(zero_stage=1)         DDP + ZeroRedundancyOptimizer
    2      DistributedOptimizer(zero_stage=2)         FSDP2 fully_shard, reshard_after_forward=False
    3      hvd.shard_model + Adam                     FSDP2 fully_shard (reshard, its default)

Each implementation is built and warmed up alone (so the process RSS it adds
can be read), then the timed steps take turns as in `hpcdl bench train`
(order rotating step by step, each step timed alone from a barrier, the
slowest rank's time). Printed per implementation: samples/s, the ratio to
hpcdl stage 0 and to its counterpart, the bytes each rank holds between
steps (optimizer state, gradients, parameters; stage 3 also its most gathered
bytes alive at once during a step), the RSS its build and warm-up added, and
the largest relative parameter difference from hpcdl stage 0 at the end
(#wrong: above 1e-4; the exit status is 1 then).
"""
import ctypes
import dataclasses
import gc
import os
import statistics
import time
from dataclasses import dataclass
import resource

import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm
from .allreduce import start_gloo
from .train import build_model, interleaved, model_and_data, start
from ..utils.atomic import write_json
import hpcdl.torch as hvd

STAGES = (0, 1, 2, 3)
COUNTERPART = {0: "torch-ddp", 1: "torch-zero1", 2: "torch-fsdp2-noreshard", 3: "torch-fsdp2"}
WRONG_REL = 1e-4


@dataclass
class Options:
    model: str = "mlp"
    stages: tuple = STAGES
    steps: int = 20          # timed steps per implementation
    warmup: int = 3
    batch: int = 32          # samples per rank per step
    lr: float = 1e-4         # Adam
    threads: int = 0         # torch threads per rank; 0 = cores / local ranks
    repeats: int = 1
    json: str = None


# ----------------------------------------------------------------------------
# what each rank holds

def tensor_bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _local(t):
    """A DTensor's local shard (FSDP2), else the tensor itself."""
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def opt_state_bytes(opt):
    """This rank's optimizer-state bytes: ZeRO's pieces' state, the local
    optimizer of ZeroRedundancyOptimizer, FSDP2's local shards."""
    inner = getattr(opt, "optim", opt)
    return tensor_bytes(_local(v) for st in inner.state.values() for v in st.values()
                        if torch.is_tensor(v))


def rss_bytes():
    """This process's resident set now, after returning freed heap to the OS
    (so a reading after another implementation's build is not hidden by
    memory glibc kept)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------
# the implementations

class Impl:
    """One implementation: a model, its optimizer, and what to measure."""

    def __init__(self, name, stage, model, opt, grads, params, whole=None, peak=None,
                 grad_peak=None):
        self.name, self.stage, self.model, self.opt = name, stage, model, opt
        self.grads, self.params, self.peak = grads, params, peak  # callables
        self.grad_peak = grad_peak
        self.whole = whole or (lambda: [p.detach() for p in model.parameters()])
        self.rss_added = 0

    def step(self, x, y):
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()


def make_hpcdl(opts, stage):
    model = build_model(opts.model)[0]
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=opts.lr),
                                   named_parameters=model.named_parameters(), zero_stage=stage)

    def grads():  # stage 2: the gradient blocks; p.grad is None between steps
        held = [p.grad for p in model.parameters()]
        return held + (opt.grad_shards() if stage == 2 else [])
    peak = (lambda: opt.grad_bytes()["peak"]) if stage == 2 else None
    return Impl("hpcdl-zero%d" % stage, stage, model, opt, grads, model.parameters,
                grad_peak=peak)


def make_hpcdl3(opts):
    model = build_model(opts.model)[0]
    shards = hvd.shard_model(model)
    opt = torch.optim.Adam(model.parameters(), lr=opts.lr)

    def whole():  # the gathered parameters, for the correctness column
        shards.unshard()
        out = [p.detach().clone() for p in model.parameters()]
        shards.reshard()
        return out
    grads = lambda: [p.grad for p in model.parameters()]  # noqa: E731 - the pieces'
    return Impl("hpcdl-zero3", 3, model, opt, grads, lambda: list(model.parameters()), whole,
                lambda: shards.param_bytes()["peak_gathered"],
                lambda: tensor_bytes(grads()) + shards.grad_bytes()["peak_reducing"])


def make_ddp(opts, sharded):
    model = build_model(opts.model)[0]
    ddp = DDP(model)
    if sharded:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=opts.lr)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=opts.lr)
    return Impl(COUNTERPART[1 if sharded else 0], 1 if sharded else 0, ddp, opt,
                lambda: [p.grad for p in model.parameters()], model.parameters,
                lambda: [p.detach() for p in model.parameters()])


def make_fsdp(opts, reshard, size):
    """FSDP2 with the units hpcdl stage 3 uses by default: every module with
    parameters of its own, then the model."""
    model = fully_shard_units(build_model(opts.model)[0], init_device_mesh("cpu", (size,)),
                              reshard)
    opt = torch.optim.Adam(model.parameters(), lr=opts.lr)
    return Impl(COUNTERPART[3 if reshard else 2], 3 if reshard else 2, model, opt,
                lambda: [_local(p.grad) for p in model.parameters()],
                lambda: [_local(p) for p in model.parameters()],
                lambda: [p.full_tensor().detach() for p in model.parameters()])


def fully_shard_units(model, mesh, reshard):
    """FSDP2 over mesh: every module with parameters of its own a unit, then
    the model (also bench train --backend --wrap fsdp2). Returns the model."""
    for m in list(model.modules())[1:]:
        if any(True for _ in m.parameters(recurse=False)):
            fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def makers(opts, gloo_ok, size):
    """(name, build) in table order: each hpcdl stage, then its counterpart."""
    out = []
    for s in opts.stages:
        out.append((lambda s=s: make_hpcdl3(opts) if s == 3 else make_hpcdl(opts, s)))
        if gloo_ok:
            out.append((lambda s=s: make_ddp(opts, s == 1) if s < 2
                        else make_fsdp(opts, s == 3, size)))
    return out


# ----------------------------------------------------------------------------
# one pass: build and warm up each alone, then interleaved timed steps

def build_all(opts, gloo_ok, data, mpi):
    impls = []
    for build in makers(opts, gloo_ok, mpi.size):
        before = rss_bytes()
        impl = build()
        comm.print0("#   built %s, %d warm-up step(s)" % (impl.name, opts.warmup))
        for x, y in data[:opts.warmup]:
            impl.step(x, y)
        impl.rss_added = mpi.allreduce(rss_bytes() - before, op=MPI.MAX)
        impls.append(impl)
    return impls


def rel_diff(params, ref):
    return max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
               for p, q in zip(params, ref))


def one_pass(opts, gloo_ok, data, mpi):
    """Rows of one pass: {name: dict(samples_per_s, bytes..., diff)}."""
    impls = build_all(opts, gloo_ok, data, mpi)
    # warm-up done in build_all: every remaining step is timed
    times = interleaved(dataclasses.replace(opts, warmup=0), impls, data[opts.warmup:], mpi)
    ref = impls[0].whole()
    rows = {}
    for impl in impls:
        mx = lambda v: mpi.allreduce(v, op=MPI.MAX)  # noqa: E731 - the largest rank's
        sb = impl.opt.state_bytes() if getattr(impl.opt, "sharding", None) else \
            opt_state_bytes(impl.opt)
        rows[impl.name] = dict(
            stage=impl.stage,
            samples_per_s=opts.batch * mpi.size / statistics.median(times[impl.name]),
            opt_state_bytes=mx(sb), grad_bytes=mx(tensor_bytes(impl.grads())),
            grad_peak_bytes=mx(impl.grad_peak()) if impl.grad_peak else None,
            param_bytes=mx(tensor_bytes(impl.params())),
            peak_gathered_bytes=mx(impl.peak()) if impl.peak else None,
            rss_added_bytes=impl.rss_added,
            max_rel_diff=mx(rel_diff(impl.whole(), ref)))
    del impls
    gc.collect()
    return rows


# ----------------------------------------------------------------------------
# report

def summarize(reps):
    """Medians of samples/s over repeats (bytes and diffs: the largest), and
    each ratio taken within a repeat (the same minutes of machine noise)."""
    rows = []
    for name in reps[0]:
        got = [r[name] for r in reps]
        row = dict(got[0], impl=name)
        row["samples_per_s"] = statistics.median(g["samples_per_s"] for g in got)
        for key in ("rss_added_bytes", "max_rel_diff", "peak_gathered_bytes",
                    "grad_peak_bytes"):
            vals = [g[key] for g in got if g[key] is not None]
            row[key] = max(vals) if vals else None
        base = "hpcdl-zero0" if "hpcdl-zero0" in reps[0] else None
        row["vs_zero0"] = statistics.median(
            r[name]["samples_per_s"] / r[base]["samples_per_s"] for r in reps) if base else None
        mate = COUNTERPART[row["stage"]]
        row["vs_torch"] = statistics.median(
            r[name]["samples_per_s"] / r[mate]["samples_per_s"] for r in reps) \
            if name.startswith("hpcdl") and mate in reps[0] else None
        rows.append(row)
    return rows


def _mib(v):
    return "-" if v is None else "%.1f" % (v / 2**20)


def _x(v):
    return "-" if v is None else "%.2f" % v


def print_table(rows, say):
    say("# %-22s %5s %10s %8s %8s %10s %10s %10s %10s %10s %9s %12s"
        % ("impl", "stage", "samples/s", "vs zero0", "vs torch", "opt MiB", "grads MiB",
           "grad pk MiB", "params MiB", "gath. MiB", "RSS+ MiB", "max rel diff"))
    for r in rows:
        say("  %-22s %5d %10.1f %8s %8s %10s %10s %10s %10s %10s %9s %12.3g"
            % (r["impl"], r["stage"], r["samples_per_s"], _x(r["vs_zero0"]), _x(r["vs_torch"]),
               _mib(r["opt_state_bytes"]), _mib(r["grad_bytes"]), _mib(r.get("grad_peak_bytes")),
               _mib(r["param_bytes"]), _mib(r["peak_gathered_bytes"]),
               _mib(r["rss_added_bytes"]), r["max_rel_diff"]))
    say("# MiB per rank (the largest rank's) between steps; grad pk: hpcdl stages 2 and 3, "
        "the most gradient bytes they held at once during backward (the blocks + full "
        "buckets or units filling or in their reduce-scatter); gath.: hpcdl stage 3's most "
        "gathered parameter bytes alive at once during a step; RSS+: resident memory the "
        "implementation's build and warm-up added; vs torch: hpcdl stage s / the PyTorch "
        "row of the same stage; max rel diff: parameters at the end against the first row")


def run(opts):
    world, job, threads = start(opts)
    mpi = world.mpi
    nparams, data = model_and_data(opts, world.rank)
    err = start_gloo(mpi, job)
    say = comm.print0
    say("# hpcdl bench train --zero: ZeRO stages %s vs DistributedOptimizer and PyTorch "
        "(DDP, ZeroRedundancyOptimizer, FSDP2) on gloo" % ",".join(map(str, opts.stages)))
    say("#  ranks %d | hosts %d | MPI: %s | cores %s | torch threads per rank %d | load %.1f"
        % (world.size, len(job["hosts"]), job["mpi_library"], job["cores"], threads,
           job["load_avg_1min"]))
    say("#  model %s (%.1f M parameters) | batch %d per rank | Adam lr %g | %d timed steps "
        "after %d warm-up | %d repeat(s) | steps interleaved, each timed from a barrier "
        "(median, slowest rank)" % (opts.model, nparams / 1e6, opts.batch, opts.lr,
                                    opts.steps, opts.warmup, opts.repeats))
    if err is not None:
        say("# gloo unavailable, PyTorch rows left out: %s" % err)
    reps = []
    for rep in range(opts.repeats):  # progress: a pass takes minutes for large models
        t0 = time.perf_counter()
        say("# repeat %d/%d: building the implementations, then %d interleaved timed steps"
            % (rep + 1, opts.repeats, opts.steps))
        reps.append(one_pass(opts, err is None, data, mpi))
        say("# repeat %d/%d done in %.0f s" % (rep + 1, opts.repeats, time.perf_counter() - t0))
    rows = summarize(reps)
    print_table(rows, say)
    peak_rss = mpi.allreduce(_peak_rss(), op=MPI.MAX)
    wrong = sum(r["max_rel_diff"] > WRONG_REL for r in rows)
    say("# peak RSS of the process (every implementation together): %.0f MiB" % (peak_rss / 2**20))
    say("# #wrong %d (parameters more than %g relative from the first row): %s"
        % (wrong, WRONG_REL, "FAILED" if wrong else "OK"))
    if opts.json and world.rank == 0:
        write_json(opts.json, {"ranks": world.size, "model": opts.model, "params": nparams,
                               "batch_per_rank": opts.batch, "threads": threads,
                               "stages": list(opts.stages), "load_avg_1min": job["load_avg_1min"],
                               "rows": rows, "repeats": reps, "peak_rss_bytes": peak_rss,
                               "wrong": wrong}, indent=1)
    return 1 if wrong else 0


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
