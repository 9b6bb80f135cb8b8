"""sim_common.py - what `hpcdl sim scaling` and `hpcdl sim step` share: the
link flags (--alpha, --beta, their -intra forms, --gamma, --calibration,
--gpus-per-node), reading them (a flag wins over the calibration file), and
--gpus."""
from .errors import UsageError


def add_network_flags(p):
    """--alpha/--beta (between nodes), their -intra forms, --gamma,
    --calibration and --gpus-per-node: the links, for scaling and step."""
    p.add_argument("--alpha", default=None, help="latency between nodes (e.g. 5us)")
    p.add_argument("--beta", default=None,
                   help="time per byte between nodes (e.g. 0.08ns) or bandwidth (12.5GB/s; "
                        "50Gb/s or 50Gbit/s in bits)")
    p.add_argument("--alpha-intra", default=None, help="latency inside a node "
                   "(default: as --alpha)")
    p.add_argument("--beta-intra", default=None, help="time per byte or bandwidth inside a "
                   "node (default: as --beta)")
    p.add_argument("--gamma", default=None, help="reduction time per byte (default: the "
                   "calibration's with --calibration, else 0)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="take alpha, beta (and the -intra values) from 'hpcdl bench "
                        "calibrate --json FILE'; explicit flags win")
    p.add_argument("--gpus-per-node", type=int, default=8, help="default 8")


def parse_gpus(text):
    """'8,64,512' -> [8, 64, 512] (positivity is checked with the other inputs)."""
    try:
        return [int(g) for g in str(text).split(",") if g.strip()]
    except ValueError:
        raise UsageError("bad --gpus %r: give comma-separated whole numbers, e.g. 8,64,512"
                         % text)


def network_values(args):
    """(alpha, beta, alpha_intra, beta_intra, gamma) in seconds (per byte) from
    the flags and --calibration; a flag wins over the file."""
    from ..sim.units import parse_beta, parse_time  # on use: loads numpy
    cal = {}
    if args.calibration:
        from ..sim.calibrate import load_calibration  # on use: loads numpy
        try:
            cal = load_calibration(args.calibration)
        except ValueError as e:
            raise UsageError("--calibration: %s" % e)
    flags = [("alpha", parse_time), ("beta", parse_beta), ("alpha_intra", parse_time),
             ("beta_intra", parse_beta), ("gamma", parse_beta)]
    out = []
    for name, parse in flags:
        text = getattr(args, name)
        out.append(parse(text, "--" + name.replace("_", "-")) if text is not None
                   else cal.get(name))
    if out[0] is None or out[1] is None:
        raise UsageError("give --alpha and --beta (the latency and time per byte between "
                         "nodes, e.g. --alpha 5us --beta 12.5GB/s) or --calibration FILE "
                         "from 'hpcdl bench calibrate --json FILE'")
    out[4] = out[4] or 0.0
    return out
