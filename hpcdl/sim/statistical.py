"""statistical.py - time to accuracy at scale: the steps a run needs to reach
its target (statistical efficiency) times the time of one step (hardware
efficiency, from the alpha-beta model), and the global batch that makes
their product smallest on N GPUs. Pure functions; `hpcdl sim
time-to-accuracy` prints them (docs/sim.md).

Names used below:

    B        global batch (samples per step, all ranks); b = B / N per GPU
    S(B)     steps to the target at batch B (McCandlish et al. 2018, eq. 2.11):
                 S(B) = S_min (1 + B_noise / B)
             S_min: the fewest steps (B -> infinity); B_noise: the noise scale,
             the batch at which S = 2 S_min (the critical batch). Fitted to a
             sweep's measured steps by `hpcdl bench large-batch`.
    E(B)     epochs to the target: S(B) B / D for D training samples; it falls
             to E_min = S_min B_noise / D as B -> 0
    c        compute per sample (forward + backward), seconds
    K(N)     what a step costs whatever its batch: the all-reduce of the
             gradient over N ranks not hidden behind compute, plus the
             optimizer step and other fixed costs
    step     c b + max(0, comm(N) - overlap c b) + fixed
    T(N, B)  S(B) x step: the time to the target

With no overlap, T = S_min (1 + B_noise/B)(c B/N + K), and dT/dB = 0 gives
the best global batch in closed form:

    B* = sqrt(N K B_noise / c)

It grows as sqrt(N K): a slow link (large K) or many GPUs want larger
batches, a slow GPU (large c) smaller ones. When K = 0 (free communication,
no fixed cost) T = S_min c (B + B_noise) / N grows with B and the smallest
batch wins; when c = 0 (free compute) T = S_min (1 + B_noise/B) K falls with
B and the largest batch allowed wins. The search below is over the batches a
GPU can hold (powers of two per GPU up to a cap, from memory), so B* is
clipped to the grid.
"""
import math
from dataclasses import dataclass

from . import scaling
from ..data import mnist1d


@dataclass
class Fit:
    """McCandlish's S = S_min (1 + B_noise / B); source says where it came from."""
    s_min: float
    b_noise: float
    source: str = "given"
    batches: tuple = None           # the measured batches the fit rests on, if known

    def beyond(self, batch):
        """True when batch lies outside the measured batches (an extrapolation)."""
        return bool(self.batches) and not min(self.batches) <= batch <= max(self.batches)


@dataclass
class Work:
    """One data-parallel step's costs apart from the link (the Network)."""
    compute_per_sample_s: float     # c: forward + backward of one sample on one GPU
    params: int                     # gradient elements all-reduced per step
    fixed_s: float = 0.0            # per step whatever the batch: optimizer, launch
    bytes_per_param: int = 4
    overlap: float = 0.0            # fraction of the compute that hides communication
    name: str = "model"


# ---------------------------------------------------------------- the steps
def _positive(value, what):
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError("%s must be a number > 0 (got %r)" % (what, value))
    return value


def check_fit(fit):
    """ValueError unless S_min and B_noise are positive numbers."""
    _positive(fit.s_min, "S_min (steps to the target at an infinite batch)")
    _positive(fit.b_noise, "B_noise (the noise scale, samples)")
    return fit


def steps_to_target(batch, fit):
    """S(B) = S_min (1 + B_noise / B): 2 S_min at B = B_noise."""
    _positive(batch, "the global batch")
    return fit.s_min * (1 + fit.b_noise / batch)


def epochs_to_target(batch, fit, dataset_size):
    """S(B) B / D: passes over D training samples until the target."""
    _positive(dataset_size, "the dataset size")
    return steps_to_target(batch, fit) * batch / dataset_size


def optimal_batch(n, per_step_s, fit, compute_per_sample_s):
    """B* = sqrt(N K B_noise / c), the continuous best global batch with no
    overlap; infinite when compute is free, 0 when per-step costs are."""
    if compute_per_sample_s <= 0:
        return math.inf
    return math.sqrt(n * per_step_s * fit.b_noise / compute_per_sample_s)


# ---------------------------------------------------------------- the time
def step_time(n, local_batch, work, net, algorithm="ring"):
    """(comm, step) seconds of one step on n GPUs of local_batch samples each:
    compute c b, the all-reduce exposed beyond overlap x compute, the fixed cost."""
    compute = work.compute_per_sample_s * local_batch
    comm = scaling.comm_time(algorithm, n, work.params * work.bytes_per_param, net)
    return comm, compute + max(0.0, comm - work.overlap * compute) + work.fixed_s


def time_to_target(n, local_batch, fit, work, net, algorithm="ring", dataset_size=None):
    """One row: the global batch N b, S(B), the step, T = S x step, epochs."""
    batch = n * local_batch
    comm, step = step_time(n, local_batch, work, net, algorithm)
    steps = steps_to_target(batch, fit)
    return {"gpus": n, "local_batch": local_batch, "batch": batch, "steps": steps,
            "comm_s": comm, "step_s": step, "time_s": steps * step,
            "epochs": steps * batch / dataset_size if dataset_size else None,
            "beyond_fit": fit.beyond(batch)}


def local_batch_grid(max_local, min_local=1):
    """Powers of two from min_local up to max_local, and max_local itself."""
    if int(min_local) != min_local or int(max_local) != max_local or not \
            1 <= min_local <= max_local:
        raise ValueError("the local batches must be whole numbers with 1 <= min <= max "
                         "(got min %r, max %r)" % (min_local, max_local))
    grid, b = [], 1
    while b <= max_local:
        if b >= min_local:
            grid.append(b)
        b *= 2
    if not grid or grid[0] != min_local:
        grid.insert(0, int(min_local))
    if grid[-1] != max_local:
        grid.append(int(max_local))
    return grid


def best_batch(n, fit, work, net, local_batches, algorithm="ring", dataset_size=None):
    """The row of smallest T(N, B) over the local batches (ties: the smaller
    batch); marked 'at_cap' when it is the largest one allowed and
    'at_floor' when the smallest."""
    rows = [time_to_target(n, b, fit, work, net, algorithm, dataset_size)
            for b in sorted(local_batches)]
    best = min(rows, key=lambda r: r["time_s"])
    best["at_cap"] = best is rows[-1] and len(rows) > 1
    best["at_floor"] = best is rows[0] and len(rows) > 1
    best["continuous_batch"] = (optimal_batch(n, best["comm_s"] + work.fixed_s, fit,
                                              work.compute_per_sample_s)
                                if work.overlap == 0 else None)
    return best


def validate(gpus, fit, work, net, algorithm):
    """ValueError naming the first impossible input (scaling's checks too)."""
    check_fit(fit)
    _positive(work.compute_per_sample_s, "the compute per sample (seconds)")
    if work.fixed_s < 0:
        raise ValueError("the fixed cost per step must be >= 0 (got %r)" % work.fixed_s)
    probe = scaling.Workload(work.params, 1.0, work.bytes_per_param, 1, work.overlap,
                             work.name)
    scaling.validate(gpus, probe, net, [algorithm])


def table(gpus, fit, work, net, local_batches, algorithm="ring", dataset_size=None):
    """The best batch for each GPU count, with the speedup of T over the
    smallest count and the scaling efficiency speedup / (N / N_0)."""
    validate(gpus, fit, work, net, algorithm)
    if dataset_size is not None:
        _positive(dataset_size, "the dataset size")
    rows = [best_batch(n, fit, work, net, local_batches, algorithm, dataset_size)
            for n in sorted(gpus)]
    t0, n0 = rows[0]["time_s"], rows[0]["gpus"]
    for r in rows:
        r["speedup"] = t0 / r["time_s"]
        r["efficiency"] = r["speedup"] * n0 / r["gpus"]
    return rows


# ---------------------------------------------------------------- a study's fit
def fit_from_study(doc, recipe=None, source="study"):
    """The Fit of `hpcdl bench large-batch --json`'s rows (fit_s_min,
    fit_b_noise per recipe), for recipe, or the only recipe with a fit.
    ValueError saying which recipes have one."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError("no 'rows' list: give the JSON of 'hpcdl bench large-batch --json "
                         "FILE'")
    fits = {}
    for r in rows:
        if isinstance(r, dict) and r.get("fit_s_min") and r.get("fit_b_noise"):
            fits.setdefault(r.get("recipe"), (r["fit_s_min"], r["fit_b_noise"]))
    if recipe is None:
        if len(fits) != 1:
            raise ValueError("%s: choose a recipe with --recipe (fitted: %s)"
                             % ("no recipe reached the target at two batch sizes, so none "
                                "has a fit" if not fits else "several recipes have a fit",
                                ", ".join(map(str, fits)) or "none"))
        recipe = next(iter(fits))
    if recipe not in fits:
        raise ValueError("recipe %r has no fit in the study (fitted: %s)"
                         % (recipe, ", ".join(map(str, fits)) or "none"))
    s_min, b_noise = fits[recipe]
    batches = tuple(sorted(b for b, _ in measured_points(doc, recipe)))
    return check_fit(Fit(float(s_min), float(b_noise), "%s, recipe %s" % (source, recipe),
                         batches or None))


def measured_points(doc, recipe):
    """[(B, measured steps to the target)] of one recipe in a study's rows."""
    return [(r["batch"], r["steps_to_target"]) for r in doc.get("rows", [])
            if r.get("recipe") == recipe and r.get("steps_to_target") is not None]


def train_samples(doc):
    """Training samples of a study's --data when they can be known here
    (mnist1d[:N]: N less its test set), else None."""
    data = str(doc.get("data", ""))
    try:
        n = mnist1d.parse(data)
    except ValueError:
        return None
    return mnist1d.split_sizes(n)[0] if n else None
