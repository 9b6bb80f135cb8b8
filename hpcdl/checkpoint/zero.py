"""zero.py - sharded checkpoints of a ZeRO stage-3 model (shard_model) and of
the plain optimizer over its pieces, and (through buckets.py) of a stage 1-2
DistributedOptimizer: one file per rank plus a manifest.

    DIR/rank-00000-of-00003.pt   rank 0's pieces, its optimizer state of them, its extra
    DIR/rank-00001-of-00003.pt   ...
    DIR/manifest.json            written last, by rank 0: the rank count and files,
                                 the ZeRO stage that saved it (3, or 1-2 through
                                 buckets.py), the optimizer's class and groups,
                                 every parameter's name, shape and dtype, every unit's
                                 parameters and block counts (the layout)

The directory is hpcdl's one sharded format (files.py: atomic
files, each rank file's size and sha256 in the manifest, the manifest written
only after every rank's file is on disk, so a directory with a manifest is a
complete checkpoint); this module adds what ZeRO records in it and reads back.

Loading on the same ranks with the same layout reads this rank's file only.
On another rank count each rank reads every file, joins each parameter (and
each per-element optimizer state: momentum, Adam's moments, 1-D like the
pieces) from the old pieces and keeps its new piece: resharding, with the
whole model passing through each rank's memory once (reshard.py). Any
stage's directory loads into any other's pieces: stage 3's units and stages
1-2's fusion buckets are both cuts of the same named parameters, so another
cut (another stage, units=, bucket size) loads through the resharding path,
and read_whole() gives stage 0 the whole model and optimizer. Another model
(names, shapes, dtypes, parameter order), another optimizer class or
grouping, or a missing rank file is a ValueError on every rank, and nothing
on disk is touched. Manifests written before the optimizer's class was
recorded load as before, unchecked on it.
"""
from ..torch.zero.layout import block_counts, pieces_of
from . import files as sharded
from .reshard import Whole, numel, restore_pieces

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
    """The optimizer's class name (buckets.py's view names the wrapped one's)."""
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
    manifest (files.py). extra: anything torch.save takes, per rank
    (returned by load). stage: what the manifest records (buckets.py
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
def _mismatch(directory, manifest, shards, optimizer):
    """The first way the checkpoint does not fit this model, or None."""
    saved = {p["name"]: p for p in manifest["params"]}
    here = {p["name"]: p for p in layout_of(shards)["params"]}
    if saved.keys() != here.keys():  # the pieces are joined by name: any order, any cut
        extra = sorted(saved.keys() ^ here.keys())
        return ("sharded checkpoint %s holds other parameters than this model (%s): it "
                "was saved from another model" % (directory, ", ".join(extra[:3])))
    for name, b in here.items():
        a = saved[name]
        if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
            return ("sharded checkpoint %s: parameter %s is %s %s there, %s %s here"
                    % (directory, name, a["dtype"], a["shape"], b["dtype"], b["shape"]))
    if optimizer is not None:
        return _optimizer_mismatch(directory, manifest, optimizer,
                                   _group_names(shards, optimizer))
    return None


def _optimizer_mismatch(directory, manifest, optimizer, groups):
    saved = manifest.get("optimizer")
    if not saved:
        return "sharded checkpoint %s holds no optimizer state" % directory
    was, now = manifest.get("optimizer_class"), _optimizer_class(optimizer)
    if was is not None and was != now:  # another class's state would fail in step()
        return ("sharded checkpoint %s was saved with optimizer class %s, this optimizer "
                "is %s; build it as when it was saved (%s)" % (directory, was, now, was))
    if saved != groups and [sorted(g) for g in saved] == [sorted(g) for g in groups]:
        return ("sharded checkpoint %s: its optimizer holds the parameters in another "
                "parameter order (its groups: %s); build the optimizer as before"
                % (directory, saved))
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


def _read(directory, check, ranks=lambda manifest: range(manifest["ranks"])):
    """Collective: the manifest and the parts of ranks(manifest) (this rank's
    own, or every rank's), after check(manifest) found nothing; a ValueError
    on every rank otherwise (the caller raises it)."""
    error, manifest, parts = None, None, None
    try:
        manifest = sharded.read_manifest(directory, kind=KIND)
        error = check(manifest)
        if error is None:
            parts = [sharded.read_shard(directory, manifest, r) for r in ranks(manifest)]
    except ValueError as e:
        error = str(e)
    return error, manifest, parts


def load_sharded(shards, directory, optimizer=None):
    """Collective: restores this rank's pieces (and the optimizer's state of
    them) from directory, written by any stage on any rank count; resharding
    when its cut is not this one. Returns this rank's extra (same cut) or
    rank 0's (resharded)."""
    comm = shards.comm

    def same(manifest):
        return manifest["ranks"] == comm.size and _same_units(manifest, shards)
    error, manifest, parts = _read(
        directory, lambda m: _mismatch(directory, m, shards, optimizer),
        lambda m: [comm.rank] if same(m) else range(m["ranks"]))
    comm.raise_if_any(error, ValueError)
    if same(manifest):  # this rank's own pieces, as saved
        own = parts[0]
        state = (own["optimizer"] or {}).get("state", {})
        source = (lambda name, start, n: own["params"][name],
                  lambda name, start, n: state.get(name))
    else:
        whole = _whole(manifest, parts)
        source = (whole.piece, whole.piece_state)
    load_pieces(shards, optimizer, *source,
                groups=(parts[0]["optimizer"] or {}).get("param_groups"))
    return parts[0]["extra"]


def load_pieces(shards, optimizer, piece, piece_state, groups):
    """This rank's pieces (and the optimizer's state of them) from
    piece(name, start, n) and piece_state(name, start, n) (reshard.py)."""
    named = [(n, p, u.starts[i]) for n, p, u, i in shards.named_pieces()]
    names = [n for g in _group_names(shards, optimizer) for n in g] if optimizer else None
    restore_pieces(named, optimizer, names, piece, piece_state, groups)


def read_whole(directory, comm):
    """Collective: the whole model and optimizer (reshard.Whole, by name)
    of a directory any stage wrote, for a run that holds them whole."""
    error, manifest, parts = _read(directory, lambda m: None)
    comm.raise_if_any(error, ValueError)
    return _whole(manifest, parts)


def _whole(manifest, parts):
    """reshard.Whole of the old ranks' parts: each piece's place from the
    manifest's units and the old rank count (layout.py's cut)."""
    shapes = {p["name"]: p["shape"] for p in manifest["params"]}
    spans = {}  # name -> [(start in the parameter, index in parts)]
    for unit in manifest["units"]:
        numels = [numel(shapes[n]) for n in unit["names"]]
        counts = block_counts(unit["numel"], manifest["ranks"])
        for r in range(manifest["ranks"]):
            for c in pieces_of(numels, counts, r):
                spans.setdefault(unit["names"][c.index], []).append((c.start, r))
    groups = (parts[0]["optimizer"] or {}).get("param_groups")
    return Whole.of_pieces(shapes, parts, spans, groups)

