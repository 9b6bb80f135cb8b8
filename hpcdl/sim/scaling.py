"""scaling.py - predicted step time, throughput and scaling efficiency of
data-parallel training on N GPUs, for each all-reduce algorithm.

One step on every GPU: compute (forward + backward, measured or given; the
same on every GPU, since each keeps its per-GPU batch), then an all-reduce
of the whole gradient (P parameters x bytes per parameter = M bytes, one
message: bucketing is left out). Part of the communication can overlap the
backward pass:

    exposed comm = max(0, comm - overlap * compute)
    step         = compute + exposed comm
    throughput   = N * batch per GPU / step              (samples / s)
    efficiency   = throughput / (N * throughput on 1 GPU) = compute / step

overlap is the fraction of the compute time during which gradients are
already being sent (0: none, communication after backward as in BSP; about
0.6: most of backward, when gradients are ready layer by layer). Overlap can
hide communication only while there is compute to hide it behind, hence the
max(0, .) rather than a fixed share of comm.
"""
from dataclasses import dataclass

from . import cost
from .units import parse_count

# parameters of the models hpcdl builds (hpcdl.models; tests check these
# counts against the built models): ImageNet heads (1000 classes, 224x224),
# and the MLP of `hpcdl bench train` (1024-4096-2048-10)
MODELS = {"resnet50": 25_557_032, "resnet18": 11_689_512, "mlp": 12_609_546}
ALGORITHMS = ("ps", "ring", "tree", "hier")


@dataclass
class Network:
    """Link costs: alpha in seconds, beta in seconds per byte. Flat
    algorithms (ps, ring, tree) see the slowest link of the job: the intra-
    node one when all ranks share a node, the inter-node one otherwise."""
    alpha: float
    beta: float
    alpha_intra: float = None   # None: the same as alpha
    beta_intra: float = None    # None: the same as beta
    per_node: int = 8           # GPUs (ranks) per node
    gamma: float = 0.0          # reduction time per byte (0: pure alpha-beta)

    def intra(self):
        a = self.alpha if self.alpha_intra is None else self.alpha_intra
        b = self.beta if self.beta_intra is None else self.beta_intra
        return a, b


@dataclass
class Workload:
    """What one training step does on each GPU."""
    params: int                 # parameters (gradient elements)
    compute_s: float            # forward + backward per step, seconds
    bytes_per_param: int = 4    # 4 fp32, 2 fp16/bf16 compressed
    batch_per_gpu: int = 32     # samples per GPU per step
    overlap: float = 0.0        # fraction of compute that hides communication
    name: str = "model"

    @property
    def nbytes(self):
        return self.params * self.bytes_per_param


@dataclass
class Prediction:
    algorithm: str
    gpus: int
    comm_s: float
    exposed_s: float
    step_s: float
    samples_per_s: float
    efficiency: float


def comm_time(algorithm, n, nbytes, net):
    """Seconds of one all-reduce of nbytes over n ranks with the algorithm."""
    ai, bi = net.intra()
    if algorithm == "hier":
        return cost.hierarchical_allreduce(n, nbytes, net.per_node, ai, bi, net.alpha,
                                           net.beta, net.gamma)
    if algorithm not in cost.ALLREDUCE:
        raise ValueError("unknown algorithm %r; use one of %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    a, b = (ai, bi) if n <= net.per_node else (net.alpha, net.beta)
    return cost.ALLREDUCE[algorithm](n, nbytes, a, b, net.gamma)


def predict(algorithm, n, work, net):
    """The Prediction for one algorithm on n GPUs."""
    comm = comm_time(algorithm, n, work.nbytes, net)
    exposed = max(0.0, comm - work.overlap * work.compute_s)
    step = work.compute_s + exposed
    return Prediction(algorithm, n, comm, exposed, step, n * work.batch_per_gpu / step,
                      work.compute_s / step)


def validate(gpus, work, net, algorithms):
    """ValueError naming the first impossible input."""
    if not gpus:
        raise ValueError("give at least one GPU count (--gpus 8,64,512)")
    for n in gpus:
        if int(n) != n or n < 1:
            raise ValueError("GPU counts must be positive integers (got %r)" % (n,))
    checks = [(work.params > 0, "the parameter count must be > 0 (got %r)" % work.params),
              (work.compute_s > 0, "the compute time per step must be > 0 ms"),
              (work.bytes_per_param > 0, "bytes per parameter must be > 0"),
              (work.batch_per_gpu > 0, "the batch per GPU must be > 0"),
              (0 <= work.overlap <= 1, "overlap must be between 0 and 1 (a fraction of "
                                       "the compute time; got %r)" % work.overlap),
              (net.per_node >= 1, "GPUs per node must be >= 1"),
              (min(net.alpha, net.beta, net.gamma) >= 0 and
               min(net.intra()) >= 0, "alpha, beta and gamma must be >= 0")]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    bad = [a for a in algorithms if a not in ALGORITHMS]
    if bad or not algorithms:
        raise ValueError("unknown algorithm(s) %s; use a comma-separated subset of %s"
                         % (", ".join(map(repr, bad)) or "(none)", ",".join(ALGORITHMS)))
    if "hier" in algorithms:
        for n in gpus:
            if n > net.per_node and n % net.per_node:
                raise ValueError("%d GPUs do not fill nodes of %d (--gpus-per-node): the "
                                 "hierarchical model needs whole nodes" % (n, net.per_node))


def scaling_table(gpus, work, net, algorithms=ALGORITHMS):
    """Predictions for every algorithm (outer) and GPU count (inner)."""
    validate(gpus, work, net, algorithms)
    return [predict(a, n, work, net) for a in algorithms for n in gpus]


def resolve_model(text):
    """(name, parameters) from a model name (MODELS) or a count ('25.6M', '1e8')."""
    key = str(text).strip().lower()
    if key in MODELS:
        return key, MODELS[key]
    count = parse_count(key)
    if count is None:
        raise ValueError("unknown model %r: use one of %s, or a parameter count such as "
                         "25.6M, 1.5B or 100000000" % (text, ", ".join(MODELS)))
    if count <= 0:
        raise ValueError("the parameter count must be > 0 (got %r)" % (text,))
    return "%s parameters" % text, count
