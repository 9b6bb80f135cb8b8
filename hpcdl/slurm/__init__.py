"""hpcdl.slurm - sbatch templates filled in safely, submitted, and the
scaling table of a sweep. The command is `hpcdl slurm` (hpcdl/cli/slurm.py).

    from hpcdl import slurm
    text = slurm.render("single-node", {"NTASKS_PER_NODE": "4"}, ["hpcdl", "train"])
    job = slurm.sbatch(text)                     # the job id, or SubmitError
    rows = slurm.scaling_table(slurm.collect("runs/sweep-12")[0])
"""
from .render import RenderError, check_time, parse_sets, quote, render
from .submit import SubmitError, sbatch
from .summary import SummaryError, collect, format_table, plot, scaling_table
from .templates import TemplateError, available, load, template_dirs

__all__ = ["render", "RenderError", "check_time", "parse_sets", "quote", "sbatch",
           "SubmitError", "collect", "scaling_table", "format_table", "plot", "SummaryError",
           "available", "load", "template_dirs", "TemplateError"]
