"""elastic_scaling.py - hvd.elastic.BatchScaling across restarts on another rank
count, for tests/test_elastic.py: three models trained side by side in one
TorchState, each with its rule (linear lr with keep="local", AdaScale with
the global batch kept, goodput with a fixed step-time model), no reset
callback for them (a plain one records hvd.size(), to show user callbacks
still run). One step = one batch of scaling.local_batch samples per rank per
model, drawn from a generator seeded by (step, rank, model); a commit after
every step; the goodput model re-picks its batch every EPOCH steps, given
step_s = STEP_S + 0.012 x rank seconds (a stand-in for a timer, different on
each rank so that the test can work the ranks' mean by hand): read after a
restart, when the comm term measured on the old rank count is stale.
ELASTIC_KILL_AT=S: the last rank SIGKILLs itself before step S. Rank 0
appends one JSON line per step (and one per reset, after the callbacks) to
ELASTIC_OUT."""
import json
import os
import signal

import torch

import hpcdl.torch as hvd
from hpcdl.optim.goodput import StepTime

STEPS, EPOCH = 12, 3
STEP_TIME = StepTime(a=0.01, c=0.002, comm=0.03)  # seconds; the test's table uses it
STEP_S = 0.05  # rank 0's "measured" step seconds (above)
RULES = {  # name: (BatchScaling keywords, base lr)
    "linear": (dict(rule="linear", keep="local", base_batch=8, global_batch=16), 0.1),
    "ada": (dict(rule="adascale", base_batch=8, global_batch=20), 0.05),
    "goodput": (dict(rule="goodput", base_batch=4, max_global_batch=32, step_time=STEP_TIME),
                0.05),
}

hvd.init()
torch.manual_seed(1)
teacher = torch.randn(8, 3)
models, opts, scalings = {}, {}, {}
for name, (kw, lr) in RULES.items():
    models[name] = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 3))
    base = torch.optim.SGD(models[name].parameters(), lr=lr, momentum=0.9)
    opts[name] = hvd.DistributedOptimizer(base, named_parameters=models[name].named_parameters(),
                                          adascale=kw["rule"] != "linear")
    scalings[name] = hvd.elastic.BatchScaling(opts[name], **kw)
out = os.environ["ELASTIC_OUT"]
kill_at = int(os.environ.get("ELASTIC_KILL_AT", "-1"))


def snapshot(name):
    opt, s = opts[name], scalings[name]
    ada = opt.adascale
    return dict(ranks=hvd.size(), local=s.local_batch, global_batch=s.global_batch,
                target=s.target, lr=opt.param_groups[0]["lr"], scale=s.scale,
                progress=ada.progress.steps if ada else None,
                gain=ada.progress.last_gain if ada else None,
                noise_steps=ada.meter.smoothed.steps if ada else None, b_noise=s.b_noise(),
                **(goodput_model(s) if s.rule == "goodput" else {}))


def goodput_model(s):
    """The step-time model in use, and whether every rank holds the same."""
    model = s.model()
    mine = torch.tensor([[s.target, s.local_batch, model.comm]], dtype=torch.float64)
    every = hvd.allgather(mine)
    return dict(comm=model.comm, measured_comm=s.step_time.comm, comm_at=s.comm_at,
                stale=s.comm_stale, agree=bool((every == mine).all()))


def write(record):
    if hvd.rank() == 0:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


def batch(step, name, n):
    g = torch.Generator().manual_seed(1000 * step + 10 * hvd.rank() + len(name))
    x = torch.randn(n, 8, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, 3, generator=g)).argmax(1)
    return x, y


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if state.step == kill_at and hvd.rank() == hvd.size() - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        losses = {}
        for name in RULES:
            x, y = batch(state.step, name, scalings[name].local_batch)
            opts[name].zero_grad()
            loss = torch.nn.functional.cross_entropy(models[name](x), y)
            loss.backward()
            opts[name].step()
            losses[name] = loss.item()
        write(dict(step=state.step, loss=losses, **{n: snapshot(n) for n in RULES}))
        if (state.step + 1) % EPOCH == 0:
            scalings["goodput"].end_epoch(STEP_S + 0.012 * hvd.rank())
        state.step += 1
        state.commit()


state = hvd.elastic.TorchState(**{"model_" + n: m for n, m in models.items()},
                               **{"opt_" + n: o for n, o in opts.items()},
                               **{"scaling_" + n: s for n, s in scalings.items()}, step=0)
state.register_reset_callbacks([lambda: write(dict(reset=hvd.size(),
                                                   **{n: snapshot(n) for n in RULES}))])
train(state)
