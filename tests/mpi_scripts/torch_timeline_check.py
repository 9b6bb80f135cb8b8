"""torch_timeline_check.py - run under mpirun: a few DistributedOptimizer
steps with the timeline on; the Chrome trace must hold, per bucket, pack,
queue, communicate and unpack phases and the backward pass, for every rank.
argv[1]: the trace path. Prints 'TIMELINE OK'."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpcdl.torch as hvd
from hpcdl.trace import start_timeline, stop_timeline

path = sys.argv[1]
hvd.init()
R, N = hvd.rank(), hvd.size()
torch.manual_seed(R)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), groups=3)
start_timeline(path)
for step in range(3):
    opt.zero_grad()
    F.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
    opt.step()
stop_timeline()
ok = True
if R == 0:
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for r in range(N):
        for b in range(3):
            names = {e["name"] for e in spans if e["pid"] == r and e["cat"] == "bucket.%d" % b}
            if not {"pack", "queue", "communicate", "unpack"} <= names:
                print("rank %d bucket.%d phases: %s" % (r, b, names))
                ok = False
        if not any(e["name"] == "backward" and e["pid"] == r for e in spans):
            print("rank %d: no backward span" % r)
            ok = False
    comm_spans = [e for e in spans if e["name"] == "communicate"]
    ok = ok and all(e["args"]["bytes"] > 0 and e["dur"] >= 0 for e in comm_spans)
    print("TIMELINE OK" if ok else "TIMELINE FAILED", flush=True)
sys.exit(0 if ok else 1)
