"""torch_init_check.py - run under mpirun with 4 ranks: hvd.init on a list of
world ranks and on an mpi4py communicator, re-init after shutdown, and a
single collective on each to show the communicator is the one asked for.
Every rank prints one 'INIT ...' line per stage; the test reads them."""
import torch
from mpi4py import MPI

import hpcdl.torch as hvd

W = MPI.COMM_WORLD.Get_rank()


def report(stage):
    x = torch.tensor([float(W)])
    total = hvd.allreduce(x, op=hvd.Sum).item()
    print("INIT %s world %d rank %d size %d sum %g" % (stage, W, hvd.rank(), hvd.size(), total),
          flush=True)


# a list of world ranks: every world rank calls, ranks outside get ValueError
try:
    hvd.init(comm=[0, 2])
    report("list")
    hvd.shutdown()
except ValueError as e:
    print("INIT list world %d outside: %s" % (W, e), flush=True)

# an mpi4py communicator: even and odd world ranks apart
hvd.init(comm=MPI.COMM_WORLD.Split(W % 2, W))
report("split")
hvd.init()  # already initialized: a no-op, same communicator
report("again")
hvd.shutdown()

hvd.init()  # back on COMM_WORLD
report("world")
hvd.shutdown()
