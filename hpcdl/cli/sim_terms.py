"""sim_terms.py - `hpcdl sim step`, `hpcdl sim profile` and `hpcdl sim
records`: the step model term by term (hpcdl/sim/terms.py), the profile it
reads (hpcdl/sim/profile.py) and the published runs it is checked against
(hpcdl/sim/records.py). Registered by cli/sim.py.

    hpcdl sim profile --model mlp --json prof.json
    hpcdl sim step --model mlp --profile prof.json --calibration cal.json --gpus 2,4,8
    hpcdl sim records --json records.json
"""
import json

from .errors import UsageError
from .sim_common import add_network_flags, network_values, parse_gpus
from ..utils.launch import env_rank
from ..utils.atomic import write_json

TERM_NAMES = ("buckets", "shared", "compression", "stragglers", "overheads", "timeshare", "cpu",
              "allreduce")


def register(sub):
    """Adds step, profile and records to `hpcdl sim`'s subcommands."""
    _register_step(sub)
    _register_profile(sub)
    _register_records(sub)


def _register_step(sub):
    p = sub.add_parser(
        "step", help="step time and efficiency term by term (buckets, stragglers, ...)",
        description="Predicts the step time on each GPU count with the terms the course "
                    "formula leaves out, switched on one by one (buckets, shared, "
                    "compression, stragglers, overheads, and from a calibration of the "
                    "hosts timeshare, cpu, allreduce; docs/sim.md), and prints what "
                    "each term adds. Reads a profile from 'hpcdl sim profile' or takes "
                    "--step-compute-ms with equal synthetic layers.",
        epilog="example: hpcdl sim step --model resnet50 --gpus 8,256 --alpha 5us "
               "--beta 50Gb/s --nics-per-node 1 --step-compute-ms 200 --spread 0.02")
    p.add_argument("--model", default=None,
                   help="model name or parameter count (default: the profile's model, "
                        "else resnet50); a profile of another model is an error")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="per-layer sizes and backward times from 'hpcdl sim profile'")
    p.add_argument("--gpus", default="8,64,256", help="GPU counts (default 8,64,256)")
    p.add_argument("--base-gpus", type=int, default=1,
                   help="efficiency against this GPU count (default 1)")
    add_network_flags(p)
    p.add_argument("--nics-per-node", type=int, default=None,
                   help="network adapters per node (default: one per GPU)")
    p.add_argument("--algorithm", default="hier", help="hier or ring (default hier)")
    p.add_argument("--step-compute-ms", type=float, default=None,
                   help="forward + backward per step (without --profile)")
    p.add_argument("--backward-share", type=float, default=2 / 3,
                   help="backward's share of the compute without --profile (default 2/3)")
    p.add_argument("--layers", type=int, default=50,
                   help="equal synthetic layers without --profile (default 50)")
    p.add_argument("--batch-per-gpu", type=int, default=32)
    p.add_argument("--overlap", type=float, default=0.0,
                   help="the course formula's overlap fraction (used with buckets off)")
    p.add_argument("--fusion-mb", type=float, default=25.0,
                   help="fusion bucket size in MiB (0: one bucket per layer; default 25)")
    p.add_argument("--first-bucket-mb", type=float, default=1.0, help="default 1")
    p.add_argument("--spread", type=float, default=None,
                   help="per-rank compute spread sigma/mean (default: the profile's, else 0)")
    p.add_argument("--optimizer-ms", type=float, default=None,
                   help="optimizer step (default: the profile's, else 0)")
    p.add_argument("--data-ms", type=float, default=0.0, help="data loading not hidden")
    p.add_argument("--bucket-latency-us", type=float, default=0.0,
                   help="launch/negotiation latency per bucket")
    p.add_argument("--wire-bytes", type=int, default=4,
                   help="bytes per gradient element on the wire (2: fp16/bf16)")
    p.add_argument("--compress-gamma", default="0",
                   help="encode + decode time per gradient byte (e.g. 0.01ns)")
    p.add_argument("--cores-per-rank", type=float, default=None,
                   help="a host's cores / the ranks on it (timeshare and cpu terms; "
                        "default: the calibration's, else the two terms are left out)")
    p.add_argument("--cpu-per-byte", default=None,
                   help="host CPU time per gradient byte all-reduced, per rank (e.g. 4ns; "
                        "default: the calibration's, else 0)")
    p.add_argument("--threads", type=float, default=None,
                   help="compute threads per rank (default: the profile's, else 1)")
    p.add_argument("--terms", default=",".join(TERM_NAMES),
                   help="terms to switch on (default all)")
    p.add_argument("--measured", default=None, metavar="BENCH.json",
                   help="compare with 'hpcdl bench train --json' (its rank count)")
    p.add_argument("--compute-from-measured", action="store_true",
                   help="scale forward, backward and optimizer so that they add up to the "
                        "--measured run's no-comm step (its compute under the same load); "
                        "leave timeshare out then: that step already shares the cores")
    p.add_argument("--json", default=None, metavar="FILE", help="write the breakdowns")
    p.set_defaults(func=run_step)


def _register_profile(sub):
    p = sub.add_parser(
        "profile", help="measure per-layer gradient sizes, backward times, step spread",
        description="Trains a few steps of a model on this process (or on every rank "
                    "under mpirun) with a hook on every parameter: the gradient sizes "
                    "in the order backward produces them, the backward time until each "
                    "is ready, forward, optimizer and step times, and the step-time "
                    "spread sigma/mean. The JSON feeds 'hpcdl sim step --profile'.")
    p.add_argument("--model", required=True,
                   help="mlp, resnet18, resnet50 (as 'hpcdl bench train' builds them) or "
                        "a Python entry point module:function returning a torch module")
    p.add_argument("--input-shape", default=None,
                   help="sample shape for an entry point, e.g. 3,32,32 or 784")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="samples per step (default 32)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default); match the run you predict, "
                        "e.g. 1 for 'hpcdl bench train -n 2' on 2 cores")
    p.add_argument("--json", default=None, metavar="FILE", help="write the profile")
    p.set_defaults(func=run_profile)


def _register_records(sub):
    p = sub.add_parser(
        "records", help="the step model against published large-scale runs",
        description="For each published run in hpcdl/sim/records.json (or --file): the "
                    "inputs with their sources, the predicted and reported scaling "
                    "efficiency (or time per epoch), each term's share of the loss, and "
                    "why where the model misses by more than 5 points.")
    p.add_argument("--file", default=None, help="a records file (default: the package's)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the rows as JSON (to stdout without FILE)")
    p.set_defaults(func=run_records)


def parse_shape(text):
    try:
        return tuple(int(d) for d in text.split(",")) if text else None
    except ValueError:
        raise UsageError("bad --input-shape %r: give whole numbers, e.g. 3,32,32" % text)


def run_profile(args):
    from ..sim import profile  # on use: loads numpy
    if args.batch < 1 or args.steps < 2 or args.warmup < 0:
        raise UsageError("--batch must be >= 1, --steps >= 2 (for a spread), --warmup >= 0")
    try:
        if args.threads > 0:
            import torch
            torch.set_num_threads(args.threads)
        doc = profile.run(args.model, args.batch, args.steps, args.warmup,
                          parse_shape(args.input_shape), args.classes)
    except ValueError as e:
        raise UsageError(str(e))
    from ..sim.units import format_time  # on use: loads numpy
    lines = ["# hpcdl sim profile: %s, %d parameters, batch %d, %s"
             % (doc["model"], doc["params"], doc["batch"], doc["spread_over"]),
             "#  forward %s, backward %s, optimizer %s, step %s (medians), step spread "
             "sigma/mean %.3f" % tuple([format_time(doc[k]) for k in
                                        ("forward_s", "backward_s", "optimizer_s", "step_s")]
                                       + [doc["spread"]]),
             "#%40s %14s %14s" % ("gradient (backward order)", "bytes", "backward(us)")]
    lines += [" %40s %14d %14.1f" % (r["name"][-40:], r["nbytes"], 1e6 * r["backward_s"])
              for r in doc["layers"]]
    _print_once(lines)
    if args.json and _rank0():
        write_json(args.json, doc, indent=1)
        _print_once(["# wrote %s" % args.json])
    return 0


def _rank0():
    return (env_rank() or 0) == 0


def _print_once(lines):
    if _rank0():
        print("\n".join(lines), flush=True)


def step_inputs(args):
    """(terms.Step, terms.Fabric, source) from the flags, --profile and
    --calibration; UsageError naming the bad input."""
    from ..sim import profile, scaling, terms  # on use: loads numpy
    from ..sim.units import parse_beta  # on use: loads numpy
    if args.profile:
        doc = profile.load(args.profile, model=args.model)
        name = doc["model"]
        layers, fwd = profile.layers_of(doc), doc["forward_s"]
        spread, opt_s = doc["spread"], doc.get("optimizer_s", 0.0)
        threads = doc.get("threads")
        source = "profile %s" % args.profile
    else:
        if args.step_compute_ms is None:
            raise UsageError("give --profile FILE (from 'hpcdl sim profile') or "
                             "--step-compute-ms")
        if not (args.step_compute_ms > 0 and 0 < args.backward_share <= 1 and args.layers > 0):
            raise UsageError("--step-compute-ms must be > 0, --backward-share in (0, 1] and "
                             "--layers > 0")
        name, params = scaling.resolve_model(args.model or "resnet50")
        bwd = args.step_compute_ms / 1e3 * args.backward_share
        layers = terms.synthetic_layers(4 * params, bwd, args.layers)
        fwd, spread, opt_s, threads = args.step_compute_ms / 1e3 - bwd, 0.0, 0.0, None
        source = "%d equal layers, backward %.0f%% of compute" % (args.layers,
                                                                100 * args.backward_share)
    alpha, beta, alpha_i, beta_i, gamma = network_values(args)
    cores, cpu_per_byte, measured = host_values(args)
    step = terms.Step(
        layers, fwd, args.batch_per_gpu, args.overlap, int(args.fusion_mb * (1 << 20)),
        int(args.first_bucket_mb * (1 << 20)),
        spread if args.spread is None else args.spread,
        opt_s if args.optimizer_ms is None else args.optimizer_ms / 1e3, args.data_ms / 1e3,
        args.bucket_latency_us / 1e6, args.wire_bytes,
        parse_beta(args.compress_gamma, "--compress-gamma"), name,
        threads if args.threads is None else args.threads)
    if args.compute_from_measured:
        step, source = scaled_to_measured(step, args, source)
    fab = terms.Fabric(alpha, beta, alpha if alpha_i is None else alpha_i,
                       beta if beta_i is None else beta_i, args.gpus_per_node,
                       args.nics_per_node, gamma, args.algorithm, cores, cpu_per_byte,
                       measured)
    return step, fab, source


def host_values(args):
    """(cores per rank, CPU seconds per byte, {ranks: [(bytes, seconds)]} of
    the ring all-reduce) from the flags, else --calibration (what `hpcdl bench
    calibrate --allreduce` measured), else (None, 0, None)."""
    from ..sim.units import parse_beta  # on use: loads numpy
    cal = {}
    if args.calibration:
        from ..sim.calibrate import load_calibration  # on use: loads numpy
        cal = load_calibration(args.calibration)
    cores = args.cores_per_rank if args.cores_per_rank is not None else cal.get("cores_per_rank")
    cpb = (parse_beta(args.cpu_per_byte, "--cpu-per-byte") if args.cpu_per_byte is not None
           else cal.get("cpu_per_byte", 0.0))
    measured = None
    if "allreduce" in cal:
        table = [(r["bytes"], r["time_us"] / 1e6) for r in cal["allreduce"]["rows"]
                 if r["bytes"] > 0 and r["time_us"] > 0]
        measured = {cal["allreduce"]["ranks"]: table} if table else None
    return cores, cpb, measured


def scaled_to_measured(step, args, source):
    """step with forward, backward and optimizer scaled by one factor so that
    they add up to the --measured run's no-comm step."""
    from ..sim import compare, terms  # on use: loads numpy
    if not args.measured:
        raise ValueError("--compute-from-measured needs --measured BENCH.json")
    nocomm = compare.measured_step(args.measured, impl="no-comm")[0]
    f = nocomm / (step.compute_s + step.optimizer_s)
    layers = [terms.Layer(x.nbytes, x.backward_s * f, x.name) for x in step.layers]
    step = terms.with_terms(step, layers=layers, forward_s=step.forward_s * f,
                            optimizer_s=step.optimizer_s * f)
    return step, "%s, scaled x%.3g to the measured no-comm step %.1f ms" % (source, f,
                                                                          1e3 * nocomm)


def run_step(args):
    from ..sim import compare, terms, terms_report  # on use: loads numpy
    try:
        step, fab, source = step_inputs(args)
        gpus = parse_gpus(args.gpus)
        enabled = [t.strip() for t in args.terms.split(",") if t.strip()]
        bad = [t for t in enabled if t not in terms.TERMS]
        if bad:
            raise ValueError("unknown term(s) %s: use a comma-separated subset of %s"
                             % (", ".join(map(repr, bad)), ",".join(terms.TERMS)))
        measured = compare.measured_step(args.measured) if args.measured else None
        if measured and measured[1] not in gpus:
            gpus.append(measured[1])
        terms.validate(gpus, step, fab, args.base_gpus)
    except ValueError as e:
        raise UsageError(str(e))
    rows = [terms.breakdown(n, step, fab, enabled, args.base_gpus) for n in gpus]
    lines = terms_report.header(step, fab, enabled, source) + terms_report.table(rows, enabled)
    doc = {"rows": [vars(b) for b in rows]}
    if measured:
        at = next(b for b in rows if b.gpus == measured[1])
        doc["measured"] = compare.against(at, measured[0])
        lines.append("# measured (%s, %d ranks, %s): %.3f ms per step = %.2fx the prediction"
                     % (args.measured, measured[1], measured[2], 1e3 * measured[0],
                        doc["measured"]["ratio"]))
    print("\n".join(lines), flush=True)
    if args.json:
        write_json(args.json, doc, indent=1)
        print("# wrote %s" % args.json)
    return 0


def run_records(args):
    from ..sim import records  # on use: loads numpy
    try:
        rows = [records.predict(r) for r in records.load(args.file or records.PATH)]
    except ValueError as e:
        raise UsageError(str(e))
    if args.json == "-":
        print(json.dumps(rows, indent=1))
        return 0
    print("\n".join(records.table(rows)), flush=True)
    if args.json:
        write_json(args.json, rows, indent=1)
        print("# wrote %s" % args.json)
    return 0
