"""torch_example_horovod.py - a Horovod PyTorch training script in the shape
of Horovod's own examples (pytorch_mnist.py), unchanged but for the import
line, on a synthetic classification set (no downloads):

    hpcdl run -n 4 -- python tests/mpi_scripts/torch_example_horovod.py

It ends with a check: every rank holds the same parameters and the loss has
fallen. Prints 'EXAMPLE OK' on rank 0, exits non-zero otherwise."""
import sys

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpcdl.torch as hvd  # was: import horovod.torch as hvd

EPOCHS, BATCH, LR = 4, 32, 0.05

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(42 + hvd.rank())  # different on purpose: the broadcast must fix it

# a fixed synthetic set: 20 features, 4 classes from a random linear map
gen = torch.Generator().manual_seed(0)
X = torch.randn(1024, 20, generator=gen)
Y = (X @ torch.randn(20, 4, generator=gen)).argmax(1)
dataset = TensorDataset(X, Y)
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, op=hvd.Average)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # after wrapping too (imagenet example)


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


def evaluate():
    """(loss, accuracy) over the whole set, each rank scoring its shard."""
    model.eval()
    idx = list(sampler)
    with torch.no_grad():
        out = model(X[idx])
        loss = F.cross_entropy(out, Y[idx]).item()
        acc = (out.argmax(1) == Y[idx]).float().mean().item()
    return metric_average(loss, "avg_loss"), metric_average(acc, "avg_accuracy")


first_loss, _ = evaluate()
for epoch in range(EPOCHS):
    model.train()
    sampler.set_epoch(epoch)
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    test_loss, test_acc = evaluate()
    if hvd.rank() == 0:
        print("epoch %d  loss %.4f  accuracy %.3f" % (epoch, test_loss, test_acc), flush=True)

# the check: identical parameters everywhere, and learning happened
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = torch.equal(hvd.allreduce(flat, op=hvd.Max), hvd.allreduce(flat, op=hvd.Min))
learned = test_loss < 0.5 * first_loss and test_acc > 0.8
if hvd.rank() == 0:
    print("EXAMPLE %s (ranks %d, parameters identical: %s, loss %.3f -> %.3f)"
          % ("OK" if same and learned else "FAILED", hvd.size(), same, first_loss, test_loss))
hvd.shutdown()
sys.exit(0 if same and learned else 1)
