"""compare.py - the step model's prediction against a measured step of
`hpcdl bench train --json` (its hpcdl row), term by term, and the run's
no-comm row (its compute alone) for `hpcdl sim step --compute-from-measured`.
Issue #20's check across vcluster hosts: benchmarks/sim_check.sh, the table
in docs/sim.md.
"""
import json


def measured_step(path, impl="hpcdl"):
    """(seconds per step of impl: hpcdl's DistributedOptimizer, or no-comm, the
    compute alone; ranks, model) from the JSON `hpcdl bench train --json FILE`
    wrote; ValueError naming the file."""
    try:
        with open(path) as f:
            doc = json.load(f)
        row = next(r for r in doc["rows"] if r["impl"] == impl)
        step = doc["batch_per_rank"] * doc["ranks"] / row["samples_per_s"]
        return step, doc["ranks"], doc["model"]
    except (OSError, ValueError, KeyError, TypeError, StopIteration, ZeroDivisionError) as e:
        raise ValueError("cannot read a measured step from %s (%s): give the JSON written "
                         "by 'hpcdl bench train --json FILE'" % (path, e))


def against(breakdown, measured_s):
    """{predicted, measured, ratio, terms}: measured / predicted and what each
    term moved the prediction (seconds), for one GPU count."""
    return {"gpus": breakdown.gpus, "predicted_s": breakdown.step_s, "measured_s": measured_s,
            "ratio": measured_s / breakdown.step_s, "terms": dict(breakdown.terms)}
