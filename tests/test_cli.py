"""test_cli.py - the `hpcdl` command: info, run (ranks, exit codes, bad input),
help texts, and `python -m hpcdl`."""
import os
import re
import subprocess
import sys

import pytest

from hpcdl.cli.run import mpirun_command, parse_hosts
from hpcdl.cli.errors import UsageError

HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl(*args, timeout=120, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True,
                          timeout=timeout, env=e)


def test_help_lists_commands():
    r = hpcdl("--help")
    assert r.returncode == 0
    for cmd in ("info", "run", "train"):
        assert cmd in r.stdout


def test_sim_help_lists_every_simulation():
    """`hpcdl --help`, `hpcdl sim --help`, README and docs/sim.md name every
    `hpcdl sim` subcommand the parser has (a new one must be added to each);
    `hpcdl --help`'s bench line names every benchmark."""
    import argparse
    from hpcdl.cli.main import build_parser
    top = build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    sim = commands.choices["sim"]
    names = sorted(next(a for a in sim._actions
                        if isinstance(a, argparse._SubParsersAction)).choices)
    assert {"scaling", "pipeline", "time-to-accuracy"} <= set(names)
    r = hpcdl("sim", "--help")
    assert r.returncode == 0, r.stderr
    top_help = " ".join(top.format_help().split())
    bench = next(a for a in commands.choices["bench"]._actions
                 if isinstance(a, argparse._SubParsersAction)).choices
    for name in bench:  # bench's line lists its benchmarks the same way
        assert re.search(r"bench [^)]*\b%s\b" % re.escape(name), top_help), (name, top_help)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(root, "docs", "sim.md")) as f:
        doc = f.read()
    for name in names:
        assert re.search(r"^\s+%s\b" % re.escape(name), r.stdout, re.M), (name, r.stdout)
        assert re.search(r"sim [^)]*\b%s\b" % re.escape(name), top_help), (name, top_help)
        assert re.search(r"hpcdl sim [a-z|-]*\b%s\b" % re.escape(name), readme), name
        assert "`hpcdl sim %s`" % name in doc or "`%s`" % name in doc, name


def test_info_names_mpi_library():
    r = hpcdl("info")
    assert r.returncode == 0, r.stderr
    assert "MPI library" in r.stdout and ("Open MPI" in r.stdout or "MPICH" in r.stdout)
    assert "core built with CUDA" in r.stdout


@pytest.mark.mpi
def test_run_starts_four_distinct_ranks():
    # one write per line: print() writes text and newline separately, and
    # unbuffered ranks' pieces interleave in mpirun's merged output
    code = ("import sys; from hpcdl import comm; comm.init(); "
            "sys.stdout.write('RANK %d %d\\n' % (comm.rank(), comm.size()))")
    r = hpcdl("run", "-n", "4", "--", sys.executable, "-c", code, timeout=60)
    assert r.returncode == 0, r.stderr
    ranks = sorted(l.split()[1:] for l in r.stdout.splitlines() if l.startswith("RANK"))
    assert ranks == [["0", "4"], ["1", "4"], ["2", "4"], ["3", "4"]], r.stdout


@pytest.mark.mpi
def test_run_forwards_exit_code():
    r = hpcdl("run", "-n", "2", "--", sys.executable, "-c", "import sys; sys.exit(3)",
              timeout=60)
    assert r.returncode == 3
    assert "exited with status 3" in r.stderr


def test_run_rejects_zero_ranks():
    r = hpcdl("run", "-n", "0", "--", "true")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "-n must be at least 1" in lines[0]


def test_run_inside_job_runs_directly():
    r = hpcdl("run", "-n", "4", "--", sys.executable, "-c", "print('direct')",
              env={"OMPI_COMM_WORLD_SIZE": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "direct"
    assert "already inside" in r.stderr


def test_mpirun_flags():
    ompi = ("/usr/bin/mpirun", "openmpi")
    line = mpirun_command(64, ["x"], launcher=ompi)
    assert "--oversubscribe" in line and line[-1] == "x"
    assert ("--allow-run-as-root" in line) == (os.geteuid() == 0)
    line = mpirun_command(2, ["x"], hosts="a:1,b:1", launcher=ompi)
    assert "--host" in line and "a:1,b:1" in line and "--oversubscribe" not in line
    line = mpirun_command(2, ["x"], hosts="a:1,b:1", launcher=("/usr/bin/mpiexec", "mpich"))
    assert "-hosts" in line and "--bind-to" not in line
    with pytest.raises(UsageError):
        parse_hosts("a:0")


# ---------------------------------------------------------------- issue #22
def test_dash_np_and_a_subcommands_usage():
    from hpcdl.cli.main import build_parser
    assert build_parser().parse_args(["train", "-np", "3"]).n == 3
    assert build_parser().parse_args(["run", "-np", "2", "--", "true"]).n == 2
    r = hpcdl("bench", "allreduce", "--bogus")  # the subcommand's name, in one line
    assert r.returncode == 2 and r.stderr == (
        "hpcdl bench allreduce: error: unrecognized arguments: --bogus (`hpcdl bench "
        "allreduce -h` shows the options)\n"), r.stderr


# ---------------------------------------------------------------- issue #38
@pytest.mark.parametrize("argv, unknown, meant", [
    (["train", "--lr-sc", "linear"], "--lr-sc linear", "--lr-scaling? (no option may be "
                                                       "abbreviated; `hpcdl train -h`"),
    (["train", "--lr-scalng", "linear"], "--lr-scalng linear", "--lr-scaling? (`hpcdl train"),
    (["train", "--warmup", "2"], "--warmup 2", "--warmup-epochs or --warmup-start-lr? (no "
                                               "option may be abbreviated"),
    (["train", "--epoch", "3", "--modle=mlp"], "--epoch 3 --modle=mlp",
     "--epochs (for --epoch), --mode or --model (for --modle=mlp)? ("),
    (["sim", "scaling", "--alfa", "5us", "--step-compute-ms", "5"], "--alfa 5us",
     "--alpha? (`hpcdl sim scaling -h`"),
    (["run", "--tracebak", "--", "true"], "--tracebak", "--tracebacks? (`hpcdl run -h`"),
    (["slurm", "render", "preemptible", "--partiton=x"], "--partiton=x", "--partition? ("),
    (["--verison"], "--verison", "--version? (`hpcdl -h` shows the options)"),
])
def test_an_unknown_option_is_one_line_naming_the_closest(argv, unknown, meant):
    """`--lr-sc linear` printed train's 25 lines of usage, then 'unrecognized
    arguments', no hint: now one line, for any subcommand, with the options
    meant; a prefix is not taken as the option (prefixes change meaning when
    options are added) but named as one."""
    from hpcdl.cli.main import build_parser, chosen_parser, unknown_options
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert " ".join(extra) == unknown  # refused, not taken as a prefix
    line = unknown_options(chosen_parser(parser, args), extra)
    assert line.startswith("unrecognized arguments: %s; did you mean %s" % (unknown, meant)), \
        line
    r = hpcdl(*argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "usage" not in r.stderr
    assert r.stderr.endswith("error: %s\n" % line), r.stderr


@pytest.mark.parametrize("argv, meant", [(["tran"], "train"), (["bench", "allredce"], "allreduce"),
                                         (["sim", "scalng"], "scaling"),
                                         (["bench", "allreduce", "--device", "cdua"], "cuda")])
def test_a_misspelled_command_or_choice_names_the_closest(argv, meant):
    r = hpcdl(*argv)
    assert r.returncode == 2 and r.stderr.strip().endswith("; did you mean %s?" % meant), \
        r.stderr
    from hpcdl.cli.main import closest_choice
    assert closest_choice("argument X: invalid choice: 'zzz' (choose from 'a', 'b')") == \
        "argument X: invalid choice: 'zzz' (choose from 'a', 'b')"  # nothing close: as it was


def test_an_unknown_option_without_a_close_one_says_where_to_look():
    from hpcdl.cli.main import build_parser, unknown_options
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    assert unknown_options(train, ["--bogus", "stray"]) == (
        "unrecognized arguments: --bogus stray (`hpcdl train -h` shows the options)")


def test_launcher_options_pass_through():
    ompi, mpich = ("/usr/bin/mpirun", "openmpi"), ("/usr/bin/mpiexec", "mpich")
    line = mpirun_command(2, ["x"], launcher=ompi, mpi_args="--map-by 'socket'",
                          export=["A=1", "B"])
    assert line[-5:] == ["-x", "B", "--map-by", "socket", "x"] and line[-7:-5] == ["-x", "A"]
    line = mpirun_command(2, ["x"], launcher=mpich, export=["A=1", "B"])
    assert line[-3:] == ["-genvlist", "A,B", "x"]
    from hpcdl.cli.run import exported_env
    assert exported_env(["HPCDL_T22=v"])["HPCDL_T22"] == "v"
    for bad in ("1A=2", "HPCDL_UNSET_T22"):
        with pytest.raises(UsageError):
            exported_env([bad])


def test_python_is_hpcdls_interpreter_and_a_missing_command_fails_up_front():
    from hpcdl.cli.run import resolve_command
    cmd, note = resolve_command(["python3", "-c", "pass"])
    assert cmd == [sys.executable, "-c", "pass"] and sys.executable in note
    assert resolve_command(["true"]) == (["true"], "")
    with pytest.raises(UsageError, match="nosuchcmd could not be started: not found on PATH"):
        resolve_command(["nosuchcmd"])
    assert resolve_command(["nosuchcmd"], check_path=False)[0] == ["nosuchcmd"]


@pytest.mark.parametrize("env, want", [
    (dict(OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="1",
          OMPI_COMM_WORLD_LOCAL_SIZE="4"), ("5", "1", "8", "4")),
    (dict(PMI_RANK="3", PMI_SIZE="6", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="3"),
     ("3", "0", "6", "3")),
    (dict(SLURM_PROCID="6", SLURM_NTASKS="7", SLURM_LOCALID="0", SLURM_NODEID="2",
          SLURM_STEP_TASKS_PER_NODE="3(x2),1"), ("6", "0", "7", "1")),
    (dict(OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="5",
          OMPI_COMM_WORLD_LOCAL_SIZE="8", HPCDL_LOCAL_SIZE="2"), ("5", "1", "8", "2")),
    (dict(PMI_RANK="3", PMI_SIZE="4", SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1",
          SLURM_NODEID="1", SLURM_TASKS_PER_NODE="2(x2)"), ("3", "1", "4", "2")),  # pmi2
])
def test_torchrun_variables_from_each_launcher(env, want):
    from hpcdl.utils.rankenv import disagreement, tasks_per_node, torchrun_env
    got = torchrun_env(env)
    assert tuple(got[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")) \
        == want
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and torchrun_env({}) == {}
    rank, local, size, local_size = map(int, want)
    assert disagreement(got, rank, size, local, local_size) is None
    assert "RANK=%d (MPI: %d)" % (rank, rank + 1) in disagreement(got, rank + 1, size, local,
                                                                  local_size)


def test_horovod_variables_honoured_or_named_once():
    from hpcdl.utils import horovod_env
    env = {"HOROVOD_TIMELINE": "/t.json", "HOROVOD_LOG_LEVEL": "trace",
           "HOROVOD_FUSION_THRESHOLD": "1024", "HPCDL_FUSION_THRESHOLD": "2048",
           "HOROVOD_CYCLE_TIME": "5", "HOROVOD_FOO": "1"}
    said = []
    line = horovod_env.apply(env, say=said.append)
    assert env["HPCDL_TIMELINE"] == "/t.json" and env["HPCDL_LOG_LEVEL"] == "DEBUG"
    assert env["HPCDL_FUSION_THRESHOLD"] == "2048"  # the HPCDL_ one is set: it wins
    assert len(said) <= 1 and line.count("\n") == 0
    for name in ("HOROVOD_CYCLE_TIME (no negotiation cycle", "HOROVOD_FOO",
                 "HOROVOD_FUSION_THRESHOLD (HPCDL_FUSION_THRESHOLD=2048 is set and wins)"):
        assert name in line, line
    assert horovod_env.apply({"HOROVOD_TIMELINE": "DYNAMIC"}) is None


def test_validate_paths(tmp_path):
    from hpcdl.train.config import TrainConfig
    from hpcdl.train.validate import problems
    f = tmp_path / "f"
    f.write_text("x")
    assert problems(TrainConfig(out=str(tmp_path / "new" / "dir"))) == []
    assert not (tmp_path / "new").exists()  # checking creates nothing
    assert problems(TrainConfig(out=str(f / "sub"))) == [
        "--out %s: %s is a file, so the directory cannot be created" % (f / "sub", f)]
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "checkpoint.pt").write_text("not a zip")
    got = problems(TrainConfig(checkpoint_dir=str(tmp_path / "ck"), resume="auto",
                               data=str(tmp_path), stage_to=str(f)))
    assert [p.split()[0] for p in got] == ["--stage-to", "--resume", "--data"], got
    assert all("\n" not in p for p in got)


@pytest.mark.mpi
def test_ranks_get_torchruns_variables_and_exported_ones():
    code = ("import os, sys; from hpcdl import comm; comm.init(); "
            "sys.stdout.write('%s %d %d %d %d %s\\n' % (' '.join(os.environ[k] for k in "
            "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE')), comm.rank(), "
            "comm.local_rank(), comm.size(), comm.local_size(), os.environ['T22']))")
    from hpcdl.cli.run import find_launcher
    tag = "--tag-output" if find_launcher()[1] == "openmpi" else "-prepend-rank"
    r = hpcdl("run", "-np", "2", "-x", "T22=yes", "--mpi-args=" + tag, "--", "python", "-c",
              code, timeout=90)
    assert r.returncode == 0, r.stderr
    assert " %s " % tag in r.stderr  # in the launch line: it went to the launcher
    rows = sorted(re.sub(r"^\[.*?\](<stdout>:)?", "", l).split()  # the launcher's tag
                  for l in r.stdout.splitlines() if "yes" in l)
    assert rows == [["0", "0", "2", "2", "0", "0", "2", "2", "yes"],
                    ["1", "1", "2", "2", "1", "1", "2", "2", "yes"]], r.stdout
    assert "disagree" not in r.stderr and "hpcdl's interpreter" in r.stderr


@pytest.mark.mpi
def test_a_command_missing_on_the_ranks_says_so():
    r = hpcdl("run", "-n", "2", "-H", "localhost:2", "--", "nosuchcmd_t22", timeout=90)
    assert r.returncode == 127, r.stderr
    assert "nosuchcmd_t22 could not be started on rank 0" in r.stderr
    assert ("hpcdl run: nosuchcmd_t22 exited with status 127: it could not be started (not "
            "found on PATH on the ranks), or a command it ran could not") in \
        r.stderr.splitlines(), r.stderr


def test_bench_relaunch_passes_the_options_on(monkeypatch):
    """`hpcdl bench data -n N` outside a job relaunches the same command on N
    ranks with every given option (cli/bench.py run_or_launch, which bench
    embedding and large-batch share; bench data imports no mpi4py.MPI here,
    which would make this process look like a parallel job to later tests)."""
    from hpcdl.cli import run as launcher
    from hpcdl.cli.main import build_parser
    launched = []
    monkeypatch.setattr(launcher, "inside_parallel_job", lambda: False)
    monkeypatch.setattr(launcher, "launch", lambda n, argv, **kw: launched.append((n, argv)) or 0)
    args = build_parser().parse_args(["bench", "data", "-n", "2", "--time-budget", "0.5",
                                      "--chunk-rows", "8"])
    assert args.func(args) == 0
    (n, argv), = launched
    assert n == 2 and argv[1:5] == ["-m", "hpcdl", "bench", "data"]
    assert argv[argv.index("--time-budget") + 1] == "0.5"
    assert argv[argv.index("--chunk-rows") + 1] == "8"
    assert "--json" not in argv and "--dir" not in argv  # not given: not passed on
