"""ps_mode.py - `hpcdl train --mode ps-bsp|ps-asp|ps-ssp`: the trainer's loop
over hpcdl.ps instead of all-reduce.

Ranks 0..K-1 serve the parameters (K = --ps-ranks), the other W ranks are
workers. Worker w reads the slice of each global batch that an all-reduce job
of W ranks gives rank w (so ps-bsp follows synchronous SGD on the same global
batch), pushes its gradients with the current lr and pulls the parameters
back, waiting as the mode requires. An epoch is one round; after it every rank
gets the servers' model, so evaluation, reporting and checkpoints are the
all-reduce trainer's. Limits: SGD with momentum and weight decay in fp32, no
compression; signals and checkpoints take effect between epochs; only ps-bsp
resumes bit-exactly (asp and ssp depend on timing).
"""
import socket
import time

import torch
import torch.nn.functional as F

from .. import comm
from . import build, checkpoint, data
from .config import ConfigError
from .report import Reporter, params_digest
from .stop import StopRequest
from .trainer import evaluate, global_sums, load_data, resume_path


def setup(cfg):
    from ..ps import PSConfigError, PSTrainer
    comm.init()
    cfg.check(comm.size())
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    ds, steps = load_data(cfg)
    model = build.build_model(cfg, ds)
    try:
        ps = PSTrainer(model, mode=cfg.mode[3:], staleness=cfg.staleness if
                       cfg.mode == "ps-ssp" else None, ps_ranks=cfg.ps_ranks,
                       momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    except PSConfigError as e:
        raise ConfigError(str(e))
    # the lr schedule runs on every rank (servers step it too, so rank 0's
    # checkpoint holds the workers' position); workers send its lr with each push
    opt = torch.optim.SGD(model.parameters(), lr=build.peak_lr(cfg))
    sched = build.build_schedule(cfg, opt, steps)
    opt.step()  # no gradients, so a no-op; torch then does not warn that the
    #             schedule steps before the optimizer (this one only holds the lr)
    return ds, model, ps, opt, sched


def train_epoch(cfg, ds, model, ps, opt, sched, epoch, reporter):
    """One round. Returns this rank's (loss sum, correct, samples, seconds)."""
    rows = data.epoch_shard(ds.n_train, cfg.global_batch, ps.worker_rank or 0,
                            ps.num_workers, cfg.seed, epoch)
    t0, loss_sum, correct, seen = time.perf_counter(), 0.0, 0.0, 0
    reporter.start_epoch(epoch, len(rows), 0)
    if ps.is_server:
        ps.serve()
        for _ in rows:
            sched.step()
    else:
        model.train()
        for s, (x, y) in enumerate(ds.train_batches(rows)):
            def closure():
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                loss.backward()
                return loss.item() * len(y), (logits.argmax(1) == y).sum().item()
            lsum, c = ps.step(closure, lr=opt.param_groups[0]["lr"])
            sched.step()
            loss_sum, correct, seen = loss_sum + lsum, correct + c, seen + len(y)
            reporter.step(s, lsum / len(y))
        ps.end_round()
    ps.sync_model()
    return loss_sum, correct, seen, time.perf_counter() - t0


def train_ps(cfg):
    """Collective. Returns the summary, or None when a signal stopped the run."""
    t_start = time.perf_counter()
    stop = StopRequest()
    ds, model, ps, opt, sched = setup(cfg)
    start, step, train_time, samples = 1, 0, 0.0, 0
    path = resume_path(cfg)
    if path:
        state = checkpoint.load(path, cfg, model)
        ps.load_state_dict(state["ps"])
        sched.load_state_dict(state["scheduler"])
        start, step = state["position"]["epoch"], state["position"]["global_step"]
        train_time, samples = state["train_time"], state["train_samples"]
        comm.print0("hpcdl train: resumed from %s at epoch %d" % (path, start))
    comm.print0("hpcdl train: %s on %s, %s with %d server(s) and %d worker(s), global batch %d "
                "(%d per worker), lr %g, seed %d" % (cfg.model, cfg.data, cfg.mode, ps.num_servers,
                                                     ps.num_workers, cfg.global_batch,
                                                     cfg.global_batch // ps.num_workers,
                                                     build.peak_lr(cfg), cfg.seed))
    reporter = Reporter(cfg, resumed=start > 1)

    def state_at(epoch):
        return {"format": checkpoint.FORMAT, "meta": checkpoint.meta_of(cfg, model),
                "position": {"epoch": epoch, "step_in_epoch": 0, "global_step": step},
                "ps": ps.state_dict(), "scheduler": sched.state_dict(),
                "train_time": train_time, "train_samples": samples}
    try:
        for epoch in range(start, cfg.epochs + 1):
            signum = stop.agreed()
            if signum:
                return _stopped(cfg, state_at(epoch), signum, epoch)
            loss_sum, correct, seen, dt = global_sums(
                *train_epoch(cfg, ds, model, ps, opt, sched, epoch, reporter))
            dt /= comm.size()
            step += data.steps_per_epoch(ds.n_train, cfg.global_batch)
            test_loss, test_acc = evaluate(model, ds, torch.device("cpu"))
            reporter.end_epoch(dict(epoch=epoch, step=step, loss=loss_sum / seen,
                                    accuracy=correct / seen, test_loss=test_loss,
                                    test_accuracy=test_acc, lr=opt.param_groups[0]["lr"],
                                    samples_per_s=seen / dt, epoch_time_s=dt))
            train_time, samples = train_time + dt, samples + int(seen)
            if cfg.checkpoint_dir and (epoch % cfg.checkpoint_every == 0 or
                                       epoch == cfg.epochs):
                checkpoint.save(checkpoint.path_in(cfg.checkpoint_dir), state_at(epoch + 1))
        stats = ps.gather_stats()
    finally:
        reporter.close()
        stop.restore()
    ps.close()
    test_loss, test_acc = evaluate(model, ds, torch.device("cpu"))
    summary = dict(test_accuracy=test_acc, test_loss=test_loss,
                   samples_per_s=samples / train_time if train_time else 0.0,
                   wall_s=time.perf_counter() - t_start, ranks=comm.size(),
                   nodes=len(set(comm.world().mpi.allgather(socket.gethostname()))),
                   global_batch=cfg.global_batch, model=cfg.model, data=cfg.data,
                   optimizer="sgd", precision="fp32", epochs=cfg.epochs, steps=step,
                   mode=cfg.mode, ps_ranks=cfg.ps_ranks, staleness=cfg.staleness,
                   max_staleness=max((s.get("max_staleness", 0) for s in stats), default=0),
                   params_sha256=params_digest(model), skipped_steps=0)
    reporter.finish(summary, model)
    return summary


def _stopped(cfg, state, signum, epoch):
    name = StopRequest.name(signum)
    if not cfg.checkpoint_dir:
        comm.print0("hpcdl train: stopped by %s before epoch %d; no --checkpoint-dir, so "
                    "nothing was saved" % (name, epoch))
        return None
    path = checkpoint.path_in(cfg.checkpoint_dir)
    checkpoint.save(path, state)
    comm.print0("hpcdl train: stopped by %s before epoch %d; checkpoint %s; rerun with "
                "--resume to continue" % (name, epoch, path))
    return None
