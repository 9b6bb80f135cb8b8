"""check_table.py - the table of benchmarks/sim_check.sh: for every
`hpcdl sim step --measured --json` it wrote (step_MODEL_HOSTS_FUSION_HOW.json
in one folder), predicted and measured step, their ratio and what each term
moved the prediction (ms), as Markdown rows for docs/sim.md.

    python -m hpcdl.sim.check_table build/simchk
"""
import glob
import json
import os
import sys

COLUMNS = ("compute", "comm", "buckets", "stragglers", "overheads", "timeshare", "cpu",
           "allreduce")
HOW = {"profile": "profile", "run": "run's no-comm"}
TARGET = 0.15   # issue #20: within 15 %


def rows(folder):
    """[(model, hosts, fusion MiB, how, measured dict)] sorted, from the files."""
    out = []
    for path in glob.glob(os.path.join(folder, "step_*_*_*_*.json")):
        model, hosts, fusion, how = os.path.basename(path)[5:-5].rsplit("_", 3)
        with open(path) as f:
            doc = json.load(f)
        if "measured" in doc:
            out.append((model, int(hosts), float(fusion), how, doc["measured"]))
    return sorted(out, key=lambda r: (r[0], r[1], r[2], r[3] != "profile"))


def table(found):
    lines = ["| model | hosts | fusion MiB | compute from | predicted ms | measured ms | "
             "measured / predicted | " + " | ".join(COLUMNS) + " |",
             "|---|---:|---:|---|---:|---:|---:|" + "---:|" * len(COLUMNS)]
    for model, hosts, fusion, how, m in found:
        t = m["terms"]
        within = abs(m["ratio"] - 1) <= TARGET
        lines.append("| %s | %d | %g | %s | %.0f | %.0f | %s%.2fx%s | %s |" % (
            model, hosts, fusion, HOW.get(how, how), 1e3 * m["predicted_s"],
            1e3 * m["measured_s"], "" if within else "**", m["ratio"], "" if within else "**",
            " | ".join("%+.0f" % (1e3 * t[c]) if c in t else "-" for c in COLUMNS)))
    hits = sum(abs(r[4]["ratio"] - 1) <= TARGET for r in found)
    lines.append("")
    lines.append("%d of %d predictions within %.0f %% (bold: outside)" % (hits, len(found),
                                                                        100 * TARGET))
    return lines


def main(argv):
    folder = argv[1] if len(argv) > 1 else "build/simchk"
    found = rows(folder)
    if not found:
        print("check_table: no step_*.json with a measurement in %s" % folder, file=sys.stderr)
        return 2
    print("\n".join(table(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
