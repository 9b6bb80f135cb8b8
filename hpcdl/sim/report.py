"""report.py - the scaling simulator's output: one table per algorithm
(nccl-tests style: '#' header, one row per GPU count), a JSON document and
a plot of efficiency and throughput against GPU count."""
from dataclasses import asdict

from . import cost
from .units import format_beta, format_time
from ..utils import atomic


def header(work, net, flat):
    """The '#' lines above the tables; flat: a ps, ring or tree table follows."""
    ai, bi = net.intra()
    lines = [
        "# hpcdl sim scaling: %s, %s parameters, %.1f MB of gradients per step "
        "(%d bytes each, one message)" % (work.name, "{:,}".format(work.params),
                                          work.nbytes / 1e6, work.bytes_per_param),
        "#  between nodes: alpha %s, beta %s" % (format_time(net.alpha), format_beta(net.beta)),
        "#  inside a node: alpha %s, beta %s; %d GPUs per node"
        % (format_time(ai), format_beta(bi), net.per_node),
        "#  compute %s per step, overlap %.2g of it, batch %d per GPU%s"
        % (format_time(work.compute_s), work.overlap, work.batch_per_gpu,
           ", reduction gamma %s" % format_beta(net.gamma) if net.gamma else ""),
        "#  step = compute + max(0, comm - overlap*compute); efficiency = compute / step",
        "#  ps, ring, tree use the inside-node link only while all GPUs fit one node",
    ]
    if not flat:
        lines.pop()
    return lines


def table(rows, algorithm):
    """Lines of one algorithm's table."""
    out = ["#", "# %s: %s" % (algorithm, cost.FORMULAS[algorithm]),
           "#%9s %12s %12s %12s %14s %11s" % ("gpus", "comm(ms)", "exposed(ms)",
                                               "step(ms)", "samples/s", "efficiency")]
    for r in rows:
        if r.algorithm == algorithm:
            out.append(" %9d %12.3f %12.3f %12.3f %14.1f %10.1f%%" % (
                r.gpus, r.comm_s * 1e3, r.exposed_s * 1e3, r.step_s * 1e3,
                r.samples_per_s, 100 * r.efficiency))
    return out


def best_lines(rows):
    """Per GPU count (above 1): the fastest and slowest algorithm; ties in
    step time (communication fully hidden) go to the one that communicates less."""
    out = ["#"]
    for n in dict.fromkeys(r.gpus for r in rows if r.gpus > 1):
        at = sorted((r for r in rows if r.gpus == n), key=lambda r: (r.step_s, r.comm_s))
        out.append("# %d GPUs: fastest %s (step %.2f ms, %.1f%%), slowest %s (step %.2f ms, "
                   "%.1f%%)" % (n, at[0].algorithm, at[0].step_s * 1e3, 100 * at[0].efficiency,
                                at[-1].algorithm, at[-1].step_s * 1e3,
                                100 * at[-1].efficiency))
    return out


def render(rows, work, net):
    """The whole printed report, as one string."""
    algorithms = list(dict.fromkeys(r.algorithm for r in rows))
    lines = header(work, net, any(a != "hier" for a in algorithms))
    for a in algorithms:
        lines += table(rows, a)
    return "\n".join(lines + best_lines(rows)) + "\n"


def write_json(path, rows, work, net):
    doc = {"workload": asdict(work), "nbytes": work.nbytes, "network": asdict(net),
           "formulas": cost.FORMULAS, "rows": [asdict(r) for r in rows]}
    atomic.write_json(path, doc, indent=1)


def write_plot(path, rows, work, net=None):
    """Efficiency (left) and throughput (right) against GPU count, log2 x;
    the title says these are the model's predictions and for what network."""
    import matplotlib  # on use: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # on use: loads matplotlib
    fig, (eff, thr) = plt.subplots(1, 2, figsize=(11, 4.5))
    gpus = sorted({r.gpus for r in rows})
    for a in dict.fromkeys(r.algorithm for r in rows):
        mine = [r for r in rows if r.algorithm == a]
        eff.plot([r.gpus for r in mine], [100 * r.efficiency for r in mine], marker="o",
                 label=a)
        thr.plot([r.gpus for r in mine], [r.samples_per_s for r in mine], marker="o",
                 label=a)
    thr.plot(gpus, [n * work.batch_per_gpu / work.compute_s for n in gpus], color="gray",
             ls=":", label="ideal")
    for ax in (eff, thr):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    thr.set_yscale("log")
    eff.set_ylabel("scaling efficiency (%)")
    eff.set_ylim(0, 105)
    thr.set_ylabel("samples / s (log)")
    fig.suptitle("hpcdl sim scaling, predicted by the alpha-beta model (not measured): %s, "
                 "%.1f MB gradients, compute %.1f ms/step, overlap %.2g%s"
                 % (work.name, work.nbytes / 1e6, work.compute_s * 1e3, work.overlap,
                    "\nbetween nodes: alpha %s, beta %s; %d GPUs per node"
                    % (format_time(net.alpha), format_beta(net.beta), net.per_node)
                    if net else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
