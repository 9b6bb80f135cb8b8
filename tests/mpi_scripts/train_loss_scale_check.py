"""train_loss_scale_check.py - the fp16 loss scaler's skip decision is agreed:
an overflow on one rank only makes every rank skip and halve the scale; clean
gradients are unscaled exactly; the scale doubles after growth_interval steps."""
import sys

import torch

from hpcdl import comm
from hpcdl.train.precision import LossScaler

comm.init()
rank = comm.rank()
scaler = LossScaler(init_scale=1024.0, growth_interval=3, agree=comm.any_rank)
p = torch.nn.Parameter(torch.zeros(5))
results = []
for step in range(6):
    p.grad = torch.arange(5.0) * 1024.0 * (rank + 1)
    if step == 1 and rank == comm.size() - 1:
        p.grad[2] = float("inf")  # only the last rank overflows
    before = scaler.scale
    took = scaler.unscale_and_check([p])
    if took and not torch.equal(p.grad, torch.arange(5.0) * (rank + 1) * 1024.0 / before):
        took = "wrong unscale: %s" % p.grad.tolist()
    results.append((took, scaler.scale))
expected = [(True, 1024.0), (False, 512.0), (True, 512.0), (True, 512.0), (True, 1024.0),
            (True, 1024.0)]
ok = results == expected and scaler.skipped == 1
sys.stdout.write("rank %d results %s skipped %d %s\n"
                 % (rank, results, scaler.skipped, "OK" if ok else "FAILED"))
sys.exit(0 if ok else 1)
