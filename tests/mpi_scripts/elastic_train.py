"""elastic_train.py - a Horovod-style elastic script (hvd.elastic.run,
TorchState with model, optimizer and ElasticSampler, a commit every step)
for tests/test_elastic.py. ELASTIC_KILL_AT=E:B makes the last rank SIGKILL
itself at epoch E, batch B on the first attempt only (a lost rank);
ELASTIC_PAUSE_AT=E:B makes every rank wait there on the first attempt (rank 0
writes ELASTIC_OUT.paused first) until the test takes a host away, at most
60 s; ELASTIC_STOP_AT=E:B makes every rank stop there cleanly on the first
attempt (a job ended by its owner). Position E:B is before batch B of epoch
E, after the commit of the batch before. Rank 0 writes the final parameters'
sha256, the steps this attempt ran and the position it started at to
ELASTIC_OUT (a JSON file)."""
import hashlib
import json
import os
import signal
import sys
import time

import torch

import hpcdl.torch as hvd

hvd.init()
torch.manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(96, 8), torch.randint(0, 3, (96,)))
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
resets = []
started = []
kill_at = os.environ.get("ELASTIC_KILL_AT")
pause_at = os.environ.get("ELASTIC_PAUSE_AT")
stop_at = os.environ.get("ELASTIC_STOP_AT")
attempt = int(os.environ.get("HPCDL_ELASTIC_ATTEMPT", "0"))


@hvd.elastic.run
def train(state):
    steps = 0
    started.append([state.epoch, state.batch])
    for state.epoch in range(state.epoch, 3):
        for state.batch, (x, y) in enumerate(loader, start=state.batch):
            if kill_at == "%d:%d" % (state.epoch, state.batch) and attempt == 0 \
                    and hvd.rank() == hvd.size() - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            here = "%d:%d" % (state.epoch, state.batch)
            if here == stop_at and attempt == 0:
                sys.exit(0)
            if here == pause_at and attempt == 0:
                if hvd.rank() == 0:
                    with open(os.environ["ELASTIC_OUT"] + ".paused", "w") as f:
                        f.write(here)
                time.sleep(60)  # the test takes a host away meanwhile
                sys.exit("elastic_train: paused 60 s at %s and no host was lost" % here)
            state.optimizer.zero_grad()
            torch.nn.functional.cross_entropy(state.model(x), y).backward()
            state.optimizer.step()
            sampler.record_batch(state.batch, 4)
            steps += 1
            state.batch += 1  # the step is done: a resume starts after it
            state.commit()
        state.batch = 0
        sampler.set_epoch(state.epoch + 1)
        state.commit()
    return steps


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
steps = train(state)
if hvd.rank() == 0:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    with open(os.environ["ELASTIC_OUT"], "w") as f:
        json.dump({"sha256": digest, "steps": steps, "resets": resets, "attempt": attempt,
                   "size": hvd.size(), "started": started[0]}, f)
