"""torchrun_ddp.py - a torchrun-style DistributedDataParallel script on the
hpcdl backend: RANK, LOCAL_RANK and WORLD_SIZE from the environment, a
DistributedSampler, DDP, init_process_group(backend=...). The same file runs
under torchrun (gloo) and, unchanged, under hpcdl's launcher (hpcdl):

    torchrun --nproc-per-node 2 examples/torchrun_ddp.py --backend gloo
    hpcdl run -n 2 -- python examples/torchrun_ddp.py           # backend hpcdl
    mpirun -n 2 python examples/torchrun_ddp.py                 # needs RANK...: use hpcdl run
    srun --mpi=pmix -n 2 hpcdl run -- python examples/torchrun_ddp.py   # in a Slurm job

The only hpcdl line is `import hpcdl.torch` (it registers "hpcdl"). The data
is a fixed synthetic regression set; every rank takes its share of each
global batch (DistributedSampler), so the trained weights equal one
process's with the same --batch-size (up to float32 sum order). --save PATH
writes rank 0's final state_dict; tests/test_examples.py compares 2 ranks
with 1, tests/test_slurm_jobs.py 2 srun tasks with 1."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpcdl.torch  # noqa: F401 - registers backend "hpcdl"


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="hpcdl", help="hpcdl (default) or gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="global batch, split over ranks")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="rank 0 saves the final state_dict here")
    return p.parse_args()


def dataset(samples, seed):
    """y = tanh(x W) + noise, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 4, generator=g)) + 0.1 * torch.randn(samples, 4,
                                                                            generator=g)
    return TensorDataset(x, y)


def main():
    args = parse()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend=args.backend)
    assert dist.get_rank() == rank and dist.get_world_size() == world_size
    if args.batch_size % world_size:
        raise SystemExit("--batch-size %d is not divisible by WORLD_SIZE %d"
                         % (args.batch_size, world_size))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else \
        torch.device("cpu")

    data = dataset(args.samples, args.seed)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size // world_size, sampler=sampler,
                        drop_last=True)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4)).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, batches
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item(), 1.0], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        if rank == 0:
            print("epoch %d: mean loss %.6f (%d ranks, backend %s)"
                  % (epoch, (total[0] / total[1]).item(), world_size, args.backend),
                  flush=True)
    if rank == 0 and args.save:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
