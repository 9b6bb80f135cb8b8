"""torch_cuda_check.py - hpcdl.torch on CUDA tensors, on a GPU machine
(tests/test_cuda_torch.py runs it under mpirun; it skips without a GPU).

Every input is produced late on a side stream that is torch's current stream
at the call: the stream first sleeps on the GPU (torch.cuda._sleep) over a
poisoned buffer, then writes the rank- and position-dependent values. A
collective that does not wait for torch's current stream reads the poison.
Results are compared on the host with the same math in float64. Covers the
all-reduce grid (device path of the core), all-gather, broadcast and
reduce-scatter (staged through the host), DistributedOptimizer against one
process, SyncBatchNorm against BatchNorm over the whole batch, and a rank
passing a host tensor where its peer passes a device tensor (an error on
every rank, then the job goes on)."""
import torch

from torch_common import N, R, check, close, hvd, run, values
from hpcdl.utils.device import select_device

DEV = select_device()
SIDE = torch.cuda.Stream()
SLEEP_CYCLES = 20_000_000  # ~10 ms at 2 GHz: long enough to lose a race


def late(host):
    """host's values on the GPU, written late on SIDE (the caller then runs with
    SIDE current); the memory holds a poison value until then."""
    with torch.cuda.stream(SIDE):
        t = torch.full(host.shape, 77, dtype=host.dtype, device=DEV)
        torch.cuda._sleep(SLEEP_CYCLES)
        t.copy_(host.to(DEV, non_blocking=True))
    return t


def want_reduce(shape, dtype, op, kind):
    per = [values(r, shape, kind) for r in range(N)]
    if op in (hvd.Sum, hvd.Average):
        w = sum(per)
        w = w / N if op == hvd.Average else w
    elif op == hvd.Min:
        w = torch.stack(per).min(0).values
    elif op == hvd.Max:
        w = torch.stack(per).max(0).values
    else:
        w = torch.stack(per).prod(0)
    return w.to(dtype)


def allreduce_grid():
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64]
    for dtype in dtypes:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            if op == hvd.Average and not dtype.is_floating_point:
                continue
            kind = "prod" if op == hvd.Product else "sum"
            for shape in [(1,), (1023,), (3, 1 << 18 | 5)]:
                what = "allreduce %s %s %s" % (dtype, op, shape)
                x = late(values(R, shape, kind, dtype))
                with torch.cuda.stream(SIDE):
                    got = hvd.allreduce(x, op=op, name=what)
                    check(got.device == x.device, what + ": result on " + str(got.device))
                    got = got.cpu()
                close(got, want_reduce(shape, dtype, op, kind), what)
    # in place, async, and grouped over mixed dtypes
    with torch.cuda.stream(SIDE):
        x = late(values(R, (4099,), dtype=torch.float32))
        h = hvd.allreduce_async_(x, op=hvd.Sum, name="inplace")
        hvd.synchronize(h)
        close(x.cpu(), want_reduce((4099,), torch.float32, hvd.Sum, "sum"), "allreduce_ in place")
        ts = [late(values(R, (n,), dtype=d)) for n, d in
              [(7, torch.float32), (100000, torch.float16), (33, torch.int64)]]
        outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grouped")
    for t, o in zip(ts, outs):
        close(o.cpu(), want_reduce(t.shape, t.dtype, hvd.Sum, "sum"), "grouped %s" % t.dtype)


def staged_collectives():
    """all-gather, broadcast and reduce-scatter of CUDA tensors (through the host)."""
    rows = R + 2
    with torch.cuda.stream(SIDE):
        x = late(values(R, (rows, 5), dtype=torch.float32))
        got = hvd.allgather(x, name="ag")
        check(got.device == x.device, "allgather result on %s" % got.device)
        want = torch.cat([values(r, (r + 2, 5), dtype=torch.float32) for r in range(N)])
        close(got.cpu(), want, "allgather cuda")
        b = late(values(R, (1000,), dtype=torch.bfloat16))
        hvd.broadcast_(b, root_rank=N - 1, name="bc_")
        close(b.cpu(), values(N - 1, (1000,), dtype=torch.bfloat16), "broadcast_ cuda")
        c = late(values(R, (17,), dtype=torch.int64))
        out = hvd.broadcast(c, root_rank=0, name="bc")
        check(out.device == c.device, "broadcast result on %s" % out.device)
        close(out.cpu(), values(0, (17,), dtype=torch.int64), "broadcast cuda")
        s = late(values(R, (2 * N + 1, 3), dtype=torch.float32))
        part = hvd.reducescatter(s, op=hvd.Sum, name="rs")
    full = want_reduce((2 * N + 1, 3), torch.float32, hvd.Sum, "sum")
    q, extra = divmod(2 * N + 1, N)
    start = R * q + min(R, extra)
    close(part.cpu(), full[start:start + q + (1 if R < extra else 0)], "reducescatter cuda")


def optimizer_exact():
    """3 SGD steps of a GPU model under DistributedOptimizer == one process
    stepping on the mean of every rank's gradient."""
    torch.manual_seed(1 + R)  # different on purpose: broadcast_parameters must fix it
    model = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(),
                                torch.nn.Linear(40, 3)).to(DEV)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    data = [(values(r, (8, 12), dtype=torch.float32) / 8, values(r + 1, (8, 3),
             dtype=torch.float32) / 8) for r in range(N)]
    ref_model = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(),
                                    torch.nn.Linear(40, 3)).to(DEV)
    with torch.no_grad():
        for p, q in zip(ref_model.parameters(), ref):
            p.copy_(q)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        x, y = (t.to(DEV) for t in data[R])
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref_model(a.to(DEV)), b.to(DEV))
                   for a, b in data) / N
        loss.backward()
        ref_opt.step()
    for i, (p, q) in enumerate(zip(model.parameters(), ref_model.parameters())):
        close(p.detach().cpu(), q.detach().cpu(), "DistributedOptimizer param %d" % i,
              rtol=1e-4, atol=1e-5)


def sync_batch_norm():
    x_all = [values(r, (6, 4), dtype=torch.float32) / 3 for r in range(N)]
    bn = hvd.SyncBatchNorm(4).to(DEV)
    ref = torch.nn.BatchNorm1d(4).to(DEV)
    out = bn(x_all[R].to(DEV))
    want = ref(torch.cat(x_all).to(DEV))[6 * R:6 * R + 6]
    close(out.detach().cpu(), want.detach().cpu(), "SyncBatchNorm cuda", rtol=1e-4, atol=1e-5)


def mixed_devices():
    """Rank 0 passes a host tensor, the others device tensors: the agreement
    check fails every rank with one error, and the next collective works."""
    x = torch.ones(1000) if R == 0 else torch.ones(1000, device=DEV)
    try:
        hvd.allreduce(x, op=hvd.Sum, name="mixed")
        check(False, "mixed host/device all-reduce did not raise")
    except Exception as e:  # noqa: BLE001 - any clear error; printed for the log
        check("device" in str(e) or "host" in str(e) or "memory" in str(e),
              "mixed devices error does not say why: %s" % e)
        if R == 0:
            print("mixed devices ->", type(e).__name__, str(e)[:200], flush=True)
    y = hvd.allreduce(torch.ones(5, device=DEV), op=hvd.Sum, name="after")
    close(y.cpu(), torch.full((5,), float(N)), "all-reduce after the mixed-device error")


if __name__ == "__main__":
    run(allreduce_grid, staged_collectives, optimizer_exact, sync_batch_norm, mixed_devices)
