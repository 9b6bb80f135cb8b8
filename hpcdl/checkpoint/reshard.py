"""reshard.py - the re-shard step: a checkpoint's model parameters and
optimizer state keyed by parameter name, whole, whatever --zero stage and
rank count wrote it; and from that, what a stage on this job's ranks keeps.

    sources   Whole.of_pieces(...)  a directory of pieces (stages 1-3, any cut
                                    into units or buckets, any rank count):
                                    each parameter joined from the old pieces
              Whole.of_torch(...)   a whole model's state_dict and a torch
                                    optimizer state_dict (stage 0, and the
                                    model in stages 1-2's checkpoint.pt)
    targets   whole.model_state()        the whole model (stages 0-2)
              whole.torch_optimizer(n)   torch's numbering over names n (stage 0;
                                         stages 1-2 keep their pieces of it)
              restore_pieces(...)        this rank's pieces and their state
                                         (stage 3; stages 1-2's buckets)

Inside a Whole every tensor is flat (numel elements). An optimizer state
entry is per element when it is a tensor of at least one dimension with the
parameter's number of elements (momentum, Adam's moments): it is joined,
sliced and reshaped with the parameter; anything else (Adam's 0-d step) is
the same for every piece and taken as it is. The whole model and optimizer
pass through each rank's memory once, as they do when resharding to another
rank count.
"""
import torch


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def per_element(value, size):
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() == size


class Whole:
    """shapes: {name: shape} of the parameters; params: {name: flat tensor};
    state: {name: {key: flat tensor (per element) or value}}; groups: the
    optimizer's param_groups with names for params (None: no optimizer)."""

    def __init__(self, shapes, params, state, groups):
        self.shapes, self.params, self.state, self.groups = shapes, params, state, groups

    @classmethod
    def of_pieces(cls, shapes, parts, spans, groups):
        """parts: the old ranks' files (dicts with 'params' and 'optimizer'
        by name); spans: {name: [(start in the parameter, index in parts)]}
        of every old piece."""
        def join(name, get):
            full = None
            for start, r in spans.get(name, ()):
                t = get(parts[r])
                if t is None:
                    continue
                if full is None:
                    full = torch.empty(numel(shapes[name]), dtype=t.dtype)
                full[start:start + t.numel()] = t.reshape(-1)
            return full

        def saved_state(part):
            return (part.get("optimizer") or {}).get("state", {})
        params, state = {}, {}
        for name in shapes:
            params[name] = join(name, lambda part: part["params"].get(name))
            have = [saved_state(p)[name] for p in parts if name in saved_state(p)]
            if have:
                state[name] = {k: join(name, lambda part: saved_state(part).get(name, {}).get(k))
                               if torch.is_tensor(v) and v.dim() == 1 else v
                               for k, v in have[0].items()}  # pieces are 1-D
        return cls(shapes, params, state, groups)

    @classmethod
    def of_torch(cls, model_state, optimizer_state, names):
        """model_state: a whole model's state_dict; optimizer_state: a torch
        optimizer's state_dict numbered over names (None: no optimizer)."""
        shapes = {n: list(model_state[n].shape) for n in names}
        params = {n: model_state[n].reshape(-1) for n in names}
        state, groups = {}, None
        if optimizer_state is not None:
            for i, st in optimizer_state["state"].items():
                n = names[i]
                state[n] = {k: v.reshape(-1) if per_element(v, numel(shapes[n])) else v
                            for k, v in st.items()}
            groups = [dict(g, params=[names[i] for i in g["params"]])
                      for g in optimizer_state["param_groups"]]
        return cls(shapes, params, state, groups)

    # ------------------------------------------------------------ targets
    def model_state(self, buffers=None):
        """The parameters in their shapes (plus buffers: a dict or None)."""
        out = {n: t.view(self.shapes[n]) for n, t in self.params.items() if t is not None}
        return dict(out, **(buffers or {}))

    def torch_optimizer(self, names):
        """A torch optimizer state_dict numbered over names (this run's
        parameter order), with the saved groups' hyper-parameters."""
        index = {n: i for i, n in enumerate(names)}
        state = {}
        for n, st in self.state.items():
            size = numel(self.shapes[n])
            state[index[n]] = {k: v.view(self.shapes[n]) if per_element(v, size) else v
                               for k, v in st.items()}
        groups = [dict(g, params=[index[n] for n in g["params"]]) for g in self.groups]
        return {"state": state, "param_groups": groups}

    def piece(self, name, start, n):
        return self.params[name][start:start + n]

    def piece_state(self, name, start, n):
        st = self.state.get(name)
        if st is None:
            return None
        size = numel(self.shapes[name])
        return {k: v[start:start + n].clone() if per_element(v, size) else v
                for k, v in st.items()}


@torch.no_grad()
def restore_pieces(named_pieces, optimizer, names, piece, piece_state, groups):
    """Each (name, tensor, start) of named_pieces from piece(name, start, n);
    the optimizer (over those pieces, its groups' parameters named in the
    order names) from piece_state(name, start, n) and the saved groups'
    hyper-parameters (renumbered over this optimizer's groups)."""
    start_of = {}
    for name, t, start in named_pieces:
        t.copy_(piece(name, start, t.numel()))
        start_of[name] = (start, t.numel())
    if optimizer is None:
        return
    sd = {"state": {}, "param_groups": []}
    for j, n in enumerate(names):
        st = piece_state(n, *start_of[n])
        if st is not None:
            sd["state"][j] = st
    at = 0
    for g, cur in zip(groups, optimizer.param_groups):
        sd["param_groups"].append(dict(g, params=list(range(at, at + len(cur["params"])))))
        at += len(cur["params"])
    optimizer.load_state_dict(sd)


def optimizer_names(model, optimizer):
    """The names of optimizer's parameters (the model's) in torch's numbering."""
    name = {p: n for n, p in model.named_parameters()}
    return [name[p] for g in optimizer.param_groups for p in g["params"]]
