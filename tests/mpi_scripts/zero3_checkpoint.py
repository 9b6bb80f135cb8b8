"""zero3_checkpoint.py - run under mpirun: sharded checkpoints of a stage-3
model and its optimizer (hpcdl.checkpoint.zero), saved on one rank
count and loaded on the same or another.

argv: save|load DIR [CASE...]: first zero3_exact.py's cases (tolerance 1e-6),
in the same launch. The model and step are zero3_exact.py's (uneven
sizes, Adam, two parameter groups, StepLR). `save` (run it on 3 ranks) trains
3 steps, saves to DIR, loads DIR into a fresh sharded model and optimizer on
the same ranks and checks that both take bit-identical next steps; then the
refusals: a manifest of another model, a missing rank file, another
optimizer grouping, another optimizer class (SGD for Adam), a truncated rank
file (torch's text quoted up to a sentence's end): a ValueError on every
rank, and no file changed. A stage-2 DistributedOptimizer's directory of the
same model loads (by name), and a manifest from before the stage and
optimizer class were recorded still loads.
`load` (run it on 2 ranks: resharding) loads DIR into a fresh model, trains
3 more steps and compares with one process that trained all 6 steps (within
1e-6 relative). Prints 'CKPT OK' per rank, exits non-zero on any failure."""
import json
import os
import re
import shutil
import sys

import torch
import torch.nn as nn

import hpcdl.torch as hvd
from hpcdl.checkpoint import buckets
from hpcdl.checkpoint.files import MANIFEST, shard_file as rank_file
from hpcdl.checkpoint.zero import load_sharded, save_sharded
import zero_common
from zero_common import digest
from zero3_exact import B, N, R, Net, make_opt, run, train_step

MODE, DIR = sys.argv[1], sys.argv[2]
fails = [f for case in sys.argv[3:] for f in run(case, 1e-6)]
STEPS = 6
torch.manual_seed(1234)
ref_model = Net()
X, Y = torch.randn(STEPS, B, 13), torch.randint(0, 3, (STEPS, B))
per = B // N


def sharded(seed):
    torch.manual_seed(seed)
    model = Net()
    shards = hvd.shard_model(model, sync=False)  # the checkpoint, not rank 0, sets them
    opt, sched = make_opt(model, "adam")
    return model, shards, opt, sched


def steps(model, opt, sched, first, last):
    for s in range(first, last):
        train_step(model, opt, sched, X[s, R * per:(R + 1) * per],
                   Y[s, R * per:(R + 1) * per], 1)


def whole(shards):
    shards.unshard()
    out = {k: v.clone() for k, v in shards.model.state_dict().items()}
    shards.reshard()
    return out



def refused(what, words, call):
    zero_common.refused(fails, what, words, call)


if MODE == "save":
    torch.manual_seed(1234)
    model = Net()
    shards = hvd.shard_model(model)
    opt, sched = make_opt(model, "adam")
    steps(model, opt, sched, 0, 3)
    save_sharded(shards, DIR, opt, extra={"scheduler": sched.state_dict()})
    before = digest(DIR)
    again, again_shards, again_opt, again_sched = sharded(99 + R)
    extra = load_sharded(again_shards, DIR, again_opt)
    again_sched.load_state_dict(extra["scheduler"])
    steps(model, opt, sched, 3, 4)
    steps(again, again_opt, again_sched, 3, 4)
    a, b = whole(shards), whole(again_shards)
    if any(not torch.equal(a[k], b[k]) for k in a):
        fails.append("loaded on the same ranks, the next step differs")

    class Wider(Net):  # another model: fc2 has other shapes
        def __init__(self):
            super().__init__()
            self.fc2 = nn.Linear(7, 4)
    other = Wider()
    refused("another model", "parameter fc2.weight", lambda: load_sharded(
        hvd.shard_model(other), DIR))
    m2, s2, _, _ = sharded(5)
    refused("another optimizer grouping", "grouped the parameters otherwise",
            lambda: load_sharded(s2, DIR, torch.optim.Adam(m2.parameters())))
    refused("another optimizer class", "saved with optimizer class Adam, this optimizer is "
            "SGD; build it as when it was saved (Adam)",
            lambda: load_sharded(s2, DIR, make_opt(m2, "sgd")[0]))
    broken, cut, old = DIR + ".broken", DIR + ".truncated", DIR + ".old"
    if R == 0:
        for copy in (broken, cut, old):
            shutil.copytree(DIR, copy)
        os.unlink(os.path.join(broken, rank_file(1, N)))
        with open(os.path.join(cut, rank_file(1, N)), "r+b") as f:
            f.truncate(100)  # torch: "... failed finding central directory. This is ..."
        with open(os.path.join(old, MANIFEST)) as f:  # as saved before the two fields
            m = json.load(f)
        del m["stage"], m["optimizer_class"]
        with open(os.path.join(old, MANIFEST), "w") as f:
            json.dump(m, f)
    plain = Net()  # a stage-2 DistributedOptimizer's checkpoint of the same model
    hvd.broadcast_parameters(plain.state_dict(), root_rank=0)
    stage2 = DIR + ".stage2"
    buckets.save_sharded(hvd.DistributedOptimizer(
        make_opt(plain, "adam")[0], named_parameters=plain.named_parameters(), zero_stage=2),
        stage2)
    hvd.allgather_object(None)  # every rank waits for the copies
    copies = {d: digest(d) for d in (broken, cut, old, stage2)}
    refused("a missing rank file", "missing rank file(s) %s of %d; copy the whole directory "
            "as it was written" % (rank_file(1, N), N), lambda: load_sharded(s2, broken))
    load_sharded(s2, stage2)  # its buckets joined by name, cut into s2's units
    got = whole(s2)
    if any(not torch.equal(got[k], v) for k, v in plain.state_dict().items()):
        fails.append("a stage-2 checkpoint: other parameters loaded")
    text = zero_common.refused(fails, "a truncated rank file", "%s cannot be read (" %
                               rank_file(1, N), lambda: load_sharded(s2, cut))
    if not re.search(r"cannot be read \(damaged or cut short\? \w+: [^()]*[.?]( \.\.\.)?\); "
                     r"copy it again", text):
        fails.append("truncated rank file: torch's text cut mid-sentence: %r" % text)
    _, s3, opt3, _ = sharded(11)
    load_sharded(s3, old, opt3)  # no stage, no optimizer class: loads as it always did
    _, s4, opt4, _ = sharded(12)
    load_sharded(s4, DIR, opt4)
    a, b = whole(s3), whole(s4)
    if any(not torch.equal(a[k], b[k]) for k in a):
        fails.append("a manifest without stage and optimizer class loads other parameters")
    if digest(DIR) != before or {d: digest(d) for d in copies} != copies:
        fails.append("the refused loads changed files in %s or its copies" % DIR)
else:
    model, shards, opt, sched = sharded(7 + R)
    extra = load_sharded(shards, DIR, opt)
    sched.load_state_dict(extra["scheduler"])
    steps(model, opt, sched, 3, STEPS)
    ref, rsched = make_opt(ref_model, "adam")
    for s in range(STEPS):
        train_step(ref_model, ref, rsched, X[s], Y[s], 1)
    got = whole(shards)
    worst = max(((got[k] - v).abs().max() / (v.abs().max() + 1e-12)).item()
                for k, v in ref_model.state_dict().items())
    MODE += " (3 more steps: %.3g from one process)" % worst
    if worst > 1e-6:
        fails.append("resharded from the saved ranks, 3 more steps: %.3g from one process"
                     % worst)
print("[rank %d] CKPT %s %s on %d ranks%s" % (R, "FAIL" if fails else "OK", MODE, N,
                                             "".join("\n  " + f for f in fails)), flush=True)
sys.exit(1 if fails else 0)
