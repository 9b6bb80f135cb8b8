"""test_first_hour.py - a new user's first hour (issue #22): README's tour
commands run verbatim, and the bad inputs a newcomer types end in one line
and status 2, all in a fresh shell whose PATH has no venv (`env -i
PATH=/usr/bin:/bin HOME=... bash -c LINE`), as after `make setup` in a new
terminal.

The commands run in a scratch folder that links .venv (the venv running the
tests), configs/ and README.md of this checkout, so their relative paths work as from the repository root
while what they write (shards/, runs/) stays out of the checkout. The quick
tour lines run here; the long ones (training, benchmarks) have their own
tests (test_train.py, test_bench.py, test_data_bench.py).
"""
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ("hpcdl info", "hpcdl run ", "hpcdl data shard ", "hpcdl sim scaling ")


def tour_lines():
    """The commands of README's 'A short tour' block, comments cut off."""
    text = open(os.path.join(REPO, "README.md")).read()
    section = re.search(r"## A short tour\n(.*?)\n## ", text, re.S).group(1)
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.splitlines():
            code = re.split(r"\s{2,}#\s", line)[0].strip()  # comments: two spaces, '# '
            if code.startswith(".venv/bin/hpcdl "):
                lines.append(code)
    return lines


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A scratch 'repository root': .venv (the venv these tests run in, which
    `make test` set up), configs and README.md of this checkout."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not run from a venv: README's .venv/bin/hpcdl does not apply")
    root = tmp_path_factory.mktemp("newuser")
    os.symlink(sys.prefix, root / ".venv")
    for name in ("configs", "README.md"):
        os.symlink(os.path.join(REPO, name), root / name)
    return root


def fresh_shell(line, cwd, timeout=120):
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    if os.geteuid() == 0:  # as tests/conftest.py: Open MPI's root permission
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run(["env", "-i"] + ["%s=%s" % kv for kv in env.items()]
                          + ["bash", "-c", line], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_the_tour_is_where_the_test_looks():
    lines = tour_lines()
    assert any(l.startswith(".venv/bin/hpcdl run -n 4 -- python -c") for l in lines), lines
    assert all(l.startswith(".venv/bin/hpcdl ") for l in lines), lines
    assert "source .venv/bin/activate" in open(os.path.join(REPO, "README.md")).read()


@pytest.mark.mpi
@pytest.mark.parametrize("line", [l for l in tour_lines() if any(q in l for q in QUICK)])
def test_tour_line_runs_as_written(line, home):
    r = fresh_shell(line, home)
    assert r.returncode == 0, (line, r.stdout, r.stderr)
    if " run -n 4 -- python -c" in line:  # the line that found the system python once
        assert sorted(r.stdout.split()) == ["0", "1", "2", "3", "4", "4", "4", "4"], r.stdout
        assert "hpcdl's interpreter" in r.stderr, r.stderr
    if " data shard digits " in line:  # the trainer's split: 1437 train, 360 val
        import json
        manifest = json.load(open(home / "shards" / "digits" / "manifest.json"))
        counts = {k: v["num_samples"] for k, v in manifest["splits"].items()}
        assert counts == {"train": 1437, "val": 360}, counts


@pytest.mark.mpi
def test_activated_venv_runs_the_tour_line_too(home):
    line = next(l for l in tour_lines() if " run -n 4 -- python" in l)
    line = line.replace(".venv/bin/hpcdl run -n 4", "hpcdl run -n 2")
    r = fresh_shell("source .venv/bin/activate && " + line, home)
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["0", "1", "2", "2"], r


# (command, what the one line says); each ends before any rank starts
BAD = [
    ("hpcdl train -n 2 --out README.md", "--out README.md is a file"),
    ("hpcdl train -n 2 --out /proc/x", "--out /proc/x: cannot create a directory in /proc"),
    ("hpcdl train -n 2 --checkpoint-dir README.md", "--checkpoint-dir README.md is a file"),
    ("hpcdl train -n 2 --resume README.md", "--resume README.md is not a checkpoint"),
    ("hpcdl train -n 2 --data nowhere", "--data nowhere: no such directory"),
    ("hpcdl train -n 2 --data configs", "--data configs has no manifest.json"),
    ("hpcdl train -n 2 --stage-to README.md", "--stage-to README.md is a file"),
    ("hpcdl train -np 2 --out README.md", "--out README.md is a file"),
    ("hpcdl train -n 2 --global-batch 0", "--global-batch is 0; give 1 or more"),
    ("hpcdl train -n 2 --milestones 5,x", "--milestones: '5,x': give comma-separated "
                                          "integers like 10,20"),
    ("hpcdl train --bogus", "hpcdl train: error: unrecognized arguments: --bogus"),
    ("hpcdl run -n 2 -- nosuchcmd", "nosuchcmd could not be started: not found on PATH"),
]


@pytest.mark.parametrize("line, message", BAD)
def test_bad_input_is_one_line_and_status_2(line, message, home):
    r = fresh_shell(".venv/bin/" + line, home, timeout=60)
    assert r.returncode == 2, (line, r.stdout, r.stderr)
    errors = [l for l in r.stderr.splitlines() if "error:" in l]
    assert len(errors) == 1 and message in errors[0], (line, r.stderr)
    assert "Traceback" not in r.stderr and "mpirun" not in r.stderr, r.stderr
    if "--milestones" in line:  # train's usage, not the top level's
        assert r.stderr.startswith("usage: hpcdl train "), r.stderr
    elif "--bogus" in line:  # one line, no usage (issue 38)
        assert r.stderr.startswith("hpcdl train: error: "), r.stderr
    else:
        assert r.stderr.startswith("hpcdl: error: "), r.stderr


def test_several_problems_are_one_line_each(home):
    r = fresh_shell(".venv/bin/hpcdl train -n 2 --out README.md --checkpoint-dir README.md "
                    "--epochs 0", home, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "hpcdl: error: --epochs is 0; give 1 or more",
        "hpcdl: error: --out README.md is a file; give a directory (it is created if "
        "missing)",
        "hpcdl: error: --checkpoint-dir README.md is a file; give a directory (it is "
        "created if missing)"], r.stderr


@pytest.mark.mpi
def test_ranks_check_paths_before_mpi_and_write_whole_lines():
    # launched by hand (no `hpcdl train -n`): every rank checks before MPI starts
    from mpi_harness import run_mpi
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "train", "--out", "README.md",
                    "--resume", "README.md"], timeout=90)
    assert r.returncode != 0
    errors = [l for l in r.stdout.splitlines() if "error:" in l and "README.md" in l]
    assert 2 <= len(errors) <= 4, r.stdout  # mpirun may end one rank before it writes
    for line in errors:  # each whole: one rank's prefix, one problem
        assert re.fullmatch(r"hpcdl: error: \[rank [01]\] --(out README\.md is a file|resume "
                            r"README\.md is not a checkpoint)[^\[]*", line), line
    assert "Traceback" not in r.stdout and "MPI_Abort" not in r.stdout, r.stdout
