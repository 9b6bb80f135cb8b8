"""device.py - one GPU per local rank: select_device() makes GPU
(local rank mod visible GPUs) this process's CUDA device when torch sees GPUs,
and returns the CPU otherwise.

    from hpcdl import comm
    from hpcdl.utils.device import select_device
    comm.init()
    device = select_device()          # cuda:<local rank> or cpu
    model.to(device)

The local rank comes from MPI (ranks sharing a node, hpcdl.comm), not from
SLURM_LOCALID, so it is right under srun, mpirun and virtual nodes alike. When
Slurm gives each task its own GPU (--gpus-per-task=1, --gpu-bind), torch sees
one device and every rank takes device 0 of its own view.
"""
from .. import comm


def select_device(local_rank=None, local_size=None):
    """torch.device for this rank (sets the current CUDA device). local_rank
    and local_size default to hpcdl.comm's (MPI is initialised if needed)."""
    import torch  # on use: loads torch
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank is None:
        local_rank = comm.local_rank()
    if local_size is None:
        local_size = comm.local_size() if comm.is_initialized() else 1
    count = torch.cuda.device_count()
    if local_size > count and local_rank == 0:
        comm.warn("%d ranks on this node share %d GPU(s); give the job one rank per GPU "
                  "(--ntasks-per-node = --gpus-per-node) for full speed" % (local_size, count))
    index = local_rank % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
