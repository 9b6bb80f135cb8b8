"""torch_backend_dcp.py - torch.distributed.checkpoint (DCP) on backend
"hpcdl": a model and its optimizer saved on N ranks and loaded on M, compared
exactly with the tensors that were saved. Imported by torch_backend_models.py,
whose launch runs dcp_save_n_load_m() (no launch of its own).

With N ranks and M = max(1, N // 2) (the ranks 0..M-1 as a sub-group):
- FSDP2 on N ranks (uneven shards of a 7-row layer) -> FSDP2 on M ranks;
- DDP on M ranks -> FSDP2 on N ranks;
- FSDP2 on N ranks -> DDP on M ranks.
Each saves after two Adam steps on rank-dependent data (so the moments
differ per position), loads into a freshly built model with other weights
and an optimizer that never stepped, and compares every model and optimizer
entry (full tensors, Adam's step count) with torch.equal."""
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_common import N, R, check


def build(kind, group, seed):
    """A small model on the ranks of group: 'fsdp2' (each Linear a unit) or 'ddp'."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    if kind == "fsdp2":
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = DDP(model, process_group=group)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def train(model, opt, group):
    me = dist.get_rank(group)
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + me)
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def full_values(state, prefix=""):
    """{path: full tensor or value} of a nested state dict (DTensors gathered:
    collective over their mesh, in the dict's order, the same on every rank)."""
    out = {}
    for key, value in state.items():
        path = "%s%s" % (prefix, key)
        if isinstance(value, dict):
            out.update(full_values(value, path + "/"))
        elif isinstance(value, DTensor):
            out[path] = value.full_tensor().clone()
        elif isinstance(value, torch.Tensor):
            out[path] = value.detach().clone()
        else:
            out[path] = value
    return out


def same(got, want, what):
    if sorted(got) != sorted(want):
        return check(False, "%s: entries %s, saved %s" % (what, sorted(got), sorted(want)))
    bad = [k for k in want
           if not (torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor)
                   else got[k] == want[k])]
    check(not bad, "%s: %d entries differ from the saved values, e.g. %s"
          % (what, len(bad), bad[:3]))
    return not bad


def save_then_load(where, saver, loader):
    """saver / loader: (kind, group, ranks). Prints one line on rank 0."""
    (kind_s, group_s, ranks_s), (kind_l, group_l, ranks_l) = saver, loader
    saved = [None]
    if R in ranks_s:
        model, opt = build(kind_s, group_s, seed=0)
        train(model, opt, group_s)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=where, process_group=group_s)
        saved[0] = full_values({"model": msd, "optim": osd})
    dist.broadcast_object_list(saved, src=0)  # rank 0 saves in every case
    ok = True
    if R in ranks_l:
        model, opt = build(kind_l, group_l, seed=1)
        msd, osd = get_state_dict(model, opt)  # initialises Adam's state (zeros)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=where, process_group=group_l)
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        msd, osd = get_state_dict(model, opt)
        got = full_values({"model": msd, "optim": osd})
        what = "dcp %s on %d ranks -> %s on %d" % (kind_s, len(ranks_s), kind_l, len(ranks_l))
        ok = same(got, saved[0], what)
        if R == 0 and ok:
            print("%s: %d entries equal to the saved ones" % (what, len(got)), flush=True)
    dist.barrier()


def dcp_save_n_load_m():
    world, everyone = dist.group.WORLD, list(range(N))
    few = list(range(max(1, N // 2)))
    sub = dist.new_group(few)
    where = [tempfile.mkdtemp(prefix="hpcdl-dcp-") if R == 0 else None]
    dist.broadcast_object_list(where, src=0)  # one directory (one host in this test)
    try:
        for i, (saver, loader) in enumerate([
                (("fsdp2", world, everyone), ("fsdp2", sub, few)),
                (("ddp", sub, few), ("fsdp2", world, everyone)),
                (("fsdp2", world, everyone), ("ddp", sub, few))]):
            save_then_load("%s/ckpt%d" % (where[0], i), saver, loader)
    finally:
        dist.barrier()
        if R == 0:
            shutil.rmtree(where[0], ignore_errors=True)
