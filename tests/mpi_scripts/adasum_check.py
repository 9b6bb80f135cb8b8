"""adasum_check.py - op=hvd.Adasum against its definition computed here in
float64 from every rank's data (data depends on rank and position): the tree
of comm/adasum.py's docstring written out independently, plus the
properties (equal inputs -> that input; orthogonal -> the sum), grouped
tensors combined one by one, in place, scale factors, and bad input."""
import sys

import numpy as np
import torch

import hpcdl.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
fails = []


def pair(a, b):
    dot = a @ b
    ca = 1 - dot / (2 * (a @ a)) if a @ a > 0 else 1.0
    cb = 1 - dot / (2 * (b @ b)) if b @ b > 0 else 1.0
    return ca * a + cb * b


def reference(vectors):
    """Binary tree over ranks: fold the ranks beyond the largest power of two,
    then pair neighbours level by level (lower rank first)."""
    p = 1 << (len(vectors).bit_length() - 1)
    level = [pair(vectors[i], vectors[i + p]) if i + p < len(vectors) else vectors[i]
             for i in range(p)]
    while len(level) > 1:
        level = [pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def data(r, n, salt):
    i = np.arange(n, dtype=np.float64)
    return np.sin(0.37 * i * (r + 1) + salt) * (1 + r) + 0.01 * i


def expect(name, got, want, tol):
    err = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want))) if want.size else 0
    if not err <= tol * (1 + float(np.max(np.abs(want))) if want.size else 1):
        fails.append("%s: max error %g" % (name, err))


for n in (1, 7, 1000):
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, 3e-3)):
        x = torch.tensor(data(rank, n, 0.5), dtype=dtype)
        want = reference([torch.tensor(data(r, n, 0.5), dtype=dtype).double().numpy()
                          for r in range(size)])
        expect("allreduce n=%d %s" % (n, dtype), hvd.allreduce(x, op=hvd.Adasum).double(),
               want, tol)
        y = x.clone()
        hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Adasum, name="inplace"))
        expect("in place n=%d %s" % (n, dtype), y.double(), want, tol)

same = torch.arange(10, dtype=torch.float64)
expect("equal inputs", hvd.allreduce(same, op=hvd.Adasum), same.numpy(), 1e-12)
basis = torch.zeros(size * 3, dtype=torch.float64)
basis[rank * 3:rank * 3 + 3] = torch.tensor([1.0, -2.0, 3.0]) * (rank + 1)
summed = torch.cat([torch.tensor([1.0, -2.0, 3.0]) * (r + 1) for r in range(size)])
expect("orthogonal inputs", hvd.allreduce(basis, op=hvd.Adasum), summed.numpy(), 1e-12)

a = torch.tensor(data(rank, 33, 1.0))
b = torch.tensor(data(rank, 5, 2.0)).view(5, 1)
outs = hvd.grouped_allreduce([a, b], op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5)
for name, got, n, salt in (("grouped a", outs[0], 33, 1.0), ("grouped b", outs[1], 5, 2.0)):
    want = reference([2.0 * data(r, n, salt) for r in range(size)]) * 0.5
    expect(name, got.reshape(-1), want, 1e-12)

bits = hvd.allgather(hvd.allreduce(torch.tensor(data(rank, 100, 3.0)), op=hvd.Adasum)
                     .view(1, -1))
if not all(torch.equal(bits[0], bits[r]) for r in range(size)):
    fails.append("ranks hold different Adasum results")

try:
    hvd.allreduce(torch.arange(4, dtype=torch.int32), op=hvd.Adasum)
    fails.append("an integer Adasum did not raise")
except ValueError as e:
    if "floating" not in str(e):
        fails.append("integer Adasum message: %s" % e)
try:
    hvd.reducescatter(torch.ones(size * 2), op=hvd.Adasum)
    fails.append("reducescatter Adasum did not raise")
except RuntimeError:
    pass

# DistributedOptimizer(op=Adasum): every rank steps SGD on its own gradient;
# the parameter deltas (-lr * grad) combine by Adasum, one parameter at a time
torch.manual_seed(0)
model = torch.nn.Linear(6, 2)
w0 = [p.detach().double().clone() for p in model.parameters()]
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), op=hvd.Adasum)
x = torch.tensor(data(rank, 12, 4.0), dtype=torch.float32).view(2, 6)
model(x).pow(2).sum().backward()
opt.step()
for i, p in enumerate(model.parameters()):
    deltas = []
    for r in range(size):
        m = torch.nn.Linear(6, 2).double()
        with torch.no_grad():
            for q, w in zip(m.parameters(), w0):
                q.copy_(w)
        m(torch.tensor(data(r, 12, 4.0)).view(2, 6)).pow(2).sum().backward()
        deltas.append(-0.1 * list(m.parameters())[i].grad.reshape(-1).numpy())
    expect("optimizer param %d" % i, (p.detach().double() - w0[i]).reshape(-1),
           reference(deltas), 1e-5)

print("rank %d: adasum %s" % (rank, "FAIL " + "; ".join(fails) if fails else "OK"), flush=True)
sys.exit(1 if fails else 0)
