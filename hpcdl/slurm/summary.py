"""summary.py - the scaling table of a sweep: every summary.json below a
folder (one per run, as `hpcdl train --out` writes them), sorted by ranks,
with speed-up and efficiency against the smallest run.

    speed-up   = samples/s of a run / samples/s of the smallest run
    efficiency = speed-up / (ranks of the run / ranks of the smallest run)

(the smallest run: fewest ranks, then the smallest global batch). A batch-size
sweep on fixed ranks thus reads speed-up = efficiency = throughput gained.
"""
import json
import os

FIELDS = ("ranks", "nodes", "global_batch", "samples_per_s")


class SummaryError(ValueError):
    """No runs to summarise, or a summary.json that cannot be read."""


def collect(folder):
    """(runs, unfinished): runs are dicts with FIELDS + 'run' (the path below
    folder); unfinished lists run folders with metrics.jsonl but no summary.json."""
    if not os.path.isdir(folder):
        raise SummaryError("%s is not a folder; give the sweep's output folder "
                           "(SWEEP_DIR of scaling-sweep.sbatch)" % folder)
    runs, unfinished = [], []
    for here, dirs, files in os.walk(folder):
        dirs.sort()
        rel = os.path.relpath(here, folder)
        if "summary.json" in files:
            runs.append(_read(os.path.join(here, "summary.json"), rel))
        elif "metrics.jsonl" in files:
            unfinished.append(rel)
    if not runs:
        raise SummaryError("no summary.json below %s%s; each run of a sweep writes one when "
                           "it finishes (hpcdl train --out DIR)" % (
                               folder, " (unfinished: %s)" % ", ".join(unfinished)
                               if unfinished else ""))
    return runs, unfinished


def _read(path, rel):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SummaryError("cannot read %s: %s" % (path, e))
    missing = [k for k in FIELDS if not isinstance(data.get(k), (int, float))]
    if missing or data["samples_per_s"] <= 0 or data["ranks"] < 1:
        raise SummaryError("%s lacks %s (or holds no positive throughput); was it written "
                           "by hpcdl train?" % (path, ", ".join(missing) or "samples_per_s"))
    run = {k: data[k] for k in FIELDS}
    run["run"] = rel
    return run


def scaling_table(runs):
    """runs sorted by (ranks, global batch), each with speed_up and efficiency."""
    rows = sorted(runs, key=lambda r: (r["ranks"], r["global_batch"], r["run"]))
    base = rows[0]
    out = []
    for r in rows:
        speed_up = r["samples_per_s"] / base["samples_per_s"]
        out.append(dict(r, speed_up=speed_up,
                        efficiency=speed_up / (r["ranks"] / base["ranks"])))
    return out


def format_table(rows, folder):
    base = rows[0]
    lines = ["# scaling of %d run(s) in %s; speed-up and efficiency against the %d-rank, "
             "global batch %d run" % (len(rows), folder, base["ranks"], base["global_batch"]),
             "# %5s %5s %12s %12s %8s %10s  %s" % ("ranks", "nodes", "global_batch",
                                                   "samples/s", "speed-up", "efficiency",
                                                   "run")]
    for r in rows:
        lines.append("  %5d %5d %12d %12.1f %8.2f %9.1f%%  %s" % (
            r["ranks"], r["nodes"], r["global_batch"], r["samples_per_s"], r["speed_up"],
            100 * r["efficiency"], r["run"]))
    return "\n".join(lines)


def plot(rows, path, folder=None):
    """Throughput against ranks (with the ideal line through the smallest run)
    and efficiency, side by side, as a PNG; ticks at the rank counts run (with
    the nodes when a run spans several), titled with the sweep's folder."""
    import matplotlib  # on use: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # on use: loads matplotlib
    base = rows[0]
    ranks = [r["ranks"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.3))
    a.plot(ranks, [r["samples_per_s"] for r in rows], "o-", label="measured")
    a.plot(ranks, [base["samples_per_s"] * n / base["ranks"] for n in ranks], "--",
           color="grey", label="linear from the smallest run")
    a.set(xlabel="ranks", ylabel="samples/s", title="throughput")
    a.legend()
    b.plot(ranks, [100 * r["efficiency"] for r in rows], "o-")
    b.set(xlabel="ranks", ylabel="efficiency (%)", title="scaling efficiency",
          ylim=(0, max(105, 5 + max(100 * r["efficiency"] for r in rows))))
    nodes = {}
    for r in rows:
        nodes.setdefault(r["ranks"], set()).add(r["nodes"])
    ticks = sorted(nodes)
    labels = [str(n) + ("\n%s nodes" % "/".join(map(str, sorted(nodes[n])))
                        if max(nodes[n]) > 1 else "") for n in ticks]
    for ax in (a, b):
        ax.set_xticks(ticks, labels)  # whole ranks only, never 1.5
        ax.grid(alpha=0.3)
    fig.suptitle("scaling sweep%s: %d run(s), against %d rank(s) at global batch %d"
                 % (" " + os.path.basename(os.path.abspath(folder)) if folder else "",
                    len(rows), base["ranks"], base["global_batch"]))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
