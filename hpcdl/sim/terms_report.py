"""terms_report.py - `hpcdl sim step`'s table: per GPU count the step time,
efficiency, and what each term (terms.TERMS) adds, nccl-tests style."""
from . import terms as T
from .units import format_beta, format_time


def header(step, fab, enabled, source):
    return [
        "# hpcdl sim step: %s, %.1f MB of gradients in %d layers (%s)"
        % (step.name, step.nbytes / 1e6, len(step.layers), source),
        "#  forward %s, backward %s, spread %.3g, optimizer %s, data %s, per bucket %s"
        % (format_time(step.forward_s), format_time(step.backward_s), step.cv,
           format_time(step.optimizer_s), format_time(step.data_s),
           format_time(step.bucket_latency_s)),
        "#  %s all-reduce; between nodes alpha %s, beta %s per NIC, %s; inside alpha %s, "
        "beta %s" % (fab.algorithm, format_time(fab.alpha), format_beta(fab.beta),
                     "one NIC per GPU" if fab.nics_per_node is None else
                     "%d NIC(s) per node of %d GPUs" % (fab.nics_per_node, fab.per_node),
                     format_time(fab.alpha_intra), format_beta(fab.beta_intra)),
        "#  %s, %d bytes per element on the wire"
        % ("one bucket per layer" if step.fusion_bytes == 0 else "fusion %.3g MiB (first "
           "%.3g MiB)" % (step.fusion_bytes / (1 << 20), step.first_bucket_bytes / (1 << 20)),
           step.wire_bytes),
        "#  host: %s, %s compute thread(s) per rank, %.3g ns of CPU per gradient byte "
        "all-reduced" % ("cores unknown (timeshare, cpu left out)" if fab.cores is None else
                         "%.3g core(s) per rank" % fab.cores,
                         "%g" % (step.threads or 1), 1e9 * fab.cpu_per_byte),
        "#  terms on, in this order: %s; each column = step time it adds (ms), negative = "
        "hidden" % (", ".join(t for t in T.TERMS if t in enabled and
                              (fab.cores is not None or t not in ("timeshare", "cpu")) and
                              (fab.measured or t != "allreduce"))
                    or "none (course formula)"),
    ]


def table(rows, enabled):
    # timeshare and cpu are left out of a breakdown without a host's cores
    cols = ["comm"] + [t for t in T.TERMS if t in enabled and all(t in b.terms for b in rows)]
    out = ["#%7s %10s %9s %8s" % ("gpus", "step(ms)", "effic.", "buckets")
           + "".join(" %11s" % c for c in cols)]
    for b in rows:
        out.append(" %7d %10.3f %8.1f%% %8d" % (b.gpus, 1e3 * b.step_s, 100 * b.efficiency,
                                                b.buckets)
                   + "".join(" %+11.3f" % (1e3 * b.terms[c]) for c in cols))
    out.append("# efficiency points each term costs (comm = the course formula's loss):")
    for b in rows:
        out.append("#%7d  " % b.gpus + ", ".join("%s %+.1f" % kv for kv in b.points.items()))
    return out
