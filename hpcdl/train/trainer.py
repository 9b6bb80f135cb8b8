"""trainer.py - synchronous data-parallel training, the loop behind `hpcdl train`.

Every rank holds the whole model; they start identical (rank 0's weights are
broadcast, or every rank loads the same checkpoint). Each step every rank
computes gradients on its own L-sample slice of the global batch of G
(data.epoch_shard); hpcdl.torch.DistributedOptimizer averages them in fusion
buckets while backward runs; every rank takes the same step. Because the
slices are equal, the average of the slice-mean gradients is the gradient of
the whole batch: N ranks follow the path of one process with the same G and
seed, up to float rounding (models with batch norm normalise per rank, as
DDP does, so they follow it only approximately).

    hpcdl train -n 4                        # relaunches itself under mpirun
    mpirun -n 4 python -m hpcdl train       # the same, launched by hand (or srun)
    python -m hpcdl train                   # one process
"""
import os
import socket
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import comm
from . import build, checkpoint, data
from .config import ConfigError
from .precision import LossScaler, autocast
from .report import Reporter, params_digest
from .stop import StopRequest


@dataclass
class Run:
    """One training run's objects and where it stands."""
    cfg: object
    ds: object
    model: torch.nn.Module
    opt: object                 # hpcdl.torch.DistributedOptimizer
    sched: object               # per-step LR scheduler
    scaler: LossScaler = None   # fp16 only
    compression: object = None
    device: torch.device = torch.device("cpu")
    epoch: int = 1              # the epoch in progress (1-based)
    step_in_epoch: int = 0      # steps of it already taken
    global_step: int = 0
    sums: dict = field(default_factory=lambda: dict(loss=0.0, correct=0.0, seen=0.0,
                                                    time=0.0))
    train_time: float = 0.0     # seconds in completed epochs' training loops
    train_samples: int = 0


# ---------------------------------------------------------------- setup
def pick_device():
    """One GPU per local rank when there are GPUs, else the CPU."""
    from ..utils.device import select_device
    device = select_device()
    if device.type == "cpu":  # the node's cores are shared by its ranks: split threads
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.local_size()))
    return device


def setup(cfg):
    """Checks cfg against the job, loads data, builds identical replicas, and
    restores a checkpoint when resuming. Returns a Run."""
    from .. import torch as hvd
    hvd.init()
    cfg.check(comm.size())
    device = pick_device()
    torch.manual_seed(cfg.seed)
    ds, steps = load_data(cfg)
    model = build.build_model(cfg, ds).to(device)
    local = build.build_optimizer(cfg, model)
    compression = build.build_compression(cfg.compression)
    opt = hvd.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                   compression=compression)
    sched = build.build_schedule(cfg, opt, steps)
    scaler = LossScaler(agree=_any_rank) if cfg.precision == "fp16" else None
    run = Run(cfg, ds, model, opt, sched, scaler, compression, device)
    path = resume_path(cfg)
    if path:
        restore(run, checkpoint.load(path, cfg, model))
        comm.print0("hpcdl train: resumed from %s at epoch %d step %d"
                    % (path, run.epoch, run.step_in_epoch))
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return run


def load_data(cfg):
    """(data source, steps per epoch); ConfigError if not one global batch fits."""
    ds = data.load(cfg.data, cfg.seed, cfg.test_fraction, workers=cfg.workers,
                   stage_to=cfg.stage_to)
    steps = data.steps_per_epoch(ds.n_train, cfg.global_batch)
    if steps < 1:
        raise ConfigError("global batch %d is larger than the %d training samples; pick a "
                          "smaller --global-batch" % (cfg.global_batch, ds.n_train))
    return ds, steps


def resume_path(cfg):
    """The checkpoint to resume from, or None (fresh start)."""
    if cfg.resume is None:
        return None
    if cfg.resume != "auto":
        return cfg.resume
    path = checkpoint.path_in(cfg.checkpoint_dir)
    if os.path.exists(path):
        return path
    comm.print0("hpcdl train: no checkpoint in %s yet; starting from scratch"
                % cfg.checkpoint_dir)
    return None


def _any_rank(flag):
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    comm.allreduce(t, op="max")
    return bool(t.item())


# ---------------------------------------------------------------- checkpoints
def state_of(run):
    """Everything the next step depends on (see checkpoint.py)."""
    residuals = getattr(run.compression, "_residuals", None)
    return {
        "format": checkpoint.FORMAT,
        "meta": checkpoint.meta_of(run.cfg, run.model),
        "position": {"epoch": run.epoch, "step_in_epoch": run.step_in_epoch,
                     "global_step": run.global_step},
        "sums": dict(run.sums), "train_time": run.train_time,
        "train_samples": run.train_samples,
        "model": run.model.state_dict(), "optimizer": run.opt.state_dict(),
        "scheduler": run.sched.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler else None,
        "rng": {"torch": torch.get_rng_state()},
        # top-k residuals differ per rank: rank r's dict is item r
        "residuals": (comm.world().mpi.gather(dict(residuals), root=0)
                      if residuals is not None else None),
        "ranks": comm.size(),
    }


def restore(run, state):
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    if run.scaler is not None and state["scaler"] is not None:
        run.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    pos = state["position"]
    run.epoch, run.step_in_epoch, run.global_step = (
        pos["epoch"], pos["step_in_epoch"], pos["global_step"])
    run.sums, run.train_time = dict(state["sums"]), state["train_time"]
    run.train_samples = state["train_samples"]
    residuals = state["residuals"]
    if residuals is not None and hasattr(run.compression, "_residuals"):
        if state["ranks"] == comm.size():
            run.compression._residuals.update(residuals[comm.rank()])
        else:
            comm.warn("top-k residuals were saved by %d ranks, this job has %d: they start "
                      "from zero (the run will not match an uninterrupted one exactly)"
                      % (state["ranks"], comm.size()))


def save_checkpoint(run):
    path = checkpoint.path_in(run.cfg.checkpoint_dir)
    checkpoint.save(path, state_of(run))
    return path


# ---------------------------------------------------------------- one step
def train_step(run, x, y):
    """One synchronous step on this rank's slice. Returns (summed loss, correct)
    over the slice, before the update."""
    x, y = x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True)
    run.opt.zero_grad()
    with autocast(run.cfg.precision, run.device):
        logits = run.model(x)
    loss = F.cross_entropy(logits.float(), y)
    if run.scaler is None:
        loss.backward()
        run.opt.step()
    else:  # fp16: scaled backward, averaged grads checked for overflow on every rank
        run.scaler.scale_loss(loss).backward()
        run.opt.synchronize()
        if run.scaler.unscale_and_check(run.model.parameters()):
            with run.opt.skip_synchronize():
                run.opt.step()
    run.sched.step()
    return loss.item() * len(y), (logits.argmax(1) == y).sum().item()


def global_sums(*values):
    """Sums each value over ranks (one small float64 all-reduce)."""
    t = torch.tensor(values, dtype=torch.float64)
    comm.allreduce(t, op="sum")
    return t.tolist()


# ---------------------------------------------------------------- one epoch
def train_epoch(run, reporter, stop):
    """The rest of run.epoch's steps. Returns the signal number if the ranks
    agreed to stop before the epoch ended, else 0."""
    cfg = run.cfg
    rows = data.epoch_shard(run.ds.n_train, cfg.global_batch, comm.rank(), comm.size(),
                            cfg.seed, run.epoch)
    run.model.train()
    reporter.start_epoch(run.epoch, len(rows), run.step_in_epoch)
    batches = run.ds.train_batches(rows[run.step_in_epoch:])
    t0 = time.perf_counter()
    for s in range(run.step_in_epoch, len(rows)):
        signum = stop.agreed()
        if signum:
            run.sums["time"] += time.perf_counter() - t0
            return signum
        x, y = next(batches)
        loss_sum, correct = train_step(run, x, y)
        run.sums["loss"] += loss_sum
        run.sums["correct"] += correct
        run.sums["seen"] += len(y)
        run.step_in_epoch, run.global_step = s + 1, run.global_step + 1
        reporter.step(s, loss_sum / len(y))
    run.sums["time"] += time.perf_counter() - t0
    return 0


@torch.no_grad()
def evaluate(model, ds, device, precision="fp32"):
    """(mean loss, accuracy) on the test set, each rank scoring its part (collective)."""
    model.eval()
    idx = data.eval_shard(ds.n_test, comm.rank(), comm.size())
    loss_sum = correct = 0.0
    for x, y in ds.test_batches(idx):
        x, y = x.to(device), y.to(device)
        with autocast(precision, device):
            logits = model(x).float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    loss_sum, correct, n = global_sums(loss_sum, correct, len(idx))
    return loss_sum / max(n, 1), correct / max(n, 1)


def end_epoch(run, reporter):
    """Global metrics of the finished epoch, its record, and the next epoch's start."""
    from .. import torch as hvd
    # batch-norm statistics are per rank: use rank 0's, as DDP does
    buffers = {k: v for k, v in run.model.named_buffers() if v.is_floating_point()}
    if buffers:
        hvd.broadcast_parameters(buffers, root_rank=0)
    loss_sum, correct, seen, dt = global_sums(run.sums["loss"], run.sums["correct"],
                                              run.sums["seen"], run.sums["time"])
    dt /= comm.size()  # mean over ranks of the epoch's training time
    test_loss, test_acc = evaluate(run.model, run.ds, run.device, run.cfg.precision)
    rec = dict(epoch=run.epoch, step=run.global_step, loss=loss_sum / seen,
               accuracy=correct / seen, test_loss=test_loss, test_accuracy=test_acc,
               lr=run.opt.param_groups[0]["lr"], samples_per_s=seen / dt, epoch_time_s=dt)
    if run.scaler is not None:
        rec["loss_scale"], rec["skipped_steps"] = run.scaler.scale, run.scaler.skipped
    reporter.end_epoch(rec)
    run.train_time += dt
    run.train_samples += int(seen)
    run.epoch, run.step_in_epoch = run.epoch + 1, 0
    run.sums = dict(loss=0.0, correct=0.0, seen=0.0, time=0.0)
    return rec


# ---------------------------------------------------------------- the run
def report_setup(run):
    cfg, ds, size = run.cfg, run.ds, comm.size()
    comm.print0("hpcdl train: %s on %s (%d train / %d test), %d rank(s), global batch %d "
                "(%d per rank), %d steps/epoch, %s lr %g (base %g, %s scaling), warmup %g "
                "epoch(s), %s schedule, %s precision, %s compression, seed %d, %s"
                % (cfg.model, cfg.data, ds.n_train, ds.n_test, size, cfg.global_batch,
                   cfg.global_batch // size, data.steps_per_epoch(ds.n_train, cfg.global_batch),
                   cfg.optimizer, build.peak_lr(cfg), cfg.base_lr, cfg.lr_scaling,
                   cfg.warmup_epochs, cfg.schedule, cfg.precision, cfg.compression, cfg.seed,
                   run.device))


def train(cfg):
    """Runs cfg on the ranks of this job (collective). Returns the summary dict
    (the same on every rank), or None when a signal stopped the run early."""
    if cfg.mode.startswith("ps-"):
        from .ps_mode import train_ps
        return train_ps(cfg)
    t_start = time.perf_counter()
    stop = StopRequest()  # before the slow setup: a signal during it is not lost
    run = setup(cfg)
    report_setup(run)
    reporter = Reporter(cfg, resumed=run.global_step > 0)
    rec = None
    try:
        while run.epoch <= cfg.epochs:
            signum = train_epoch(run, reporter, stop)
            if signum:
                return stopped(run, signum)
            rec = end_epoch(run, reporter)
            if cfg.checkpoint_dir and (rec["epoch"] % cfg.checkpoint_every == 0
                                       or rec["epoch"] == cfg.epochs):
                save_checkpoint(run)
    finally:
        reporter.close()
        stop.restore()
    if rec is None:  # resumed from a checkpoint of a finished run
        test_loss, test_acc = evaluate(run.model, run.ds, run.device, run.cfg.precision)
        rec = dict(test_loss=test_loss, test_accuracy=test_acc)
    summary = summarize(run, rec, time.perf_counter() - t_start)
    reporter.finish(summary, run.model)
    return summary


def stopped(run, signum):
    """A signal asked every rank to stop: checkpoint and return None."""
    name = StopRequest.name(signum)
    if not run.cfg.checkpoint_dir:
        comm.print0("hpcdl train: stopped by %s at epoch %d step %d; no --checkpoint-dir, "
                    "so nothing was saved" % (name, run.epoch, run.step_in_epoch))
        return None
    path = save_checkpoint(run)
    comm.print0("hpcdl train: stopped by %s at epoch %d step %d; checkpoint %s; rerun with "
                "--resume to continue" % (name, run.epoch, run.step_in_epoch, path))
    return None


def summarize(run, rec, wall):
    hosts = comm.world().mpi.allgather(socket.gethostname())
    return dict(
        test_accuracy=rec["test_accuracy"], test_loss=rec["test_loss"],
        samples_per_s=run.train_samples / run.train_time if run.train_time else 0.0,
        wall_s=wall, ranks=comm.size(), nodes=len(set(hosts)),
        global_batch=run.cfg.global_batch, model=run.cfg.model, data=run.cfg.data,
        optimizer=run.cfg.optimizer, precision=run.cfg.precision, epochs=run.cfg.epochs,
        steps=run.global_step, params_sha256=params_digest(run.model),
        skipped_steps=run.scaler.skipped if run.scaler else 0)
