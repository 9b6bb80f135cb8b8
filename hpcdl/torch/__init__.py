"""hpcdl.torch - Horovod's PyTorch API on hpcdl's collectives, so that a
Horovod script runs with one changed line:

    import hpcdl.torch as hvd          # was: import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(42)
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Run with `hpcdl run -n 4 -- python train.py` (or mpirun / srun). What is
supported and how it differs from Horovod: docs/horovod.md.
"""
from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import *  # noqa: F401,F403 - the collectives grid, listed in mpi_ops.__all__
from .mpi_ops import __all__ as _ops_all
from .distributed_optimizer import DistributedOptimizer  # a function, as Horovod's
from .sync_batch_norm import SyncBatchNorm
from .zero.stage3 import shard_model  # ZeRO stage 3 (docs/zero.md)
from . import elastic  # hvd.elastic.run, TorchState, ... (restart-based)
from ..trace import start_timeline, stop_timeline
from . import distributed as _distributed  # torch.distributed backend "hpcdl"
_distributed.register()  # cheap: records a creator with torch, starts no MPI

__all__ = list(_ops_all) + ["Compression", "DistributedOptimizer", "SyncBatchNorm",
                            "broadcast_parameters", "broadcast_optimizer_state",
                            "broadcast_object", "allgather_object", "start_timeline",
                            "stop_timeline", "elastic", "shard_model"]
