"""goodput_check.py - run under mpirun (2 ranks) with a scratch directory:
`--global-batch auto` (hpcdl/train/goodput.py) on digits.

Run A trains uninterrupted, a checkpoint after every epoch; the one written
after epoch 2 (the batch already re-picked at epoch 1's end) is kept. Run B
resumes from that copy. Rank 0 prints one line 'RESULT {json}': both
summaries' params_sha256, steps and final global batch, and A's per-epoch
batches, for the test to compare (exact resume: the same params_sha256).
A and B re-pick at epoch ends only (--repick-steps 0); C re-picks every 10
steps as well and keeps a checkpoint 3 steps after its first change within
an epoch, from which D resumes (the same params_sha256 as C).
"""
import json
import os
import shutil
import sys

from hpcdl import comm
from hpcdl.train import TrainConfig, train, trainer

scratch = sys.argv[1]
KEEP = os.path.join(scratch, "after-epoch-2")  # checkpoint.pt and the save directory it names
saved = trainer.save_checkpoint


def save_and_keep(run):
    path = saved(run)
    if run.epoch == 3 and comm.rank() == 0 and not os.path.exists(KEEP):
        shutil.copytree(os.path.dirname(path), KEEP)  # after epoch 2: at epoch 3 step 0
    comm.barrier()
    return path


trainer.save_checkpoint = save_and_keep
MID = os.path.join(scratch, "mid-epoch")  # run C's checkpoint dir, 3 steps after a change within
step_done, kept_mid = trainer.Run.step_done, []


def step_done_and_keep(run, *args):
    """Run C: a checkpoint 3 steps after the first change of the batch within
    an epoch (every rank saves at the same step; rank 0 copies the directory)."""
    step_done(run, *args)
    if run.cfg.repick_steps and run.epoch_start and run.step_in_epoch == 3 and not kept_mid:
        kept_mid.append(trainer.save_checkpoint(run))
        if comm.rank() == 0:
            shutil.copytree(run.cfg.checkpoint_dir, MID)
        comm.barrier()


trainer.Run.step_done = step_done_and_keep


def config(name, **extra):
    return TrainConfig(global_batch="auto", base_batch=32, max_global_batch=128, epochs=2,
                       hidden=(32,), seed=3, checkpoint_dir=os.path.join(scratch, name),
                       out=os.path.join(scratch, "out-" + name), **extra)


def records(name):
    with open(os.path.join(scratch, "out-" + name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def ending(summary):
    return [summary["params_sha256"], summary["steps"], summary["global_batch"]]


a = train(config("a", repick_steps=0))
b = train(config("b", repick_steps=0, resume=os.path.join(KEEP, "checkpoint.pt")))
c = train(config("c", repick_steps=10))  # re-picks within epochs too
d = train(config("d", repick_steps=10, resume=os.path.join(MID, "checkpoint.pt")))
if comm.rank() == 0:
    recs = records("a")
    print("RESULT " + json.dumps(dict(
        a=ending(a), b=ending(b), c=ending(c), d=ending(d),
        batches=[r["global_batch"] for r in recs],
        next=[r["next_global_batch"] for r in recs],
        goodput=recs[0]["goodput"], model=recs[0].get("step_time_model"),
        within=[r.get("changes_within", []) for r in records("c")],
        c_model=records("c")[0].get("step_time_model"))))
