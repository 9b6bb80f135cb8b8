"""templates.py - finding the sbatch templates and reading their settings.

A template is a plain sbatch script that runs as it stands. What
`hpcdl slurm render` may change is recognised by the shape of a line:

    #SBATCH --nodes=2              # comment     sbatch setting NODES (on)
    ##SBATCH --partition=PARTITION # comment     sbatch setting PARTITION (off
                                                 until a value is given)
    VENV="${VENV:-.venv}"          # comment     shell setting VENV
    COMMAND=(hpcdl train)          # comment     the command (-- CMD ...)

An sbatch setting's name is its option in capitals with '_' for '-'
(--ntasks-per-node -> NTASKS_PER_NODE). #SBATCH lines without a value
(--requeue) are fixed parts of the template.
"""
import os
import re
from dataclasses import dataclass, field

SUFFIX = ".sbatch"
HERE = os.path.dirname(os.path.abspath(__file__))

SBATCH_LINE = re.compile(r"^(?P<off>#?)#SBATCH\s+--(?P<opt>[a-z][a-z0-9-]*)=(?P<value>\S*)"
                         r"(?P<gap>\s*)(?P<comment>#.*)?$")
SHELL_LINE = re.compile(r'^(?P<name>[A-Z][A-Z0-9_]*)="\$\{(?P=name):-(?P<value>.*)\}"'
                        r"(?P<gap>\s*)(?P<comment>#.*)?$")
COMMAND_LINE = re.compile(r"^COMMAND=\((?P<value>.*)\)(?P<gap>\s*)(?P<comment>#.*)?$")


class TemplateError(ValueError):
    """An unknown template, or a template file hpcdl cannot read."""


@dataclass
class Setting:
    name: str       # NODES, VENV, ...
    kind: str       # "sbatch" or "shell"
    default: str    # the value written in the template
    on: bool        # sbatch: '#SBATCH' (on) or '##SBATCH' (off); shell: always on
    comment: str    # the line's comment, '#' included ('' if none)
    column: int     # where the comment starts, to keep columns when rendering
    line: int       # index of the line in Template.lines
    option: str = ""  # sbatch: the long option (nodes, ntasks-per-node)


@dataclass
class Template:
    name: str
    path: str
    lines: list
    description: str
    settings: dict = field(default_factory=dict)  # name -> Setting, in file order
    command_line: int = -1                           # index of COMMAND=(...), -1 if none


def template_dirs():
    """Where templates live: hpcdl/slurm/templates in an installed package
    (setup.py copies them there), else the source tree's slurm/ folder (an
    editable install or a checkout). $HPCDL_SLURM_TEMPLATES comes first."""
    packaged = os.path.join(HERE, "templates")
    source = os.path.join(os.path.dirname(os.path.dirname(HERE)), "slurm")
    dirs = [os.environ.get("HPCDL_SLURM_TEMPLATES"),
            packaged if os.path.isdir(packaged) else source]
    return [d for d in dirs if d and os.path.isdir(d)]


def available():
    """{name: path} of every template found, the first directory winning."""
    found = {}
    for d in template_dirs():
        for entry in sorted(os.listdir(d)):
            if entry.endswith(SUFFIX):
                found.setdefault(entry[:-len(SUFFIX)], os.path.join(d, entry))
    return found


def find(name):
    """The path of template `name` (with or without .sbatch), or of a file path."""
    if os.sep in name or os.path.isfile(name):
        if not os.path.isfile(name):
            raise TemplateError("no template file %s" % name)
        return name
    known = available()
    key = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
    if key not in known:
        raise TemplateError("unknown template %r; available: %s (hpcdl slurm list)"
                            % (name, ", ".join(sorted(known)) or "none found"))
    return known[key]


def load(name):
    """Reads and parses template `name` (see find)."""
    path = find(name)
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise TemplateError("%s is not an sbatch script (no #! line first)" % path)
    base = os.path.basename(path)
    t = Template(name=base[:-len(SUFFIX)] if base.endswith(SUFFIX) else base, path=path,
                 lines=lines, description=_description(lines))
    for i, text in enumerate(lines):
        _parse_line(t, i, text)
    return t


def _parse_line(t, i, text):
    m = SBATCH_LINE.match(text)
    if m:
        name = m["opt"].upper().replace("-", "_")
        _add(t, Setting(name, "sbatch", m["value"], not m["off"], m["comment"] or "",
                        m.start("comment") if m["comment"] else 0, i, m["opt"]))
        return
    m = SHELL_LINE.match(text)
    if m:
        _add(t, Setting(m["name"], "shell", m["value"], True, m["comment"] or "",
                        m.start("comment") if m["comment"] else 0, i))
        return
    if COMMAND_LINE.match(text):
        t.command_line = i


def _add(t, setting):
    if setting.name in t.settings:
        raise TemplateError("%s sets %s twice (lines %d and %d)" % (
            t.path, setting.name, t.settings[setting.name].line + 1, setting.line + 1))
    t.settings[setting.name] = setting


def _description(lines):
    """'name.sbatch - what it is' on the second line -> 'what it is'."""
    for text in lines[1:3]:
        if " - " in text:
            return text.split(" - ", 1)[1].strip()
    return ""
