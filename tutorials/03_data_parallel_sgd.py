"""Tutorial 03 - data-parallel SGD on digits, written out in full.

Run it with 4 ranks:

    hpcdl run -n 4 -- python tutorials/03_data_parallel_sgd.py

Synchronous data-parallel SGD in four moves, each visible below:
  1. every rank starts from the same weights (broadcast from rank 0);
  2. each step, every rank takes its own slice of the same global batch;
  3. the ranks average their gradients with one all-reduce;
  4. every rank applies the same update, so the replicas never drift apart.
Then the checks: (a) the replicas are bit-identical after training; (b) the
run equals one process training on the whole global batch (rank 0 replays it
alone) up to float rounding; (c) the model learned (test accuracy > 90%).
The last section does the same with hpcdl.torch's DistributedOptimizer, the
Horovod-style wrapper that overlaps the all-reduce with backward.

Exercise (for the student):
  a. Make the slices unequal (give rank 0 two more samples per step). Which
     check fails, and why does averaging slice means then go wrong? How would
     you weight the average to fix it?
  b. Skip step 1 (no broadcast; seed each rank differently). What happens to
     check (a), and does the model still learn?
  c. Replace the average by a sum without changing the learning rate. What
     learning rate makes it equivalent again?
"""
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from hpcdl import comm

c = comm.init()
rank, size = c.rank, c.size
torch.manual_seed(rank)  # deliberately different: step 1 must make them equal
torch.set_num_threads(1)

GLOBAL_BATCH, STEPS, LR = 64 * size, 150, 0.5
assert GLOBAL_BATCH % size == 0
LOCAL = GLOBAL_BATCH // size

x, y = load_digits(return_X_y=True)
x = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-8), dtype=torch.float32)
y = torch.tensor(y)
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def batch_indices(step):
    """The global batch of a step: the same on every rank (same seed)."""
    g = np.random.default_rng(step)
    return torch.from_numpy(g.choice(len(y_train), GLOBAL_BATCH, replace=False))


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# 1. the same starting point everywhere: rank 0's weights
model = make_model()
start = flat_params(model)
c.broadcast(start, root=0)
torch.nn.utils.vector_to_parameters(start.clone(), model.parameters())  # a copy: it aliases

for step in range(STEPS):
    idx = batch_indices(step)
    mine = idx[rank * LOCAL:(rank + 1) * LOCAL]          # 2. my slice
    model.zero_grad()
    F.cross_entropy(model(x_train[mine]), y_train[mine]).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    c.allreduce(grads, op="average")                      # 3. average over ranks
    offset = 0
    with torch.no_grad():                                 # 4. the same update everywhere
        for p in model.parameters():
            p -= LR * grads[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

# (a) bit-identical replicas: gather every rank's parameters
final = flat_params(model)
everyone = c.allgather_object(final.numpy())
identical = all(np.array_equal(everyone[0], other) for other in everyone)

# (b) rank 0 replays the run alone on the whole global batch
ok_single, diff = True, 0.0
if rank == 0:
    alone = make_model()
    torch.nn.utils.vector_to_parameters(start.clone(), alone.parameters())
    for step in range(STEPS):
        idx = batch_indices(step)
        alone.zero_grad()
        F.cross_entropy(alone(x_train[idx]), y_train[idx]).backward()
        with torch.no_grad():
            for p in alone.parameters():
                p -= LR * p.grad
    diff = (flat_params(alone) - final).abs().max().item()
    ok_single = diff < 1e-4

# (c) it learned
with torch.no_grad():
    acc = (model(x_test).argmax(1) == y_test).float().mean().item()

comm.print0("data-parallel SGD on %d ranks: global batch %d (%d per rank), %d steps, lr %g"
            % (size, GLOBAL_BATCH, LOCAL, STEPS, LR))
comm.print0("check (a) replicas bit-identical:            %s" % ("ok" if identical else "FAILED"))
comm.print0("check (b) equals one process, max |diff| %.2e: %s"
            % (diff, "ok" if ok_single else "FAILED"))
comm.print0("check (c) test accuracy %.4f > 0.90:          %s"
            % (acc, "ok" if acc > 0.9 else "FAILED"))

# The same training with hpcdl.torch (Horovod's API): DistributedOptimizer
# averages gradients in fusion buckets while backward runs.
import hpcdl.torch as hvd  # noqa: E402  (after the hand-written version on purpose)

hvd.init()
model2 = make_model()
torch.nn.utils.vector_to_parameters(start.clone(), model2.parameters())  # same start
hvd.broadcast_parameters(model2.state_dict(), root_rank=0)       # Horovod's step 1
opt = hvd.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=LR),
                               named_parameters=model2.named_parameters())
for step in range(STEPS):
    mine = batch_indices(step)[rank * LOCAL:(rank + 1) * LOCAL]
    opt.zero_grad()
    F.cross_entropy(model2(x_train[mine]), y_train[mine]).backward()
    opt.step()
diff2 = (flat_params(model2) - final).abs().max().item()
same = diff2 < 1e-5
comm.print0("check (d) DistributedOptimizer matches the hand-written loop, max |diff| %.2e: %s"
            % (diff2, "ok" if same else "FAILED"))

ok = identical and ok_single and acc > 0.9 and same
ok = c.bcast_object(ok, root=0) and ok
comm.print0("all checks passed" if ok else "some checks FAILED")
raise SystemExit(0 if ok else 1)
