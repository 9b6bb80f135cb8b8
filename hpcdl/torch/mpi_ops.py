"""mpi_ops.py - the Horovod module path for the collectives, so that
`from horovod.torch.mpi_ops import allreduce_async_` style imports port over
as `from hpcdl.torch.mpi_ops import allreduce_async_`. The work lives in
_basics (init, topology, ops), allreduce_ops, gather_ops, alltoall_ops and
_handles (poll / synchronize), _join (join); barrier and sparse_allreduce
are here.
"""
import torch

from ._basics import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, ccl_built, comm_op,
                      cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, handle_average_backwards_compatibility, init,
                      is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                      mpi_enabled,
                      mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size)
from ._handles import poll, synchronize, world
from ._join import join
from .allreduce_ops import (auto_name, allreduce, allreduce_, allreduce_async, allreduce_async_,
                            grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                            grouped_allreduce_async_)
from .alltoall_ops import alltoall, alltoall_async
from .exceptions import HorovodInternalError
from .gather_ops import (allgather, allgather_async, broadcast, broadcast_, broadcast_async,
                         broadcast_async_, grouped_allgather, grouped_allgather_async,
                         grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                         reducescatter_async)
from .process_sets import (ProcessSet, add_process_set, comm_of, global_process_set,
                           remove_process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of process_set (default: all) has called barrier()."""
    comm_of(process_set, "barrier").barrier()


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's all-reduce of a sparse COO tensor as two all-gathers (its
    indices and its values). Returns a callable (not an integer handle, as
    in Horovod) whose call waits and returns the reduced sparse tensor
    (uncoalesced: the entries of every rank; Average divides the values by
    the set's size)."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    size = comm_of(process_set, "sparse_allreduce").size
    indices = allgather_async(t.indices().t().contiguous(), name="%s.indices" % name,
                              process_set=process_set)
    values = allgather_async(t.values().contiguous(), name="%s.values" % name,
                             process_set=process_set)

    def wait():
        v, i = synchronize(values), synchronize(indices)
        if op == Average:
            v = v / size
        return torch.sparse_coo_tensor(i.t(), v, t.shape, check_invariants=True)
    return wait


def sparse_allreduce(tensor, name=None, op=Average, process_set=global_process_set):
    """sparse_allreduce_async(...)() with an automatic name."""
    return sparse_allreduce_async(tensor, auto_name(name, "sparse_allreduce"), op,
                                  process_set)()


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
    "join", "sparse_allreduce", "sparse_allreduce_async", "HorovodInternalError",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
]
