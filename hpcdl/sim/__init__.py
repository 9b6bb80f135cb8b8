"""hpcdl.sim - the alpha-beta cost model of each collective, a scaling
simulator for data-parallel training, and calibration of alpha and beta on
the machine at hand. Pure Python; MPI only for calibration.

    from hpcdl import sim
    sim.ring_allreduce(n=8, nbytes=100e6, alpha=5e-6, beta=1e-10)     # seconds
    work = sim.Workload(params=sim.MODELS["resnet50"], compute_s=0.1, overlap=0.5)
    rows = sim.scaling_table([8, 64, 512], work, sim.Network(alpha=5e-6, beta=1e-10))

The step model term by term (buckets, shared links, compression, stragglers,
overheads) is terms.py; profiles of real models profile.py; published runs
records.py (records.json); pipeline parallelism's bubble and stage-to-stage
messages pipeline.py; time to accuracy (steps to the target from the noise
scale x the step time, the best global batch per GPU count) statistical.py.

Command line: `hpcdl sim scaling|step|profile|records|pipeline|time-to-accuracy`
and `hpcdl bench calibrate`; formulas and their limits in docs/sim.md.
"""
from .cost import (FORMULAS, allgather, broadcast, hierarchical_allreduce, log2_rounds,
                   parameter_server, ring_allreduce, tree_allreduce)
from .scaling import (ALGORITHMS, MODELS, Network, Prediction, Workload, comm_time, predict,
                      resolve_model, scaling_table)
from .stragglers import expected_max_std_normal, slowdown
from .terms import TERMS, Fabric, Layer, Step, breakdown, step_time

__all__ = ["FORMULAS", "allgather", "broadcast", "hierarchical_allreduce", "log2_rounds",
           "parameter_server", "ring_allreduce", "tree_allreduce", "ALGORITHMS", "MODELS",
           "Network", "Prediction", "Workload", "comm_time", "predict", "resolve_model",
           "scaling_table", "expected_max_std_normal", "slowdown", "TERMS", "Fabric", "Layer",
           "Step", "breakdown", "step_time"]
