"""ps_common.py - shared by the ps_*_check.py scripts (run under mpirun): the
digits data and MLP, the worker loop of one round, the all-reduce reference
run, and one verdict line summed with mpi4py's own MPI_Allreduce (rank 0
prints 'CHECKS n FAILED k'; every rank exits non-zero if k > 0)."""
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from hpcdl import comm, models
from hpcdl.comm import Communicator
from hpcdl.train import data

C = comm.init()
R, N = C.rank, C.size
torch.set_num_threads(1)
DS = data.load("digits", seed=0)
_state = {"checks": 0, "failures": 0}


def say(msg):
    sys.stdout.write("[rank %d] %s\n" % (R, msg))


def check(ok, what):
    _state["checks"] += 1
    if not ok:
        _state["failures"] += 1
        say("FAIL " + what)


def verdict():
    t = np.array(list(_state.values()), np.int64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)
    if R == 0:
        sys.stdout.write("CHECKS %d FAILED %d\n" % tuple(t))
    sys.stdout.flush()
    return int(t[1])


def mlp(seed=0):
    torch.manual_seed(seed)
    return models.build("mlp", DS.num_features, DS.num_classes, hidden=(32,))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def batches(epoch, G, part, parts, steps):
    """(x, y) of the first `steps` steps of epoch for slice `part` of `parts`."""
    rows = data.epoch_shard(len(DS.y_train), G, part, parts, seed=0, epoch=epoch)[:steps]
    for idx in torch.from_numpy(rows):
        yield DS.x_train[idx], DS.y_train[idx]


def lr_of(epoch, s):
    """A learning rate that changes every step, so a wrong lr shows."""
    return 0.05 * (1.0 + 0.5 * ((epoch * 7 + s) % 3))


def worker_round(ps, epoch, G, steps, sleep=0.0):
    """One round on a worker: its slice of each step, loss via the closure."""
    model, losses = ps.model, []

    def closure(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.item()
    for s, (x, y) in enumerate(batches(epoch, G, ps.worker_rank, ps.num_workers, steps)):
        if sleep:
            time.sleep(sleep)
        losses.append(ps.step(lambda: closure(x, y), lr=lr_of(epoch, s)))
    ps.end_round()
    return losses


def run_round(ps, epoch, G, steps, sleep=0.0):
    if ps.is_server:
        ps.serve()
        return []
    return worker_round(ps, epoch, G, steps, sleep)


def allreduce_reference(workers, epochs, G, steps, momentum, weight_decay):
    """Synchronous data-parallel SGD on the communicator `workers` (hpcdl's
    average all-reduce of the gradients, then torch.optim.SGD): the flat
    parameters after the same epochs and steps, from the same initial model."""
    c = Communicator(workers)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum,
                          weight_decay=weight_decay)
    params = list(model.parameters())
    for epoch in epochs:
        for s, (x, y) in enumerate(batches(epoch, G, c.rank, c.size, steps)):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            g = torch.cat([p.grad.reshape(-1) for p in params])
            c.allreduce(g, op="average")
            offset = 0
            for p in params:
                p.grad.copy_(g[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.param_groups[0]["lr"] = lr_of(epoch, s)
            opt.step()
    c.close()
    return flat(model)
