"""run.py - Horovod's own PyTorch test suite against hpcdl.torch.

Horovod's test/parallel/test_torch.py is taken from a Horovod git
repository at a tag (v0.28.1 by default; the three helpers it imports from
test/utils/common.py are written out below), copied into a temporary folder with one line changed,
`import horovod.torch as hvd` -> `import hpcdl.torch as hvd`, and each test
runs in its own N-rank launch (hpcdl's own launcher line, as `hpcdl run`
builds it) under a hard timeout. Horovod's files are never copied into this
repository. Not part of `make test`: it needs a Horovod checkout.

    git clone https://github.com/horovod/horovod /tmp/horovod
    .venv/bin/python tests/horovod_suite/run.py --repo /tmp/horovod        # all 115
    .venv/bin/python tests/horovod_suite/run.py --repo /tmp/horovod -k process_set -j 2
    .venv/bin/python tests/horovod_suite/run.py --test-file test_torch.py     # a copy of it

Prints one line per test (PASS / FAIL / TIMEOUT / SKIP, seconds) and a total;
--log DIR keeps each test's output. Exit status 1 when any test failed or
timed out.
"""
import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from hpcdl.cli.run import mpirun_command  # noqa: E402 - after the path is set

sys.path.insert(0, os.path.join(REPO, "tests"))
import hang_guard  # noqa: E402 - timeouts of full-speed seconds, as in the suite

IMPORT_LINE = "import horovod.torch as hvd"


def git_show(repo, rev, path):
    git_dir = repo if os.path.isdir(os.path.join(repo, "objects")) else os.path.join(repo, ".git")
    return subprocess.run(["git", "--git-dir", git_dir, "show", "%s:%s" % (rev, path)],
                          check=True, capture_output=True, text=True).stdout


def prepare(repo, rev, folder, test_file=None):
    """Writes the changed test file and its utils into folder; returns the test path."""
    if test_file:
        with open(test_file) as f:
            source = f.read()
    else:
        source = git_show(repo, rev, "test/parallel/test_torch.py")
    if IMPORT_LINE not in source:
        sys.exit("run.py: %r not found in test_torch.py at %s" % (IMPORT_LINE, rev))
    os.makedirs(os.path.join(folder, "parallel"))
    os.makedirs(os.path.join(folder, "utils"))
    path = os.path.join(folder, "parallel", "test_torch.py")
    with open(path, "w") as f:
        f.write(source.replace(IMPORT_LINE, "import hpcdl.torch as hvd"))
    with open(os.path.join(folder, "utils", "common.py"), "w") as f:
        f.write(COMMON)
    return path


# test_torch.py imports three helpers from Horovod's test/utils/common.py, which
# itself imports horovod.runner; these are the same helpers in our own words.
COMMON = '''import contextlib, os, tempfile


def mpi_env_rank_and_size():
    """(rank, size) from the launcher's variables; (0, 1) outside a launch."""
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


@contextlib.contextmanager
def temppath():
    with tempfile.TemporaryDirectory() as d:
        yield os.path.join(d, "temp_test_file")


@contextlib.contextmanager
def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)
    yield
'''


def test_names(path):
    """Names of the test methods of every TestCase class, in file order."""
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out += ["%s::%s" % (node.name, f.name) for f in node.body
                    if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    return out


def outcome(text, rc):
    """PASS / FAIL / SKIP from every rank's pytest summary lines."""
    summaries = [line for line in text.splitlines() if " in " in line and
                 any(w in line for w in ("passed", "failed", "skipped", "error"))]
    if rc == 0 and summaries and all("skipped" in s and "passed" not in s for s in summaries):
        return "SKIP"
    if rc == 0 and summaries:
        return "PASS"
    return "FAIL"


def run_one(path, name, ranks, timeout, log_dir, hpcdl_dir):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no",
           "-x", "%s::%s" % (path, name)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=hpcdl_dir + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"):
        env.pop(var, None)
    t0 = time.time()
    proc = subprocess.Popen(mpirun_command(ranks, cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=os.path.dirname(path), start_new_session=True)
    try:
        out, _ = hang_guard.communicate(proc, timeout=timeout)
        result = outcome(out, proc.returncode)
    except subprocess.TimeoutExpired:
        hang_guard.kill_job(proc.pid)  # mpirun and every rank
        out, _ = proc.communicate()
        result = "TIMEOUT"
    if log_dir:
        with open(os.path.join(log_dir, name.split("::")[-1] + ".log"), "w") as f:
            f.write(out)
    return name, result, time.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", help="a Horovod git checkout (or bare git dir)")
    p.add_argument("--test-file", help="Horovod's test/parallel/test_torch.py itself, instead "
                   "of --repo (for a machine without git or network)")
    p.add_argument("--rev", default="v0.28.1", help="tag or commit (default v0.28.1)")
    p.add_argument("-n", "--ranks", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60,
                   help="seconds of full-speed time per test (60; tests/hang_guard.py)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="tests run at once (1)")
    p.add_argument("-k", default=None, help="only tests whose name contains this")
    p.add_argument("--log", default=None, help="folder for each test's output")
    p.add_argument("--hpcdl", default=REPO, help="folder holding the hpcdl package to test "
                   "(default: this checkout; a copy keeps a baseline run steady)")
    args = p.parse_args()
    if not (args.repo or args.test_file):
        p.error("give --repo (a Horovod checkout) or --test-file (its test_torch.py)")
    if args.log:
        os.makedirs(args.log, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hvd_suite_") as folder:
        path = prepare(args.repo, args.rev, folder, args.test_file)
        names = [n for n in test_names(path) if args.k is None or args.k in n]
        counts = {"PASS": 0, "FAIL": 0, "TIMEOUT": 0, "SKIP": 0}
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for name, result, secs in pool.map(
                    lambda n: run_one(path, n, args.ranks, args.timeout, args.log, args.hpcdl), names):
                counts[result] += 1
                print("%-8s %6.1fs  %s" % (result, secs, name), flush=True)
    print("# Horovod %s test_torch.py on %d ranks: %d tests: %d passed, %d failed, "
          "%d timed out, %d skipped" % (args.rev, args.ranks, len(names), counts["PASS"],
                                         counts["FAIL"], counts["TIMEOUT"], counts["SKIP"]))
    return 1 if counts["FAIL"] or counts["TIMEOUT"] else 0


if __name__ == "__main__":
    sys.exit(main())
