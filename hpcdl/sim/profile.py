"""profile.py - `hpcdl sim profile`: measure what the step model (terms.py)
needs instead of guessing it: each gradient's size and the backward time
until it is ready (post-accumulate-grad hooks, in the order backward
produces them), the forward time, and the spread of the step time.

    hpcdl sim profile --model resnet18 --batch 32 --json prof.json
    hpcdl sim profile --model mypkg.nets:build --input-shape 3,64,64 --json prof.json

Models: those `hpcdl bench train` builds (MODELS below, the same shapes), or a
user's entry point `module:function` returning a torch.nn.Module, or a tuple
(module, input shape, classes). The spread is sigma / mean of the step time
over the timed steps on this rank; under mpirun with several ranks, over all
ranks' steps (hpcdl.comm's allgather_object). Median per-layer times are kept.
"""
import importlib
import json
import statistics as st
import time

from .terms import Layer
from .. import comm
from .. import models
from ..utils.launch import inside_parallel_job

# name -> (builder arguments, input shape per sample, classes), as
# hpcdl.bench.train.build_model (tests check they agree)
MLP_HIDDEN = (4096, 2048)
MODELS = {"mlp": ((1024, 10), {"hidden": MLP_HIDDEN}, (1024,), 10),
          "resnet18": (((3, 32, 32), 10), {}, (3, 32, 32), 10),
          "resnet50": (((3, 32, 32), 10), {}, (3, 32, 32), 10)}
FORMAT = "hpcdl-sim-profile-1"


def build(name, input_shape=None, classes=10):
    """(model, input shape, classes) for a name in MODELS or 'module:function'."""
    import torch  # on use: loads torch
    torch.manual_seed(0)
    if name in MODELS:
        args, opts, shape, classes = MODELS[name]
        return models.build(name, *args, **opts), shape, classes
    if ":" not in name:
        raise ValueError("unknown model %r: use one of %s, or a Python entry point "
                         "module:function that returns a torch.nn.Module"
                         % (name, ", ".join(MODELS)))
    module, func = name.split(":", 1)
    try:
        got = getattr(importlib.import_module(module), func)()
    except (ImportError, AttributeError) as e:
        raise ValueError("cannot load the model entry point %r (%s)" % (name, e))
    if isinstance(got, tuple):
        got, input_shape, classes = (list(got) + [input_shape, classes])[:3]
    if not isinstance(got, torch.nn.Module) or input_shape is None:
        raise ValueError("entry point %r must return a torch.nn.Module (and give "
                         "--input-shape) or (module, input shape, classes)" % name)
    return got, tuple(input_shape), classes


def _one_step(model, opt, x, y, marks):
    """Times of one training step: (forward, backward, total); marks gets
    (parameter name, perf_counter) as each gradient is accumulated."""
    import torch.nn.functional as F  # on use: loads torch
    marks.clear()
    opt.zero_grad()
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    t1 = time.perf_counter()
    marks.append(("", t1))
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    return t1 - t0, t2 - t1, time.perf_counter() - t0


def measure(model, shape, classes, batch=32, steps=10, warmup=2):
    """The profile document (one rank): layers in backward order with their
    gradient bytes (4 per parameter) and median backward time since the
    previous gradient, forward/backward/step medians and the step spread."""
    import torch  # on use: loads torch
    names = {p: n for n, p in model.named_parameters()}
    marks = []
    for p in names:
        p.register_post_accumulate_grad_hook(
            lambda p: marks.append((names[p], time.perf_counter())))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, *shape, generator=g), torch.randint(0, classes, (batch,),
                                                                    generator=g)
    per_layer, fwd, bwd, total, order = {}, [], [], [], None
    for k in range(warmup + steps):
        f, b, s = _one_step(model, opt, x, y, marks)
        if k < warmup:
            continue
        fwd.append(f), bwd.append(b), total.append(s)
        order = [n for n, _ in marks[1:]]
        for (_, t_prev), (n, t) in zip(marks, marks[1:]):
            per_layer.setdefault(n, []).append(t - t_prev)
    sizes = {n: 4 * p.numel() for n, p in model.named_parameters()}
    layers = [{"name": n, "nbytes": sizes[n], "backward_s": st.median(per_layer[n])}
              for n in order]
    return {"format": FORMAT, "batch": batch, "steps": steps, "forward_s": st.median(fwd),
            "backward_s": st.median(bwd), "step_s": st.median(total), "step_times": total,
            "optimizer_s": st.median(s - f - b for s, f, b in zip(total, fwd, bwd)),
            "params": sum(sizes.values()) // 4, "layers": layers}


def spread(times):
    """sigma / mean of step times (population sigma; 0 for fewer than 2)."""
    if len(times) < 2:
        return 0.0
    return st.pstdev(times) / st.mean(times)


def run(name, batch=32, steps=10, warmup=2, input_shape=None, classes=10):
    """Profile a model on this process, or on every rank when launched under
    mpirun/srun (the spread is then over all ranks' steps); the document."""
    model, shape, classes = build(name, input_shape, classes)
    doc = measure(model, shape, classes, batch, steps, warmup)
    import torch  # on use: loads torch
    doc["model"], doc["threads"] = name, torch.get_num_threads()  # the cpu terms read it
    times, ranks = doc["step_times"], 1
    if inside_parallel_job():
        world = comm.init()
        every = world.allgather_object(times)
        times, ranks = [t for mine in every for t in mine], world.size
    doc.update(ranks=ranks, spread=spread(times), spread_over="%d step(s) on %d rank(s)"
               % (len(times), ranks))
    return doc


def layers_of(doc):
    """[Layer] from a profile document, in backward order."""
    return [Layer(row["nbytes"], row["backward_s"], row["name"]) for row in doc["layers"]]


def load(path, model=None):
    """A profile document; ValueError naming the file (and the model when the
    profile was made for another one)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        for key in ("model", "forward_s", "backward_s", "layers", "spread"):
            if key not in doc:
                raise ValueError("no field %r" % key)
        layers_of(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError("cannot read the profile %s (%s): give the JSON written by "
                         "'hpcdl sim profile --json FILE'" % (path, e))
    if model is not None and doc["model"] != model:
        raise ValueError("the profile %s is for model %r, not %r: profile %s with "
                         "'hpcdl sim profile --model %s'" % (path, doc["model"], model,
                                                            model, model))
    return doc
