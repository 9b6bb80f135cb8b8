"""checkpoint_matrix.py - run under mpirun on 4 ranks: the resume matrix of
`hpcdl train`: every --zero stage (0-3) on 2, 3 and 4 ranks writes a
checkpoint after epoch 1, and every one of them is resumed by every stage on
every rank count for epoch 2, all in this one launch (each run on the first
N ranks of the job, through hpcdl.comm.init(comm=...); the others wait).

argv: matrix DIR [READER_STAGES, default 0,1,2,3] | older DIR... For each
reader (S', M) the uninterrupted 2-epoch run of (S', M) on this machine is
the reference. Where the sums cannot differ (exact(): the same stage and
ranks, any stages on 2 ranks, stages 0 and 1 on the same ranks) the resumed
run must end with its parameters bit for bit; elsewhere within TOL relative
(max |a - b| / max |b| over each tensor): the first epoch's gradients were
summed in another order, that is all. Each resumed run must take the
reference's steps. Rank 0 prints one line per pair ('PAIR S,N -> S',M
worst=...'), the worst of the pairs that may differ, and 'MATRIX OK' or the
failures (exit 1). `older DIR...` (2 ranks): older hpcdl versions'
checkpoints of each stage, each resumed by each stage (older()).

Data and model are small on purpose (synthetic 1x4x4, 5 classes, 600 samples;
MLP 16; Adam, whose state has per-element moments and a 0-d step; global
batch 24, divisible by 2, 3 and 4 ranks; constant lr, so a 1-epoch run's
schedule is the 2-epoch run's first half).
"""
import contextlib
import io
import os
import sys

import torch
from mpi4py import MPI

from hpcdl import comm
from hpcdl.train import TrainConfig, report
from hpcdl.train.trainer import train

STAGES, RANKS = (0, 1, 2, 3), (2, 3, 4)
TOL = 1e-5
OLD_TOL = 1e-4  # older checkpoints' first epoch may come from another CPU
WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
BASE = dict(data="synthetic:1x4x4:5:600", hidden=(16,), global_batch=24, optimizer="adam",
            base_lr=0.01, schedule="constant", seed=3)

_model = {}
_finish = report.Reporter.finish


def _capture(self, summary, model):  # the whole model at the end of each run
    _model["last"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _finish(self, summary, model)


report.Reporter.finish = _capture


def run_on(n, **options):
    """Runs hpcdl train on ranks 0..n-1 of the job; returns (summary, whole
    model) on rank 0, None elsewhere."""
    sub = WORLD.Split(0 if RANK < n else MPI.UNDEFINED, RANK)
    result = None
    if RANK < n:
        try:
            comm.init(comm=sub)
            with contextlib.redirect_stdout(io.StringIO()):  # 168 runs' tables: not needed
                summary = train(TrainConfig(**dict(BASE, **options)))
        except BaseException:  # the waiting ranks would hang in the barrier below
            import traceback
            traceback.print_exc()
            WORLD.Abort(1)
        result = (summary, _model.pop("last"))
        comm.shutdown()
        sub.Free()
    WORLD.Barrier()
    return result if RANK == 0 else None


def worst(a, b):
    return max(((a[k] - v).abs().max() / (v.abs().max() + 1e-12)).item() for k, v in b.items())


def exact(s, n, r, m):
    """Where the sums cannot differ: the same stage and ranks; 2 ranks (each
    element's reduction is one addition, a + b == b + a); stages 0 and 1 on
    the same ranks (both all-reduce the gradients alike; stage 1 shards only
    the optimizer's element-wise step)."""
    return (s, n) == (r, m) or n == m == 2 or (n == m and {s, r} <= {0, 1})


def matrix(directory, readers):
    configs = [(s, n) for s in STAGES for n in RANKS]
    for s, n in configs:  # each writer's checkpoint after epoch 1
        run_on(n, zero=s, epochs=1, checkpoint_dir=os.path.join(directory, "w%d-%d" % (s, n)))
    fails, inexact = [], 0.0
    for r in readers:
        for m in RANKS:
            full = run_on(m, zero=r, epochs=2)
            for s, n in configs:
                got = run_on(m, zero=r, epochs=2, resume=os.path.join(
                    directory, "w%d-%d" % (s, n), "checkpoint.pt"))
                if RANK == 0:
                    fails += check("%d,%d -> %d,%d" % (s, n, r, m), got, full,
                                   exact(s, n, r, m))
                    if not exact(s, n, r, m):
                        inexact = max(inexact, worst(got[1], full[1]))
    if RANK == 0:
        print("worst of the pairs that may differ: %.3g (tolerance %g)" % (inexact, TOL))
    return fails


def check(pair, got, full, same_sums):
    """The failures of one resumed run against the uninterrupted one."""
    diff = worst(got[1], full[1])
    line = "PAIR %s worst=%.3g steps=%d %s" % (pair, diff, got[0]["steps"],
                                              "exact" if same_sums else "tolerance")
    print(line, flush=True)
    fails = []
    if got[0]["steps"] != full[0]["steps"]:
        fails.append("%s: the uninterrupted run took %d steps" % (line, full[0]["steps"]))
    if same_sums and got[0]["params_sha256"] != full[0]["params_sha256"]:
        fails.append("%s: not bit for bit" % line)
    if diff > TOL:
        fails.append("%s: beyond %g" % (line, TOL))
    return fails


def older(directories):
    """Checkpoints of older hpcdl versions (2 ranks, digits, --epochs 1
    --global-batch 64 --hidden 32, --zero S in zeroS/): each resumed by each
    stage on 2 ranks. Their first epoch may have been computed on another
    CPU, so the resumes of one checkpoint directory set must agree with each
    other bit for bit (the same bytes, then 2 ranks: the same sums), and
    with today's uninterrupted run within OLD_TOL."""
    options = dict(data="digits", hidden=(32,), global_batch=64, optimizer="sgd",
                   base_lr=0.1, schedule="constant", seed=0, epochs=2)
    full = run_on(2, **options)
    fails = []
    for directory in directories:
        first = None
        for s in sorted(os.listdir(directory)):
            for r in STAGES:
                got = run_on(2, zero=r, resume=os.path.join(directory, s, "checkpoint.pt"),
                             **options)
                if RANK != 0:
                    continue
                first = first or got
                pair = "%s %s -> %d,2" % (os.path.basename(directory), s, r)
                fails += check(pair, got, first, True)
                if worst(got[1], full[1]) > OLD_TOL:
                    fails.append("%s: %.3g from today's run, beyond %g"
                                 % (pair, worst(got[1], full[1]), OLD_TOL))
    return fails


if __name__ == "__main__":
    MODE, WHERE = sys.argv[1], sys.argv[2]
    if MODE == "matrix":
        failed = matrix(WHERE, [int(s) for s in (sys.argv[3] if len(sys.argv) > 3
                                                  else "0,1,2,3").split(",")])
    else:
        failed = older(sys.argv[2:])
    if RANK == 0:
        print("\n".join(failed) if failed else "MATRIX OK", flush=True)
    sys.exit(1 if failed else 0)
