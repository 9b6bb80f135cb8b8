"""Tutorial 04 - a parameter server three ways: BSP, ASP and SSP.

Run it with 4 ranks (1 server, 3 workers; 2 to 4 ranks work):

    hpcdl run -n 4 -- python tutorials/04_bsp_asp_ssp.py

Rank 0 is a parameter server: it holds the MLP's parameters and applies SGD
with momentum. The other ranks are workers: each computes the gradient of its
slice of every global batch, pushes it to the server and pulls the new
parameters back. Worker 0 is a straggler: it sleeps a little in every step.
How long may the others run ahead of it?

  BSP  (bulk synchronous): never. A step's pull is answered once every worker
       has pushed that step; the server then takes one SGD step on their mean,
       exactly what synchronous all-reduce training does.
  ASP  (asynchronous): as far as they like. Every push is applied when it
       arrives; a pull is answered at once with whatever the server holds.
  SSP  (stale synchronous, bound s): at most s steps. A worker that has made c
       steps gets its parameters once the slowest worker has made c - s.

What it shows, ending in checks:
  1. the same training in each mode, with a table of wall time, each worker's
     steps per second, the largest lead over the slowest worker seen
     (staleness), pulls the server held back, and test accuracy;
  2. BSP gives the parameters of synchronous all-reduce SGD on the workers;
  3. SSP kept its bound: replayed from the server's own log of pushes and answers;
  4. every mode learns the digits.

Exercise (for the student): (a) set SLOW to 0 and STALENESS to 0, and predict
before running how the table changes. (b) Each worker reads a fixed slice of
every epoch, so the slow worker still sets the wall time in all three modes:
ASP only lets the others idle at the end of the epoch instead of at every step.
Make the straggler rotate: worker w sleeps W * SLOW, only in its steps number
k with k % W == w (so each worker sleeps as long in total as worker 0 did).
Predict which mode now finishes first, and why SSP with s >= W - 1 gets most
of ASP's speed while keeping a bound.
"""
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI

from hpcdl import comm, models
from hpcdl.comm import Communicator
from hpcdl.ps import PSTrainer
from hpcdl.ps.clock import replay
from hpcdl.train import data

c = comm.init()
rank, size = c.rank, c.size
torch.set_num_threads(1)  # ranks share the cores

W = size - 1              # workers (rank 0 is the only server)
G = 96                    # global batch: G / W samples per worker per step
assert size >= 2 and G % W == 0, "run with 2, 3, 4, 5 or 7 ranks (1 server, W workers " \
    "that split a global batch of %d evenly); this job has %d" % (G, size)
EPOCHS, LR, MOMENTUM = 3, 0.05, 0.9
SLOW = 0.02               # seconds worker 0 sleeps in every step
STALENESS = 2             # the SSP bound s

ds = data.load("digits", seed=0)  # 1,437 training and 360 test images of 8x8 pixels


def fresh_model():
    torch.manual_seed(0)  # the same initial weights in every run
    return models.build("mlp", ds.num_features, ds.num_classes, hidden=(64,))


def test_accuracy(model):
    with torch.no_grad():
        return (model(ds.x_test).argmax(1) == ds.y_test).float().mean().item()


# ---------------------------------------------------------------- 1. three modes
def train(mode, staleness=None):
    """EPOCHS epochs in one mode. Returns the model, every rank's stats, wall time."""
    model = fresh_model()
    ps = PSTrainer.create(model, mode=mode, staleness=staleness, ps_ranks=1,
                          momentum=MOMENTUM, record=True)
    slow = SLOW if ps.worker_rank == 0 else 0.0

    def closure(x, y):  # this worker's share of one step: forward, backward
        time.sleep(slow)
        F.cross_entropy(model(x), y).backward()

    c.barrier()
    t0 = time.perf_counter()
    for epoch in range(1, EPOCHS + 1):
        if ps.is_server:
            ps.serve()  # answers pushes and pulls until every worker ends the epoch
        else:
            # worker w reads the slice rank w of a W-rank all-reduce job would read
            rows = data.epoch_shard(ds.n_train, G, ps.worker_rank, W, seed=0, epoch=epoch)
            for idx in torch.from_numpy(rows):
                ps.step(lambda: closure(ds.x_train[idx], ds.y_train[idx]), lr=LR)
            ps.end_round()
        ps.sync_model()  # every rank gets the server's parameters
    wall = time.perf_counter() - t0
    stats = ps.gather_stats()
    ps.close()
    return model, stats, wall


runs = {}
for mode, s in (("bsp", None), ("asp", None), ("ssp", STALENESS)):
    runs[mode] = train(mode, s)

comm.print0("# %d worker(s), worker 0 sleeps %.0f ms a step, global batch %d, %d epochs"
            % (W, SLOW * 1e3, G, EPOCHS))
comm.print0("# %-7s %7s  %-24s %9s %6s %8s" % ("mode", "wall_s", "steps/s per worker",
                                               "staleness", "held", "test_acc"))
for mode, (model, stats, wall) in runs.items():
    workers = [st for st in stats if st["role"] == "worker"]
    rates = " ".join("%5.0f" % (st["clock"] / st["step_s"]) for st in workers)
    name = "ssp(%d)" % STALENESS if mode == "ssp" else mode
    comm.print0("  %-7s %7.2f  %-24s %9d %6d %8.3f"
                % (name, wall, rates, max(st["max_staleness"] for st in workers),
                   stats[0]["held_pulls"], test_accuracy(model)))

# ---------------------------------------------------------------- 2. BSP = all-reduce
# The workers train again, the all-reduce way: average the gradients with
# hpcdl's all-reduce among themselves, every worker takes the same SGD step.
workers = c.mpi.Split(0 if rank > 0 else MPI.UNDEFINED, rank)
gap = 0.0
if workers != MPI.COMM_NULL:
    wc = Communicator(workers)
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for epoch in range(1, EPOCHS + 1):
        rows = data.epoch_shard(ds.n_train, G, wc.rank, wc.size, seed=0, epoch=epoch)
        for idx in torch.from_numpy(rows):
            opt.zero_grad()
            F.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx]).backward()
            for p in model.parameters():
                wc.allreduce(p.grad, op="average")
            opt.step()
    wc.close()
    workers.Free()
    bsp_model = runs["bsp"][0]
    gap = max((a - b).abs().max().item()
              for a, b in zip(model.parameters(), bsp_model.parameters()))
gap = c.mpi.allreduce(gap, op=MPI.MAX)
assert gap < 1e-5, "BSP differs from all-reduce SGD by %g" % gap
comm.print0("2. BSP vs all-reduce SGD on the %d workers: max |difference| %.2g" % (W, gap))

# ---------------------------------------------------------------- 3. the SSP bound
# Replay the server's log: count pushes ourselves and look at each answered
# pull for step c: how far was c ahead of the fewest pushes at that moment?
events = runs["ssp"][1][0]["events"]
lags = [lag for _, _, lag in replay(events, W)]
assert max(lags) <= STALENESS, "SSP(%d) let a worker run %d ahead" % (STALENESS, max(lags))
comm.print0("3. SSP(%d): %d pulls answered, the largest lead over the slowest worker was %d"
            % (STALENESS, len(lags), max(lags)))

# ---------------------------------------------------------------- 4. all modes learn
for mode, (model, _, _) in runs.items():
    acc = test_accuracy(model)
    assert acc > 0.8, "%s reached only %.3f test accuracy" % (mode, acc)
comm.print0("4. every mode learned the digits (test accuracy above 0.8; chance is 0.1)")
comm.print0("tutorial 04: all checks passed on %d ranks" % size)
