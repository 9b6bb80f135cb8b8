"""ddp_check.py - tests/test_train_ddp.py's ranks: the same short training
(digits, the LAMB recipe's parts: sqrt scaling, warmup, poly decay, weight
decay not on biases, label smoothing) run in one job with every way the
gradients can meet: --mode allreduce, ddp-gloo, ddp-hpcdl (fp32), and
allreduce / ddp-gloo in fp16. Rank 0 prints one line 'RESULT {json}': per
run its summary's params_sha256, steps, test accuracy and where its
model.pt is; and a run checkpointed after epoch 1 with ddp-gloo and resumed
to epoch 2 with ddp-hpcdl against the 2 epochs at once. Then, in the same
job (the gloo group reused), the study of
`hpcdl bench large-batch --modes allreduce,ddp-gloo` on digits, its JSON at
argv[1]/lb.json. argv[1]: a directory for the runs' --out; argv[2]
(optional): the names of the training runs to do, comma-separated (default
all, and the study), e.g. allreduce-fp32 for the one-process reference."""
import json
import os
import sys

from hpcdl import comm
from hpcdl.bench import large_batch
from hpcdl.train import TrainConfig, train

COMMON = dict(data="digits", model="mlp", hidden=(32,), epochs=2, global_batch=64,
              recipe="lamb", base_batch=64, warmup_epochs=0.5, label_smoothing=0.1, seed=3)
RUNS = (("allreduce", "fp32"), ("ddp-gloo", "fp32"), ("ddp-hpcdl", "fp32"),
        ("allreduce", "fp16"), ("ddp-gloo", "fp16"))

comm.init()
top = sys.argv[1]
names = sys.argv[2].split(",") if len(sys.argv) > 2 else None
result = {}
for mode, precision in RUNS:
    name = "%s-%s" % (mode, precision)
    if names and name not in names:
        continue
    out = os.path.join(top, name)
    s = train(TrainConfig(mode=mode, precision=precision, out=out, **COMMON))
    result[name] = dict(sha=s["params_sha256"], steps=s["steps"], mode=s["mode"],
                        acc=s["test_accuracy"], ddp=s.get("ddp_backend"),
                        model=os.path.join(out, "model.pt"))
if names is None:  # resume: 1 epoch on ddp-gloo, then on to 2 on ddp-hpcdl, vs 2 at once
    plain = dict(data="digits", model="mlp", hidden=(32,), global_batch=64, seed=5)
    ck = os.path.join(top, "ck")
    whole = train(TrainConfig(mode="ddp-gloo", epochs=2, **plain))
    train(TrainConfig(mode="ddp-gloo", epochs=1, checkpoint_dir=ck, **plain))
    resumed = train(TrainConfig(mode="ddp-hpcdl", epochs=2, checkpoint_dir=ck, resume="auto",
                                **plain))
    result["resume"] = dict(whole=whole["params_sha256"], resumed=resumed["params_sha256"])
if comm.rank() == 0:
    print("RESULT " + json.dumps(result), flush=True)
if names is None:
    large_batch.run(large_batch.Options(
        batches=[64], recipes=["goyal"], data="digits", model="mlp", epochs=2,
        warmup_epochs=1, extra=dict(hidden=(32,)), offline_samples=0,
        modes=["allreduce", "ddp-gloo"], json=os.path.join(top, "lb.json")))
