"""trainer.py - synchronous data-parallel SGD over hpcdl's collectives.

Every rank holds the whole model. They start identical (rank 0's weights are
broadcast). Each step, every rank computes gradients on its own L-sample slice
of the global batch of G; one all-reduce of a flat float32 buffer averages
them; every rank then takes the same optimizer step, so the replicas stay
identical. Because the slices are equal, the average of the slice-mean
gradients is the gradient of the whole batch: N ranks follow the same path as
one process with the same G and seed, up to float rounding.

    hpcdl train -n 4                        # relaunches itself under mpirun
    mpirun -n 4 python -m hpcdl train       # the same, launched by hand (or srun)
    python -m hpcdl train                   # one process
"""
import json
import os
import time

import torch
import torch.nn.functional as F

from .. import comm, models
from . import data
from .config import ConfigError


# ---------------------------------------------------------------- setup
def build_optimizer(cfg, params):
    # only SGD so far; LARS and others slot in here by name
    return torch.optim.SGD(params, lr=cfg.base_lr, momentum=cfg.momentum)


def lr_at(cfg, epoch):
    """The learning rate for epoch (1-based): constant until schedules arrive."""
    return cfg.base_lr


def broadcast_parameters(model):
    """Every rank's parameters become rank 0's, through one flat buffer."""
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).contiguous()
    comm.broadcast(flat, root=0)
    _unflatten(flat, [p.data for p in params])


def _unflatten(flat, tensors):
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


# ---------------------------------------------------------------- one step
def allreduce_gradients(params, flat):
    """Averages every parameter's gradient over ranks: one all-reduce of flat."""
    torch.cat([p.grad.reshape(-1) for p in params], out=flat)
    comm.allreduce(flat, op="average")
    _unflatten(flat, [p.grad for p in params])


def train_step(model, opt, flat, x, y):
    """One synchronous step on this rank's slice x (L, F), y (L,).
    Returns (summed loss, correct predictions) over the slice, before the update."""
    opt.zero_grad(set_to_none=False)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    allreduce_gradients(list(model.parameters()), flat)
    opt.step()
    return loss.item() * len(y), (logits.argmax(1) == y).sum().item()


def global_sums(*values):
    """Sums each value over ranks (one small float64 all-reduce)."""
    t = torch.tensor(values, dtype=torch.float64)
    comm.allreduce(t, op="sum")
    return t.tolist()


# ---------------------------------------------------------------- one epoch
def train_epoch(cfg, model, opt, flat, ds, epoch):
    """One pass over this rank's shard. Returns global (mean loss, accuracy, samples)."""
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, epoch)
    model.train()
    shard = data.epoch_shard(len(ds.y_train), cfg.global_batch, comm.rank(), comm.size(),
                             cfg.seed, epoch)
    loss_sum = correct = 0.0
    for idx in torch.from_numpy(shard):
        l, c = train_step(model, opt, flat, ds.x_train[idx], ds.y_train[idx])
        loss_sum, correct = loss_sum + l, correct + c
    loss_sum, correct, seen = global_sums(loss_sum, correct, shard.size)
    return loss_sum / seen, correct / seen, int(seen)


@torch.no_grad()
def evaluate(model, x, y):
    """(mean loss, accuracy) on x, y, each rank scoring its part of the samples."""
    model.eval()
    idx = torch.from_numpy(data.eval_shard(len(y), comm.rank(), comm.size()))
    logits = model(x[idx])
    loss_sum = F.cross_entropy(logits, y[idx], reduction="sum").item()
    correct = (logits.argmax(1) == y[idx]).sum().item()
    loss_sum, correct, n = global_sums(loss_sum, correct, len(idx))
    return loss_sum / n, correct / n


# ---------------------------------------------------------------- reporting
def open_metrics(cfg):
    """metrics.jsonl in cfg.out, truncated, on rank 0; None elsewhere or without --out."""
    if cfg.out is None or comm.rank() != 0:
        return None
    os.makedirs(cfg.out, exist_ok=True)
    return open(os.path.join(cfg.out, "metrics.jsonl"), "w")


def report_setup(cfg, ds):
    size = comm.size()
    comm.print0("hpcdl train: %s on %s (%d train / %d test), %d rank(s), global batch %d "
                "(%d per rank), %d steps/epoch, %s lr %g momentum %g, seed %d"
                % (cfg.model, cfg.data, len(ds.y_train), len(ds.y_test), size,
                   cfg.global_batch, cfg.global_batch // size,
                   data.steps_per_epoch(len(ds.y_train), cfg.global_batch),
                   cfg.optimizer, cfg.base_lr, cfg.momentum, cfg.seed))


def report_epoch(cfg, metrics, rec):
    comm.print0("epoch %3d/%d  loss %.4f  acc %.4f  test_acc %.4f  lr %.4g  samples/s %.0f"
                % (rec["epoch"], cfg.epochs, rec["loss"], rec["accuracy"],
                   rec["test_accuracy"], rec["lr"], rec["samples_per_s"]))
    if metrics is not None:
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()  # readable while training runs


def report_summary(summary):
    comm.print0("# summary")
    for label, key, fmt in (("test accuracy", "test_accuracy", "%.4f"),
                            ("test loss", "test_loss", "%.4f"),
                            ("samples/s", "samples_per_s", "%.0f"),
                            ("wall time (s)", "wall_time_s", "%.2f"),
                            ("ranks", "ranks", "%d"),
                            ("global batch", "global_batch", "%d")):
        comm.print0("%-14s " % label + fmt % summary[key])


# ---------------------------------------------------------------- the run
def setup(cfg):
    """Checks cfg against the job, loads the data, builds identical replicas.
    Returns (dataset, model, optimizer, flat gradient buffer)."""
    comm.init()
    cfg.check(comm.size())
    torch.set_num_threads(1)  # ranks share the node's cores: one thread each
    torch.manual_seed(cfg.seed)
    ds = data.load(cfg.data, cfg.seed, cfg.test_fraction)
    if data.steps_per_epoch(len(ds.y_train), cfg.global_batch) < 1:
        raise ConfigError("global batch %d is larger than the %d training samples; pick a "
                         "smaller --global-batch" % (cfg.global_batch, len(ds.y_train)))
    model = models.build(cfg.model, ds.num_features, ds.num_classes, hidden=cfg.hidden)
    broadcast_parameters(model)
    opt = build_optimizer(cfg, model.parameters())
    # the gradients travel as one contiguous float32 buffer: one all-reduce per step
    flat = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
    report_setup(cfg, ds)
    return ds, model, opt, flat


def train(cfg):
    """Runs cfg on the ranks of this job (collective). Returns the summary dict
    (the same on every rank); rank 0 prints and writes the metrics."""
    t_start = time.perf_counter()
    ds, model, opt, flat = setup(cfg)
    metrics = open_metrics(cfg)
    step, train_time, samples = 0, 0.0, 0
    try:
        for epoch in range(1, cfg.epochs + 1):
            t0 = time.perf_counter()
            loss, acc, seen = train_epoch(cfg, model, opt, flat, ds, epoch)
            dt = time.perf_counter() - t0
            step += data.steps_per_epoch(len(ds.y_train), cfg.global_batch)
            train_time, samples = train_time + dt, samples + seen
            test_loss, test_acc = evaluate(model, ds.x_test, ds.y_test)
            report_epoch(cfg, metrics, dict(
                epoch=epoch, step=step, loss=loss, accuracy=acc, test_loss=test_loss,
                test_accuracy=test_acc, lr=lr_at(cfg, epoch), samples_per_s=seen / dt))
    finally:
        if metrics is not None:
            metrics.close()
    summary = dict(test_accuracy=test_acc, test_loss=test_loss,
                   samples_per_s=samples / train_time,
                   wall_time_s=time.perf_counter() - t_start, ranks=comm.size(),
                   global_batch=cfg.global_batch)
    report_summary(summary)
    return summary
