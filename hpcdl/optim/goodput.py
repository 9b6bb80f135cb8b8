"""goodput.py - Pollux-style goodput (Qiao et al., OSDI 2021): the global batch
that makes the most training progress per second, from the gradient noise
scale and a fitted step-time model. No MPI, no torch; the trainer's
`--global-batch auto` (hpcdl/train/goodput.py) measures and applies it.
docs/goodput.md.

    efficiency(M) = (B_noise + M0) / (B_noise + M)   progress per sample at batch M,
                                                     relative to the base batch M0
    throughput(M) = M / t(M)                         samples per second
    goodput(M)    = throughput(M) x efficiency(M)    base-batch samples' worth per second

with the step time of N ranks, each taking k accumulated passes of a local
batch L (M = N L k), modelled as

    t(L, k) = k (a + c L) + comm

a + c L: one pass's compute (forward and backward), comm: the all-reduce and
the optimizer step, once per step whatever the batch. Efficiency falls and
throughput rises with M, so the best batch grows with B_noise: while the
gradient is mostly signal (small B_noise) a bigger batch buys little progress,
later (B_noise larger) it buys nearly its size.
"""
import math
from dataclasses import dataclass

from ._checks import check_number


def efficiency(b_noise, base_batch, batch):
    """Statistical efficiency of batch over base_batch: (B_noise + M0) /
    (B_noise + M), 1 at the base batch; None for b_noise (no estimate yet)
    counts as 0 (every sample beyond the base batch wasted: the safe choice)."""
    check_number("base batch", base_batch, strict=True)
    check_number("batch", batch, strict=True)
    b = 0.0 if b_noise is None or not math.isfinite(b_noise) else max(float(b_noise), 0.0)
    return (b + base_batch) / (b + batch)


@dataclass
class StepTime:
    """t(L, k) = k (a + c L) + comm seconds (see the module docstring)."""
    a: float      # seconds per pass whatever its batch
    c: float      # seconds per sample of a pass
    comm: float   # seconds per step whatever the batch (all-reduce, optimizer)

    def __call__(self, local_batch, accum=1):
        return accum * (self.a + self.c * local_batch) + self.comm

    @classmethod
    def fit(cls, passes, step_s, local_batch, accum=1):
        """From passes = [(local batch, seconds of one forward+backward)] (a + c L
        is their least-squares line) and one measured step at local_batch x
        accum: comm is what the step took beyond its passes."""
        return cls(*fit_line(passes), 0.0).with_comm(step_s, local_batch, accum)

    def with_comm(self, step_s, local_batch, accum=1):
        """The same compute line a + c L, comm re-fitted from one measured step
        at local_batch x accum: what the step took beyond its passes (at least 0)."""
        check_number("step seconds", step_s)
        return StepTime(self.a, self.c,
                        max(step_s - accum * (self.a + self.c * local_batch), 0.0))

    def comm_moved(self, measured_ranks, ranks):
        """An estimate for `ranks` ranks of a model whose comm was measured on
        measured_ranks: comm x ring_bytes(ranks) / ring_bytes(measured_ranks),
        the ring all-reduce's bytes per rank (its bandwidth term; the latency
        term, the optimizer step inside comm and a changed link are not
        modelled: re-measure). a + c L is per rank and stays. None when
        measured on one rank (no all-reduce in it to scale)."""
        if measured_ranks == ranks:
            return self
        if measured_ranks < 2:
            return None
        return StepTime(self.a, self.c,
                        self.comm * ring_bytes(ranks) / ring_bytes(measured_ranks))

    def state_dict(self):
        return dict(a=self.a, c=self.c, comm=self.comm)


def ring_bytes(ranks):
    """What each rank sends in a ring all-reduce (hpcdl's, src_c/ring.c), over
    the buffer's size: 2 (N - 1) / N (reduce-scatter, then all-gather)."""
    return 2.0 * (ranks - 1) / ranks


def fit_line(points):
    """(a, c) of the least-squares line t = a + c L through (L, t) points;
    with one distinct L, a flat line through their mean (c = 0). Both clipped
    at 0 (a negative cost is noise)."""
    if not points:
        raise ValueError("fit_line needs at least one (local batch, seconds) point")
    n = float(len(points))
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    c = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx > 0 else 0.0
    c = max(c, 0.0)
    return max(my - c * mx, 0.0), c


def candidates(ranks, base_batch, ceiling, max_local=None):
    """[(M, L, k)]: global batches M = base_batch x 2^i up to ceiling (the base
    batch always), each as N ranks x local batch L x k accumulated passes, k
    the smallest power of two that keeps L <= max_local (None: k = 1)."""
    if base_batch % ranks:
        raise ValueError("base batch %d does not divide by %d ranks" % (base_batch, ranks))
    out = []
    for m in doublings(base_batch, ceiling):
        k = 1
        while max_local is not None and m // (ranks * k) > max_local and \
                (m // ranks) % (2 * k) == 0:
            k *= 2
        out.append((m, m // (ranks * k), k))
    return out


def doublings(base_batch, ceiling):
    """base_batch x 2^i up to ceiling; base_batch always, even above it."""
    m = base_batch
    while m == base_batch or m <= ceiling:
        yield m
        m *= 2


def table(b_noise, base_batch, step_time, cands):
    """One row per candidate: global_batch, local_batch, accum, step_time_s,
    throughput (samples/s), efficiency, goodput."""
    rows = []
    for m, local, k in cands:
        t = step_time(local, k)
        eff = efficiency(b_noise, base_batch, m)
        rows.append(dict(global_batch=m, local_batch=local, accum=k, step_time_s=t,
                         throughput=m / t, efficiency=eff, goodput=m / t * eff))
    return rows


def best(rows):
    """The row of the largest goodput (the smaller batch on a tie within 1e-12)."""
    top = rows[0]
    for r in rows[1:]:
        if r["goodput"] > top["goodput"] * (1 + 1e-12):
            top = r
    return top
