"""sim_statistical.py - `hpcdl sim time-to-accuracy`: steps to the target from
McCandlish's S = S_min (1 + B_noise / B) times the step time of the alpha-beta
model, the best global batch and the predicted time to accuracy for each GPU
count (hpcdl/sim/statistical.py). One process; no MPI. Registered by cli/sim.py.

    hpcdl sim time-to-accuracy --from study.json --profile prof.json \\
        --alpha 5us --beta 12.5GB/s --max-local-batch 512
"""
import json

from .errors import UsageError
from .sim_common import add_network_flags, network_values, parse_gpus
from ..utils.atomic import write_json

GPUS = ",".join(str(2 ** k) for k in range(3, 13))      # 8 .. 4096


def register(sub):
    p = sub.add_parser(
        "time-to-accuracy", help="best global batch and time to the target against GPU count",
        description="Predicts, for each GPU count, the global batch that reaches the target "
                    "accuracy soonest: steps S(B) = S_min (1 + B_noise/B) (McCandlish et al. "
                    "2018; the fit of 'hpcdl bench large-batch') times the step time of the "
                    "alpha-beta model (compute per sample x local batch + the all-reduce not "
                    "hidden + fixed costs), searched over local batches 1, 2, 4 .. "
                    "--max-local-batch (docs/sim.md).",
        epilog="example: hpcdl sim time-to-accuracy --s-min 145 --b-noise 8793 "
               "--compute-ms-per-sample 0.05 --model 1M --alpha 5us --beta 12.5GB/s")
    p.add_argument("--from", dest="study", default=None, metavar="STUDY.json",
                   help="take S_min and B_noise from 'hpcdl bench large-batch --json' (the "
                        "fit of --recipe); --s-min/--b-noise win")
    p.add_argument("--recipe", default=None,
                   help="which recipe's fit in --from (default: the only one with a fit)")
    p.add_argument("--s-min", type=float, default=None,
                   help="steps to the target at an infinite batch")
    p.add_argument("--b-noise", type=float, default=None,
                   help="the noise scale in samples: the batch at which the steps are 2 S_min")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="'hpcdl sim profile --json': compute per sample = (forward + "
                        "backward) / batch, the parameters, the optimizer step as fixed cost")
    p.add_argument("--compute-ms-per-sample", type=float, default=None,
                   help="forward + backward of one sample on one GPU, ms (without --profile)")
    p.add_argument("--model", default=None,
                   help="parameters all-reduced: resnet50, resnet18, mlp or a count (1.2M, "
                        "1e8); default: the profile's")
    p.add_argument("--fixed-ms", type=float, default=None,
                   help="per-step cost whatever the batch (optimizer, launch); default: the "
                        "profile's optimizer step, else 0")
    add_network_flags(p)
    p.add_argument("--algorithm", default="ring", help="ps, ring, tree or hier (default ring)")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of the compute that hides communication (default 0)")
    p.add_argument("--bytes-per-param", type=int, default=4, help="4 fp32, 2 fp16 (default 4)")
    p.add_argument("--gpus", default=GPUS, help="GPU counts (default 8,16,..,4096)")
    p.add_argument("--max-local-batch", type=int, default=256,
                   help="the most samples a GPU holds (memory); default 256")
    p.add_argument("--min-local-batch", type=int, default=1, help="default 1")
    p.add_argument("--dataset-size", type=int, default=None,
                   help="training samples, for epochs to the target (default: from "
                        "--from's mnist1d:N, else no epochs column)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows")
    p.set_defaults(func=run_time_to_accuracy)


def _fit(args):
    from ..sim import statistical  # on use: loads numpy
    doc = None
    if args.study:
        try:
            with open(args.study) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError("cannot read the study %s (%s): give the JSON of 'hpcdl bench "
                             "large-batch --json FILE'" % (args.study, e))
    if args.s_min is not None and args.b_noise is not None:
        return statistical.Fit(args.s_min, args.b_noise), doc
    if doc is None:
        raise ValueError("give --s-min and --b-noise (McCandlish's fit), or --from STUDY.json "
                         "from 'hpcdl bench large-batch --json'")
    fit = statistical.fit_from_study(doc, args.recipe, args.study)
    fit.s_min = args.s_min if args.s_min is not None else fit.s_min
    fit.b_noise = args.b_noise if args.b_noise is not None else fit.b_noise
    return fit, doc


def _work(args):
    from ..sim import profile, scaling, statistical  # on use: loads numpy
    if args.profile is None and args.compute_ms_per_sample is None:
        raise ValueError("give --compute-ms-per-sample (forward + backward of one sample, "
                         "measure it) or --profile FILE from 'hpcdl sim profile --json'")
    if args.profile is not None and args.compute_ms_per_sample is not None:
        raise ValueError("give --profile or --compute-ms-per-sample, not both")
    prof = profile.load(args.profile) if args.profile else None
    if prof is None and args.model is None:
        raise ValueError("give --model (resnet50, resnet18, mlp, or a parameter count such "
                         "as 1.2M): the gradient the all-reduce carries")
    if prof is not None:
        if not prof.get("batch"):
            raise ValueError("the profile %s has no batch: make it with 'hpcdl sim profile "
                             "--json FILE'" % args.profile)
        per_sample = (prof["forward_s"] + prof["backward_s"]) / prof["batch"]
        name, params = prof["model"], prof.get("params")
    else:
        per_sample, name, params = args.compute_ms_per_sample / 1e3, None, None
    if args.model is not None:
        name, params = scaling.resolve_model(args.model)
    if not params:
        raise ValueError("the profile %s has no parameter count: give --model COUNT"
                         % args.profile)
    fixed = args.fixed_ms / 1e3 if args.fixed_ms is not None else \
        (prof.get("optimizer_s", 0.0) if prof else 0.0)
    return statistical.Work(per_sample, params, fixed, args.bytes_per_param, args.overlap,
                            name), prof


def run_time_to_accuracy(args):
    from ..sim import scaling, statistical  # on use: loads numpy
    from ..sim.units import format_beta, format_time  # on use: loads numpy
    try:
        gpus = parse_gpus(args.gpus)
        fit, doc = _fit(args)
        work, prof = _work(args)
        alpha, beta, alpha_intra, beta_intra, gamma = network_values(args)
        net = scaling.Network(alpha, beta, alpha_intra, beta_intra, args.gpus_per_node, gamma)
        grid = statistical.local_batch_grid(args.max_local_batch, args.min_local_batch)
        size = args.dataset_size
        if size is None and doc is not None:
            size = statistical.train_samples(doc)
        rows = statistical.table(gpus, fit, work, net, grid, args.algorithm, size)
    except ValueError as e:
        raise UsageError(str(e))
    label = "" if work.name is None or work.name.endswith("parameters") else work.name + ", "
    print("# hpcdl sim time-to-accuracy: %s%d parameters (%.4g MB of gradients), compute "
          "%.4g ms per sample, fixed %.4g ms per step, overlap %g"
          % (label, work.params, work.params * work.bytes_per_param / 1e6,
             work.compute_per_sample_s * 1e3, work.fixed_s * 1e3, work.overlap))
    print("#  steps S(B) = S_min (1 + B_noise/B): S_min %.4g, B_noise %.4g (%s)%s"
          % (fit.s_min, fit.b_noise, fit.source, "; measured at batches %s"
             % ",".join("%d" % b for b in fit.batches) if fit.batches else ""))
    print("#  %s all-reduce; alpha %s, beta %s; %d GPUs per node; local batches %s"
          % (args.algorithm, format_time(alpha), format_beta(beta), args.gpus_per_node,
             ",".join(map(str, grid))))
    print("#  step = c b + max(0, comm - overlap c b) + fixed; T = S(B) x step; best B "
          "minimises T%s" % ("; epochs = S B / %d" % size if size else ""))
    print("#   gpus  local   global B     steps   epochs   comm(ms)   step(ms)  time(s)  "
          "speedup  effic.")
    for r in rows:
        mark = " cap" if r["at_cap"] else (" floor" if r["at_floor"] else "")
        mark += " beyond-fit" if r["beyond_fit"] else ""
        print("%8d %6d %10d %9.0f %8s %10.3f %10.3f %8.4g %8.2fx %6.1f%%%s"
              % (r["gpus"], r["local_batch"], r["batch"], r["steps"],
                 "%.2f" % r["epochs"] if r["epochs"] is not None else "-",
                 r["comm_s"] * 1e3, r["step_s"] * 1e3, r["time_s"], r["speedup"],
                 100 * r["efficiency"], mark))
    print("# speedup: time to the target on the fewest GPUs over this one's; effic. = "
          "speedup / (N / N0); cap/floor: the best local batch is the largest/smallest allowed")
    if any(r["beyond_fit"] for r in rows):
        print("# beyond-fit: a global batch outside the batches the fit was measured at: "
              "S(B) there is an extrapolation")
    if args.json:
        write_json(args.json, {"model": work.name, "params": work.params,
                               "compute_per_sample_s": work.compute_per_sample_s,
                               "fixed_s": work.fixed_s, "overlap": work.overlap,
                               "bytes_per_param": work.bytes_per_param, "s_min": fit.s_min,
                               "b_noise": fit.b_noise, "fit_source": fit.source,
                               "fit_batches": list(fit.batches) if fit.batches else None,
                               "algorithm": args.algorithm, "alpha": alpha, "beta": beta,
                               "alpha_intra": alpha_intra, "beta_intra": beta_intra, "gamma": gamma,
                               "gpus_per_node": args.gpus_per_node, "local_batches": grid,
                               "dataset_size": size, "rows": rows}, indent=1)
        print("# wrote %s" % args.json)
    return 0
