"""cpu.py - what the hosts measured, in the step model (terms.py's
`timeshare`, `cpu` and `allreduce` terms): compute threads that outnumber
their cores, communication that takes cores from backward while it overlaps
it, and the all-reduce's measured times.

    K = cores per rank (a host's cores / the ranks on it; on `hpcdl vcluster`
        the hosts share the machine's cores), T = compute threads per rank,
    c = host CPU seconds per gradient byte all-reduced, per rank (kernel TCP
        work, copies, the reduction; `hpcdl bench calibrate --allreduce`)

    timeshare: compute takes max(1, T / K) times its profiled time
    cpu:       a bucket of b bytes on the link for d seconds uses u = c b / d
               cores (at most K); the spare cores max(0, K - T) absorb it
               first, the rest comes from backward's min(T, K) cores, so
               backward progresses at r = 1 - max(0, u - spare) / min(T, K)
               while the bucket runs (0 <= r <= 1).

Backward is then a piecewise-linear clock: time_at(w, busy) is when backward
has done w seconds of its (profiled, stretched) work, given the buckets'
busy intervals before it.
"""
from dataclasses import dataclass
import math


def has_inputs(term, fab, n):
    """False for timeshare / cpu without a host's cores, and for allreduce
    without a measured table for n GPUs: the term is left out."""
    if term in ("timeshare", "cpu"):
        return fab.cores is not None
    if term == "allreduce":
        return n in (fab.measured or {})
    return True


def interpolate(table, nbytes):
    """Seconds for nbytes from [(bytes, seconds)] measured (sizes > 0, sorted):
    log-log between neighbours, proportional above the largest, the smallest
    size's time below it."""
    if nbytes <= table[0][0]:
        return table[0][1]
    for (b0, t0), (b1, t1) in zip(table, table[1:]):
        if nbytes <= b1:
            x = math.log(nbytes / b0) / math.log(b1 / b0)
            return t0 * (t1 / t0) ** x
    return table[-1][1] * nbytes / table[-1][0]


def timeshare(threads, cores):
    """Compute stretch when T threads per rank share K < T cores."""
    if cores is None:
        return 1.0
    return max(1.0, (threads or 1) / cores)


@dataclass
class Share:
    """How overlapped communication slows backward on one rank."""
    threads: float          # T (None: 1)
    cores: float            # K (None: unknown, no slowdown)
    cpu_per_byte: float     # c
    on: bool                # the cpu term is switched on

    def rate(self, nbytes, seconds):
        """Backward's progress rate while nbytes are all-reduced in `seconds`."""
        if not self.on or self.cores is None or seconds <= 0 or not self.cpu_per_byte:
            return 1.0
        t = self.threads or 1
        used = min(self.cpu_per_byte * nbytes / seconds, self.cores)
        spare = max(0.0, self.cores - t)
        return max(0.0, 1.0 - max(0.0, used - spare) / min(t, self.cores))


def time_at(work, busy):
    """The time at which backward has done `work` seconds of its work, when it
    runs at rate 1 except in the busy intervals [(start, end, rate)] (disjoint,
    in time order; the link carries one bucket at a time)."""
    if work <= 0:
        return 0.0
    t = done = 0.0
    for start, end, rate in busy:
        if start > t:                      # free stretch before this bucket
            if done + (start - t) >= work:
                return t + (work - done)
            done, t = done + (start - t), start
        if end > t and rate > 0 and done + rate * (end - t) >= work:
            return t + (work - done) / rate
        if end > t:
            done, t = done + rate * (end - t), end
    return t + (work - done)
