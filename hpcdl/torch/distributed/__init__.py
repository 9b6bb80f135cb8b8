"""hpcdl.torch.distributed - hpcdl as a torch.distributed backend.

    import hpcdl.torch                        # registers backend "hpcdl" (starts no MPI)
    import torch.distributed as dist
    dist.init_process_group("hpcdl")          # was "gloo"; MPI is the rendezvous
    model = DDP(model)                        # DDP, all_reduce, all_gather, ... on hpcdl

Run under `hpcdl run -n 4 -- python train.py`, mpirun or srun; no
MASTER_ADDR/MASTER_PORT needed (_rendezvous.py says how). Also as
"cpu:hpcdl,cuda:hpcdl". What works and what not yet: docs/torch_distributed.md.
torch's dist.monitored_barrier admits gloo only; monitored_barrier() here is
the same call for this backend.

Registering only records a creator with torch and starts nothing; hpcdl.comm
is initialised (hpcdl.comm.init()) in the rendezvous or in the creator, when
init_process_group is called, and that starts MPI: importing hpcdl.torch
does not (tests/test_facts.py).
"""
import sys

import torch.distributed as dist

from . import _rendezvous
from .sharded_embedding import ShardedEmbeddingBag  # noqa: F401 - docs/embedding.md
from ... import comm

BACKEND = "hpcdl"
_registered = False


def _create(store, rank, world_size, timeout):
    """torch's creator hook: the default group's ProcessGroupHpcdl. rank and
    world_size came from the rendezvous; they must be MPI's."""
    from .process_group import ProcessGroupHpcdl  # on use: loads MPI
    world = comm.init()
    if (rank, world_size) != (world.rank, world.size):
        raise ValueError(
            "init_process_group('hpcdl'): torch was given rank %d of %d but MPI says rank %d "
            "of %d; the hpcdl backend takes rank and size from MPI: drop rank=/world_size= "
            "(or RANK/WORLD_SIZE that do not match the launcher's)"
            % (rank, world_size, world.rank, world.size))
    _keep_tracebacks()
    return ProcessGroupHpcdl(world, timeout)


def _keep_tracebacks():
    """init_process_group wraps sys.excepthook to prefix lines with the rank:
    it runs the previous hook with sys.stderr pointed at a buffer and prints
    the buffer afterwards. hpcdl's hook ends the job (MPI_Abort) before it
    returns, so the traceback would stay in the buffer, never shown. The hook
    torch wraps therefore writes to the real stderr."""
    hook = sys.excepthook
    if getattr(hook, "hpcdl_real_stderr", False):
        return

    def real_stderr_hook(*args):
        captured, sys.stderr = sys.stderr, sys.__stderr__
        try:
            hook(*args)
        finally:
            sys.stderr = captured

    real_stderr_hook.hpcdl_real_stderr = True
    sys.excepthook = real_stderr_hook


def register():
    """Registers backend "hpcdl" with torch.distributed (idempotent, cheap)."""
    global _registered
    if _registered:
        return
    _rendezvous.install()
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    _registered = True


def is_available():
    """True: hpcdl's backend needs nothing but hpcdl's own core and MPI."""
    return True


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """dist.monitored_barrier for the hpcdl backend (torch's admits gloo only):
    a barrier that raises BarrierTimeout (a RuntimeError) naming the ranks
    that did not arrive within timeout (timedelta or seconds; default the
    group's timeout) - on rank 0 and on every rank that arrived. A rank
    outside group returns at once."""
    from .process_group import ProcessGroupHpcdl  # on use: loads MPI
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        return
    if not isinstance(group, ProcessGroupHpcdl):  # hpcdl's groups are torch's groups
        raise ValueError("hpcdl.torch.distributed.monitored_barrier: this group's backend is "
                         "%s, not hpcdl; use torch.distributed.monitored_barrier for gloo"
                         % dist.get_backend(group))
    group.monitored_barrier(timeout, wait_all_ranks)
