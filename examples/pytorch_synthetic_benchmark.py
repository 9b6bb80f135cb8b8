"""pytorch_synthetic_benchmark.py - Horovod's PyTorch synthetic benchmark
(examples/pytorch/pytorch_synthetic_benchmark.py) on hpcdl: training steps on
one fixed random batch, timed, with Horovod's printout. The model comes from
hpcdl.models (no torchvision); by default ResNet-18 on 3x32x32 images, so it
runs on a laptop's CPU:

    hpcdl run -n 2 -- python examples/pytorch_synthetic_benchmark.py
    # Horovod's own settings (ResNet-50 on 224x224, best on GPUs):
    hpcdl run -n 8 -- python examples/pytorch_synthetic_benchmark.py \\
        --model resnet50 --image-size 224 --num-classes 1000 --batch-size 32 \\
        --num-warmup-batches 10 --num-batches-per-iter 10 --num-iters 10 --sync-bn

Every rank is counted as one "GPU" in the printout, as in Horovod's GPU runs,
so scripts that read Horovod's lines read these; the "Number of GPUs" line
says when the ranks ran on the CPU. The run ends with a check, outside the
timed loop: every rank must hold the same parameters (exit status 1 if not).
"""
import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import hpcdl.torch as hvd  # was: import horovod.torch as hvd
from hpcdl import models

# ---------------------------------------------------------------- settings
parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="resnet18",
                    choices=("mlp",) + models.IMAGE_NAMES,  # image models (cnn1d: sequences)
                    help="model to benchmark (from hpcdl.models)")
parser.add_argument("--image-size", type=int, default=32,
                    help="synthetic images are 3 x S x S (Horovod: 224)")
parser.add_argument("--num-classes", type=int, default=10,
                    help="classes of the synthetic labels (Horovod: 1000)")
parser.add_argument("--batch-size", type=int, default=16,
                    help="input batch size (per rank)")
parser.add_argument("--num-warmup-batches", type=int, default=2,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=2,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=3,
                    help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--sync-bn", action="store_true", default=False,
                    help="ResNets: hvd.SyncBatchNorm instead of BatchNorm2d (Horovod's "
                         "current benchmark does this; costs two small collectives per "
                         "norm layer and step)")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")

args = parser.parse_args()
if args.sync_bn and args.model not in models.IMAGE_NAMES:
    parser.error("--sync-bn: model %s has no batch norm; use it with %s"
                 % (args.model, " or ".join(models.IMAGE_NAMES)))
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    # Horovod: pin GPU to local rank (ranks share GPUs when there are fewer)
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.backends.cudnn.benchmark = True
else:
    # ranks on one node share its cores: split them, or the threads fight
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, cores // hvd.local_size()))

# ---------------------------------------------------------------- model and optimizer
# Set up standard model (with --sync-bn, batch norm over every rank's samples).
options = {"norm_layer": hvd.SyncBatchNorm} if args.sync_bn else {}
model = models.build(args.model, (3, args.image_size, args.image_size), args.num_classes,
                     **options)

if args.cuda:
    # Move model to GPU.
    model.cuda()

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Set up fixed fake data
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.LongTensor(args.batch_size).random_() % args.num_classes
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


# ---------------------------------------------------------------- the benchmark
log("Model: %s" % args.model)
log("Batch size: %d" % args.batch_size)
device = "GPU" if args.cuda else "CPU"
log("Number of GPUs: %d (ranks, on %s)" % (hvd.size(), device))

# Warm-up
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

# Benchmark
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    log("Iter #%d: %.1f img/sec per GPU" % (x, img_sec))
    img_secs.append(img_sec)

# Results
img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log("Img/sec per GPU: %.1f +-%.1f" % (img_sec_mean, img_sec_conf))
log("Total img/sec on %d GPU(s): %.1f +-%.1f" %
    (hvd.size(), hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))

# ---------------------------------------------------------------- the check
# data-parallel SGD keeps the replicas identical: the element-wise max and min
# of the parameters over ranks must agree
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = torch.equal(hvd.allreduce(flat, op=hvd.Max), hvd.allreduce(flat, op=hvd.Min))
log("Parameters identical on all %d ranks: %s" % (hvd.size(), "OK" if same else "FAILED"))
hvd.shutdown()
sys.exit(0 if same else 1)
