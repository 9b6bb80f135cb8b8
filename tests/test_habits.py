"""test_habits.py - what horovodrun, mpirun and torchrun users type without
thinking (issue 32, item 5): `hpcdl run -np 2 python train.py --epochs 1`
without `--`; a torchrun-style script's init_process_group("gloo") under
`hpcdl run` (MASTER_ADDR / MASTER_PORT); `-H host:2,...` without -n starting
every slot; and no argparse abbreviations anywhere."""
import os
import subprocess
import sys

import pytest

from hpcdl.cli.main import build_parser, parsers
from mpi_harness import mpi_env

HPCDL = [sys.executable, "-m", "hpcdl"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCHRUN_SCRIPT = """
import argparse, os, sys
import torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, required=True)
a = p.parse_args()
dist.init_process_group("gloo")          # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
x = torch.arange(4, dtype=torch.float32) + dist.get_rank()
dist.all_reduce(x)
sys.stdout.write("GLOO %d %d %s %s\\n" % (dist.get_rank(), a.epochs,
                 ",".join("%g" % v for v in x.tolist()), os.environ["MASTER_ADDR"]))
dist.destroy_process_group()
"""


def hpcdl(*args, timeout=180, env=None):
    e = mpi_env(env)  # not inside the test's own job
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        e.pop(var, None)
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=REPO)


@pytest.mark.mpi
def test_horovodrun_form_and_a_torchrun_script(tmp_path):
    """No `--`, the script's own --epochs after it, and dist.init_process_group
    with nothing but what hpcdl run sets (it failed on every rank: no
    MASTER_ADDR)."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    r = hpcdl("run", "-np", "2", "python", str(script), "--epochs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = sorted(l.split() for l in r.stdout.splitlines() if l.startswith("GLOO"))
    # sum over ranks of arange(4) + rank: 2 * i + 1
    assert rows == [["GLOO", "0", "1", "1,3,5,7", "127.0.0.1"],
                    ["GLOO", "1", "1", "1,3,5,7", "127.0.0.1"]], r.stdout + r.stderr


@pytest.mark.mpi
def test_hosts_without_n_start_every_slot():
    """-H localhost:3 without -n starts 3 ranks, as mpirun does (it started 1);
    MASTER_ADDR is the first host listed."""
    code = ("import os, sys; sys.stdout.write('R %s %s %s\\n' % (os.environ['RANK'], "
            "os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR']))")
    r = hpcdl("run", "-H", "localhost:3", "--", "python", "-c", code)
    assert r.returncode == 0, r.stderr
    rows = sorted(l.split()[1:] for l in r.stdout.splitlines() if l.startswith("R "))
    assert rows == [[str(i), "3", "localhost"] for i in range(3)], r.stdout + r.stderr


def test_rendezvous_respects_the_users_values():
    from hpcdl.cli.run import rendezvous_env
    assert rendezvous_env({"MASTER_ADDR": "a", "MASTER_PORT": "1"}, "b:2") == []
    got = dict(v.split("=") for v in rendezvous_env({}, "nodeA:2,nodeB:2"))
    assert got["MASTER_ADDR"] == "nodeA" and 0 < int(got["MASTER_PORT"]) < 65536
    assert rendezvous_env({"MASTER_PORT": "29500"}, None) == ["MASTER_ADDR=127.0.0.1"]


def test_no_abbreviations_anywhere():
    """`hpcdl train --lr 0.05` was taken as --lr-scaling 0.05, `--lr linear`
    silently set the scaling rule; a prefix is now an unknown option."""
    top = build_parser()
    assert all(not p.allow_abbrev for p in parsers(top))
    args, extra = top.parse_known_args(["train", "--lr-sc", "linear"])
    assert extra == ["--lr-sc", "linear"] and not hasattr(args, "lr_scaling")
    args, extra = top.parse_known_args(["train", "--lr", "0.05"])
    if any("--lr" in a.option_strings for p in parsers(top) for a in p._actions):
        assert args.base_lr == 0.05 and not extra  # --lr is the learning rate
    else:
        assert extra == ["--lr", "0.05"] and not hasattr(args, "lr_scaling")
    r = subprocess.run(HPCDL + ["train", "--lr-sc", "linear"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "unrecognized arguments: --lr-sc linear" in r.stderr


def test_bench_cuda_without_a_gpu_is_refused_before_launch():
    """Issue 32 item 7: it was refused only after launch (twice, plus a banner)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = hpcdl("bench", "allreduce", "-n", "2", "--device", "cuda")
    assert r.returncode == 2 and "hpcdl run:" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "hpcdl: error: --device cuda: torch sees no GPU here (run on a GPU node, or use "
        "--device cpu)"], r.stderr
