"""ddp.py - `hpcdl bench train --backend hpcdl,gloo`: the same PyTorch code
(DDP, and FSDP2 with --wrap ddp,fsdp2) on torch.distributed backend "hpcdl"
and on gloo, same model, data and seed, in one run on the same ranks.

    hpcdl bench train -n 2 --backend hpcdl,gloo --model mlp
    hpcdl bench train -n 2 --backend hpcdl,gloo --wrap ddp,fsdp2 --model resnet18

gloo is the default group (as bench train starts it); hpcdl's group is
new_group(backend="hpcdl") beside it (the default group itself when gloo is
not asked for). On a ResNet the CLI's defaults shrink (batch 8, 5 steps, 2
repeats: under a minute on 2 cores).

Rows are named <wrap>-<backend> (ddp-hpcdl, ddp-gloo, fsdp2-hpcdl,
fsdp2-gloo) plus two floors: ddp-none, DDP with a comm hook that returns each
bucket untouched (DDP's own bucketing and copies, no data moved: the most any
backend can reach under DDP; ddp-none/ddp-gloo bounds the hpcdl/gloo ratio),
and no-comm, every rank training alone (the compute floor). Timing as in
`hpcdl bench train`: steps interleaved, order rotating, each timed from a
barrier, the slowest rank's time; --repeats R gives medians and the range,
and the hpcdl/gloo ratio of each wrap is taken within a repeat.
Both backends start from the same parameters and see the same batches: after
the first step their parameters must agree to 1e-4 (exit status 1 if not);
after the last step the difference is reported (with 2 ranks a sum has one
order, so it is checked too).

--profile adds hpcdl-opt (hpcdl's own DistributedOptimizer, same model and
data) and a table of where each step's time goes, per implementation: the
step's phases on the caller's thread (forward, backward, optimizer; within
backward, the backend's all_reduce calls and get_future), the engine's
queue / negotiate / communicate time from its own records, and the
finisher thread's lag and completion work (hpcdl/torch/distributed/
_profile.py), in ms per step averaged over every rank's timed steps.
"""
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F

import torch
from mpi4py import MPI
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import comm
from .allreduce import start_gloo, start_hpcdl_group
from .train import (Impl, build_model, cpu_model, interleaved, max_param_diff, model_and_data,
                    sgd_step, start)
from .zero import _local, fully_shard_units
from ..utils.atomic import write_json

BACKENDS = ("hpcdl", "gloo")
WRAPS = ("ddp", "fsdp2")
WRONG = 1e-4


@dataclass
class Options:
    model: str = "mlp"         # mlp, resnet18, resnet50, tiny (tests)
    backends: tuple = BACKENDS
    wraps: tuple = ("ddp",)
    steps: int = 20
    warmup: int = 3
    batch: int = 32            # samples per rank per step
    lr: float = 0.01           # SGD
    threads: int = 0           # torch threads per rank; 0 = cores / local ranks
    repeats: int = 1
    json: str = None
    profile: bool = False      # hpcdl-opt too, and the table of where the time goes


def groups(mpi, job, backends):
    """Collective: {backend: process group} (None for gloo: the default group)."""
    out = {}
    if "gloo" in backends:
        err = start_gloo(mpi, job)
        if err is not None:
            raise RuntimeError("gloo could not start: %s" % err)
        out["gloo"] = None
    if "hpcdl" in backends:
        out["hpcdl"] = start_hpcdl_group()
    return out


def make(opts, wrap, backend, group, size):
    model = build_model(opts.model)[0]
    if wrap == "ddp":
        run = DDP(model, process_group=group)
        if backend == "none":  # DDP's own work (buckets, hooks, copies), no data moved
            run.register_comm_hook(None, _bucket_untouched)
    else:
        mesh = (init_device_mesh("cpu", (size,)) if group is None
                else DeviceMesh.from_group(group, "cpu"))
        run = fully_shard_units(model, mesh, reshard=True)
    return _impl(opts, "%s-%s" % (wrap, backend), model, run,
                 torch.optim.SGD(run.parameters(), lr=opts.lr), wrap, backend)


def _impl(opts, name, model, run, opt, wrap, backend):
    """An Impl stepping run with opt (its phases timed under --profile)."""
    impl = Impl(name, model, None)
    impl.wrap, impl.backend, impl.profile = wrap, backend, []
    impl.step = phased_step(run, opt, impl.profile) if opts.profile else sgd_step(run, opt)
    return impl


def make_opt(opts):
    """hpcdl-opt: hpcdl's own DistributedOptimizer (--profile's comparison)."""
    import hpcdl.torch as hvd  # on use: the reducer's buckets
    model = build_model(opts.model)[0]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=opts.lr),
                                   named_parameters=model.named_parameters())
    return _impl(opts, "hpcdl-opt", model, model, opt, "hvd-opt", "hpcdl")


def _bucket_untouched(state, bucket):
    """A DDP comm hook that communicates nothing: the bucket as it is."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def make_local(opts):
    model = build_model(opts.model)[0]
    return _impl(opts, "no-comm", model, model, torch.optim.SGD(model.parameters(), lr=opts.lr),
                 None, None)


# ----------------------------------------------------------------------------
# --profile: where a step's time goes

def phased_step(run, opt, out):
    """sgd_step with its phases timed; appends one dict per step to out (the
    backend's counters and the engine's records of that step included)."""
    from ..torch.distributed import _profile  # on use: the backend's timers
    from ..comm.communicator import wtime
    engines = {id(c): c for c in [comm.init()]}

    def step(x, y):
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        loss = F.cross_entropy(run(x), y)
        t1 = time.perf_counter_ns()
        loss.backward()
        t2, w2 = time.perf_counter_ns(), wtime()
        opt.step()
        t3 = time.perf_counter_ns()
        for c in _profile.communicators():
            engines.setdefault(id(c), c)
        records = [r for c in engines.values() for r in c.timeline()]
        got = _profile.take()
        phases = dict(step=t3 - t0, forward=t1 - t0, backward=t2 - t1, optimizer=t3 - t2)
        phases = {k: v / 1e6 for k, v in phases.items()}
        phases.update({k: got[k] for k in _profile.KEYS})
        phases.update(engine_phases(records, w2, got["picked"]), calls=got["calls"],
                      staged=got["staged"])
        phases["bookkeeping"] = (time.perf_counter_ns() - t3) / 1e6
        out.append(phases)
    return step


def engine_phases(records, backward_end, picked):
    """One step's engine records (MPI_Wtime seconds) as ms: queue (submitted,
    engine busy with earlier work), negotiate (waiting for the other ranks),
    communicate (data moving), the last bucket's end against backward's end
    (past: communication still running after backward returned; before:
    backward went on after the last bucket was done: DDP's finisher hand-off
    and finalize), the last collective's time from its hand-off to its end
    (what no compute hides: its bucket is ready only when backward ends), and
    the finisher's lag (engine done -> its Work picked)."""
    ms = lambda a, b: max(0.0, 1e3 * (b - a))  # noqa: E731
    last = max((r["t_end"] for r in records), default=backward_end)
    final = max(records, key=lambda r: r["t_end"], default=None)
    out = dict(queue=sum(ms(r["t_submit"], r["t_start"]) for r in records),
               negotiate=sum(ms(r["t_start"], r.get("t_agreed", r["t_start"]))
                             for r in records),
               communicate=sum(ms(r.get("t_agreed", r["t_start"]), r["t_end"])
                               for r in records),
               last_collective=ms(final["t_submit"], final["t_end"]) if final else 0.0,
               past_backward=ms(backward_end, last), before_backward_end=ms(last, backward_end),
               lag=sum(ms(r["t_end"], picked[r["handle"]]) for r in records
                       if r["handle"] in picked),
               collectives=len(records), mbytes=sum(r["bytes"] for r in records) / 1e6)
    return out


# (key, label, depth): the table's rows, in order; a deeper row is part of the row above
# it at the depth before (allreduce_async: inside the backend's calls for DDP on hpcdl,
# the reducer's own hand-off for hpcdl-opt)
PHASES = (
    ("step", "step (caller's thread)", 0),
    ("forward", "zero_grad, forward, loss", 1),
    ("backward", "backward", 1),
    ("call", "backend all_reduce calls", 2),
    ("view", "core_view (copy in if staged)", 3),
    ("submit", "allreduce_async: engine hand-off", 2),
    ("get_future", "get_future", 2),
    ("optimizer", "optimizer step", 1),
    ("bookkeeping", "--profile's own bookkeeping", 0),
    ("queue", "engine: queued", 0),
    ("negotiate", "engine: negotiate", 0),
    ("communicate", "engine: communicate", 0),
    ("last_collective", "engine: last one, hand-off -> end", 0),
    ("past_backward", "last comm past backward's end", 0),
    ("before_backward_end", "backward after last comm", 0),
    ("lag", "finisher: engine done -> picked", 0),
    ("finish", "finisher: finish", 0),
    ("deliver", "set_result + DDP callbacks", 1),
    ("copy_out", "copy out of staging", 1),
    ("calls", "backend all_reduce calls (count)", 0),
    ("staged", "staged tensors (count)", 0),
    ("collectives", "engine collectives (count)", 0),
    ("mbytes", "engine MB moved", 0))


def profile_totals(impls, warmup, mpi):
    """{impl: {phase: sum over every rank's timed steps}, 'steps': their number}."""
    out = {}
    for impl in impls:
        timed = impl.profile[warmup:]
        mine = np.array([[p[k] for k, _, _ in PHASES] for p in timed] or
                        [[0.0] * len(PHASES)]).sum(axis=0)
        total = np.empty_like(mine)
        mpi.Allreduce(mine, total, op=MPI.SUM)
        out[impl.name] = dict(zip([k for k, _, _ in PHASES], total.tolist()),
                              steps=mpi.allreduce(len(timed)))
        impl.profile.clear()
    return out


def add_totals(acc, more):
    for name, row in more.items():
        into = acc.setdefault(name, dict.fromkeys(row, 0))
        for k, v in row.items():
            into[k] += v


def profile_table(totals, say):
    """ms per step (mean over every rank's timed steps), one column per impl."""
    names = list(totals)
    steps = {n: max(1, totals[n]["steps"]) for n in names}
    say("#\n# where the time goes (--profile): ms per step, mean over %s rank-steps; engine and "
        "finisher rows run beside the caller's thread" % "/".join(str(steps[n]) for n in names))
    say("#%-37s %s" % ("phase", " ".join("%11s" % n for n in names)))
    rows = {n: {} for n in names}  # {impl: {phase: ms per step}} (the --json's profile)
    for key, label, depth in PHASES:
        vals = [totals[n][key] / steps[n] for n in names]
        for n, v in zip(names, vals):
            rows[n][key] = v
        fmt = "%11.1f" if key in ("calls", "staged", "collectives") else "%11.2f"
        say(" %-37s %s" % ("  " * depth + label, " ".join(fmt % v for v in vals)))
    return rows


def local_diff(a, b):
    """Largest parameter difference between two implementations (FSDP2:
    this rank's shards; both shard alike)."""
    if a.wrap == "fsdp2":
        return max((_local(p) - _local(q)).abs().max().item()
                   for p, q in zip(a.model.parameters(), b.model.parameters()))
    return max_param_diff(a.model, b.model)


def one_pass(opts, data, gs, mpi):
    """({impl: dict(seconds, samples_per_s)}, {wrap: (first-step diff, last)})."""
    impls = [make(opts, w, b, gs[b], mpi.size) for w in opts.wraps for b in opts.backends]
    if "ddp" in opts.wraps:  # the DDP floor: any backend's best under DDP
        impls.append(make(opts, "ddp", "none", gs[opts.backends[0]], mpi.size))
    if opts.profile:
        impls.append(make_opt(opts))
    impls.append(make_local(opts))
    pairs = [(a, b) for a in impls for b in impls
             if a.wrap and a.wrap == b.wrap and a.backend == "hpcdl" and b.backend == "gloo"]
    first = {}

    def diffs():
        return {a.wrap: mpi.allreduce(local_diff(a, b), op=MPI.MAX) for a, b in pairs}
    times = interleaved(opts, impls, data, mpi, after_first=lambda: first.update(diffs()))
    last = diffs()
    rows = {i.name: dict(seconds=sum(times[i.name]), wrap=i.wrap, backend=i.backend,
                         samples_per_s=opts.steps * opts.batch * mpi.size / sum(times[i.name]))
            for i in impls}
    prof = profile_totals(impls, opts.warmup, mpi) if opts.profile else None
    return rows, {w: (first[w], last[w]) for w in first}, prof


def summarize(reps, wraps):
    """(rows: medians and ranges over repeats, {wrap: per-repeat hpcdl/gloo ratios})."""
    rows = []
    for name, row in reps[0].items():
        rate = [r[name]["samples_per_s"] for r in reps]
        rows.append(dict(impl=name, wrap=row["wrap"], backend=row["backend"],
                         samples_per_s=statistics.median(rate), min=min(rate), max=max(rate),
                         seconds=statistics.median(r[name]["seconds"] for r in reps)))
    ratios = {w: [r["%s-hpcdl" % w]["samples_per_s"] / r["%s-gloo" % w]["samples_per_s"]
                  for r in reps] for w in wraps if "%s-gloo" % w in reps[0]
              and "%s-hpcdl" % w in reps[0]}
    bound = ([r["ddp-none"]["samples_per_s"] / r["ddp-gloo"]["samples_per_s"] for r in reps]
             if "ddp" in ratios else None)
    return rows, ratios, bound


def run(opts):
    world, job, threads = start(opts)
    mpi = world.mpi
    nparams, data = model_and_data(opts, world.rank)
    gs = groups(mpi, job, opts.backends)
    say = comm.print0
    say("# hpcdl bench train --backend %s --wrap %s: the same PyTorch code on each "
        "torch.distributed backend" % (",".join(opts.backends), ",".join(opts.wraps)))
    say("#  ranks %d | hosts %d | MPI: %s | cores %s | torch threads per rank %d | "
        "load %.1f" % (world.size, len(job["hosts"]), job["mpi_library"], job["cores"],
                       threads, job["load_avg_1min"]))
    say("#  model %s (%.2f M parameters) | batch %d per rank (%d global) | SGD lr %g | "
        "%d steps after %d warm-up | %d repeat(s) | steps interleaved, each timed from a "
        "barrier (slowest rank)" % (opts.model, nparams / 1e6, opts.batch,
                                    opts.batch * world.size, opts.lr, opts.steps,
                                    opts.warmup, opts.repeats))
    say("#  CPU: %s" % cpu_model())
    if opts.profile:
        from ..torch.distributed import _profile  # on use: the backend's timers
        _profile.enable()
        say("#  --profile: steps timed by phase (their bookkeeping is inside each timed "
            "step); hpcdl-opt is hpcdl's own DistributedOptimizer")
    reps, diffs, totals = [], [], {}
    for k in range(opts.repeats):
        rep, diff, prof = one_pass(opts, data, gs, mpi)
        reps.append(rep)
        diffs.append(diff)
        if prof is not None:
            add_totals(totals, prof)
        if opts.repeats > 1:
            say("#  repeat %d/%d: %s" % (k + 1, opts.repeats, "  ".join(
                "%s %.1f/s" % (n, r["samples_per_s"]) for n, r in rep.items())))
    rows, ratios, bound = summarize(reps, opts.wraps)
    say("#\n#%13s %8s %6s %11s %10s   %s" % ("impl", "wrap", "backend", "samples/s",
                                             "step(ms)", "min..max samples/s"))
    for r in rows:
        say(" %13s %8s %6s %11.1f %10.1f   %.1f..%.1f"
            % (r["impl"], r["wrap"] or "-", r["backend"] or "-", r["samples_per_s"],
               1e3 * r["seconds"] / opts.steps, r["min"], r["max"]))
    summary = {}
    for w, rs in ratios.items():
        first = max(d[w][0] for d in diffs)
        last = max(d[w][1] for d in diffs)
        bad = first > WRONG or (world.size == 2 and last > WRONG)
        summary[w] = dict(ratio=statistics.median(rs), ratios=rs, range=(min(rs), max(rs)),
                          first_step_param_diff=first, max_param_diff=last, wrong=bad)
        say("# %s: hpcdl / gloo samples/s %.2fx median of %d repeat(s) (range %.2f..%.2fx); "
            "parameters differ by %.2g after the first step (%s), %.2g after the last"
            % (w, summary[w]["ratio"], len(rs), min(rs), max(rs), first,
               "FAILED" if bad else "OK", last))
        if w == "ddp":
            summary[w]["bound"] = statistics.median(bound)
            say("#  the most any backend could reach under DDP here (ddp-none / ddp-gloo): "
                "%.2fx (range %.2f..%.2fx)" % (statistics.median(bound), min(bound), max(bound)))
    profile = profile_table(totals, say) if opts.profile else None
    if opts.profile:
        _profile.disable()
    wrong = any(s["wrong"] for s in summary.values())
    if opts.json and world.rank == 0:
        write_json(opts.json, {"ranks": world.size, "model": opts.model, "params": nparams,
                               "batch_per_rank": opts.batch, "threads": threads,
                               "backends": list(opts.backends), "wraps": list(opts.wraps),
                               "steps": opts.steps, "load_avg_1min": job["load_avg_1min"],
                               "cpu_model": cpu_model(), "rows": rows, "repeats": reps,
                               "summary": summary, "profile": profile,
                               "profile_steps": {n: t["steps"] for n, t in totals.items()}},
                   indent=1)
    return 1 if wrong else 0
