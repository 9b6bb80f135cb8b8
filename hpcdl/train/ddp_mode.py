"""ddp_mode.py - the trainer's PyTorch DDP strategy (`hpcdl train --mode
ddp-gloo|ddp-hpcdl`): the same run as `--mode allreduce` with the gradients
averaged by torch.nn.parallel.DistributedDataParallel over torch.distributed
instead of by hpcdl's DistributedOptimizer: the peer that "hpcdl is faster
than PyTorch DDP" is measured against (docs/training.md, docs/large_batch.md).

    hpcdl train -n 4 --recipe lamb --global-batch 2048 --mode ddp-gloo

Everything but how gradients meet is allreduce.py's, which this class
extends: the data slices (rank r of N reads what an all-reduce rank r
reads), the recipe (optimizer, lr scaling, warmup, decay, label smoothing,
weight-decay exclusions), precision (fp16: the gradients are already the
same on every rank after DDP's all-reduce, so each rank's overflow check
agrees without a vote), batch-norm buffers (rank 0's at each epoch end, as
broadcast_buffers=False leaves them per rank during the epoch), the summary
and checkpoints. DDP averages (sum / N) in its buckets during backward, the
gradient of the whole global batch up to float rounding, so the parameters
follow --mode allreduce's.

The process group: backend gloo (torch's own) or "hpcdl" (hpcdl's backend
for torch.distributed, hpcdl.torch.distributed), started once per process
and kept for later runs in it (hpcdl bench large-batch runs several); gloo's
rendezvous is MASTER_ADDR/MASTER_PORT when set (hpcdl run and hpcdl train -n
set them), else rank 0's host and a free port there, sent to every rank
over MPI. Not supported (config.py refuses them before any rank starts):
--zero, --compression, --lr-scaling adascale (and so --global-batch auto).
The gradient noise scale is not measured (b_simple is None): it needs
DistributedOptimizer's per-rank and averaged gradient norms.
"""
import atexit
import datetime
import os
import socket
import inspect

from torch.nn.parallel import DistributedDataParallel
import torch.distributed as dist

from .. import comm
from . import build, checkpoint
from .allreduce import AllReduce
from .errors import ConfigError
from .precision import LossScaler, autocast
from ..torch import distributed

BACKENDS = ("gloo", "hpcdl")
INIT_TIMEOUT = datetime.timedelta(minutes=5)
_GROUPS = {}  # backend -> its process group (None: the default group), this process's


def backend_of(mode):
    """"ddp-gloo" -> "gloo"."""
    return mode.split("-", 1)[1]


def rendezvous_env():
    """Collective: MASTER_ADDR and MASTER_PORT for torch's env:// rendezvous,
    the launcher's when it set both (the same on every rank), else rank 0's
    host (127.0.0.1 when every rank is on it) and a port free there."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return
    hosts = comm.allgather_object(socket.gethostname())
    where = None
    if comm.rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        where = ("127.0.0.1" if len(set(hosts)) == 1 else hosts[0], str(port))
    addr, port = comm.bcast_object(where)
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=port)


def process_group(backend):
    """Collective: a torch.distributed group of every rank on backend: the
    default group when none was started yet or it is already this backend,
    else new_group beside it. Started once per process; destroyed at exit,
    before hpcdl.comm shuts MPI down (atexit runs the later handler first)."""
    if backend in _GROUPS:
        return _GROUPS[backend]
    if backend == "hpcdl":
        distributed.register()
    rendezvous_env()
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=comm.rank(), world_size=comm.size(),
                                timeout=INIT_TIMEOUT)
        atexit.register(_destroy)
        _GROUPS[backend] = None
    elif dist.get_backend() == backend:
        _GROUPS[backend] = None
    else:
        _GROUPS[backend] = dist.new_group(backend=backend, timeout=INIT_TIMEOUT)
    return _GROUPS[backend]


def no_buffer_sync(ddp_class):
    """DDP's option for buffers synced at construction only (not every
    forward): forward_sync_buffers=False since torch 2.13, which deprecates
    broadcast_buffers=False, its older spelling."""
    if "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters:
        return dict(forward_sync_buffers=False)
    return dict(broadcast_buffers=False)


def _destroy():
    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUPS.clear()


class DDP(AllReduce):
    """Gradients meet in torch DDP's bucketed all-reduce; every rank steps alike."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.backend = backend_of(cfg.mode)
        self.ddp = None

    def build(self, model, steps):
        """DDP around the model (its constructor broadcasts rank 0's parameters
        and buffers), the plain local optimizer, the schedule, the loss scaler."""
        cfg = self.cfg
        self.model = model
        self.opt = build.build_optimizer(cfg, model)
        group = process_group(self.backend)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=ids, process_group=group,
                                           **no_buffer_sync(DistributedDataParallel))
        self.sched = build.build_schedule(cfg, self.opt, steps)
        self.scaler = LossScaler() if cfg.precision == "fp16" else None

    def start_fresh(self):
        pass  # DDP's constructor gave every rank rank 0's parameters and buffers

    def describe(self, ds):
        return "%s, gradients by torch DDP over %s" % (super().describe(ds), self.backend)

    def train_step(self, x, y):
        """One synchronous step on this rank's slice, its forward and backward
        through DDP. Returns (summed loss, correct) over the slice, before the update."""
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self.opt.zero_grad()
        with autocast(self.cfg.precision, self.device):
            logits = self.ddp(x)
        loss = build.train_loss(self.cfg, logits.float(), y)
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:  # fp16: averaged scaled gradients, the same on every rank: no vote needed
            self.scaler.scale_loss(loss).backward()
            if self.scaler.unscale_and_check(self.model.parameters()):
                self.opt.step()
        self.sched.step()
        return loss.item() * len(y), (logits.argmax(1) == y).sum().item()

    def finish(self):
        return dict(super().finish(), ddp_backend=self.backend)

    def restore(self, state, dirs):
        """A checkpoint of whole replicas (DDP's: checkpoint.py refuses other
        modes' by the mode they record); one from before modes were recorded
        that holds no model is a parameter server's, refused here."""
        if "model" not in state:
            raise ConfigError("checkpoint %s holds no whole model (a parameter server's, from "
                              "an hpcdl that did not record --mode); resume it with its --mode "
                              "ps-*" % checkpoint.resumed_path(self.cfg))
        super().restore(state, dirs)
