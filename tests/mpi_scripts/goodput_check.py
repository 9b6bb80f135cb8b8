"""goodput_check.py - run under mpirun (2 ranks) with a scratch directory:
`--global-batch auto` (hpcdl/train/goodput.py) on digits.

Run A trains uninterrupted, a checkpoint after every epoch; the one written
after epoch 2 (the batch already re-picked at epoch 1's end) is kept. Run B
resumes from that copy. Rank 0 prints one line 'RESULT {json}': both
summaries' params_sha256, steps and final global batch, and A's per-epoch
batches, for the test to compare (exact resume: the same params_sha256).
"""
import json
import os
import shutil
import sys

from hpcdl import comm
from hpcdl.train import TrainConfig, train, trainer

scratch = sys.argv[1]
KEEP = os.path.join(scratch, "after-epoch-2.pt")
saved = trainer.save_checkpoint


def save_and_keep(run):
    path = saved(run)
    if run.epoch == 3 and comm.rank() == 0 and not os.path.exists(KEEP):
        shutil.copy(path, KEEP)  # written after epoch 2: the position is epoch 3 step 0
    comm.barrier()
    return path


trainer.save_checkpoint = save_and_keep


def config(name, **extra):
    return TrainConfig(global_batch="auto", base_batch=32, max_global_batch=128, epochs=2,
                       hidden=(32,), seed=3, checkpoint_dir=os.path.join(scratch, name),
                       out=os.path.join(scratch, "out-" + name), **extra)


a = train(config("a"))
b = train(config("b", resume=KEEP))
if comm.rank() == 0:
    with open(os.path.join(scratch, "out-a", "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    print("RESULT " + json.dumps(dict(
        a=[a["params_sha256"], a["steps"], a["global_batch"]],
        b=[b["params_sha256"], b["steps"], b["global_batch"]],
        batches=[r["global_batch"] for r in recs],
        next=[r["next_global_batch"] for r in recs],
        goodput=recs[0]["goodput"], model=recs[0].get("step_time_model"))))
