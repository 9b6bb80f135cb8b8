"""buckets.py - sharded checkpoints of a ZeRO stage 1 or 2
DistributedOptimizer: one file per rank plus a manifest, in the format of
stage 3's (zero.py), resharded on load to any rank count and cut.

    from hpcdl.checkpoint.buckets import save_sharded, load_sharded
    save_sharded(opt, "ckpt/step-1000", extra={"scheduler": sched.state_dict()})
    extra = load_sharded(opt, "ckpt/step-1000")       # on any number of ranks

Each fusion bucket is presented to zero.py as a stage-3 unit: its
parameters' names, shapes and block counts, and this rank's piece of each
(empty where the rank owns none). Each rank writes its pieces of the
parameters and the optimizer state of them (Adam's moments: 1/N of the
state, never gathered in one place); the load restores this rank's pieces
and state and all-gathers the buckets, so every rank holds the whole model
again. A split of M elements over N ranks always exists (ranks past M own
nothing), so any rank count can load, and a stage-3 model's directory
loads as well (its units are joined by name and cut into these buckets).
`opt.state_dict()` stays the consolidated, unsharded dict (torch/zero/state.py).
"""
import torch

from . import zero


class _BucketUnit:
    """One bucket as zero.py sees a stage-3 unit."""

    def __init__(self, shard, names):
        b = shard.bucket
        self.index, self.numel, self.counts = b.index, b.numel, shard.counts
        self.names = [names[p] for p in b.params]
        self.shapes = [tuple(p.shape) for p in b.params]
        self.dtype = shard.dtype
        self.starts = [0] * len(b.params)
        self.pieces = [torch.empty(0, dtype=shard.dtype) for _ in b.params]
        for c, t in zip(shard.pieces, shard.tensors):
            self.starts[c.index], self.pieces[c.index] = c.start, t.view(-1)


class _Layout:
    """A stage 1/2 Sharding with stage 3's checkpoint interface."""

    def __init__(self, sharding):
        self.comm = sharding.comm
        names = sharding.names
        self.units = [_BucketUnit(s, names) for s in sharding.shards]

    def named_pieces(self):
        return [(u.names[i], p, u, i) for u in self.units for i, p in enumerate(u.pieces)]


class _AllPieces:
    """The wrapped optimizer seen over every parameter's piece, in the
    unsharded groups' order (the same names on every rank and rank count);
    its state_dict() and load_state_dict() translate to the wrapped
    optimizer, which holds the non-empty pieces only."""

    def __init__(self, sharding, layout):
        self.sharding = sharding
        self.class_name = type(sharding.inner).__name__  # what the manifest records
        piece = {}
        for u, s in zip(layout.units, sharding.shards):
            for p, t in zip(s.bucket.params, u.pieces):
                piece[p] = t
        self.param_groups = [{"params": [piece[p] for p in full]}
                             for full in sharding.full_groups]
        full = [p for g in sharding.full_groups for p in g]
        self.pos = {p: i for i, p in enumerate(full)}   # parameter -> index here

    def _inner_params(self):
        return [self.sharding.piece_of[t][0] for g in self.sharding.inner.param_groups
                for t in g["params"]]

    def state_dict(self):
        sd = self.sharding.inner.state_dict()
        owned = self._inner_params()
        state = {self.pos[owned[i]]: st for i, st in sd["state"].items()}
        return {"state": state, "param_groups": _renumber(sd["param_groups"],
                                                          self.param_groups)}

    def load_state_dict(self, sd):
        inner = self.sharding.inner
        owned = self._inner_params()
        state = {i: sd["state"][self.pos[p]] for i, p in enumerate(owned)
                 if self.pos[p] in sd["state"]}
        groups = _renumber(sd["param_groups"], inner.param_groups)
        inner.load_state_dict({"state": state, "param_groups": groups})


def _renumber(saved_groups, groups):
    """saved_groups' hyper-parameters, params numbered 0.. over groups' params."""
    out, at = [], 0
    for g, cur in zip(saved_groups, groups):
        out.append(dict(g, params=list(range(at, at + len(cur["params"])))))
        at += len(cur["params"])
    return out


def _sharding(opt):
    z = getattr(opt, "sharding", None)
    if z is None:
        raise ValueError("sharded checkpoints need DistributedOptimizer(zero_stage=1 or 2) "
                         "on more than one rank (got zero_stage=%s); save opt.state_dict() "
                         "instead" % getattr(opt, "zero_stage", None))
    return z


def save_sharded(opt, directory, extra=None):
    """Collective: every rank writes its pieces and their optimizer state,
    then rank 0 the manifest (atomic; zero.py)."""
    z = _sharding(opt)
    layout = _Layout(z)
    zero.save_sharded(layout, directory, _AllPieces(z, layout), extra,
                      stage=opt.zero_stage)


def load_sharded(opt, directory):
    """Collective: this rank's pieces and state from directory (saved on any
    rank count, by any stage), then the parameters all-gathered. One of
    another model, parameter order, optimizer class or grouping, or with a
    rank file missing, is a ValueError on every rank; nothing on disk
    changes. Returns the saved extra."""
    z = _sharding(opt)
    layout = _Layout(z)
    extra = zero.load_sharded(layout, directory, _AllPieces(z, layout))
    # the wrapped optimizer's load replaced its groups and state: the wrapper
    # (which LR schedulers step) must hand out the new ones, as its own load does
    opt.param_groups, opt.state = z.inner.param_groups, z.inner.state
    z.gather_params()
    return extra
