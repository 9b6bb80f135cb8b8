"""fit.py - least-squares fits of measured times to the cost model.

Times span five orders of magnitude (1 us at 0 bytes, 10 ms at 64 MiB), so
the fit minimises *relative* errors, sum(((model - t) / t)^2): a plain fit
would let the largest sizes decide everything and return a meaningless,
even negative, alpha. R^2 is reported on the times themselves (the usual
1 - SS_res / SS_tot), together with each size's relative error.
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class Fit:
    coef: tuple          # fitted coefficients, one per column
    r2: float            # 1 - SS_res / SS_tot on the times
    rel_errors: list     # (model - t) / t per point
    model: list          # the fitted times per point

    @property
    def worst(self):
        """Index of the point with the largest relative error."""
        return int(np.argmax(np.abs(self.rel_errors)))


def fit_columns(columns, times):
    """Least squares with relative weights of times ~ sum_j coef_j * columns[j].
    columns: list of per-point sequences (the model's terms). ValueError when
    there are fewer positive times than coefficients."""
    t = np.asarray(times, dtype=np.float64)
    x = np.column_stack([np.asarray(c, dtype=np.float64) for c in columns])
    if (t > 0).sum() < x.shape[1]:
        raise ValueError("need at least %d positive times to fit %d coefficients (got %d)"
                         % (x.shape[1], x.shape[1], int((t > 0).sum())))
    keep = t > 0
    coef, *_ = np.linalg.lstsq(x[keep] / t[keep, None], np.ones(keep.sum()), rcond=None)
    return _scored(coef, x @ coef, t)


def _scored(coef, model, t):
    """The Fit of coefficients coef whose model times are model, against times t."""
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float(((model - t) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    rel = np.where(t > 0, (model - t) / np.where(t > 0, t, 1), 0.0)
    return Fit(tuple(float(c) for c in coef), r2, rel.tolist(), model.tolist())


def fit_alpha_beta(sizes, times):
    """t = alpha + beta * m for one message of m bytes: Fit with coef (alpha, beta)."""
    return fit_columns([np.ones(len(sizes)), sizes], times)


def fit_ring(n, sizes, times):
    """t = 2(N-1) alpha + 2((N-1)/N) m beta (a ring all-reduce of m bytes over
    N ranks; the reduction's cost lands in beta): Fit with coef (alpha, beta)."""
    if n < 2:
        raise ValueError("a ring fit needs at least 2 ranks (got %d)" % n)
    sizes = np.asarray(sizes, dtype=np.float64)
    return fit_columns([np.full(len(sizes), 2.0 * (n - 1)), 2.0 * (n - 1) / n * sizes],
                       times)


def fit_two_regimes(sizes, times, ratio=1000.0):
    """For a link that one line does not fit, e.g. one shaped by a token bucket
    (tc tbf, `hpcdl vcluster --link`): messages below its burst pass at the
    wire's speed, the rest at the shaped rate. With base = the median time of
    the 3 smallest messages, alpha is the median time of the latency regime
    (times <= 2 x base), beta the slope of the relative fit over the
    bandwidth regime (times >= ratio x base);
    the Fit reports both against every point. None when a regime
    has < 2 points or beta comes out <= 0."""
    m = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    pos = np.flatnonzero(t > 0)
    if len(pos) < 4:
        return None
    # the base latency: median time of the 3 smallest messages (one odd fast
    # or slow round trip must not move the regimes)
    base = float(np.median(t[pos[np.argsort(m[pos], kind="stable")[:3]]]))
    small, large = (t > 0) & (t <= 2 * base), (t > 0) & (t >= ratio * base)
    if small.sum() < 2 or large.sum() < 2:
        return None
    alpha = float(np.median(t[small]))
    beta = fit_alpha_beta(m[large], t[large]).coef[1]  # the slope; its intercept
    if beta <= 0:                                      # holds the burst's head start
        return None
    return _scored((alpha, beta), alpha + beta * m, t)
