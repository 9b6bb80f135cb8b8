"""test_slurm_render.py - `hpcdl slurm list | render | submit | summary`
without a running Slurm: the templates' shape, what rendering writes (read
back by bash itself), every kind of bad input refused before anything is
written or submitted, and the scaling table against its own arithmetic.
The same commands against a real Slurm: test_slurm_jobs.py."""
import json
import os
import subprocess
import sys

import pytest

from hpcdl import slurm
from hpcdl.cli.run import default_ranks

HPCDL = [sys.executable, "-m", "hpcdl"]
TEMPLATES = ("single-node", "multi-node-gpu", "scaling-sweep", "preemptible")
SITE = ("PARTITION", "ACCOUNT", "CONSTRAINT", "MODULES", "VENV", "NET_IFACE")
RESOURCES = ("JOB_NAME", "NODES", "NTASKS_PER_NODE", "GPUS_PER_NODE", "TIME")
# words a shell would act on, if they were not quoted
NASTY = ["it's", "$(touch PWNED)", "`touch PWNED`", "a b;touch PWNED", "*", "--x=\"y\""]


def hpcdl(*args, cwd=None, env=None):
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=dict(os.environ, **(env or {})))


def bash_values(script, names, cwd):
    """Runs only the site-values block of a rendered script in bash and prints
    each name's value (arrays one word per line), as the job would see them."""
    block = [l for l in script.splitlines()
             if l.startswith(tuple(n + "=" for n in names))]
    show = "".join('printf "%%s\\n" "${%s[@]}"; echo ---;' % n for n in names)
    out = subprocess.run(["bash", "-c", "\n".join(block) + "\n" + show], capture_output=True,
                         text=True, cwd=cwd, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    return [part.strip("\n").split("\n") for part in out.stdout.split("---\n")[:-1]]


# ---------------------------------------------------------------- templates
@pytest.mark.parametrize("name", TEMPLATES)
def test_template_shape(name):
    t = slurm.load(name)
    assert t.description and t.command_line > 0
    for var in SITE + RESOURCES:
        assert var in t.settings, "%s lacks %s" % (name, var)
    for i, line in enumerate(t.lines):
        if line.lstrip("#").startswith("SBATCH"):
            assert " # " in line, "%s line %d: #SBATCH line without a comment" % (name, i + 1)
    # sbatch stops reading #SBATCH at the first command: all of them come first
    first_code = next(i for i, l in enumerate(t.lines) if l and not l.startswith("#"))
    assert all(not l.lstrip("#").startswith("SBATCH") for l in t.lines[first_code:])
    # the template is valid bash as it stands
    assert subprocess.run(["bash", "-n", t.path]).returncode == 0


def test_list_names_every_template_and_its_variables():
    r = hpcdl("slurm", "list")
    assert r.returncode == 0, r.stderr
    for name in TEMPLATES:
        assert name in r.stdout
    r = hpcdl("slurm", "list", "preemptible")
    assert r.returncode == 0, r.stderr
    for var in ("SIGNAL", "RUN_DIR", "MAX_RESTARTS", "PARTITION", "COMMAND"):
        assert var in r.stdout


# ---------------------------------------------------------------- rendering
def test_render_quotes_values_and_command_words(tmp_path):
    cmd = ["python", "train.py"] + NASTY
    r = hpcdl("slurm", "render", "single-node", "--nodes", "2", "--ntasks-per-node", "3",
              "--time", "1-02:03:04", "--partition", "gpu", "--account", "proj_42",
              "--job-name", "my.job", "--set", "MODULES=openmpi/4.1 cuda/12.4",
              "--set", "venv=/opt/envs/x", "--", *cmd)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for line in ("#SBATCH --partition='gpu'", "#SBATCH --account='proj_42'",
                 "#SBATCH --nodes='2'", "#SBATCH --ntasks-per-node='3'",
                 "#SBATCH --time='1-02:03:04'", "#SBATCH --job-name='my.job'"):
        assert any(l.startswith(line + " ") for l in text.splitlines()), line
    assert "##SBATCH --constraint=" in text  # not given: stays off
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    modules, venv, command = bash_values(text, ["MODULES", "VENV", "COMMAND"], tmp_path)
    assert modules == ["openmpi/4.1 cuda/12.4"] and venv == ["/opt/envs/x"]
    assert command == cmd
    assert not (tmp_path / "PWNED").exists()


def test_render_keeps_defaults_and_switches_lines_off():
    text = slurm.render("multi-node-gpu", {"GPUS_PER_NODE": ""})
    assert "##SBATCH --gpus-per-node=4" in text
    assert text.count("\n") == len(slurm.load("multi-node-gpu").lines) + 1  # + the header
    assert 'VENV="${VENV:-' in text  # unset shell values still follow the environment


def test_render_derives_array_from_sweep_values(tmp_path):
    text = slurm.render("scaling-sweep", slurm.parse_sets(["SWEEP=ranks",
                                                           "SWEEP_VALUES=1 2 4"]))
    assert "#SBATCH --array='0-2'" in text
    assert bash_values(text, ["SWEEP_VALUES"], tmp_path) == [["1 2 4"]]


BAD = [  # (arguments after the template, words the error must contain)
    (["--job-name", "a;touch x"], ["--job-name", "letters"]),
    (["--job-name", "a`id`"], ["--job-name"]),
    (["--job-name", "$(id)"], ["--job-name"]),
    (["--job-name", "a\nb"], ["--job-name"]),
    (["--set", "VENV=/x;rm -rf /"], ["VENV", "command separator"]),
    (["--set", "VENV=$(id)"], ["VENV", "expansion"]),
    (["--set", "MODULES=a`id`"], ["MODULES", "command substitution"]),
    (["--set", "MODULES=a\nb"], ["MODULES", "new line"]),
    (["--time", "1:2"], ["--time", "HH:MM:SS"]),
    (["--time", "00:61:00"], ["--time", "HH:MM:SS"]),
    (["--time", "00:00:00"], ["--time", "more than zero"]),
    (["--time", "soon"], ["--time"]),
    (["--nodes", "0"], ["--nodes", "positive"]),
    (["--nodes", "-2"], ["--nodes", "positive"]),
    (["--ntasks-per-node", "two"], ["--ntasks-per-node", "positive"]),
    (["--gpus-per-node", "0"], ["--gpus-per-node", "positive"]),
    (["--set", "NODES=0"], ["NODES", "positive"]),
    (["--set", "NO_SUCH=1"], ["no variable NO_SUCH", "VENV"]),
    (["--set", "VENV"], ["KEY=VALUE"]),
    (["--partition", "a b"], ["--partition"]),
    (["--set", "LAUNCHER=ssh"], ["LAUNCHER", "srun or mpirun"]),
    (["--"], ["nothing after --"]),
]


@pytest.mark.parametrize("args,words", BAD, ids=[" ".join(a) for a, _ in BAD])
@pytest.mark.parametrize("action", ["render", "submit"])
def test_bad_input_is_refused_before_anything_happens(tmp_path, action, args, words):
    save = tmp_path / "job.sbatch"
    extra = ["--save", str(save)] if action == "submit" else []
    cmd = [] if args == ["--"] else ["--", "hpcdl", "train"]
    # sbatch off PATH: were a bad value not caught first, submit would say so instead
    r = hpcdl("slurm", action, "single-node", *extra, *args, *cmd, cwd=tmp_path,
              env={"PATH": os.path.dirname(sys.executable)})
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcdl: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert not save.exists() and os.listdir(tmp_path) == []


def test_unknown_template_names_the_available_ones():
    r = hpcdl("slurm", "render", "no-such-template")
    assert r.returncode == 2
    assert "unknown template 'no-such-template'" in r.stderr
    assert all(t in r.stderr for t in TEMPLATES)


def test_submit_without_sbatch_says_where_to_submit():
    r = hpcdl("slurm", "submit", "single-node", env={"PATH": os.path.dirname(sys.executable)})
    assert r.returncode == 2 and "sbatch is not on PATH" in r.stderr


def test_templates_ship_in_the_built_package(tmp_path):
    """setup.py's build_py copies slurm/*.sbatch into hpcdl/slurm/templates."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # egg_info into tmp_path too: the checkout stays as it was
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base",
                        str(tmp_path), "build_py", "-d", str(tmp_path / "lib")],
                       cwd=repo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shipped = sorted(os.listdir(tmp_path / "lib" / "hpcdl" / "slurm" / "templates"))
    assert shipped == sorted(n + ".sbatch" for n in TEMPLATES)


# ---------------------------------------------------------------- summary
def write_run(folder, ranks, nodes, batch, rate):
    os.makedirs(folder)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(dict(ranks=ranks, nodes=nodes, global_batch=batch, samples_per_s=rate,
                       model="mlp", data="digits"), f)


def test_summary_table_against_its_arithmetic(tmp_path):
    runs = {"nodes-4": (16, 4, 512, 9137.5), "nodes-1": (4, 1, 128, 3001.25),
            "nodes-2": (8, 2, 256, 5710.0)}
    for name, (ranks, nodes, batch, rate) in runs.items():
        write_run(tmp_path / "sweep" / name, ranks, nodes, batch, rate)
    os.makedirs(tmp_path / "sweep" / "nodes-8")
    (tmp_path / "sweep" / "nodes-8" / "metrics.jsonl").write_text("{}\n")
    rows_file, png = tmp_path / "rows.json", tmp_path / "s.png"
    r = hpcdl("slurm", "summary", str(tmp_path / "sweep"), "--json", str(rows_file),
              "--plot", str(png))
    assert r.returncode == 0, r.stderr
    rows = json.loads(rows_file.read_text())
    assert [row["run"] for row in rows] == ["nodes-1", "nodes-2", "nodes-4"]
    base = runs["nodes-1"][3]
    for row in rows:
        ranks, _, _, rate = runs[row["run"]]
        assert row["speed_up"] == pytest.approx(rate / base)
        assert row["efficiency"] == pytest.approx(rate / base / (ranks / 4))
    table = [l.split() for l in r.stdout.splitlines() if not l.startswith("#")]
    assert [t[0] for t in table] == ["4", "8", "16"]
    assert table[2][4] == "%.2f" % (9137.5 / 3001.25)
    assert "unfinished" in r.stdout and "nodes-8" in r.stdout
    assert png.stat().st_size > 0


def test_summary_errors(tmp_path):
    r = hpcdl("slurm", "summary", str(tmp_path / "nope"))
    assert r.returncode == 2 and "is not a folder" in r.stderr
    r = hpcdl("slurm", "summary", str(tmp_path))
    assert r.returncode == 2 and "no summary.json" in r.stderr
    os.makedirs(tmp_path / "bad")
    (tmp_path / "bad" / "summary.json").write_text('{"ranks": 2}')
    r = hpcdl("slurm", "summary", str(tmp_path))
    assert r.returncode == 2 and "lacks nodes, global_batch, samples_per_s" in r.stderr


# ---------------------------------------------------------------- launch helpers
def test_default_ranks_outside_an_allocation(monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert default_ranks(None) is None and default_ranks(3) == 3


def test_select_device_on_a_machine_without_gpus():
    import torch
    from hpcdl.utils.device import select_device
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: the GPU case runs where they are")
    assert select_device(local_rank=3, local_size=4) == torch.device("cpu")
