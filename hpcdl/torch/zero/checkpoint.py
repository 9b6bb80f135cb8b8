"""checkpoint.py - sharded checkpoints of a stage-3 model (shard_model) and of
the plain optimizer over its pieces: one file per rank plus a manifest.

    DIR/rank-00000-of-00003.pt   rank 0's pieces, its optimizer state of them, its extra
    DIR/rank-00001-of-00003.pt   ...
    DIR/manifest.json            written last, by rank 0: the rank count and files,
                                 the ZeRO stage that saved it (3, or 1-2 through
                                 checkpoint12.py), the optimizer's class and groups,
                                 every parameter's name, shape and dtype, every unit's
                                 parameters and block counts (the layout)

The directory is hpcdl's one sharded format (hpcdl/utils/sharded.py: atomic
files, each rank file's size and sha256 in the manifest, the manifest written
only after every rank's file is on disk, so a directory with a manifest is a
complete checkpoint); this module adds what ZeRO records in it and reads back.

Loading on the same ranks with the same layout reads this rank's file only.
On another rank count each rank reads every file, joins each parameter (and
each per-element optimizer state: momentum, Adam's moments, 1-D like the
pieces) from the old pieces and keeps its new piece: resharding, with the
whole model passing through each rank's memory once. A manifest of another
stage (stage 3's directory given to checkpoint12.py or the reverse), another
model (names, shapes, dtypes, parameter order), another optimizer class or
grouping, or a missing rank file is a ValueError on every rank, and nothing
on disk is touched. Manifests written before the stage and the optimizer's
class were recorded load as before, unchecked on those two. Another cut
into units (stage 3's units=, stages 1-2's fusion buckets) loads through the
resharding path.
"""
import torch

from ...utils import sharded
from .layout import block_counts, pieces_of

KIND = "zero"  # the manifest's kind (stages 1-3; "stage" says which)


# ---------------------------------------------------------------- save
def layout_of(shards):
    """The manifest's description of the model and how it is cut."""
    return {"params": [{"name": u.names[i], "shape": list(u.shapes[i]),
                        "dtype": str(u.dtype).replace("torch.", ""), "unit": u.index}
                       for u in shards.units for i in range(len(u.names))],
            "units": [{"names": list(u.names), "numel": u.numel, "counts": list(u.counts)}
                      for u in shards.units]}


def _group_names(shards, optimizer):
    """The optimizer's parameter groups as lists of parameter names (None: none)."""
    if optimizer is None:
        return None
    name_of = {id(p): n for n, p, _, _ in shards.named_pieces()}
    return [[name_of[id(p)] for p in g["params"]] for g in optimizer.param_groups]


def _optimizer_class(optimizer):
    """The optimizer's class name (checkpoint12.py's view names the wrapped one's)."""
    return getattr(optimizer, "class_name", None) or type(optimizer).__name__


def _optimizer_part(shards, optimizer):
    """The optimizer's state and groups keyed by parameter name, not position."""
    sd = optimizer.state_dict()
    groups = _group_names(shards, optimizer)
    names = [n for g in groups for n in g]
    state = {names[i]: st for i, st in sd["state"].items()}
    saved_groups = [dict(g, params=gn) for g, gn in zip(sd["param_groups"], groups)]
    return {"state": state, "param_groups": saved_groups}


def save_sharded(shards, directory, optimizer=None, extra=None, stage=3):
    """Collective: every rank writes its file into directory, then rank 0 the
    manifest (utils/sharded.py). extra: anything torch.save takes, per rank
    (returned by load). stage: what the manifest records (checkpoint12.py
    passes 1 or 2). An OSError on any rank is an OSError on every rank."""
    comm = shards.comm
    save = comm.bcast_object(sharded.new_save_id())  # ties the rank files to their manifest
    part = {"params": {n: p.detach().clone() for n, p, _, _ in shards.named_pieces()},
            "optimizer": _optimizer_part(shards, optimizer) if optimizer is not None else None,
            "extra": extra}
    entry, error = None, None
    try:
        entry = sharded.write_shard(directory, comm.rank, comm.size, save, part)
    except OSError as e:
        error = str(e)
    comm.raise_if_any(error, OSError)
    entries = comm.gather_object(entry, root=0)
    if comm.rank == 0:
        try:
            sharded.write_manifest(
                directory, KIND, save, entries, stage=stage,
                optimizer=_group_names(shards, optimizer),
                optimizer_class=_optimizer_class(optimizer) if optimizer is not None else None,
                **layout_of(shards))
        except OSError as e:
            error = str(e)
    comm.raise_if_any(error, OSError)


# ---------------------------------------------------------------- load
def _other_stage(directory, manifest, stage):
    """The refusal of a checkpoint another stage's loader must read, or None
    (also for manifests from before the stage was recorded)."""
    saved = manifest.get("stage")
    if saved is None or (saved == 3) == (stage == 3):  # stages 1 and 2 read each other's
        return None
    if saved == 3:
        return ("sharded checkpoint %s was saved from a ZeRO stage-3 model (shard_model), not "
                "a DistributedOptimizer: load it with hpcdl.torch.zero.checkpoint.load_sharded"
                "(shards, directory, optimizer) on hvd.shard_model(model)" % directory)
    return ("sharded checkpoint %s was saved by a ZeRO stage-%s DistributedOptimizer, not a "
            "stage-3 model: load it with hpcdl.torch.zero.checkpoint12.load_sharded(opt, "
            "directory) into a DistributedOptimizer(zero_stage=1 or 2)" % (directory, saved))


def _mismatch(directory, manifest, shards, optimizer, stage):
    """The first way the checkpoint does not fit this model, or None."""
    other = _other_stage(directory, manifest, stage)
    if other:
        return other
    saved, here = manifest["params"], layout_of(shards)["params"]
    if [p["name"] for p in saved] != [p["name"] for p in here]:
        extra = sorted({p["name"] for p in saved} ^ {p["name"] for p in here})
        return ("sharded checkpoint %s holds other parameters than this model (%s): it "
                "was saved from another model or another parameter order"
                % (directory, ", ".join(extra[:3]) or "same names, another order"))
    for a, b in zip(saved, here):
        if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
            return ("sharded checkpoint %s: parameter %s is %s %s there, %s %s here"
                    % (directory, a["name"], a["dtype"], a["shape"], b["dtype"], b["shape"]))
    if optimizer is not None:
        saved, groups = manifest.get("optimizer"), _group_names(shards, optimizer)
        if not saved:
            return "sharded checkpoint %s holds no optimizer state" % directory
        was, now = manifest.get("optimizer_class"), _optimizer_class(optimizer)
        if was is not None and was != now:  # another class's state would fail in step()
            return ("sharded checkpoint %s was saved with optimizer class %s, this optimizer "
                    "is %s; build it as when it was saved (%s)" % (directory, was, now, was))
        if saved != groups:
            return ("sharded checkpoint %s: its optimizer grouped the parameters otherwise "
                    "(%d groups of %s; here %d of %s); build the optimizer as before"
                    % (directory, len(saved), [len(g) for g in saved], len(groups),
                       [len(g) for g in groups]))
    return None


def _same_units(manifest, shards):
    """True when the saved pieces are this rank's pieces: the same cut into
    units (stage 3's units=, stages 1-2's fusion buckets) and block counts.
    Otherwise each parameter is joined from the old pieces by name."""
    return [(u["names"], u["counts"]) for u in manifest["units"]] == [
        (list(u.names), list(u.counts)) for u in shards.units]


def load_sharded(shards, directory, optimizer=None, stage=3):
    """Collective: restores this rank's pieces (and the optimizer's state of
    them) from directory, resharding when it was saved on another rank count.
    Returns this rank's extra (same rank count) or rank 0's (resharded).
    stage: the loader's (checkpoint12.py passes 1 or 2); a checkpoint of
    the other kind is refused."""
    comm = shards.comm
    error, parts = None, None
    try:
        manifest = sharded.read_manifest(directory, kind=KIND)
        error = _mismatch(directory, manifest, shards, optimizer, stage)
        if error is None:
            same = manifest["ranks"] == comm.size and _same_units(manifest, shards)
            ranks = [comm.rank] if same else range(manifest["ranks"])
            parts = [sharded.read_shard(directory, manifest, r) for r in ranks]
    except ValueError as e:
        error = str(e)
    comm.raise_if_any(error, ValueError)
    if len(parts) == 1:
        _restore(shards, optimizer, lambda name, i, u: parts[0]["params"][name],
                 (parts[0]["optimizer"] or {}).get("state", {}).get,
                 parts[0]["optimizer"])
        return parts[0]["extra"]
    _reshard(shards, optimizer, manifest, parts)
    return parts[0]["extra"]


def _reshard(shards, optimizer, manifest, parts):
    """This rank's pieces from the old ranks' pieces (any rank counts)."""
    old = {}  # name -> [(start in the parameter, rank's part)] of the old pieces
    for unit in manifest["units"]:
        numels = [_numel(manifest, n) for n in unit["names"]]
        counts = block_counts(unit["numel"], manifest["ranks"])
        for r, part in enumerate(parts):
            for c in pieces_of(numels, counts, r):
                old.setdefault(unit["names"][c.index], []).append((c.start, part))

    def join(name, get):
        """The whole flat tensor from the old pieces that get(part) returns."""
        spans = [(start, get(part)) for start, part in old.get(name, [])]
        spans = [(s, t) for s, t in spans if t is not None]
        full = torch.empty(_numel(manifest, name), dtype=spans[0][1].dtype if spans else
                           torch.float32)
        for start, t in spans:
            full[start:start + t.numel()] = t.reshape(-1)
        return full

    def param(name, i, u):
        start = u.starts[i]
        return join(name, lambda part: part["params"][name])[start:start + u.pieces[i].numel()]

    pieces_by_name = {n: (u, i) for n, _, u, i in shards.named_pieces()}

    def state(name):
        have = [p["optimizer"]["state"][name] for p in parts
                if name in p["optimizer"]["state"]]
        if not have:
            return None
        u, i = pieces_by_name[name]
        start, n = u.starts[i], u.pieces[i].numel()
        out = {}
        for k, v in have[0].items():
            if torch.is_tensor(v) and v.dim() == 1:  # per element, like the pieces
                out[k] = join(name, lambda part: part["optimizer"]["state"]
                              .get(name, {}).get(k))[start:start + n].clone()
            else:
                out[k] = v
        return out

    _restore(shards, optimizer, param, state, parts[0]["optimizer"])


def _numel(manifest, name):
    n = 1
    for p in manifest["params"]:
        if p["name"] == name:
            for d in p["shape"]:
                n *= d
            return n
    raise KeyError(name)


@torch.no_grad()
def _restore(shards, optimizer, param, state, saved_opt):
    for name, piece, u, i in shards.named_pieces():
        piece.copy_(param(name, i, u))
    if optimizer is None:
        return
    flat = [n for g in _group_names(shards, optimizer) for n in g]
    sd = {"state": {}, "param_groups": []}
    for j, n in enumerate(flat):
        st = state(n)
        if st is not None:
            sd["state"][j] = st
    at = 0
    for g in saved_opt["param_groups"]:
        sd["param_groups"].append(dict(g, params=list(range(at, at + len(g["params"])))))
        at += len(g["params"])
    optimizer.load_state_dict(sd)
