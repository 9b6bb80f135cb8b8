"""torch_functions_check.py - run under mpirun: broadcast_parameters,
broadcast_optimizer_state, broadcast_object / allgather_object and
SyncBatchNorm. Every rank starts from a rank-dependent state; what root's
state should be is rebuilt locally from root's seed (CPU torch is
deterministic), so each rank checks against single-process math.
argv: PART = state | syncbn. Prints 'CHECKS n FAILED k'."""
import threading

import numpy as np
import torch
from torch import nn

import hpcdl.torch.functions as hvd_functions
from torch_common import N, R, check, close, hvd, run, section, values


# ------------------------------------------------------------------- helpers
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3)
        self.register_buffer("mask", torch.zeros(4, dtype=torch.bool))
        self.register_buffer("h16", torch.zeros(3, dtype=torch.float16))
        self.register_buffer("counter", torch.tensor(0))

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_net(seed):
    torch.manual_seed(seed)
    net = Net()
    with torch.no_grad():
        net.mask.copy_(torch.rand(4) > 0.5)
        net.h16.copy_(torch.randn(3))
        net.counter.fill_(7 * seed + 1)
        net(torch.randn(8, 5))  # running stats differ per seed too
    return net


def same(a, b):
    """Deep equality of state dicts: tensors exactly, scalars with ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def trained(seed, steps, make_opt):
    """A net and optimizer after `steps` rank-dependent steps."""
    net = make_net(seed)
    opt = make_opt(net, seed)
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(steps):
        x, t = torch.randn(6, 5, generator=gen), torch.randn(6, 3, generator=gen)
        nn.functional.mse_loss(net(x), t).backward()
        opt.step()
        opt.zero_grad()
    return net, opt


OPTIMIZERS = {
    "sgd-momentum": lambda net, s: torch.optim.SGD(
        [{"params": net.fc1.parameters()},
         {"params": list(net.bn.parameters()) + list(net.fc2.parameters()), "lr": 0.01 * (s + 1)}],
        lr=0.1 * (s + 1), momentum=0.9, nesterov=True),
    "adam": lambda net, s: torch.optim.Adam(net.parameters(), lr=0.001 * (s + 1),
                                            betas=(0.8 + 0.01 * s, 0.99)),
    "adamw-amsgrad": lambda net, s: torch.optim.AdamW(net.parameters(), lr=0.002,
                                                      weight_decay=0.1 * s, amsgrad=True),
}


# ---------------------------------------------------------------------- state
def parameters_checks():
    for root in range(N):
        net = make_net(R)
        hvd.broadcast_parameters(net.state_dict(), root_rank=root)
        check(same(net.state_dict(), make_net(root).state_dict()),
              "broadcast_parameters(state_dict) root %d" % root)
        net = make_net(R)
        hvd.broadcast_parameters(net.named_parameters(), root_rank=root)
        want = make_net(root)
        check(all(torch.equal(p, q) for p, q in zip(net.parameters(), want.parameters())),
              "broadcast_parameters(named_parameters) root %d" % root)
        check(torch.equal(net.counter, make_net(R).counter), "buffers untouched by "
              "named_parameters")
    old, hvd_functions.BUCKET_BYTES = hvd_functions.BUCKET_BYTES, 64  # many small buckets
    try:
        net = make_net(R)
        hvd.broadcast_parameters(list(net.parameters()), root_rank=N - 1)
        check(all(torch.equal(p, q) for p, q in zip(net.parameters(),
                                                      make_net(N - 1).parameters())),
              "broadcast_parameters in 64-byte buckets")
    finally:
        hvd_functions.BUCKET_BYTES = old


def optimizer_checks():
    for name, make_opt in OPTIMIZERS.items():
        for root, steps in ((0, lambda k: k % 2 + 1), (N - 1, lambda k: k)):
            net, opt = trained(R, steps(R), make_opt)
            hvd.broadcast_parameters(net.state_dict(), root_rank=root)
            hvd.broadcast_optimizer_state(opt, root_rank=root)
            want_net, want_opt = trained(root, steps(root), make_opt)
            check(same(opt.state_dict(), want_opt.state_dict()),
                  "broadcast_optimizer_state %s root %d (root took %d steps)"
                  % (name, root, steps(root)))
            # one more identical step everywhere keeps every rank identical
            x, t = values(0, (6, 5)).float(), values(1, (6, 3)).float()
            for n_, o_ in ((net, opt), (want_net, want_opt)):
                nn.functional.mse_loss(n_(x), t).backward()
                o_.step()
            check(same(net.state_dict(), want_net.state_dict()),
                  "%s: after a step every rank equals root" % name)


def object_checks():
    def obj(k):
        return {"rank": k, "arr": np.arange(k + 3) * 1.5, "text": "é" * k,
                "blob": bytes((i * 7 + k) % 256 for i in range(1000 + 997 * k)),
                "nested": [(k, None), {"t": torch.arange(k + 1)}]}
    for root in range(N):
        got = hvd.broadcast_object(obj(R), root_rank=root)
        want = obj(root)
        check(got["rank"] == root and np.array_equal(got["arr"], want["arr"])
              and got["blob"] == want["blob"] and got["text"] == want["text"]
              and torch.equal(got["nested"][1]["t"], want["nested"][1]["t"]),
              "broadcast_object root %d" % root)
    mine = ("x", R, list(range(R)), None if R == 0 else b"\x00" * (R * 100003))
    got = hvd.allgather_object(mine)
    check(got == [("x", k, list(range(k)), None if k == 0 else b"\x00" * (k * 100003))
                  for k in range(N)], "allgather_object")
    check(hvd.allgather_object("") == [""] * N, "allgather_object of empty strings")
    try:
        hvd.broadcast_object(threading.Lock() if R == N - 1 else 1, root_rank=N - 1)
        check(False, "broadcast_object of a lock did not raise")
    except Exception as e:  # noqa: BLE001 - pickling errors vary
        check(R == N - 1 or isinstance(e, RuntimeError), "unpicklable root object: %r" % e)
    try:  # one rank cannot pickle: every rank raises, none waits
        hvd.allgather_object(threading.Lock() if R == 0 else 1)
        check(False, "allgather_object of a lock did not raise")
    except Exception as e:  # noqa: BLE001 - pickling errors vary
        check(R == 0 or isinstance(e, RuntimeError), "unpicklable object: %r" % e)


# --------------------------------------------------------------------- syncbn
def syncbn_case(what, ref_cls, tail, sizes, momentum=0.1, dtype=torch.float64, track=True):
    C = 3
    sbn = hvd.SyncBatchNorm(C, momentum=momentum, track_running_stats=track).to(dtype)
    ref = ref_cls(C, momentum=momentum, track_running_stats=track).to(dtype)
    with torch.no_grad():
        for m in (sbn, ref):
            m.weight.copy_(1 + 0.1 * torch.arange(C))
            m.bias.copy_(0.05 * torch.arange(C))
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for step in range(3):
        xs = [(values(k + step, (sizes[k], C) + tail) * 0.3 + k).to(dtype) for k in range(N)]
        ws = [values(k + 9, (sizes[k], C) + tail).to(dtype) for k in range(N)]
        x = xs[R].clone().requires_grad_()
        y = sbn(x)
        (ws[R] * y).sum().backward()
        xr = [t.clone().requires_grad_() for t in xs]
        ys = torch.split(ref(torch.cat(xr)), sizes)
        sum(w.mul(yk).sum() for w, yk in zip(ws, ys)).backward()
        tag = "%s step %d" % (what, step)
        close(y.detach(), ys[R].detach(), tag + " forward", **tol)
        close(x.grad, xr[R].grad, tag + " input gradient", **tol)
        for p, q, pname in ((sbn.weight, ref.weight, "weight"), (sbn.bias, ref.bias, "bias")):
            close(hvd.allreduce(p.grad, op=hvd.Sum), q.grad, tag + " %s gradient" % pname, **tol)
            p.grad, q.grad = None, None
    if track:
        close(sbn.running_mean, ref.running_mean, what + " running_mean", **tol)
        close(sbn.running_var, ref.running_var, what + " running_var", **tol)
        close(sbn.num_batches_tracked, ref.num_batches_tracked, what + " num_batches_tracked")
    sbn.eval()
    ref.eval()
    xs = [(values(k + 4, (sizes[k], C) + tail) * 0.2 - k).to(dtype) for k in range(N)]
    close(sbn(xs[R]).detach(), torch.split(ref(torch.cat(xs)), sizes)[R].detach(),
          what + " eval", **tol)


def syncbn_checks():
    uneven = [k % 3 + 1 for k in range(N)]
    syncbn_case("BatchNorm1d (B, C)", nn.BatchNorm1d, (), [k + 2 for k in range(N)])
    syncbn_case("BatchNorm1d (B, C, L) uneven", nn.BatchNorm1d, (5,), uneven)
    syncbn_case("BatchNorm2d float32", nn.BatchNorm2d, (4, 3), uneven, dtype=torch.float32)
    syncbn_case("BatchNorm2d momentum=None", nn.BatchNorm2d, (2, 2), uneven, momentum=None)
    syncbn_case("rank 0 empty", nn.BatchNorm1d, (4,), [0] + [2] * (N - 1))
    syncbn_case("no running stats", nn.BatchNorm1d, (3,), uneven, track=False)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3),
                          nn.Sequential(nn.BatchNorm2d(2).double()))
    model[1].running_mean.fill_(0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    conv = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    check(isinstance(conv[1], hvd.SyncBatchNorm) and isinstance(conv[2][0], hvd.SyncBatchNorm)
          and isinstance(conv[0], nn.Linear) and same(conv.state_dict(), before)
          and conv[2][0].weight.dtype == torch.float64,
          "convert_sync_batchnorm")


if __name__ == "__main__":
    parts = []
    if section("state"):
        parts += [parameters_checks, optimizer_checks, object_checks]
    if section("syncbn"):
        parts += [syncbn_checks]
    run(*parts)
