"""sim.py - `hpcdl sim scaling`: predicted step time, throughput and scaling
efficiency of data-parallel training for each all-reduce algorithm, from
the alpha-beta model (hpcdl/sim/). Runs in one process; no MPI needed.
`hpcdl sim step`, `profile` and `records` live in sim_terms.py, `pipeline` in
sim_pipeline.py, `time-to-accuracy` in sim_statistical.py.

    hpcdl sim scaling --model resnet50 --gpus 8,64,512,2048 --alpha 5us --beta 12.5GB/s \\
        --step-compute-ms 100 --overlap 0.5 --plot scaling.png
"""
from .errors import UsageError
from .sim_common import add_network_flags, network_values, parse_gpus
from . import sim_pipeline
from . import sim_statistical
from . import sim_terms


def register(subparsers):
    p = subparsers.add_parser(
        "sim", help="cost-model simulations (scaling, step, profile, records, pipeline, "
             "time-to-accuracy)",
        description="Simulations from the alpha-beta cost model of each collective "
                    "(docs/sim.md). Measure alpha and beta with 'hpcdl bench calibrate'.",
        epilog="example: hpcdl sim scaling --model resnet50 --gpus 8,64,512 --alpha 5us "
               "--beta 12.5GB/s --step-compute-ms 100")
    sub = p.add_subparsers(dest="simulation", metavar="SIMULATION")
    p.set_defaults(func=lambda args: p.print_help() or 2)
    _register_scaling(sub)
    sim_terms.register(sub)
    sim_pipeline.register(sub)
    sim_statistical.register(sub)


def _register_scaling(sub):
    p = sub.add_parser(
        "scaling", help="step time, throughput and efficiency against GPU count",
        description="Predicts, for each all-reduce algorithm (parameter server, ring, "
                    "binomial tree, hierarchical) and GPU count, the communication time "
                    "of one gradient all-reduce, the step time (compute + the "
                    "communication not hidden behind it), samples/s and the scaling "
                    "efficiency (compute / step). Times accept units (5us, 1.5ms); beta "
                    "is a time per byte (0.08ns) or a bandwidth (12.5GB/s).",
        epilog="example: hpcdl sim scaling --model resnet50 --gpus 8,64,512,2048 "
               "--alpha 5us --beta 12.5GB/s --alpha-intra 2us --beta-intra 150GB/s "
               "--step-compute-ms 100 --overlap 0.5")
    p.add_argument("--model", default="resnet50",
                   help="resnet50, resnet18, mlp, or a parameter count (25.6M, 1.5B, "
                        "1e8); default resnet50")
    p.add_argument("--gpus", default="8,64,512,2048", help="GPU counts (default 8,64,512,2048)")
    add_network_flags(p)
    p.add_argument("--step-compute-ms", type=float, required=True,
                   help="forward + backward time of one step on one GPU, in ms (measure "
                        "it: it depends on the GPU, model and batch)")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of the compute time that communication can hide behind "
                        "(0..1; default 0, no overlap)")
    p.add_argument("--batch-per-gpu", type=int, default=32, help="samples (default 32)")
    p.add_argument("--bytes-per-param", type=int, default=4,
                   help="4 for fp32 gradients, 2 for fp16/bf16 compression (default 4)")
    p.add_argument("--algorithms", default="ps,ring,tree,hier",
                   help="comma-separated subset of ps,ring,tree,hier (default all)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the predictions")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="efficiency and throughput against GPU count")
    p.set_defaults(func=run_scaling)


def run_scaling(args):
    from ..sim import report, scaling  # on use: loads numpy
    try:
        name, params = scaling.resolve_model(args.model)
        alpha, beta, alpha_intra, beta_intra, gamma = network_values(args)
        net = scaling.Network(alpha, beta, alpha_intra, beta_intra, args.gpus_per_node, gamma)
        work = scaling.Workload(params, args.step_compute_ms / 1e3, args.bytes_per_param,
                                args.batch_per_gpu, args.overlap, name)
        algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        rows = scaling.scaling_table(parse_gpus(args.gpus), work, net, algorithms)
    except ValueError as e:
        raise UsageError(str(e))
    print(report.render(rows, work, net), end="", flush=True)
    if args.json:
        report.write_json(args.json, rows, work, net)
        print("# wrote %s" % args.json)
    if args.plot:
        report.write_plot(args.plot, rows, work, net)
        print("# wrote %s" % args.plot)
    return 0
