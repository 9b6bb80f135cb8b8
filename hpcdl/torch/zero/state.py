"""state.py - a ZeRO optimizer's state as one unsharded optimizer's
state_dict, and back.

consolidate() (collective: every rank calls it) gathers every rank's piece
states and joins them into the tensors an unsharded optimizer over the same
parameters would hold, indexed as torch numbers them (over the original
parameter groups, frozen parameters included), so the dict loads into a
plain torch optimizer, into a stage-0 DistributedOptimizer, or into a ZeRO
one on any number of ranks. load_full() takes such a dict and keeps this
rank's pieces (no communication).

A state entry is per element when its shape is the piece's (momentum, Adam's
moments); anything else (Adam's 0-d step) is the same for every piece of a
parameter and is taken from the first.
"""
import torch


def _full_index(sharding):
    """{model parameter: its index in the unsharded state_dict}."""
    flat = [p for g in sharding.full_groups for p in g]
    return {p: i for i, p in enumerate(flat)}


def consolidate(sharding):
    inner = sharding.inner
    index = _full_index(sharding)
    mine = {}
    for t, (p, c) in sharding.piece_of.items():
        st = inner.state.get(t)
        if st:
            mine[index[p]] = (c.start, c.stop, {k: (v.detach().cpu(), v.shape == t.shape)
                                                if torch.is_tensor(v) else (v, False)
                                                for k, v in st.items()})
    every = sharding.comm.allgather_object(mine)
    params = [p for g in sharding.full_groups for p in g]
    out = {}
    for i, p in enumerate(params):
        parts = [r[i] for r in every if i in r]
        if parts:
            out[i] = _join(p, parts)
    sd = inner.state_dict()
    groups, start = [], 0
    for g, full in zip(sd["param_groups"], sharding.full_groups):
        groups.append(dict(g, params=list(range(start, start + len(full)))))
        start += len(full)
    return {"state": out, "param_groups": groups}


def _join(p, parts):
    """One parameter's state from its pieces' states."""
    joined = {}
    for k, (v0, per_element) in parts[0][2].items():
        if not per_element:
            joined[k] = v0.to(p.device) if torch.is_tensor(v0) else v0
            continue
        full = torch.empty(p.numel(), dtype=v0.dtype)
        for start, stop, st in parts:
            full[start:stop] = st[k][0].reshape(-1)
        joined[k] = full.view(p.shape).to(p.device)
    return joined


def load_full(sharding, full):
    """Loads an unsharded state_dict (consolidate()'s, or a plain optimizer's)."""
    groups = full["param_groups"]
    sizes = [len(g) for g in sharding.full_groups]
    if [len(g["params"]) for g in groups] != sizes:
        raise ValueError("optimizer state_dict has parameter groups of sizes %s, this "
                         "optimizer has %s: it was saved for another model or grouping"
                         % ([len(g["params"]) for g in groups], sizes))
    inner = sharding.inner
    saved_ids = [i for g in groups for i in g["params"]]
    pos = {p: saved_ids[j] for j, p in enumerate(p for g in sharding.full_groups for p in g)}
    shard_state, shard_groups, n = {}, [], 0
    for g, cur in zip(groups, inner.param_groups):
        ids = []
        for t in cur["params"]:
            p, c = sharding.piece_of[t]
            st = full["state"].get(pos[p])
            if st is not None:
                shard_state[n] = {k: _slice(v, p, c, t) for k, v in st.items()}
            ids.append(n)
            n += 1
        shard_groups.append(dict(g, params=ids))
    inner.load_state_dict({"state": shard_state, "param_groups": shard_groups})


def _slice(v, p, c, t):
    if torch.is_tensor(v) and v.shape == p.shape:
        return v.reshape(-1)[c.start:c.stop].clone().view(t.shape)
    return v
