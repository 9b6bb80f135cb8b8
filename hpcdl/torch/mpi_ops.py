"""mpi_ops.py - the Horovod module path for the collectives, so that
`from horovod.torch.mpi_ops import allreduce_async_` style imports port over
as `from hpcdl.torch.mpi_ops import allreduce_async_`. The work lives in
_basics (init, topology, ops), allreduce_ops, gather_ops, alltoall_ops and
_handles (poll / synchronize); join and barrier are here.
"""
import time

import torch

from ._basics import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, ccl_built, comm_op,
                      cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, handle_average_backwards_compatibility, init,
                      is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                      mpi_enabled,
                      mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size)
from ._handles import poll, synchronize, world
from .allreduce_ops import (allreduce, allreduce_, allreduce_async, allreduce_async_,
                            grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                            grouped_allreduce_async_)
from .alltoall_ops import alltoall, alltoall_async
from .gather_ops import (allgather, allgather_async, broadcast, broadcast_, broadcast_async,
                         broadcast_async_, grouped_allgather, grouped_allgather_async,
                         grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                         reducescatter_async)


def barrier():
    """Returns once every rank has called barrier()."""
    world().barrier()


def join(device=-1):
    """Collective: returns once every rank has called join(), with the rank
    that called it last (agreed through one all-gather of arrival times;
    ties go to the higher rank).

    Unlike Horovod, ranks that have joined do not keep answering the other
    ranks' all-reduces with zeros: every rank must make the same collective
    calls before join(). For uneven data, give every rank the same number
    of batches (torch's DistributedSampler pads to equal shards). device is
    accepted for Horovod compatibility and unused.
    """
    arrived = torch.tensor([time.time()], dtype=torch.float64)
    times = world().allgather(arrived).tolist()
    return max(range(len(times)), key=lambda r: (times[r], r))


__all__ = [
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_built",
    "mpi_enabled",
    "gloo_built", "gloo_enabled", "nccl_built", "ddl_built", "ccl_built", "rocm_built",
    "cuda_built", "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "handle_average_backwards_compatibility", "comm_op",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_allgather", "grouped_allgather_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "poll", "synchronize", "barrier",
    "join",
]
