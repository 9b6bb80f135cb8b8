"""zero_misuse.py - run under mpirun: a zero_stage outside 0..2 is a
ValueError on every rank that names the supported stages, before any
collective (so no rank waits); afterwards a good one steps, and
broadcast_optimizer_state works on it. Prints 'MISUSE OK' per rank."""
import sys

import torch

import hpcdl.torch as hvd

hvd.init()
R = hvd.rank()
model = torch.nn.Linear(5, 3)
fails = []
for bad, words in ((5, "zero_stage must be 0"), (-1, "zero_stage must be 0"),
                   ("1", "zero_stage must be 0"), (True, "zero_stage must be 0"),
                   (3, "zero_stage=3 (sharded parameters) is not implemented")):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), zero_stage=bad)
        fails.append("zero_stage=%r accepted" % (bad,))
    except ValueError as e:
        if words not in str(e):
            fails.append("zero_stage=%r: unclear message %r" % (bad, str(e)))
# still usable afterwards: a good one builds and steps on every rank
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), zero_stage=2)
model(torch.randn(4, 5)).sum().backward()
opt.step()
# broadcast_optimizer_state joins the collective state_dict() on every rank (no hang)
hvd.broadcast_optimizer_state(opt, root_rank=0)
if opt.state_dict()["param_groups"][0]["lr"] != 0.1:
    fails.append("broadcast_optimizer_state lost the lr")
print("[rank %d] MISUSE %s%s" % (R, "FAIL" if fails else "OK", "".join("\n  " + f for f in fails)),
      flush=True)
sys.exit(1 if fails else 0)
