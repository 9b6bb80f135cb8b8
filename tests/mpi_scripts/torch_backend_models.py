"""torch_backend_models.py - run under mpirun: training on backend "hpcdl"
against one process on the same global batch (exact to 1e-6 relative in
float32): DistributedDataParallel with small buckets (several all-reduces in
flight during backward), with register_comm_hook (torch's allreduce_hook,
and a hook of our own chaining the future), gradient accumulation with
no_sync(), find_unused_parameters; FSDP2 fully_shard with reshard after
forward on and off; DTensor tensor parallelism (ColwiseParallel /
RowwiseParallel on the MLP); a 2-D DeviceMesh (FSDP2 x tensor parallel,
even rank counts); torch.distributed.pipelining (ScheduleGPipe and
Schedule1F1B, one stage per rank, over the backend's send/recv); DCP
save on N ranks and load on M (torch_backend_dcp.py). Prints
'CHECKS n FAILED k'."""
import os

for var in ("MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(var, None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B,  # noqa: E402
                                          ScheduleGPipe)
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,  # noqa: E402
                                               parallelize_module)
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from torch_backend_dcp import dcp_save_n_load_m  # noqa: E402
from torch_common import N, R, check, run  # noqa: E402

dist.init_process_group("hpcdl")
B_LOCAL, D_IN, D_HID, D_OUT, STEPS, LR = 4, 12, 24, 5, 4, 0.1  # D_HID: 2, 3, 4 ranks (TP)
TOL = 1e-6


class MLP(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(D_IN, D_HID)
        self.fc2 = torch.nn.Linear(D_HID, D_HID)
        self.fc3 = torch.nn.Linear(D_HID, D_OUT)
        self.spare = torch.nn.Linear(D_HID, D_OUT) if unused else None

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def batch(step, micro=0):
    """The global batch of a step (every rank builds it; rank r uses rows r*B..)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(N * B_LOCAL, D_IN, generator=g)
    y = torch.randn(N * B_LOCAL, D_OUT, generator=g)
    return x, y


def mine(t):
    return t[R * B_LOCAL:(R + 1) * B_LOCAL]


def reference(micro_batches, unused=False):
    """One process: the same model and steps on the whole global batch."""
    torch.manual_seed(0)
    model = MLP(unused)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(step, micro)
            loss = torch.nn.functional.mse_loss(model(x), y) / micro_batches
            loss.backward()
        opt.step()
    return model


def distributed(micro_batches, hook=None, unused=False, bucket_mb=0.001):
    torch.manual_seed(0)
    model = DDP(MLP(unused), bucket_cap_mb=bucket_mb, find_unused_parameters=unused)
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(step, micro)
            last = micro == micro_batches - 1
            ctx = model.no_sync() if not last else _nothing()
            with ctx:
                loss = torch.nn.functional.mse_loss(model(mine(x)), mine(y)) / micro_batches
                loss.backward()
        opt.step()
    return model.module


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compare(name, got, want):
    worst = 0.0
    for (pname, p), q in zip(got.named_parameters(), want.parameters()):
        if hasattr(p, "full_tensor"):  # a DTensor (FSDP2, tensor parallel)
            p = p.full_tensor()
        rel = ((p - q).abs().max() / q.abs().max().clamp_min(1e-12)).item()
        worst = max(worst, rel)
    check(worst <= TOL, "%s: max relative difference %.3g > %g" % (name, worst, TOL))
    if R == 0:
        print("%s: max relative difference %.3g" % (name, worst), flush=True)


def chained_hook(state, bucket):
    """A hook of our own: all_reduce through the backend, average in .then()."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / dist.get_world_size())


def plain():
    compare("ddp", distributed(1), reference(1))


def hooks():
    compare("ddp allreduce_hook", distributed(1, default_hooks.allreduce_hook), reference(1))
    compare("ddp chained hook", distributed(1, chained_hook), reference(1))


def accumulate():
    compare("ddp no_sync x3", distributed(3), reference(3))


def unused():
    compare("ddp find_unused_parameters", distributed(1, unused=True), reference(1, True))


def sharded(reshard):
    """FSDP2: each Linear a unit, then the root; one mesh dimension over all ranks."""
    mesh = init_device_mesh("cpu", (N,))
    torch.manual_seed(0)
    model = MLP()
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
    return model


def fsdp2():
    compare("fsdp2 reshard_after_forward=True", sharded(True), reference(1))
    compare("fsdp2 reshard_after_forward=False", sharded(False), reference(1))


def tensor_parallel():
    """fc1 split by columns, fc2 by rows (one all-reduce in forward), fc3
    replicated; every rank sees the whole batch, as in one process."""
    mesh = init_device_mesh("cpu", (N,))
    torch.manual_seed(0)
    model = MLP()
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    compare("tensor parallel colwise/rowwise", model, reference(1))


def two_d():
    """A 2 x N/2 DeviceMesh (sub-groups from new_group): tensor parallel inside
    each row ("tp"), FSDP2 across the rows ("dp"); each row takes half the batch."""
    if N % 2:
        return
    mesh = init_device_mesh("cpu", (2, N // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = MLP()
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    row, half = mesh.get_local_rank("dp"), N * B_LOCAL // 2
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        rows = slice(row * half, (row + 1) * half)
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    compare("2-D mesh: FSDP2 x tensor parallel", model, reference(1))


def stages():
    """One block per rank: Linear + tanh, the last one Linear to D_OUT."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(D_IN, D_IN), torch.nn.Tanh())
              for _ in range(N - 1)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(D_IN, D_OUT))


def pipelined(schedule_cls, micro=4):
    """Rank r runs block r; the schedule splits the global batch in micro-
    batches and averages their losses' gradients (torch's scale_grads)."""
    ref, model = stages(), stages()
    part = model[R]
    stage = PipelineStage(part, R, N, torch.device("cpu"))
    schedule = schedule_cls(stage, n_microbatches=micro,
                            loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        if R == 0:
            schedule.step(x)
        elif R == N - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        ref_opt.zero_grad()
        pairs = zip(x.chunk(micro), y.chunk(micro))
        (sum(torch.nn.functional.mse_loss(ref(xm), ym) for xm, ym in pairs) / micro).backward()
        ref_opt.step()
    compare("pipelining %s" % schedule_cls.__name__, part, ref[R])


def pipelining():
    pipelined(ScheduleGPipe)
    pipelined(Schedule1F1B)


if __name__ == "__main__":
    run(plain, hooks, accumulate, unused, fsdp2, tensor_parallel, two_d, pipelining,
        dcp_save_n_load_m, dist.destroy_process_group)
