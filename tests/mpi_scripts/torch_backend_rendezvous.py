"""torch_backend_rendezvous.py - run under mpirun: init_process_group
(argv[1] = backend) through hpcdl's env:// handler, one all_reduce, and which
store was made. argv[2] = 'torchrun-env': first set RANK, WORLD_SIZE, ...
from the launcher's variables, as hpcdl run does. Prints 'rank R BACKEND sum
S store KIND built B' per rank, or 'refused: ...' when init_process_group fails."""
import os
import sys

import torch
import torch.distributed as dist

import hpcdl.torch  # noqa: F401 - registers the backend, wraps env://
from hpcdl.torch.distributed import _rendezvous

from hpcdl.utils.rankenv import torchrun_env

backend = sys.argv[1]
if sys.argv[2:] == ["torchrun-env"]:
    os.environ.update(torchrun_env())
try:
    dist.init_process_group(backend)
except RuntimeError as e:
    print("refused: %s" % str(e).splitlines()[0], flush=True)
    sys.exit(0)
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
deferred = _rendezvous.LAST_DEFERRED
kind = "deferred" if deferred is not None else "local"
print("rank %d %s sum %s store %s built %s" % (dist.get_rank(), backend, t.tolist(), kind,
                                               deferred.built if deferred else "-"), flush=True)
dist.destroy_process_group()
