"""test_docs_commands.py - the `hpcdl ...` commands of README.md and docs/*.md
work as written (issue 38: docs/goodput.md's own example was refused).

Every command in a code block (fenced, or indented four spaces; after `$ `
or a path such as `.venv/bin/`, and after sudo, VAR=value or mpirun / srun and
their options; a `...` word dropped; continued with a trailing backslash; and the
`hpcdl ...` after the `--` of run, vcluster exec or slurm submit) must:
- parse: the parser of the command line takes every word (nothing runs);
- `hpcdl train`: resolve to a config that checks on its rank count, with a
  global batch no larger than the training set (which the ranks would refuse
  only after starting);
- `hpcdl bench large-batch`: pass the checks it makes before launching.
Lines that show output (`hpcdl train: recipe ...`) or a synopsis
(`[--shards K]`) are not commands. The `hpcdl sim` commands whose input
files exist run whole in a scratch folder (a second or so each), and a
chosen few training commands (RUNS) run with small data and one epoch.
"""
import functools
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from hpcdl.cli import main as cli_main
from mpi_harness import mpi_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPCDL = re.compile(r"^(?:\$ )?(?:\S*/)?hpcdl(?=\s|$)")  # hpcdl, $ hpcdl, .venv/bin/hpcdl
# what may stand before hpcdl on a command line: sudo, VAR=value, a launcher and its options
PREFIX = re.compile(r"sudo|[A-Za-z_]\w*=\S*|mpirun|mpiexec|srun")
LAUNCHERS = ("mpirun", "mpiexec", "srun")
OUTPUT = re.compile(r"^\s*(?:[\w-]+\s+)?[\w-]+:(\s|$)")  # 'hpcdl data verify: ...'
SHELL = ("|", "&&", ";", ">", "2>&1")  # where a shell line's hpcdl command ends
COMMENT = re.compile(r"\s{2,}[#(].*$")  # '  # ...' or, in --help texts, '  (...)'


# ---------------------------------------------------------------- the commands
def code_lines(text):
    """(line number, stripped line) of each line in a fenced or indented block."""
    fence, prev_blank, indented = False, True, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        indented = bool(line.startswith("    ") and line.strip() and (prev_blank or indented))
        if fence or indented:
            yield number, line.strip()
        prev_blank = not line.strip()


def without_prefix(line):
    """line from its hpcdl word on where sudo, VAR=value or a launcher (with
    its options) stands before it; else line as it is."""
    words = line.split()
    if words[:1] == ["$"]:
        words = words[1:]
    k = 0
    while k < len(words) and PREFIX.fullmatch(words[k]):
        if words[k] in LAUNCHERS:  # its options, up to hpcdl
            while k + 1 < len(words) and not HPCDL.match(words[k + 1]):
                k += 1
        k += 1
    if k == 0 or k == len(words) or not HPCDL.match(words[k]):
        return line
    return " ".join(words[k:])


def commands_in(lines, name):
    """[(where, argv)] of the hpcdl commands in [(line number, text)] of the
    file or help text called name; argv without the leading hpcdl, comments
    cut off."""
    out, lines = [], [(number, COMMENT.sub("", line)) for number, line in lines]
    for k, (number, line) in enumerate(lines):
        line = without_prefix(line)  # 'srun -n 64 hpcdl train ...': the hpcdl command
        m = HPCDL.match(line)
        if not m:
            continue
        text, j = line[m.end():], k
        while text.rstrip().endswith("\\") and j + 1 < len(lines):
            j += 1
            text = text.rstrip()[:-1] + " " + lines[j][1]
        if OUTPUT.match(text) or "[-" in text:
            continue
        words = shlex.split(text, comments=True)
        words = words[:min([words.index(s) for s in SHELL if s in words] + [len(words)])]
        words = [w for w in words if w != "..."]  # 'and the rest as you need'
        where = "%s:%d" % (name, number)
        out.append((where, words))
        while "--" in words:  # hpcdl run/vcluster exec/slurm submit ... -- hpcdl ...
            words = words[words.index("--") + 1:]
            if words and HPCDL.match(words[0]):
                out.append((where + " after --", words[1:]))
    return out


def doc_commands():
    """README.md's and docs/*.md's code blocks, the recipes' comments (`#
    hpcdl train ...`) and every subcommand's --help text (its examples)."""
    paths = ["README.md"] + sorted(os.path.relpath(p, REPO)
                                   for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
    out = [c for path in paths
           for c in commands_in(list(code_lines(open(os.path.join(REPO, path)).read())), path)]
    for path in sorted(glob.glob(os.path.join(REPO, "hpcdl", "recipes", "*.yaml"))):
        lines = [(i, l.lstrip("# ").strip()) for i, l in enumerate(open(path), 1)]
        out += commands_in(lines, os.path.relpath(path, REPO))
    for parser in cli_main.parsers(cli_main.build_parser()):
        text = "%s\n%s" % (parser.description or "", parser.epilog or "")
        lines = [(i, l.strip()) for i, l in enumerate(text.splitlines(), 1)]
        out += commands_in(lines, "`%s --help`" % parser.prog)
    return out


COMMANDS = doc_commands()


def test_the_docs_have_the_commands_this_test_reads():
    """A guard against the extraction reading nothing: the tour, the goodput
    page's example (both lines of it) and a command after `--` are found."""
    found = {(where.split(":")[0], " ".join(argv)) for where, argv in COMMANDS}
    assert len(COMMANDS) >= 60, len(COMMANDS)
    assert ("docs/goodput.md", "train -n 4 --data mnist1d:200000 --model cnn1d --recipe plain "
            "--global-batch auto --max-global-batch 4096") in found, found
    assert ("README.md", "info") in found
    assert any("after --" in where for where, _ in COMMANDS)
    assert ("docs/sim.md", "sim profile --model mlp --json prof.json") in found  # mpirun -n 4
    assert ("docs/training.md", "train --data /scratch/shards/imagenet --model resnet50") in found
    assert not any(argv and argv[0].endswith(":") for _, argv in COMMANDS)  # no output lines


# ---------------------------------------------------------------- parse and check
@functools.lru_cache(maxsize=None)
def train_samples(spec):
    """The training set's size of a built-in --data source (None: a directory)."""
    from hpcdl.data import mnist1d
    from hpcdl.train import data
    n = mnist1d.parse(spec)
    if n is not None:
        return mnist1d.split_sizes(n)[0]
    if spec == "digits" or spec.startswith("synthetic:"):
        return data.load(spec).n_train
    return None


def parsed(argv):
    """The argparse namespace of `hpcdl argv`; fails the test on a word the
    parser does not take."""
    parser = cli_main.build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as e:
        if e.code == 0:  # --help, --version
            return None
        pytest.fail("does not parse: hpcdl %s" % " ".join(argv))
    assert not extra, cli_main.unknown_options(cli_main.chosen_parser(parser, args), extra)
    return args


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_docs_command_parses_and_checks(where, argv, capsys):
    args = parsed(argv)
    if args is None:
        return
    capsys.readouterr()  # --help's text
    elsewhere = os.path.isabs(getattr(args, "data", None) or "") and not os.path.exists(args.data)
    if args.command == "train" and not elsewhere:  # (a cluster's /scratch/...: parsed only)
        from hpcdl.cli.train import config_from_args
        cfg = config_from_args(args)
        cfg.check(args.n or 1)
        n_train = train_samples(cfg.data)
        assert n_train is None or cfg.global_batch <= n_train, \
            "global batch %d > %d training samples of %s" % (cfg.global_batch, n_train, cfg.data)
    if args.command == "bench" and args.benchmark == "large-batch":
        from hpcdl.cli.bench_large_batch import check_configs, options
        check_configs(options(args), args.n)


# ---------------------------------------------------------------- sim commands run
def needs_files(argv):
    """The input files a sim command names that are not in the checkout."""
    inputs = ("--calibration", "--profile", "--from", "--measured")
    return [v for k, v in zip(argv, argv[1:]) if k in inputs
            and not os.path.exists(os.path.join(REPO, v))]


SIMS = [(w, a) for w, a in COMMANDS if a[:1] == ["sim"] and a[1:2] != ["profile"]
        and not needs_files(a)]


@pytest.mark.parametrize("where, argv", SIMS, ids=[w for w, _ in SIMS])
def test_sim_commands_run_as_written(where, argv, tmp_path, monkeypatch, capsys):
    """In a scratch folder (their --plot and --json files land there)."""
    monkeypatch.chdir(tmp_path)
    argv = [os.path.join(REPO, a) if os.path.exists(os.path.join(REPO, a)) and "/" in a
            else a for a in argv]
    try:
        rc = cli_main.main(argv)
    except SystemExit as e:  # --help
        rc = e.code
    out = capsys.readouterr()
    assert rc == 0, (where, out.err)


def test_sim_commands_are_run():
    assert len(SIMS) >= 6, SIMS


# ---------------------------------------------------------------- chosen runs
# (file, words the command holds, flags to set: small data, one epoch, scratch output)
RUNS = [
    ("docs/goodput.md", "--recipe plain --global-batch auto", ["--data", "mnist1d:4000",
                                                               "--epochs", "1"]),
    ("docs/training.md", "lamb --global-batch 2048 --target", ["--data", "mnist1d:12000",
                                                               "--epochs", "1"]),
    ("README.md", "--mode ps-ssp", ["--epochs", "1"]),
]


def with_flags(argv, flags):
    """argv with each (flag, value) of flags set: replaced where given, else added."""
    argv = list(argv)
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def chosen(path, words):
    (argv,) = [a for w, a in COMMANDS if w.startswith(path + ":") and words in " ".join(a)]
    return argv


@pytest.mark.mpi
@pytest.mark.parametrize("path, words, flags", RUNS, ids=[r[0] + " " + r[1] for r in RUNS])
def test_chosen_commands_train(path, words, flags, tmp_path):
    argv = with_flags(chosen(path, words), flags)
    assert argv[0] == "train" and argv[1] in ("-n", "-np")  # started by hpcdl's launcher
    r = subprocess.run([sys.executable, "-m", "hpcdl"] + argv + ["--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env=mpi_env())  # not inside the job of an MPI singleton in pytest
    assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
    assert "# summary" in r.stdout and (tmp_path / "summary.json").exists(), r.stdout
