"""slurm.py - `hpcdl slurm list | render | submit | summary`: the sbatch
templates in slurm/, filled in safely, submitted, and a sweep's scaling table.

    hpcdl slurm list                          # templates; `list NAME`: its variables
    hpcdl slurm render single-node --ntasks-per-node 4 -- hpcdl train --epochs 30
    hpcdl slurm submit multi-node-gpu --nodes 4 --partition gpu -- hpcdl train
    hpcdl slurm summary runs/sweep-1234 --plot
"""
import os
import sys

from .errors import UsageError
from .. import slurm
from ..utils.atomic import write_json

# flag -> template variable; each is also `--set NAME=VALUE`
RESOURCE_FLAGS = (("--nodes", "NODES", "N", "nodes"),
                  ("--ntasks-per-node", "NTASKS_PER_NODE", "K", "ranks per node (one per GPU "
                                                                 "on GPU nodes)"),
                  ("--gpus-per-node", "GPUS_PER_NODE", "G", "GPUs per node"),
                  ("--time", "TIME", "HH:MM:SS", "wall-clock limit ([D-]HH:MM:SS)"),
                  ("--partition", "PARTITION", "P", "partition (queue)"),
                  ("--account", "ACCOUNT", "A", "account charged"),
                  ("--job-name", "JOB_NAME", "J", "job name"))


def register(sub):
    p = sub.add_parser(
        "slurm", help="sbatch templates: list, render, submit; sweep summary",
        description="Slurm job scripts from hpcdl's templates (single-node, multi-node-gpu, "
                    "scaling-sweep, preemptible): list them and their variables, render one "
                    "with your values (every value checked, then quoted), submit it with "
                    "sbatch, and tabulate a scaling sweep's results.",
        epilog="example: hpcdl slurm submit single-node --ntasks-per-node 4 --time 00:20:00 "
               "-- hpcdl train --epochs 30 --out runs/digits")
    actions = p.add_subparsers(dest="slurm_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    _register_list(actions)
    for name in ("render", "submit"):
        _register_render(actions, name)
    _register_summary(actions)


# ---------------------------------------------------------------- list
def _register_list(actions):
    p = actions.add_parser(
        "list", help="the templates, or one template's variables",
        description="Without TEMPLATE: every template with what it is for and where it "
                    "lives. With TEMPLATE: its variables (for --set), their defaults and "
                    "comments; '(off)' marks #SBATCH lines that are left out until set.",
        epilog="example: hpcdl slurm list preemptible")
    p.add_argument("template", nargs="?", metavar="TEMPLATE")
    p.set_defaults(func=run_list)


def run_list(args):
    if args.template:
        t = _load(args.template)
        print("# %s (%s): %s" % (t.name, t.path, t.description))
        print("# %-16s %-7s %-28s %s" % ("variable", "kind", "default", "comment"))
        for s in t.settings.values():
            default = s.default + ("" if s.on else " (off)")
            print("  %-16s %-7s %-28s %s" % (s.name, s.kind, default, s.comment.lstrip("# ")))
        if t.command_line >= 0:
            print("  %-16s %-7s %s" % ("COMMAND", "-- CMD", t.lines[t.command_line]))
        return 0
    found = slurm.available()
    if not found:
        raise UsageError("no templates found (looked in %s)" % ", ".join(slurm.template_dirs()))
    width = max(len(n) for n in found)
    for name, path in found.items():
        print("%-*s  %s" % (width, name, _load(name).description))
    print("# in %s" % os.path.dirname(next(iter(found.values()))))
    return 0


def _load(name):
    try:
        return slurm.load(name)
    except slurm.TemplateError as e:
        raise UsageError(str(e))


# ---------------------------------------------------------------- render / submit
def _register_render(actions, name):
    submit = name == "submit"
    p = actions.add_parser(
        name, help="fill a template in and sbatch it, printing the job id" if submit
        else "fill a template in and print the script",
        usage="hpcdl slurm %s TEMPLATE [options] [-- CMD ...]" % name,
        description=("Render TEMPLATE (as `hpcdl slurm render`) and submit it with sbatch; "
                     "prints the job id, or sbatch's own message when Slurm refuses the "
                     "job." if submit else
                     "Print TEMPLATE with your values. CMD (after --) becomes the command "
                     "every rank runs. Counts must be positive, times [D-]HH:MM:SS, names "
                     "plain words; any value with shell syntax (; ` $( newline ...) is an "
                     "error, and every value is written single-quoted.") +
                    " `--set NAME=` (empty) turns an #SBATCH line off.",
        epilog="example: hpcdl slurm %s multi-node-gpu --nodes 4 --ntasks-per-node 4 "
               "--gpus-per-node 4 --partition gpu --set MODULES='openmpi/4.1 cuda/12.4' "
               "-- hpcdl train --model resnet50 --data synthetic:3x224x224:1000:51200"
               % name)
    p.add_argument("template", metavar="TEMPLATE", help="a name from `hpcdl slurm list`, or "
                                                        "a template file")
    for flag, var, meta, text in RESOURCE_FLAGS:
        p.add_argument(flag, dest=var, metavar=meta, help=text + " (= --set %s=...)" % var)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="any template variable (repeatable; see hpcdl slurm list TEMPLATE)")
    if submit:
        p.add_argument("--save", metavar="FILE", help="also write the script to FILE "
                                                      "(sbatch then reads it from there)")
    _split_at_dashes(p)
    p.set_defaults(func=run_submit if submit else run_render)


def _split_at_dashes(parser):
    """argparse cannot parse TEMPLATE, options, then `-- CMD ...` with CMD a
    positional (it matches the empty CMD too early), so everything after the
    first '--' is cut off before parsing and kept as args.cmd (None if no '--')."""
    parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        cmd = None
        if "--" in args:
            i = args.index("--")
            args, cmd = args[:i], args[i + 1:]
        ns, extra = parse(args, namespace)
        ns.cmd = cmd
        return ns, extra

    parser.parse_known_args = parse_known_args


def rendered(args):
    """The script text for the parsed render/submit arguments; UsageError if bad."""
    try:
        values = slurm.parse_sets(args.sets)
        flags = {}
        for flag, var, _, _ in RESOURCE_FLAGS:
            value = getattr(args, var)
            if value is not None:
                values[var], flags[var] = value, flag
        if args.cmd == []:
            raise slurm.RenderError("nothing after --; give the command, e.g. -- hpcdl train")
        return slurm.render(args.template, values, args.cmd, flags)
    except (slurm.RenderError, slurm.TemplateError) as e:
        raise UsageError(str(e))


def run_render(args):
    sys.stdout.write(rendered(args))
    return 0


def run_submit(args):
    script = rendered(args)  # every check first: nothing is written or submitted on error
    try:
        job = slurm.sbatch(script, save=args.save)
    except slurm.SubmitError as e:
        raise UsageError(str(e))
    print("hpcdl slurm: submitted %s as job %s" % (args.template, job), file=sys.stderr)
    print(job)
    return 0


# ---------------------------------------------------------------- summary
def _register_summary(actions):
    p = actions.add_parser(
        "summary", help="scaling table (and plot) of a sweep's runs",
        description="Read every summary.json below DIR (one per run, written by hpcdl "
                    "train --out; scaling-sweep.sbatch puts each array task's run in "
                    "DIR/<sweep>-<value>) and print one row per run, sorted by ranks: ranks, "
                    "nodes, global batch, samples/s, speed-up and efficiency against the "
                    "smallest run.",
        epilog="example: hpcdl slurm summary runs/sweep-1234 --plot runs/sweep-1234/scaling.png")
    p.add_argument("folder", metavar="DIR")
    p.add_argument("--plot", nargs="?", const="", default=None, metavar="FILE.png",
                   help="write throughput and efficiency against ranks (default file: "
                        "DIR/scaling.png)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.set_defaults(func=run_summary)


def run_summary(args):
    try:
        runs, unfinished = slurm.collect(args.folder)
    except slurm.SummaryError as e:
        raise UsageError(str(e))
    rows = slurm.scaling_table(runs)
    print(slurm.format_table(rows, args.folder))
    if unfinished:
        print("# unfinished (no summary.json): %s" % ", ".join(unfinished))
    if args.json:
        write_json(args.json, rows, indent=1)
    if args.plot is not None:
        path = args.plot or os.path.join(args.folder, "scaling.png")
        slurm.plot(rows, path, args.folder)
        print("# plot: %s" % path)
    return 0
