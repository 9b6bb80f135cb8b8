"""large_batch.py - `hpcdl bench large-batch`: the large-batch study in one
command. For every recipe x global batch x seed it trains the same model on
the same data for the same epoch budget (hpcdl.train, all ranks together,
one run after another in this job), then reports per batch x recipe the
final and best test accuracy (mean over seeds), the steps and training time
to the target, and the gradient noise scale B_simple the run measured (the
median of its per-epoch values; meaningless for a run that diverged).
A run diverged when its loss became inf or nan, or when it ended at chance
accuracy: within CHANCE_MARGIN of what predicting the test set's most common
class scores (0.1 on MNIST-1D; plain SGD at 2048 ends there with a finite
loss). The JSON (--json) is strict JSON: a number that is not finite (a
B_simple of inf, where |G|^2 came out <= 0) is written as the string "inf"
("-inf", "nan"), which float() reads back.

The target is A0 - --target-drop, where A0 is the baseline's mean final
accuracy (by default the first recipe at the smallest batch), unless
--target is given. Steps and time to the target are read at epoch ends
(where the trainer evaluates), so they are exact to one epoch.

The fit is McCandlish et al. 2018's S = S_min (1 + B_noise / B): linear in
1/B (S = a + c / B, S_min = a, B_noise = c / a) by least squares over the
runs of one recipe that reached the target. The measured critical batch is
where the steps to the target reach twice the perfect-scaling line drawn
from the smallest batch B0 (S_perfect(B) = S(B0) B0 / B). In the model
that is B = B_noise + 2 B0 (B_noise itself when B0 << B_noise, where
S = 2 S_min), so both estimates of the critical batch are printed.

The online B_simple is checked against an offline estimate at the same
weights (--offline-noise-scale SAMPLES, on by default): after each run that
did not diverge, the ranks load its final model and, with the weights
frozen (lr 0), estimate B_simple online as training does (global batches of
the run's size) and offline on rank 0 (offline_noise_scale over the same
samples in per-rank slices). The training's own last-epoch value is printed
beside them; it averages over the last ~100 steps of moving weights, so it
need not match the final weights' value.

An auto row (Options.auto, `--batches auto,...`): per recipe, one more run
with `hpcdl train --global-batch auto` (docs/goodput.md): the recipe's values
with --lr-scaling adascale forced (auto takes its lr from AdaScale), the base
batch the recipe's, the ceiling (--max-global-batch) the largest fixed batch.
Its row's batch is "auto"; its steps and time to the target are read as for
the others (the time is the comparison that matters: its steps mix batch
sizes). Its runs keep the batch of every epoch (global_batches, from
metrics.jsonl). It has no single batch, so the fit and the critical batch
ignore it, and the baseline A0 is always a fixed batch's.

Modes (Options.modes, `--modes allreduce,ddp-gloo`): every recipe x batch x
seed once per mode, i.e. per way the gradients meet (hpcdl train --mode:
allreduce is hpcdl's; ddp-gloo is PyTorch DDP over gloo, ddp-hpcdl DDP over
hpcdl's torch.distributed backend), each mode's runs right after the first
mode's of the same recipe, batch and seed, so that a changing machine load
falls on both alike. A mode other than allreduce has its own rows (recipe
shown as recipe/mode), fit and critical batch, no auto run (AdaScale needs
hpcdl's optimizer), no B_simple and no offline check; the same target
(from the first mode's baseline) applies to all, and a comparison per recipe
and batch prints each mode's time to the target and training time over the
budget against the first mode's (docs/large_batch.md).
"""
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from .. import comm
from ..train import TrainConfig, train
from ..train.config import load_recipe, with_recipe
from ..utils.atomic import write_json

AUTO = "auto"  # the batch of a --global-batch auto run (Options.auto)
CHANCE_MARGIN = 0.01  # a run ending within this of chance accuracy learned nothing
ALLREDUCE = "allreduce"  # hpcdl train's default --mode


@dataclass
class Options:
    batches: list                 # fixed global batch sizes, ascending
    recipes: list                 # recipe names (configs/recipes/)
    seeds: list = field(default_factory=lambda: [0])
    epochs: int = 10
    data: str = "mnist1d"
    model: str = "cnn1d"
    target: float = None          # absolute target accuracy; None: A0 - target_drop
    target_drop: float = 0.01
    warmup_epochs: float = None   # replaces the warmup of recipes that warm up
    extra: dict = field(default_factory=dict)   # more TrainConfig values for every run
    out: str = None               # keep each run's metrics here (default: a temp dir)
    offline_samples: int = 16384  # offline B_simple from this many samples (0: no check)
    json: str = None
    plot: str = None
    auto: bool = False            # also one --global-batch auto run per recipe and seed
    modes: list = field(default_factory=lambda: [ALLREDUCE])  # hpcdl train --mode of each run


# ---------------------------------------------------------------- pure analysis
def first_reach(epochs, target):
    """(steps, train seconds, epoch) at the first epoch end whose test accuracy
    reaches target, from metrics.jsonl records; None if never."""
    seconds = 0.0
    for rec in epochs:
        seconds += rec.get("epoch_time_s", 0.0)
        if rec["test_accuracy"] >= target:
            return rec["step"], seconds, rec["epoch"]
    return None


def fit_steps(points):
    """McCandlish's S = S_min (1 + B_noise / B) through [(B, S), ...] by least
    squares in (1, 1/B). Returns (S_min, B_noise), or None with fewer than
    two batch sizes or a fit without meaning (S_min or B_noise <= 0)."""
    if len({b for b, _ in points}) < 2:
        return None
    xs = [1.0 / b for b, _ in points]
    ys = [float(s) for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - c * mx
    if a <= 0 or c <= 0:
        return None
    return a, c / a


def critical_batch(points):
    """The batch where steps-to-target reach twice the perfect-scaling line
    from the smallest batch, interpolated in log B between the two measured
    batches around the crossing; None if the ratio never reaches 2 (or there
    is one batch). points: [(B, S)] with one S per B, any order."""
    pts = sorted(points)
    if len(pts) < 2:
        return None
    b0, s0 = pts[0]
    ratio = [(b, s / (s0 * b0 / b)) for b, s in pts]
    for (b1, r1), (b2, r2) in zip(ratio, ratio[1:]):
        if r1 < 2.0 <= r2:
            t = (math.log(2.0) - math.log(r1)) / (math.log(r2) - math.log(r1))
            return math.exp(math.log(b1) + t * (math.log(b2) - math.log(b1)))
    return None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def median_b_simple(epochs):
    """The median of a run's per-epoch B_simple (None where an epoch had no
    estimate): one number for a quantity that grows while the model learns
    and is noisy near convergence, where |G|^2 is small."""
    values = [e["b_simple"] for e in epochs if e.get("b_simple") is not None]
    return statistics.median(values) if values else None


def chance_accuracy(spec, seed=0):
    """Collective where spec is a shard directory. The test accuracy of
    predicting the test set's most common class (1 / classes where the test
    labels are not in memory): where a run that learned nothing ends."""
    from ..train import data  # on use: loads numpy and torch
    ds = data.load(spec, seed)
    y = getattr(ds, "y_test", None)
    if y is None or not len(y):
        return 1.0 / ds.num_classes
    return max(int((y == c).sum()) for c in set(y.tolist())) / len(y)


def diverged(epochs, chance=None):
    """Whether a run's records say it diverged: a loss that is not finite, or
    a final test accuracy at chance (at most chance + CHANCE_MARGIN). Records
    read back from the JSON too (a loss of "nan" there: strict_json)."""
    if not all(math.isfinite(float(e["loss"])) for e in epochs):
        return True
    return chance is not None and epochs[-1]["test_accuracy"] <= chance + CHANCE_MARGIN


def strict_json(value):
    """value with every float that is not finite replaced by "inf", "-inf" or
    "nan" (json.dump writes bare Infinity / NaN, which is not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def series(r):
    """(recipe, mode) of a run or row: one line of the table's rows, fit and plot."""
    return r["recipe"], r.get("mode", ALLREDUCE)


def label(r):
    """A series' name: the recipe, with the mode when it is not allreduce."""
    recipe, mode = series(r)
    return recipe if mode == ALLREDUCE else "%s/%s" % (recipe, mode)


def summarize(runs, target, chance=None):
    """Rows per recipe x mode x batch (means over seeds) from the runs' records;
    chance: the accuracy at which a run counts as diverged (diverged())."""
    rows = []
    for key in dict.fromkeys(series(r) for r in runs):
        batches = {r["batch"] for r in runs if series(r) == key}
        fixed = sorted(b for b in batches if b != AUTO)
        for batch in fixed + [AUTO] * (AUTO in batches):
            mine = [r for r in runs if series(r) == key and r["batch"] == batch]
            hits = [first_reach(r["epochs"], target) for r in mine]
            reached = [h for h in hits if h is not None]
            rows.append(dict(
                recipe=key[0], mode=key[1], batch=batch, seeds=len(mine),
                final_acc=mean([r["epochs"][-1]["test_accuracy"] for r in mine]),
                best_acc=mean([max(e["test_accuracy"] for e in r["epochs"]) for r in mine]),
                reached=len(reached),
                steps_to_target=mean([h[0] for h in reached]) if len(reached) == len(mine)
                else None,
                time_to_target_s=mean([h[1] for h in reached]) if len(reached) == len(mine)
                else None,
                train_s=mean([sum(e.get("epoch_time_s", 0.0) for e in r["epochs"])
                              for r in mine]),
                b_simple=mean([median_b_simple(r["epochs"]) for r in mine]),
                b_simple_last=mean([r["epochs"][-1].get("b_simple") for r in mine]),
                b_simple_frozen=mean([r.get("b_simple_frozen") for r in mine]),
                b_simple_offline=mean([r.get("b_simple_offline") for r in mine]),
                diverged=sum(1 for r in mine if diverged(r["epochs"], chance))))
            if batch == AUTO:  # where auto ended: the mean over seeds of the last batch
                rows[-1]["final_batch"] = mean([global_batches(r)[-1] for r in mine])
    for key in dict.fromkeys(series(r) for r in rows):
        pts = [(r["batch"], r["steps_to_target"]) for r in rows
               if series(r) == key and r["steps_to_target"] is not None
               and r["batch"] != AUTO]
        fit, crit = fit_steps(pts), critical_batch(pts)
        for r in rows:
            if series(r) == key:
                r["fit_s_min"], r["fit_b_noise"] = fit if fit else (None, None)
                r["critical_batch"] = crit
    return rows


def compare_modes(rows, modes):
    """Per recipe and fixed batch, each later mode against the first: their
    time to the target and training time over the whole budget (means over
    seeds) and first/other ratios (> 1: the first mode is faster); [] with
    one mode."""
    out = []
    for first in (r for r in rows if r["mode"] == modes[0] and r["batch"] != AUTO):
        for mode in modes[1:]:
            other = next((r for r in rows if (r["recipe"], r["mode"], r["batch"])
                          == (first["recipe"], mode, first["batch"])), None)
            if other is None:
                continue
            t1, t2 = first["time_to_target_s"], other["time_to_target_s"]
            out.append(dict(recipe=first["recipe"], batch=first["batch"], first=modes[0],
                            other=mode, time_to_target_s=(t1, t2),
                            target_speedup=t2 / t1 if t1 and t2 is not None else None,
                            train_s=(first["train_s"], other["train_s"]),
                            train_speedup=other["train_s"] / first["train_s"]
                            if first["train_s"] else None))
    return out


def global_batches(run):
    """The global batch of each epoch of a run: its records' (an auto run's),
    else its fixed batch."""
    return [e.get("global_batch", run["batch"]) for e in run["epochs"]]


# ---------------------------------------------------------------- the runs
def run_values(opts, recipe, batch, seed, out, mode=ALLREDUCE):
    """TrainConfig values of one run: the recipe's own, with this study's data,
    model, batch, budget, seed and mode (and --warmup-epochs where the recipe
    warms up).
    batch "auto": --global-batch auto, --lr-scaling adascale, the ceiling the
    largest fixed batch."""
    values = dict(opts.extra, data=opts.data, model=opts.model, recipe=recipe,
                  global_batch=batch, epochs=opts.epochs, seed=seed, out=out, mode=mode)
    if batch == AUTO:
        values["lr_scaling"] = "adascale"
        if opts.batches:
            values["max_global_batch"] = max(opts.batches)
    if opts.warmup_epochs is not None and load_recipe(recipe).get("warmup_epochs", 0) > 0:
        values["warmup_epochs"] = opts.warmup_epochs
    return values


def train_one(opts, recipe, batch, seed, out, mode=ALLREDUCE):
    """One training run, every rank together; rank 0 returns its epoch records."""
    train(TrainConfig(**run_values(opts, recipe, batch, seed, out, mode)))
    if comm.rank() != 0:
        return None
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def check_after(opts, recipe, batch, seed, out, epochs, mode=ALLREDUCE, chance=None):
    """Collective, after a run: the noise-scale check at its final weights
    ((online, offline) B_simple on rank 0), or None: not asked for, one
    rank, an auto run (no single batch to estimate at), a mode other than
    allreduce (it measures no B_simple to check), or the run diverged
    (rank 0's epochs say, with chance as in diverged())."""
    lost = comm.bcast_object(epochs is not None and diverged(epochs, chance))
    if (opts.offline_samples <= 0 or lost or comm.size() < 2 or batch == AUTO
            or mode != ALLREDUCE):
        return None
    cfg = TrainConfig(**run_values(opts, recipe, batch, seed, out))
    return noise_scale_check(cfg, out, opts.offline_samples)


def noise_scale_check(cfg, out, samples):
    """Collective. B_simple at the run's final weights (rank 0's out/model.pt, frozen:
    an lr of 0) estimated twice from the same `samples` training samples:
    online, by DistributedOptimizer(noise_scale=True) over global batches of
    the run's size on the job's ranks, and offline on rank 0
    (offline_noise_scale over the per-rank slices). Returns (online, offline)
    on rank 0, None elsewhere, and None on every rank when the training set
    holds fewer than two global batches (digits at batch 1024)."""
    import numpy as np  # on use: loads numpy
    import torch  # on use: loads torch
    from .. import torch as hvd  # on use: loads numpy and torch and tqdm
    from ..optim.noise_scale import offline_noise_scale  # on use: loads numpy and torch and tqdm
    from ..train import build, data  # on use: loads numpy and torch and tqdm
    cfg = with_recipe(cfg)
    ds = data.load(cfg.data, cfg.seed, cfg.test_fraction)
    if 2 * cfg.global_batch > ds.n_train:  # fewer than two global batches: no estimate
        return None
    model = build.build_model(cfg, ds)
    state = torch.load(os.path.join(out, "model.pt"), map_location="cpu",
                       weights_only=True) if comm.rank() == 0 else None
    model.load_state_dict(comm.bcast_object(state))  # rank 0 wrote it, in its own --out
    n, b = comm.size(), cfg.global_batch // comm.size()
    k = max(2, min(samples, ds.n_train) // cfg.global_batch)
    rows = np.random.default_rng(cfg.seed + 7919).permutation(ds.n_train)[:k * n * b]
    rows = rows.reshape(k, n, b)
    loss = lambda logits, y: build.train_loss(cfg, logits, y)  # noqa: E731
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), noise_scale=True)
    model.train()  # as the training steps' gradients
    for x, y in ds.train_batches(rows[:, comm.rank()]):
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()
    online = opt.noise_scale(batch_size=b).b_simple
    if comm.rank() != 0:
        return None
    offline = offline_noise_scale(model, loss, ds.train_batches(rows.reshape(k * n, b)))
    return online, offline.b_simple


def run(opts):
    """The study (collective); returns the exit status (0) on every rank."""
    comm.init()
    batches = list(opts.batches) + [AUTO] * bool(opts.auto)
    plan = [(r, b, s, m) for r in opts.recipes for b in batches for s in opts.seeds
            for m in opts.modes if b != AUTO or m == ALLREDUCE]
    comm.print0("# hpcdl bench large-batch: %d runs (%d recipes x %d batches x %d seeds%s), "
                "%s, %s, %d epochs each, %d ranks"
                % (len(plan), len(opts.recipes), len(batches), len(opts.seeds),
                   " x modes %s; auto with allreduce only" % ",".join(opts.modes)
                   if len(opts.modes) > 1 or opts.modes[0] != ALLREDUCE else "",
                   opts.data, opts.model, opts.epochs, comm.size()))
    chance = chance_accuracy(opts.data, opts.seeds[0])
    runs, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpcdl-large-batch-") as tmp:
        top = opts.out or tmp
        for i, (recipe, batch, seed, mode) in enumerate(plan, 1):
            comm.print0("\n== run %d/%d: recipe %s, global batch %s, seed %d%s (%.0f s so far)"
                        % (i, len(plan), recipe, batch, seed, "" if mode == ALLREDUCE else
                           ", mode %s" % mode, time.perf_counter() - t0))
            out = os.path.join(top, "%s-b%s-s%d%s" % (recipe, batch, seed, "" if mode ==
                                                      ALLREDUCE else "-" + mode))
            epochs = train_one(opts, recipe, batch, seed, out, mode)
            check = check_after(opts, recipe, batch, seed, out, epochs, mode, chance)
            if epochs is not None:
                online, offline = check or (None, None)
                runs.append(dict(recipe=recipe, batch=batch, seed=seed, mode=mode,
                                 epochs=epochs, b_simple_frozen=online,
                                 b_simple_offline=offline))
                if batch == AUTO:
                    runs[-1]["global_batches"] = global_batches(runs[-1])
                if check is not None:
                    print("B_simple at the final weights (frozen, %d samples): online %.4g, "
                          "offline %.4g; the training's last epoch %s"
                          % (opts.offline_samples, online, offline,
                             _fmt(epochs[-1].get("b_simple"), "%.4g")), flush=True)
    if comm.rank() != 0:
        return comm.bcast_object(None, root=0)
    a0 = mean([r["epochs"][-1]["test_accuracy"] for r in runs
               if series(r) == (opts.recipes[0], opts.modes[0])
               and r["batch"] == opts.batches[0]])
    target = opts.target if opts.target is not None else a0 - opts.target_drop
    rows = summarize(runs, target, chance)
    compared = compare_modes(rows, opts.modes)
    print_table(rows, a0, target, opts, chance)
    print_comparison(compared)
    if opts.json:
        write_json(opts.json, strict_json(dict(a0=a0, target=target, chance=chance,
                                               ranks=comm.size(), epochs=opts.epochs,
                                               data=opts.data, model=opts.model,
                                               modes=opts.modes, rows=rows, runs=runs,
                                               mode_comparison=compared)),
                   indent=1, allow_nan=False)
        print("json: %s" % opts.json)
    if opts.plot:
        plot(rows, target, opts.plot)
        print("plot: %s" % opts.plot)
    return comm.bcast_object(0, root=0)


# ---------------------------------------------------------------- output
def _fmt(value, fmt):
    return fmt % value if value is not None else "-"


def print_table(rows, a0, target, opts, chance=None):
    print("\n# baseline A0 = %.4f (%s at batch %d, mean of %d seeds); target %.4f"
          % (a0, label(dict(recipe=opts.recipes[0], mode=opts.modes[0])), opts.batches[0],
             len(opts.seeds), target))
    print("# %-15s %7s %9s %9s %8s %10s %10s %9s %9s %9s %9s %9s"
          % ("recipe", "batch", "final", "best", "reached", "steps->tgt", "s->tgt",
             "B_simple", "B_last", "B_frozen", "B_offline", "diverged"))
    for r in rows:
        print("  %-15s %7s %9.4f %9.4f %5d/%-2d %10s %10s %9s %9s %9s %9s %9d"
              % (label(r), r["batch"], r["final_acc"], r["best_acc"], r["reached"],
                 r["seeds"], _fmt(r["steps_to_target"], "%.0f"),
                 _fmt(r["time_to_target_s"], "%.1f"), _fmt(r["b_simple"], "%.0f"),
                 _fmt(r.get("b_simple_last"), "%.0f"), _fmt(r.get("b_simple_frozen"), "%.0f"),
                 _fmt(r.get("b_simple_offline"), "%.0f"), r["diverged"]))
    print("# B_simple: the run's median over epochs; B_last: its last epoch's (online, "
          "smoothed over ~100 steps); B_frozen / B_offline: at the final weights, online "
          "and offline from the same samples")
    print("# inf: |G|^2 came out <= 0, the gradient all noise as far as the samples tell "
          "(near a minimum): no batch size limit measured; -: not measured (diverged, auto, "
          "other modes, one rank, fewer than two global batches of training data)")
    print("# diverged: runs whose loss became inf or nan%s"
          % ("" if chance is None else " or that ended at chance (test accuracy <= %.4f, "
             "what predicting the most common class scores, + %g)" % (chance + CHANCE_MARGIN,
                                                                     CHANCE_MARGIN)))
    for r in (x for x in rows if x["batch"] == AUTO):
        print("# %s auto: --global-batch auto, lr by AdaScale, ended at batch %.0f (mean over "
              "seeds); its steps mix batch sizes, compare its s->tgt"
              % (r["recipe"], r["final_batch"]))
    for key in dict.fromkeys(series(r) for r in rows):
        r = next(x for x in rows if series(x) == key)
        print("# %s: fit S = S_min (1 + B_noise/B): S_min %s, B_noise %s; measured critical "
              "batch (2x the perfect-scaling steps) %s"
              % (label(r), _fmt(r["fit_s_min"], "%.0f"), _fmt(r["fit_b_noise"], "%.0f"),
                 _fmt(r["critical_batch"], "%.0f")))


def print_comparison(compared):
    """compare_modes' lines: time to the target and over the budget, per mode."""
    for c in compared:
        (t1, t2), (s1, s2) = c["time_to_target_s"], c["train_s"]
        print("# %s at batch %s, %s vs %s: to the target %s s vs %s s (%s), whole budget "
              "%.1f s vs %.1f s (%s)"
              % (c["recipe"], c["batch"], c["first"], c["other"], _fmt(t1, "%.1f"),
                 _fmt(t2, "%.1f"), _fmt(c["target_speedup"], "%s %%.2fx faster" % c["first"]),
                 s1, s2, _fmt(c["train_speedup"], "%s %%.2fx faster" % c["first"])))


def plot(rows, target, path):
    """Left: final test accuracy against global batch per recipe. Middle: steps
    to the target against batch (log-log) with the perfect-scaling line and the
    McCandlish fit. Right: seconds to the target against batch; an auto row is
    a horizontal dashed line there (and a star at its final batch)."""
    import matplotlib  # on use: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # on use: loads matplotlib
    fig, (acc, steps, secs) = plt.subplots(1, 3, figsize=(15, 4.2))
    for key in dict.fromkeys(series(r) for r in rows):
        mine = [r for r in rows if series(r) == key and r["batch"] != AUTO]
        auto = [r for r in rows if series(r) == key and r["batch"] == AUTO]
        recipe = label(mine[0] if mine else auto[0])
        line = acc.plot([r["batch"] for r in mine], [r["final_acc"] for r in mine],
                        marker="o", label=recipe)[0]
        times = [(r["batch"], r["time_to_target_s"]) for r in mine
                 if r["time_to_target_s"] is not None]
        if times:
            secs.plot(*zip(*times), marker="o", color=line.get_color(), label=recipe)
        for r in auto:
            acc.plot([r["final_batch"]], [r["final_acc"]], marker="*", ms=12,
                     color=line.get_color(), ls="none", label="%s auto (final batch)" % recipe)
            if r["time_to_target_s"] is not None:
                secs.axhline(r["time_to_target_s"], ls="--", color=line.get_color(), lw=1,
                             label="%s auto" % recipe)
                secs.plot([r["final_batch"]], [r["time_to_target_s"]], marker="*", ms=12,
                          color=line.get_color())
        pts = [(r["batch"], r["steps_to_target"]) for r in mine
               if r["steps_to_target"] is not None]
        if not pts:
            continue
        steps.plot(*zip(*pts), marker="o", color=line.get_color(), label=recipe)
        b0, s0 = pts[0]
        bs = [r["batch"] for r in mine if r["batch"] >= b0]
        steps.plot(bs, [s0 * b0 / b for b in bs], ls=":", color=line.get_color(), lw=0.8)
        if mine[0]["fit_s_min"]:
            s_min, b_noise = mine[0]["fit_s_min"], mine[0]["fit_b_noise"]
            steps.plot(bs, [s_min * (1 + b_noise / b) for b in bs], ls="--",
                       color=line.get_color(), lw=0.8)
    acc.axhline(target, color="gray", lw=0.5)
    acc.set_xscale("log", base=2)
    acc.set_xlabel("global batch")
    acc.set_ylabel("final test accuracy")
    acc.legend(fontsize=8)
    steps.set_xscale("log", base=2)
    steps.set_yscale("log")
    steps.set_xlabel("global batch")
    steps.set_ylabel("steps to test accuracy %.3f" % target)
    steps.set_title("dotted: perfect scaling from the smallest batch; dashed: "
                    "S_min (1 + B_noise/B)", fontsize=8)
    acc.set_title("final test accuracy, mean over seeds; line: the target", fontsize=8)
    steps.legend(fontsize=8)
    secs.set_xscale("log", base=2)
    secs.set_xlabel("global batch")
    secs.set_ylabel("training seconds to test accuracy %.3f" % target)
    secs.set_title("dashed: --global-batch auto (star: its final batch)", fontsize=8)
    if secs.get_legend_handles_labels()[0]:
        secs.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
