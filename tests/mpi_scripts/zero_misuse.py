"""zero_misuse.py - run under mpirun: a zero_stage outside 0..2 is a
ValueError on every rank that names the supported stages, before any
collective (so no rank waits); afterwards a good one steps, and
broadcast_optimizer_state works on it. Sparse gradients at stage 2 are a
one-line error on every rank, and so is a parameter whose storage one rank
replaced after a stage-1 optimizer was built; load_state_dict(assign=True)
after building one makes step() warn that no gradient arrived. shard_model (stage 3) refuses tied weights
across units, sparse embeddings and non-CPU parameters on every rank, and
works afterwards, also after a backward that raised midway. Prints 'MISUSE OK' per rank."""
import copy
import sys
import warnings

import torch

import hpcdl.torch as hvd

hvd.init()
R = hvd.rank()
model = torch.nn.Linear(5, 3)
fails = []
for bad, words in ((5, "zero_stage must be 0"), (-1, "zero_stage must be 0"),
                   ("1", "zero_stage must be 0"), (True, "zero_stage must be 0"),
                   (3, "hvd.shard_model(model)")):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), zero_stage=bad)
        fails.append("zero_stage=%r accepted" % (bad,))
    except ValueError as e:
        if words not in str(e):
            fails.append("zero_stage=%r: unclear message %r" % (bad, str(e)))
# still usable afterwards: a good one builds and steps on every rank
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), zero_stage=2)
model(torch.randn(4, 5)).sum().backward()
opt.step()
# broadcast_optimizer_state joins the collective state_dict() on every rank (no hang)
hvd.broadcast_optimizer_state(opt, root_rank=0)
if opt.state_dict()["param_groups"][0]["lr"] != 0.1:
    fails.append("broadcast_optimizer_state lost the lr")


def refused(what, words, make):
    """make() must raise on this rank with words in a one-line message."""
    try:
        make()
        fails.append("%s accepted" % what)
    except (ValueError, RuntimeError) as e:
        if words not in str(e) or "\n" in str(e):
            fails.append("%s: unclear message %r" % (what, str(e)))


def boom(grad):
    raise RuntimeError("boom")


def sparse_stage2():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    o = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                 named_parameters=emb.named_parameters(), zero_stage=2)
    emb(torch.tensor([1, 2])).sum().backward()
    o.step()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.dec = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(self.enc(x))


def moved_parameter():
    # rank 0 alone replaces a parameter's storage after the optimizer was built
    lin = torch.nn.Linear(5, 3)
    o = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                 named_parameters=lin.named_parameters(), zero_stage=1)
    if R == 0:
        lin.weight.data = lin.weight.data.clone()
    lin(torch.randn(4, 5)).sum().backward()
    o.step()


def assigned_after_building():
    """load_state_dict(assign=True) puts new Parameters into the model: the
    optimizer still holds the old ones; step() must say so, not pass silently."""
    lin = torch.nn.Linear(5, 3)
    o = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                 named_parameters=lin.named_parameters(), zero_stage=1)
    lin.load_state_dict(copy.deepcopy(lin.state_dict()), assign=True)
    lin(torch.randn(4, 5)).sum().backward()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        o.step()
    if not any("assign=True" in str(w.message) for w in seen):
        fails.append("step() after load_state_dict(assign=True): no warning (%s)"
                     % [str(w.message) for w in seen])


assigned_after_building()
refused("sparse gradients at stage 2", "does not support sparse gradients", sparse_stage2)
refused("a parameter moved after the optimizer was built (rank 0 only)", "no longer lives",
        moved_parameter)
refused("tied weights across units", "tied weights", lambda: hvd.shard_model(Tied()))
refused("sparse embedding at stage 3", "does not support sparse gradients",
        lambda: hvd.shard_model(torch.nn.Embedding(10, 4, sparse=True)))
refused("meta-device parameters at stage 3", "needs CPU parameters",
        lambda: hvd.shard_model(torch.nn.Linear(4, 4, device="meta")))
# tied weights inside one unit are fine; and a good shard_model steps
tied = Tied()
hvd.shard_model(tied, units=[tied])
torch.optim.SGD(tied.parameters(), lr=0.1).zero_grad()
tied(torch.randn(3, 4)).sum().backward()
if len(list(tied.parameters())) != 3 or tied.enc.weight.grad is None:
    fails.append("tied weights in one unit: %d pieces, grad %s"
                 % (len(list(tied.parameters())), tied.enc.weight.grad))
# stage 3: a backward that raises midway leaves reduce-scatters in flight; the next
# forward waits for them, and the next step is right (every rank sees the same x here)
torch.manual_seed(5)
net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
ref = copy.deepcopy(net)
hvd.shard_model(net)
x = torch.randn(6, 5)
hook = net[1].register_forward_hook(lambda m, i, o: (o.register_hook(boom), o)[1])
refused("a backward that raises", "boom", lambda: net(x).sum().backward())
hook.remove()
for m in (net, ref):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(x).sum().backward()
    opt.step()
net._hpcdl_shards.unshard()
if any(not torch.allclose(a, b, atol=1e-7) for a, b in zip(net.parameters(), ref.parameters())):
    fails.append("stage 3 after a backward that raised: the next step differs")
print("[rank %d] MISUSE %s%s" % (R, "FAIL" if fails else "OK", "".join("\n  " + f for f in fails)),
      flush=True)
sys.exit(1 if fails else 0)
