"""sim_pipeline.py - `hpcdl sim pipeline`: the bubble (p - 1) / (m + p - 1)
and the point-to-point messages between stages of a pipeline-parallel step,
for each micro-batch count m (hpcdl/sim/pipeline.py). One process; no MPI.
Registered by cli/sim.py.

    hpcdl sim pipeline --stages 4 --micro-batches 1,4,8,16 --batch 64 \\
        --activation-elements 1M --step-compute-ms 400 --alpha 5us --beta 12.5GB/s
"""

from .errors import UsageError
from ..utils.atomic import write_json


def register(sub):
    p = sub.add_parser(
        "pipeline", help="pipeline parallelism: bubble and stage-to-stage messages",
        description="Predicts a GPipe step of --stages balanced stages for each "
                    "micro-batch count: the bubble (p-1)/(m+p-1), the activation (and "
                    "its gradient) each micro-batch sends across a stage boundary with "
                    "its alpha-beta time, the step time, and the activations GPipe and "
                    "1F1B keep (docs/sim.md). Times accept units (5us, 1.5ms); beta is "
                    "a time per byte (0.08ns) or a bandwidth (12.5GB/s).",
        epilog="example: hpcdl sim pipeline --stages 4 --micro-batches 1,4,8,16 --batch 64 "
               "--activation-elements 1M --bytes-per-element 2 --step-compute-ms 400 "
               "--alpha 5us --beta 12.5GB/s")
    p.add_argument("--stages", type=int, required=True, help="pipeline stages p (devices)")
    p.add_argument("--micro-batches", default="1,2,4,8,16,32",
                   help="micro-batch counts m per step (default 1,2,4,8,16,32)")
    p.add_argument("--batch", type=int, required=True,
                   help="samples per step through the pipeline (split into m micro-batches)")
    p.add_argument("--activation-elements", required=True,
                   help="elements per sample crossing a stage boundary (an MLP: its width; "
                        "a transformer: sequence length x hidden size; 4096, 1M)")
    p.add_argument("--bytes-per-element", type=int, default=4,
                   help="4 for fp32 activations, 2 for fp16/bf16 (default 4)")
    p.add_argument("--step-compute-ms", type=float, required=True,
                   help="forward + backward of the whole model on the whole batch on one "
                        "device, in ms (measure it)")
    p.add_argument("--backward-share", type=float, default=2 / 3,
                   help="backward's share of that compute (default 2/3)")
    p.add_argument("--alpha", required=True, help="latency between stages (e.g. 5us)")
    p.add_argument("--beta", required=True,
                   help="time per byte between stages (0.08ns) or bandwidth (12.5GB/s, 1Gbit/s)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows")
    p.set_defaults(func=run_pipeline)


def run_pipeline(args):
    from ..sim import pipeline  # on use: loads numpy
    # on use: loads numpy
    from ..sim.units import format_beta, format_time, parse_beta, parse_count, parse_time
    try:
        alpha, beta = parse_time(args.alpha, "--alpha"), parse_beta(args.beta, "--beta")
        elements = parse_count(args.activation_elements)
        if elements is None:
            raise ValueError("bad --activation-elements %r: give a count such as 4096, 1M "
                             "or 2.5e6" % args.activation_elements)
        try:
            counts = [int(m) for m in args.micro_batches.split(",") if m.strip()]
        except ValueError:
            raise ValueError("bad --micro-batches %r: give comma-separated whole numbers, "
                             "e.g. 1,4,8" % args.micro_batches)
        if not counts:
            raise ValueError("--micro-batches is empty: give counts such as 1,4,8")
        rows = [pipeline.predict(args.stages, m, args.step_compute_ms / 1e3, args.batch,
                                 elements, alpha, beta, args.backward_share,
                                 args.bytes_per_element) for m in counts]
    except ValueError as e:
        raise UsageError(str(e))
    p = args.stages
    print("# hpcdl sim pipeline: %d stages, batch %d, compute %g ms per step on one device "
          "(backward %.0f%%)" % (p, args.batch, args.step_compute_ms, 100 * args.backward_share))
    print("#  a message: B/m samples x %d elements x %d bytes, each way per boundary; "
          "alpha %s, beta %s" % (elements, args.bytes_per_element, format_time(alpha),
                                 format_beta(beta)))
    print("#  bubble = (p-1)/(m+p-1); step = phase(f) + phase(b), phase(t) = t + (p-1)(c+t) "
          "+ (m-1)max(t,c); ideal = compute / p")
    print("#     m   bubble   msg(MB)   msg(ms)  p2p/step(MB)   step(ms)  ideal(ms)  "
          "efficiency  activations GPipe 1F1B")
    for r in rows:
        print("%7d  %7.3f  %8.4g  %8.4g  %12.4g  %9.3f  %9.3f  %9.1f%%  %17d %4d%s"
              % (r["micro_batches"], r["bubble"], r["message_bytes"] / 1e6,
                 r["message_s"] * 1e3, r["p2p_bytes_per_step"] / 1e6, r["step_s"] * 1e3,
                 r["ideal_s"] * 1e3, 100 * r["efficiency"], r["activations_gpipe"],
                 r["activations_1f1b"], "  link-bound" if r["link_bound"] else ""))
    print("# p2p/step: bytes through one stage boundary per step (activations forward + "
          "gradients back); activations: micro-batches stage 0 keeps at once")
    if args.json:
        write_json(args.json, {"stages": p, "batch": args.batch, "activation_elements": elements,
                               "bytes_per_element": args.bytes_per_element, "alpha": alpha,
                               "beta": beta, "step_compute_s": args.step_compute_ms / 1e3,
                               "backward_share": args.backward_share, "rows": rows}, indent=1)
        print("# wrote %s" % args.json)
    return 0
