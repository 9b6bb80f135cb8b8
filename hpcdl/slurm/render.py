"""render.py - fills a template in: checks every value first, then writes
the script with each substituted value in single quotes.

Nothing a user passes is ever read by a shell as code: names and counts must
match strict patterns, free-form values are limited to plain characters, and
every value lands in the script single-quoted. Any bad value is a
RenderError before a line is produced.
"""
import re

from .._version import __version__
from .templates import load

COUNTS = ("NODES", "NTASKS", "NTASKS_PER_NODE", "GPUS_PER_NODE", "CPUS_PER_TASK",
          "GPUS_PER_TASK")
NAMES = ("JOB_NAME", "PARTITION", "ACCOUNT", "QOS", "RESERVATION")
NAME_CHARS = re.compile(r"^[A-Za-z0-9_.+-]+$")
TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})$")
PATTERNS = {  # setting -> (regular expression, what it should look like)
    "CONSTRAINT": (r"^[A-Za-z0-9_.,&|*\[\]-]+$", "node features like a100 or 'a100&ib'"),
    "ARRAY": (r"^\d+(-\d+)?(:\d+)?(,\d+(-\d+)?(:\d+)?)*(%\d+)?$", "indices like 0-3 or 0,2,4%2"),
    "SIGNAL": (r"^([BR]:)?(SIG)?[A-Z0-9]+(@\d+)?$", "like B:USR1@300"),
    "OUTPUT": (r"^[A-Za-z0-9_./%-]+$", "a file name like hpcdl-%j.out"),
    "SWEEP": (r"^(nodes|ranks|batch)$", "nodes, ranks or batch"),
    "LAUNCHER": (r"^(srun|mpirun)$", "srun or mpirun"),
    "MAX_RESTARTS": (r"^\d+$", "a whole number (0: never requeue)"),
    "SWEEP_VALUES": (r"^\s*[1-9]\d*(\s+[1-9]\d*)*\s*$", "positive whole numbers separated "
                                                       "by spaces, like '1 2 4 8'"),
}
# free-form values (paths, module lists): what a plain word needs, no shell syntax
PLAIN = re.compile(r"[A-Za-z0-9 _./:=,@%+~-]")
SHELL_WORDS = {";": "a command separator", "`": "command substitution",
               "$": "expansion ($VAR, $(cmd))", "\n": "a new line", "\r": "a carriage return",
               "|": "a pipe", "&": "a background/and operator", "<": "a redirection",
               ">": "a redirection", "\\": "an escape", "'": "a quote", '"': "a quote"}


class RenderError(ValueError):
    """A value that cannot go into the script; the message says what to give."""


def quote(value):
    """value in single quotes for bash (and for sbatch's #SBATCH parser)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------- checks
def check_value(name, value, flag=None):
    """RenderError unless value is valid for setting `name` (flag: how the user
    gave it, for the message). Empty means 'off' and is checked elsewhere."""
    given = flag or "--set %s" % name
    if name in COUNTS:
        if not re.fullmatch(r"\d+", value) or int(value) < 1:
            raise RenderError("%s must be a positive whole number (got %r)" % (given, value))
    elif name == "TIME":
        check_time(value, given)
    elif name in NAMES:
        if not NAME_CHARS.match(value) or len(value) > 128:
            raise RenderError("%s %r: use letters, digits and _ . + - only (at most 128)"
                              % (given, value))
    elif name in PATTERNS:
        pattern, looks = PATTERNS[name]
        if not re.match(pattern, value):
            raise RenderError("%s %r: give %s" % (given, value, looks))
    else:
        check_plain(value, given)


def check_time(value, given="--time"):
    """Slurm's [D-]HH:MM:SS, more than zero, minutes and seconds below 60."""
    m = TIME.match(value)
    if not m or int(m["m"]) > 59 or int(m["s"]) > 59:
        raise RenderError("%s %r: give a time as HH:MM:SS or D-HH:MM:SS, e.g. 01:30:00"
                          % (given, value))
    if not any(int(m[k] or 0) for k in "dhms"):
        raise RenderError("%s %r: a time limit must be more than zero" % (given, value))


def check_plain(value, given):
    for ch in value:
        if not PLAIN.match(ch):
            what = SHELL_WORDS.get(ch, "not a plain character")
            raise RenderError(
                "%s: %r contains %r (%s); values may hold letters, digits, spaces and "
                "_ . / : = , @ %% + ~ - only. hpcdl quotes values itself, and shell syntax "
                "is refused so that a value can never run a command" % (given, value, ch, what))


def check_command(cmd):
    # any word is safe once single-quoted (a multi-line `python -c` program too)
    if not cmd:
        raise RenderError("the command after -- is empty")


def parse_sets(pairs):
    """['KEY=VALUE', ...] -> {KEY: VALUE}; RenderError for a malformed pair."""
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key):
            raise RenderError("--set %r: give KEY=VALUE with KEY a template variable "
                              "(see hpcdl slurm list TEMPLATE)" % pair)
        out[key.upper()] = value
    return out


def resolve(template, values, flags=None):
    """Checks values ({NAME: str}) against the template's settings; returns them
    plus values derived from them (ARRAY from SWEEP_VALUES)."""
    flags = flags or {}
    unknown = sorted(set(values) - set(template.settings))
    if unknown:
        raise RenderError("template %s has no variable %s; its variables: %s" % (
            template.name, ", ".join(unknown), ", ".join(template.settings)))
    for name, value in values.items():
        if value == "" and template.settings[name].kind == "sbatch":
            continue  # empty turns the #SBATCH line off
        check_value(name, value, flags.get(name))
    out = dict(values)
    if "SWEEP_VALUES" in out and "ARRAY" in template.settings and "ARRAY" not in out:
        out["ARRAY"] = "0-%d" % (len(out["SWEEP_VALUES"].split()) - 1)  # one task per value
    return out


# ---------------------------------------------------------------- writing
def render(name, values=None, cmd=None, flags=None):
    """The script text of template `name` with values ({NAME: str}) and cmd
    (list of words, or None to keep the template's command)."""
    t = load(name)
    values = resolve(t, values or {}, flags)
    if cmd is not None:
        check_command(cmd)
        if t.command_line < 0:
            raise RenderError("template %s has no COMMAND=(...) line to put the command in"
                              % t.name)
    lines = list(t.lines)
    for key, value in values.items():
        s = t.settings[key]
        if s.kind == "sbatch":
            left = ("##SBATCH --%s=%s" % (s.option, s.default) if value == ""
                    else "#SBATCH --%s=%s" % (s.option, quote(value)))
        else:
            left = "%s=%s" % (key, quote(value))
        lines[s.line] = _with_comment(left, s.comment, s.column)
    if cmd is not None:
        comment = lines[t.command_line].partition(")")[2].strip()
        lines[t.command_line] = _with_comment(
            "COMMAND=(%s)" % " ".join(quote(w) for w in cmd), comment, 0)
    changed = sorted(values) + (["COMMAND"] if cmd is not None else [])
    lines.insert(1, "# rendered by hpcdl %s from %s%s" % (
        __version__, t.name, "; set: " + ", ".join(changed) if changed else ""))
    return "\n".join(lines) + "\n"


def _with_comment(left, comment, column):
    if not comment:
        return left
    return left.ljust(column - 1) + " " + comment if column else left + "   " + comment
