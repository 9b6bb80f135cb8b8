"""Tutorial 06 - running on Slurm: templates, safe rendering, a real job.

Run it on a login node (one process: it plays the user, Slurm starts the ranks):

    python tutorials/06_slurm.py

  1. `hpcdl slurm list`: the job-script templates hpcdl ships;
  2. `hpcdl slurm render`: fill one in for 2 ranks and a training command, and
     check that bash reads it and that every value we substituted is quoted;
  3. the guard: a job name that would run a shell command is refused before
     anything is written or submitted;
  4. when a Slurm cluster answers (`sinfo` works): `hpcdl slurm submit`, wait
     for the job, and check that the training it ran finished and learned.
     Without Slurm, step 4 says so and is skipped (CI runs it on a real
     single-node Slurm that the test suite starts).

Exercise (for the student):
  a. Render `preemptible` and follow the signal: which line asks Slurm for
     SIGUSR1 before the time limit, where does the batch shell catch it, how
     does the trainer learn about it, and what makes the job run again?
  b. Render `scaling-sweep` for global batches 64,128,256 and predict how many
     jobs squeue will show. Submit it on a cluster and read the result with
     `hpcdl slurm summary DIR`.
  c. Try a job name with a `$(...)` in it, or a time of 25:99:00. Why is it
     better to refuse these than to escape them silently?
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HPCDL = [sys.executable, "-m", "hpcdl"]
VENV = sys.prefix if sys.prefix != sys.base_prefix else ""
TRAIN = ["hpcdl", "train", "--epochs", "3", "--global-batch", "64", "--out"]
checks = []


def hpcdl(*args, cwd=None):
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def check(text, passed):
    print("check: %-58s %s" % (text, "ok" if passed else "FAILED"))
    checks.append(passed)


work = tempfile.mkdtemp(prefix="hpcdl-tutorial06-")
out_dir = os.path.join(work, "run")

# 1. the templates
r = hpcdl("slurm", "list")
print("1. hpcdl slurm list\n" + r.stdout)
check("single-node and preemptible templates are listed",
      r.returncode == 0 and "single-node" in r.stdout and "preemptible" in r.stdout)

# 2. render one for 2 ranks; the command goes after --
args = ["single-node", "--ntasks-per-node", "2", "--time", "00:05:00", "--job-name",
        "tutorial06", "--set", "VENV=" + VENV, "--"] + TRAIN + [out_dir]
r = hpcdl("slurm", "render", *args)
script = r.stdout
print("2. hpcdl slurm render %s\n%s" % (" ".join(shlex.quote(a) for a in args),
                                         "\n".join(script.splitlines()[:22]) + "\n..."))
syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
check("the script renders and bash parses it", r.returncode == 0 and syntax.returncode == 0)
sbatch = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
check("#SBATCH lines carry our values (quoted)", "--ntasks-per-node='2'" in sbatch
      and "--time='00:05:00'" in sbatch)
check("the output directory is a quoted word", shlex.quote(out_dir) in script
      or "'%s'" % out_dir in script)

# 3. the guard against shell injection
r = hpcdl("slurm", "render", "single-node", "--job-name", "x; rm -rf ~", "--", "true")
print("3. a job name with ';' in it ->", r.stderr.strip())
check("an unsafe job name is refused with exit 2", r.returncode == 2 and r.stdout == "")

# 4. a real job, when a cluster answers
if shutil.which("sinfo") and subprocess.run(["sinfo"], capture_output=True).returncode == 0:
    r = hpcdl("slurm", "submit", *args, cwd=work)
    job = r.stdout.strip()
    print("4. submitted job %s" % job)
    state, deadline = "", time.monotonic() + 150
    while time.monotonic() < deadline:
        q = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
        state = next((w.split("=")[1] for w in q.stdout.split() if w.startswith("JobState=")),
                     "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(1)
    log = os.path.join(work, "hpcdl-%s.out" % job)
    if os.path.exists(log):
        print("   job output (last lines):\n   " +
              "\n   ".join(open(log).read().splitlines()[-6:]))
    summary = os.path.join(out_dir, "summary.json")
    acc = json.load(open(summary))["test_accuracy"] if os.path.exists(summary) else 0.0
    check("job %s COMPLETED" % job, state == "COMPLETED")
    check("it trained on 2 ranks to test accuracy %.3f > 0.85" % acc, acc > 0.85)
else:
    print("4. no Slurm cluster answers here (sinfo): step 4 skipped")

shutil.rmtree(work, ignore_errors=True)
print("all checks passed" if all(checks) else "some checks FAILED")
sys.exit(0 if all(checks) else 1)
