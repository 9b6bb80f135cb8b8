"""terms.py - the step time of data-parallel training, term by term: what
scaling.py's course formula leaves out, each term switched on separately.

    course   step = compute + max(0, comm - overlap * compute)      (scaling.py)

Terms (names as in TERMS, switched on in this order, each reported as the
step time it adds; a negative number is time it hides):

  buckets      gradients appear layer by layer during backward; they are
               sent in fusion buckets (a small first one, then fusion_bytes),
               one all-reduce at a time on the link. Bucket k starts when its
               last layer's gradient exists and the link is free; what runs
               past the end of backward is exposed. The last bucket (the
               first layers) is never hidden. Replaces the overlap fraction.
  shared       links shared by the ranks of a node: the hierarchical
               all-reduce runs L inter-node rings at once through the node's
               nics_per_node NICs, so each gets nics/L of a NIC. (A flat ring
               laid out node by node has one inter-node edge per node: no
               sharing.) Off: every GPU has its own NIC, as cost.py assumes.
  compression  gradients travel in wire_bytes per parameter (2: fp16/bf16)
               and every byte costs compress_gamma seconds to encode and
               decode (on the critical path of its bucket).
  stragglers   every rank's compute is normal with spread cv = sigma / mean;
               the step waits for the slowest of N (stragglers.py): compute
               times 1 + cv e_N (and so does each bucket's ready time).
  overheads    fixed costs per step (optimizer step, data loading not hidden)
               and a latency per bucket (launch, negotiation).
  timeshare    ranks with more compute threads than cores (threads T per
               rank, cores per rank K = a host's cores / the ranks on it):
               compute takes max(1, T / K) times its profiled time.
  cpu          communication needs a core too: cpu_per_byte seconds of host
               CPU per gradient byte all-reduced (TCP in the kernel, copies,
               the reduction; measured by `hpcdl bench calibrate`). While a
               bucket of b bytes holds the link for d seconds during
               backward, it uses u = c b / d cores; what exceeds the spare
               cores (K - T) is taken from backward's min(T, K), which
               progresses at 1 - (u - spare) / min(T, K) meanwhile (cpu.py).
  allreduce    each bucket priced by the ring all-reduce `hpcdl bench
               calibrate --allreduce` measured on the same hosts and rank
               count (fastest time, interpolated log-log between its sizes,
               proportional beyond the largest) instead of the alpha-beta
               formula: the ring as it runs (its chunking, both directions
               at once, TCP), which ping-pong's alpha and beta do not see.

timeshare and cpu need a host's cores (fab.cores), allreduce a measured
table for the GPU count (fab.measured); without them they add nothing and
are left out of the breakdown.

Efficiency = step on base_gpus / step on N (the same per-GPU batch), so fixed
costs present on one GPU do not count as a loss of scaling.
"""
from dataclasses import dataclass, field, replace

from . import cost, cpu
from .stragglers import slowdown

TERMS = ("buckets", "shared", "compression", "stragglers", "overheads", "timeshare", "cpu",
         "allreduce")
FIRST_BUCKET_BYTES = 1 << 20     # as hpcdl.torch.reducer
FUSION_BYTES = 25 << 20          # HPCDL_FUSION_THRESHOLD's default


@dataclass
class Layer:
    """One gradient, in the order backward produces it."""
    nbytes: int                  # gradient bytes at 4 bytes per parameter
    backward_s: float            # backward time until this gradient is ready
    name: str = ""


@dataclass
class Step:
    """One rank's training step and the costs around it."""
    layers: list                 # [Layer], backward order
    forward_s: float
    batch_per_gpu: int = 32
    overlap: float = 0.0         # the course formula's fraction (buckets off)
    fusion_bytes: int = FUSION_BYTES    # 0: one bucket per layer
    first_bucket_bytes: int = FIRST_BUCKET_BYTES
    cv: float = 0.0              # compute-time spread sigma / mean across ranks
    optimizer_s: float = 0.0
    data_s: float = 0.0          # data loading not hidden behind compute
    bucket_latency_s: float = 0.0
    wire_bytes: int = 4          # bytes per parameter on the wire (compression)
    compress_gamma: float = 0.0  # encode + decode seconds per (4-byte) gradient byte
    name: str = "model"
    threads: float = None        # compute threads per rank (timeshare, cpu); None: 1

    @property
    def backward_s(self):
        return sum(layer.backward_s for layer in self.layers)

    @property
    def compute_s(self):
        return self.forward_s + self.backward_s

    @property
    def nbytes(self):
        return sum(layer.nbytes for layer in self.layers)


@dataclass
class Fabric:
    """Links: alpha seconds, beta seconds per byte; inter = one NIC."""
    alpha: float
    beta: float
    alpha_intra: float
    beta_intra: float
    per_node: int = 8
    nics_per_node: int = None    # None: one per GPU
    gamma: float = 0.0
    algorithm: str = "hier"      # "hier" or "ring" (flat)
    cores: float = None          # cores per rank (a host's / its ranks); None: unknown
    cpu_per_byte: float = 0.0    # host CPU seconds per gradient byte all-reduced, per rank
    measured: dict = None        # {ranks: [(bytes, seconds)]} of the ring all-reduce


@dataclass
class Breakdown:
    gpus: int
    step_s: float
    efficiency: float
    exposed_s: float
    comm_s: float
    buckets: int
    terms: dict = field(default_factory=dict)   # term -> step seconds it adds
    points: dict = field(default_factory=dict)  # term -> efficiency points it costs


def synthetic_layers(nbytes, backward_s, count=50):
    """count equal layers: the rule when no profile was measured."""
    return [Layer(nbytes / count, backward_s / count, "layer%d" % i) for i in range(count)]


def plan_buckets(layers, fusion_bytes, first_bytes):
    """[(bytes, index of the bucket's last layer)], like hpcdl.torch.reducer:
    a first bucket of up to first_bytes, then up to fusion_bytes each; a
    layer larger than the limit is a bucket of its own; fusion 0 = per layer."""
    plan, cur, limit = [], 0.0, first_bytes
    for i, layer in enumerate(layers):
        # (a relative tolerance: equal float layers must fill a bucket exactly)
        if cur and (fusion_bytes == 0 or cur + layer.nbytes > limit * (1 + 1e-9)):
            plan.append((cur, i - 1))
            cur, limit = 0.0, fusion_bytes
        cur += layer.nbytes
    if cur or not plan:
        plan.append((cur, len(layers) - 1))
    return plan


def allreduce_s(n, nbytes, fab, shared):
    """One all-reduce of nbytes over n GPUs with the fabric's algorithm."""
    if n == 1:
        return 0.0
    if fab.algorithm == "ring":
        flat = n <= fab.per_node
        a, b = (fab.alpha_intra, fab.beta_intra) if flat else (fab.alpha, fab.beta)
        return cost.ring_allreduce(n, nbytes, a, b, fab.gamma)
    local = min(fab.per_node, n)
    beta = fab.beta
    if shared and fab.nics_per_node and local > fab.nics_per_node:
        beta = fab.beta * local / fab.nics_per_node   # L rings share the NICs
    return cost.hierarchical_allreduce(n, nbytes, fab.per_node, fab.alpha_intra,
                                       fab.beta_intra, fab.alpha, beta, fab.gamma)


def _ready_times(layers, stretch):
    """Backward time (from its start) at which each layer's gradient exists."""
    out, t = [], 0.0
    for layer in layers:
        t += layer.backward_s * stretch
        out.append(t)
    return out


def _bucket_cost(n, nbytes, step, fab, on):
    """Seconds one bucket holds the link: all-reduce of its wire bytes, plus
    encoding (compression) and its fixed latency (overheads)."""
    if n == 1:
        return 0.0
    wire = step.wire_bytes / 4 if "compression" in on else 1.0
    if "allreduce" in on and n in (fab.measured or {}):
        t = cpu.interpolate(fab.measured[n], nbytes * wire)
    else:
        t = allreduce_s(n, nbytes * wire, fab, "shared" in on)
    if "compression" in on:
        t += nbytes * step.compress_gamma
    if "overheads" in on:
        t += step.bucket_latency_s
    return t


def step_time(n, step, fab, on=()):
    """(step seconds, exposed comm, total comm, buckets) on n GPUs with the
    terms in `on`; on = () is the course formula of scaling.py exactly."""
    stretch = slowdown(n, step.cv) if "stragglers" in on else 1.0
    if "timeshare" in on:
        stretch *= cpu.timeshare(step.threads, fab.cores)
    fwd, bwd = step.forward_s * stretch, step.backward_s * stretch
    share = cpu.Share(step.threads, fab.cores, fab.cpu_per_byte, "cpu" in on)
    if "buckets" in on:
        ready = _ready_times(step.layers, stretch)
        plan = plan_buckets(step.layers, step.fusion_bytes, step.first_bucket_bytes)
        free = comm = 0.0
        busy = []                   # (start, end, backward's rate) of each bucket
        for nbytes, last in plan:   # one all-reduce at a time, in bucket order
            d = _bucket_cost(n, nbytes, step, fab, on)
            start = max(cpu.time_at(ready[last], busy), free)
            free, comm = start + d, comm + d
            busy.append((start, free, share.rate(nbytes, d)))
        bwd = cpu.time_at(bwd, busy)   # backward slowed where buckets took its cores
        exposed, buckets = max(0.0, free - bwd), len(plan)
    else:                           # one message after backward
        comm = _bucket_cost(n, step.nbytes, step, fab, on)
        hidden = min(comm, step.overlap * (fwd + bwd))
        exposed, buckets = comm - hidden, 1
        bwd += hidden * (1.0 - share.rate(step.nbytes, comm))
    fixed = step.optimizer_s + step.data_s if "overheads" in on else 0.0
    return fwd + bwd + exposed + fixed, exposed, comm, buckets


def breakdown(n, step, fab, enabled=TERMS, base_gpus=1):
    """Breakdown on n GPUs: the terms in `enabled` switched on one by one in
    TERMS order; terms[t] = step seconds term t adds, points[t] = efficiency
    (percentage points) it costs. Efficiency against base_gpus."""
    on = []
    prev, _, _, _ = step_time(n, step, fab, on)
    prev_eff = step_time(base_gpus, step, fab, on)[0] / prev
    terms = {"compute": step.compute_s, "comm": prev - step.compute_s}
    points = {"comm": 100 * (1.0 - prev_eff)}
    for t in TERMS:
        if t in enabled and cpu.has_inputs(t, fab, n):
            on.append(t)
            s = step_time(n, step, fab, on)[0]
            eff = step_time(base_gpus, step, fab, on)[0] / s
            terms[t], points[t] = s - prev, 100 * (prev_eff - eff)
            prev, prev_eff = s, eff
    s, exposed, comm, buckets = step_time(n, step, fab, on)
    return Breakdown(n, s, prev_eff, exposed, comm, buckets, terms, points)


def validate(gpus, step, fab, base_gpus=1):
    """ValueError naming the first impossible input."""
    for n in list(gpus) + [base_gpus]:
        if int(n) != n or n < 1:
            raise ValueError("GPU counts must be positive integers (got %r)" % (n,))
        if n > fab.per_node and n % fab.per_node:
            raise ValueError("%d GPUs do not fill nodes of %d GPUs each (--gpus-per-node): "
                             "give a GPU count that the node size divides" % (n, fab.per_node))
    rates = [("alpha", fab.alpha), ("alpha-intra", fab.alpha_intra), ("gamma", fab.gamma)]
    rates += [("beta", fab.beta), ("beta-intra", fab.beta_intra)]
    for name, v in rates:
        if v is None or v < 0:
            raise ValueError("--%s must be >= 0 (got %r)" % (name, v))
    positive = [("the forward time", step.forward_s), ("the backward time", step.backward_s),
                ("--batch-per-gpu", step.batch_per_gpu), ("--wire-bytes", step.wire_bytes),
                ("--gpus-per-node", fab.per_node)]
    positive += [("--nics-per-node", fab.nics_per_node)] if fab.nics_per_node is not None else []
    positive += [("--cores-per-rank", fab.cores)] if fab.cores is not None else []
    positive += [("--threads", step.threads)] if step.threads is not None else []
    for name, v in positive:
        if not v > 0:
            raise ValueError("%s must be > 0 (got %r)" % (name, v))
    others = [("--spread", step.cv), ("--optimizer-ms", step.optimizer_s),
              ("--data-ms", step.data_s), ("--bucket-latency", step.bucket_latency_s),
              ("--compress-gamma", step.compress_gamma), ("--fusion-mb", step.fusion_bytes),
              ("--first-bucket-mb", step.first_bucket_bytes),
              ("--cpu-per-byte", fab.cpu_per_byte)]
    for name, v in others:
        if v < 0:
            raise ValueError("%s must be >= 0 (got %r)" % (name, v))
    if not 0 <= step.overlap <= 1:
        raise ValueError("--overlap must be between 0 and 1 (got %r)" % step.overlap)
    if fab.algorithm not in ("hier", "ring"):
        raise ValueError("unknown algorithm %r: use hier or ring" % fab.algorithm)
    if any(layer.nbytes < 0 or layer.backward_s < 0 for layer in step.layers):
        raise ValueError("every layer needs bytes >= 0 and a backward time >= 0")


def with_terms(step, **changes):
    """A copy of step with some fields changed (for what-if tables)."""
    return replace(step, **changes)
