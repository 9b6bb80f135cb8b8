"""ps_bsp_check.py K - run under mpirun with K parameter-server ranks: BSP
training on the digits MLP equals synchronous all-reduce SGD on the worker
ranks (same slices, momentum, weight decay, a per-step lr); a BSP run resumed
from state_dict() equals the uninterrupted one bit for bit; SSP with s = 0
reaches BSP's parameters (float tolerance) and never runs ahead."""
import sys

import torch
from mpi4py import MPI

from ps_common import (C, N, R, allreduce_reference, check, flat, mlp, run_round, say,
                       verdict)
from hpcdl.ps import PSTrainer

K = int(sys.argv[1])
W = N - K
G, STEPS, M, WD = 16 * W, 6, 0.9, 1e-3  # 16 samples per worker, 6 steps per round


def trainer(mode, staleness=None, seed=0):
    return PSTrainer.create(mlp(seed), mode=mode, staleness=staleness, ps_ranks=K,
                            momentum=M, weight_decay=WD)


# 1. BSP for 2 rounds, keeping the state between them
bsp = trainer("bsp")
run_round(bsp, 1, G, STEPS)
state = bsp.state_dict()
run_round(bsp, 2, G, STEPS)
last_pull = flat(bsp.model).clone()
bsp.sync_model()
final = flat(bsp.model)
if not bsp.is_server:  # a worker's last pull is the servers' final model
    check(torch.equal(last_pull, final), "last pull differs from the servers' parameters")
check(bsp.stats().get("max_staleness", 0) == 0, "BSP worker ran ahead: %s" % bsp.stats())

# 2. the all-reduce reference on the W worker ranks
workers = C.mpi.Split(0 if R >= K else MPI.UNDEFINED, R)
if workers != MPI.COMM_NULL:
    ref = allreduce_reference(workers, (1, 2), G, STEPS, M, WD)
    gap = (final - ref).abs().max().item()
    moved = (final - flat(mlp())).abs().max().item()
    check(moved > 1e-3, "training did not move the parameters (max change %g)" % moved)
    check(torch.allclose(final, ref, rtol=1e-5, atol=1e-6),
          "BSP vs all-reduce: max |diff| %g" % gap)
    say("BSP vs all-reduce SGD on %d workers: max |diff| %.3g (parameters moved up to %.3g)"
        % (W, gap, moved))
    workers.Free()

# 3. resume: a new trainer from another initial model, loaded with round 1's state
again = trainer("bsp", seed=123)
again.load_state_dict(state)
run_round(again, 2, G, STEPS)
again.sync_model()
check(torch.equal(flat(again.model), final), "resumed BSP differs from the uninterrupted run")

# 4. SSP with s = 0: the same path as BSP, pushes applied as they arrive
ssp0 = trainer("ssp", staleness=0)
for epoch in (1, 2):
    run_round(ssp0, epoch, G, STEPS)
ssp0.sync_model()
gap = (flat(ssp0.model) - final).abs().max().item()
check(torch.allclose(flat(ssp0.model), final, rtol=1e-4, atol=1e-5),
      "SSP(0) vs BSP: max |diff| %g" % gap)
for st in ssp0.gather_stats():
    if st["role"] == "worker":
        check(st["max_staleness"] == 0 and st["clock"] == 2 * STEPS, "SSP(0) worker: %s"
              % {k: st[k] for k in ("worker", "clock", "max_staleness")})
if R == 0:
    say("SSP(0) vs BSP: max |diff| %.3g" % gap)
for ps in (bsp, again, ssp0):
    ps.close()
sys.exit(1 if verdict() else 0)
