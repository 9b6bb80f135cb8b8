"""trainer.py - the training loop behind `hpcdl train`, one loop for every mode.

    hpcdl train -n 4                        # relaunches itself under mpirun
    mpirun -n 4 python -m hpcdl train       # the same, launched by hand (or srun)
    python -m hpcdl train                   # one process
    hpcdl train -n 3 --mode ps-bsp          # the same loop over a parameter server

train() reads top to bottom like a training script: distributed state set in
one block, then data, model, the strategy's optimizer, resume, the loop of
epochs, the summary. The loop is shared by every mode: data loading (each
step's rows from data.epoch_shard, so N ranks read the global batches one
process would), resume from a checkpoint, the stop request (a signal ends the
run at a step boundary every rank agrees on), evaluation, the epoch record,
checkpoint timing and the summary, all kept in one Run record.

The loop owns the steps: it asks for the stop request before each one,
counts them (Run.step_done) and decides when the run is over; it owns the
checkpoint's keys too (state_of), a strategy only adds its own state.

A *strategy* decides the rest: how gradients meet and how state is saved.

    --mode          strategy                       gradients meet in
    allreduce       allreduce.AllReduce            DistributedOptimizer's bucketed all-reduce
    ps-bsp|asp|ssp  ps_mode.ParameterServer        pushes to and pulls from hpcdl.ps servers
    allreduce       zero.Zero (with --zero 1|2)    reduce-scatter / all-gather of ZeRO shards
    allreduce       zero.Zero3 (with --zero 3)     the same, per module, parameters sharded too
    ddp-gloo|hpcdl  ddp_mode.DDP                   torch DDP over torch.distributed gloo / hpcdl

Adding a strategy (as zero.py added ZeRO): write hpcdl/train/<mode>.py
with a class of the interface below (copy allreduce.py, the reference), add
its mode to config.MODES and one line to STRATEGIES here. The loop does not
change. A strategy never imports this module; this module imports them.

    Strategy(cfg)                          after comm.init(); sets .device
    .n_train                               set by the loop before build(): training samples
    .build(model, steps)                   optimizer, lr schedule (collective); then
                                           .data_rank / .data_ranks: the slice of each
                                           global batch this rank reads
    .start_fresh()                         identical replicas when not resuming
    .describe(ds) -> str                   the set-up line
    .lr() -> float                         the current learning rate
    .start_epoch()                         before an epoch's steps (model.train(), ...)
    .train_step(x, y) -> (loss sum, correct)
                                           one step on this rank's slice of a global batch
    or .train_round(ds, rows)              instead of the two: a strategy that can stop
                                           only between epochs (ps modes); yields
                                           (loss sum, correct, samples) per step taken
    .end_epoch(run) -> dict                collective; extra fields of the epoch record
    .done() -> bool or None                optional: the run is over (None: after --epochs)
    .save_prefix                           the name of its save directories (checkpoint.py)
    .save(dirs) -> dict                    collective: writes its state into a fresh save
                                           directory through dirs (the run's SaveDirs);
                                           returns checkpoint.pt's entries naming it
    .restore(state, dirs)                  collective: the inverse, from checkpoint.load's state
    .finish() -> dict                      collective, after the last epoch; extra summary
                                           fields (optimizer, precision, skipped_steps, ...)
"""
import os
import socket
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import comm
from . import build, checkpoint, data
from .allreduce import AllReduce
from .config import recipe_lines, with_recipe
from .ddp_mode import DDP
from .errors import ConfigError
from .goodput import AutoBatch
from .precision import autocast
from .ps_mode import ParameterServer
from .report import Reporter, global_sums, params_digest
from .stop import StopRequest
from .zero import Zero, Zero3

STRATEGIES = {"allreduce": AllReduce, "ps-bsp": ParameterServer, "ps-asp": ParameterServer,
              "ps-ssp": ParameterServer, "zero": Zero, "zero3": Zero3,
              "ddp-gloo": DDP, "ddp-hpcdl": DDP}


def train(cfg):
    """Runs cfg on the ranks of this job (collective). Returns the summary dict
    (the same on every rank), or None when a signal stopped the run early or
    the checkpoint resumed holds a complete run (nothing is trained then)."""
    t_start = time.perf_counter()
    stop = StopRequest()  # before the slow setup: a signal during it is not lost

    # distributed state, in one block: the job's ranks and the strategy that
    # spreads the work over them (it picks the device, and threads, too)
    comm.init()
    cfg = with_recipe(cfg)  # a TrainConfig(recipe=...) made in Python
    cfg.check(comm.size())
    strategy = STRATEGIES[{0: cfg.mode, 3: "zero3"}.get(cfg.zero, "zero")](cfg)

    # data, model, optimizer: identical replicas on every rank
    torch.manual_seed(cfg.seed)
    ds, steps = load_data(cfg)
    model = build.build_model(cfg, ds).to(strategy.device)
    strategy.n_train = ds.n_train
    strategy.build(model, steps)
    run = Run(cfg, ds, model, strategy, checkpoint.SaveDirs(cfg, strategy.save_prefix))
    run.auto = AutoBatch(cfg, strategy, ds) if getattr(cfg, "auto_batch", False) else None
    resume_or_start(run)
    if run.global_step and finished(run):  # resumed from a complete run: say so, train nothing
        stop.restore()
        return None
    comm.print0("hpcdl train: " + strategy.describe(ds))
    if run.auto is not None:
        comm.print0("hpcdl train: " + run.auto.describe())
    for line in recipe_lines(cfg, build.peak_lr(cfg)):
        comm.print0("hpcdl train: " + line)

    # the loop
    reporter = Reporter(cfg, resumed=run.global_step > 0)
    rec = None
    try:
        while not finished(run):
            signum = train_epoch(run, reporter, stop)
            if signum:
                return stopped(run, signum)
            rec = end_epoch(run, reporter)
            if cfg.checkpoint_dir and (rec["epoch"] % cfg.checkpoint_every == 0
                                       or finished(run)):
                save_checkpoint(run)
        extra = strategy.finish()
    finally:
        reporter.close()
        stop.restore()
    summary = summarize(run, rec, time.perf_counter() - t_start, extra)
    reporter.finish(summary, model)
    return summary


# ---------------------------------------------------------------- the run record
@dataclass
class Run:
    """One training run's objects and where it stands."""
    cfg: object
    ds: object
    model: torch.nn.Module
    strategy: object            # how gradients meet and state is saved (see above)
    dirs: object                # checkpoint.SaveDirs: the strategy's save directories
    epoch: int = 1              # the epoch in progress (1-based)
    epoch_start: int = 0        # samples of it read before a batch change within it (auto)
    step_in_epoch: int = 0      # steps of it taken since epoch_start
    global_step: int = 0
    sums: dict = field(default_factory=lambda: zero_sums())  # this rank's, of the epoch
    train_time: float = 0.0     # seconds in completed epochs' training loops
    train_samples: int = 0
    eval_time: float = 0.0      # this rank's seconds in the epochs' evaluations
    save_time: float = 0.0      # this rank's seconds writing checkpoints, this process
    resumed_times: tuple = (0.0, 0.0)  # train_time, eval_time the checkpoint brought
    target: dict = None         # when --target-accuracy was first reached (see reach_target)
    auto: object = None         # --global-batch auto's goodput.AutoBatch, else None

    def step_done(self, s, loss_sum, correct, seen, reporter):
        """Step s of the epoch is taken: its summed loss and correct count over
        this rank's seen samples."""
        self.sums["loss"] += loss_sum
        self.sums["correct"] += correct
        self.sums["seen"] += seen
        self.step_in_epoch, self.global_step = s + 1, self.global_step + 1
        reporter.step(s, loss_sum / seen)


def finished(run):
    """Whether the run is over: --epochs epochs done, or where the strategy
    says (its optional done(): AdaScale ends when its progress reaches the base
    schedule's steps, allreduce.py), or --stop-at-target and the target is
    reached (the same on every rank: the accuracy is a global sum)."""
    if run.cfg.stop_at_target and run.target is not None:
        return True
    done = getattr(run.strategy, "done", lambda: None)()
    return run.epoch > run.cfg.epochs if done is None else done


def zero_sums():
    return dict(loss=0.0, correct=0.0, seen=0.0, time=0.0)


# ---------------------------------------------------------------- data and resume
def load_data(cfg):
    """(data source, steps per epoch); ConfigError if not one global batch fits."""
    ds = data.load(cfg.data, cfg.seed, cfg.test_fraction, workers=cfg.workers,
                   stage_to=cfg.stage_to)
    steps = data.steps_per_epoch(ds.n_train, cfg.global_batch)
    if steps < 1:  # under auto the batch is where auto starts: --base-batch (maybe a recipe's)
        flag = "--base-batch (where --global-batch auto starts)" if cfg.auto_batch \
            else "--global-batch"
        raise ConfigError("global batch %d is larger than the %d training samples; pick a "
                          "smaller %s" % (cfg.global_batch, ds.n_train, flag))
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


def resume_or_start(run):
    """Restores the checkpoint when resuming, else makes the replicas identical."""
    path = resume_path(run.cfg)
    if not path:
        run.strategy.start_fresh()
        return
    state = checkpoint.load(path, run.cfg, run.model)  # checked against this run
    if run.auto is not None:  # --global-batch auto continues at the checkpoint's batch
        run.auto.adopt(state)
    run.strategy.restore(state, run.dirs)
    if run.auto is not None:
        run.auto.load_state_dict(state)
    pos = state["position"]
    run.epoch, run.step_in_epoch, run.global_step = (
        pos["epoch"], pos["step_in_epoch"], pos["global_step"])
    run.epoch_start = pos.get("epoch_start", 0)  # absent before re-picks within an epoch
    run.sums = dict(state.get("sums", zero_sums()))
    run.train_time, run.train_samples = state["train_time"], state["train_samples"]
    run.eval_time = state.get("eval_time", 0.0)
    run.resumed_times = (run.train_time, run.eval_time)
    run.target = kept_target(state.get("target"), run.cfg.target_accuracy)
    if finished(run):
        comm.print0("hpcdl train: %s holds a complete run (%d steps, up to epoch %d of %d): "
                    "nothing left to train. To train anew, give another --checkpoint-dir or "
                    "leave out --resume" % (path, run.global_step, run.epoch - 1,
                                            run.cfg.epochs))
        return
    comm.print0("hpcdl train: resumed from %s at %s" % (path, position_text(run)))


def position_text(run):
    """'epoch E step S' for messages; after a batch change within the epoch
    (--global-batch auto) S counts from the change, and the text says so."""
    text = "epoch %d step %d" % (run.epoch, run.step_in_epoch)
    if run.epoch_start:
        text += " of batch %d (after the epoch's first %d samples at other batches)" % (
            run.cfg.global_batch, run.epoch_start)
    return text


# ---------------------------------------------------------------- checkpoints
def state_of(run):
    """Everything the next step depends on (see checkpoint.py): the run's
    position and sums, and the strategy's state."""
    return dict({
        "format": checkpoint.FORMAT,
        "meta": checkpoint.meta_of(run.cfg, run.model),
        "position": {"epoch": run.epoch, "step_in_epoch": run.step_in_epoch,
                     "global_step": run.global_step, "epoch_start": run.epoch_start},
        "sums": dict(run.sums), "train_time": run.train_time,
        "train_samples": run.train_samples, "eval_time": run.eval_time,
        "target": run.target,
        "goodput": run.auto.state_dict() if run.auto is not None else None,
    }, **run.strategy.save(run.dirs))


def save_checkpoint(run):
    """The strategy's save directory first, then checkpoint.pt naming it
    (the commit); then the save directories it no longer names go."""
    t0 = time.perf_counter()
    path = checkpoint.path_in(run.cfg.checkpoint_dir)
    checkpoint.save(path, state_of(run))
    run.dirs.written()
    run.save_time += time.perf_counter() - t0
    return path


def stopped(run, signum):
    """A signal asked every rank to stop: checkpoint and return None."""
    name = StopRequest.name(signum)
    if not run.cfg.checkpoint_dir:
        comm.print0("hpcdl train: stopped by %s at %s; no --checkpoint-dir, so nothing was "
                    "saved" % (name, position_text(run)))
        return None
    path = save_checkpoint(run)
    comm.print0("hpcdl train: stopped by %s at %s; checkpoint %s; rerun with --resume to "
                "continue" % (name, position_text(run), path))
    return None


# ---------------------------------------------------------------- one epoch
REPICKED = -1  # train_steps: --global-batch auto changed the batch within the epoch


def train_epoch(run, reporter, stop):
    """The rest of run.epoch's steps, by the strategy. Returns the signal
    number if the ranks agreed to stop before the epoch ended, else 0."""
    cfg, strategy = run.cfg, run.strategy
    t0 = time.perf_counter()
    try:
        while True:  # more than once when --global-batch auto re-picks within the epoch
            rows = data.epoch_shard(run.ds.n_train, cfg.global_batch, strategy.data_rank,
                                    strategy.data_ranks, cfg.seed, run.epoch, run.epoch_start)
            reporter.start_epoch(run.epoch, len(rows), run.step_in_epoch)
            if hasattr(strategy, "train_round"):
                return train_round(run, rows, reporter, stop)
            signum = train_steps(run, rows, reporter, stop)
            if signum != REPICKED:
                return signum
    finally:
        run.sums["time"] += time.perf_counter() - t0


def train_steps(run, rows, reporter, stop):
    """The rest of the epoch's steps, stopping before any of them when the
    ranks agree to, or mid-epoch when the run is over (AdaScale's progress).
    REPICKED when --global-batch auto changed the batch after a step: the
    rest of the epoch's samples are then cut at the new batch."""
    run.strategy.start_epoch()
    batches = run.ds.train_batches(rows[run.step_in_epoch:])
    t0, taken = time.perf_counter(), 0
    for s in range(run.step_in_epoch, len(rows)):
        if finished(run):
            break
        signum = stop.agreed()
        if signum:
            return signum
        x, y = next(batches)
        loss_sum, correct = run.strategy.train_step(x, y)
        run.step_done(s, loss_sum, correct, len(y), reporter)
        taken += 1
        if run.auto is not None and run.auto.due(s + 1, len(rows)) and repick(
                run, (time.perf_counter() - t0) / taken):
            batches.close()
            return REPICKED
    return 0


def repick(run, step_s):
    """--global-batch auto's choice within the epoch (collective the first
    time: the step-time model is measured from step_s, the mean step time so
    far); True when the batch changed."""
    old = run.cfg.global_batch
    if not run.auto.within_epoch(run.epoch, run.global_step, step_s):
        return False
    run.epoch_start += run.step_in_epoch * old
    run.step_in_epoch = 0
    return True


def train_round(run, rows, reporter, stop):
    """The epoch as one round (ps modes): stops only before it. A server
    takes no steps of its own but counts the round's as its workers do."""
    signum = stop.agreed()
    if signum:
        return signum
    first = run.global_step
    for s, (loss_sum, correct, seen) in enumerate(run.strategy.train_round(run.ds, rows)):
        run.step_done(s, loss_sum, correct, seen, reporter)
    run.step_in_epoch = len(rows)
    run.global_step = first + data.steps_per_epoch(run.ds.n_train, run.cfg.global_batch)
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
    extra = run.strategy.end_epoch(run)
    loss_sum, correct, seen, dt = global_sums(run.sums["loss"], run.sums["correct"],
                                              run.sums["seen"], run.sums["time"])
    dt /= comm.size()  # mean over ranks of the epoch's training time
    t0 = time.perf_counter()
    test_loss, test_acc = evaluate(run.model, run.ds, run.strategy.device, run.cfg.precision)
    run.eval_time += time.perf_counter() - t0
    rec = dict(epoch=run.epoch, step=run.global_step, loss=loss_sum / seen,
               accuracy=correct / seen, test_loss=test_loss, test_accuracy=test_acc,
               lr=run.strategy.lr(), samples_per_s=seen / dt, epoch_time_s=dt, **extra)
    if run.auto is not None:  # the next epoch's global batch, for goodput
        rec.update(run.auto.end_epoch(run.epoch, dt, seen))
    reporter.end_epoch(rec)
    run.train_time += dt
    run.train_samples += int(seen)
    reach_target(run, test_acc)
    run.epoch, run.step_in_epoch, run.epoch_start = run.epoch + 1, 0, 0
    run.sums = zero_sums()
    return rec


def reach_target(run, test_acc):
    """At the end of an epoch: the first time the test accuracy reaches
    --target-accuracy, keep the training time (mean over ranks, evaluations
    and checkpoints left out), this rank's evaluation time so far, the steps
    and the epochs. Test accuracy is measured once per epoch, so the epoch
    is the resolution."""
    target = run.cfg.target_accuracy
    if target is None or run.target is not None or test_acc < target:
        return
    run.target = dict(train_time=run.train_time, eval_time=run.eval_time,
                      steps=run.global_step, epochs=run.epoch, test_accuracy=test_acc)


def kept_target(saved, target):
    """The checkpoint's record of reaching the target (reach_target), kept
    on resume only if its accuracy reaches this run's --target-accuracy: a
    resume may give a higher one, which that epoch did not reach (kept, it
    would end a --stop-at-target run at once and report the lower hit). A
    lower target keeps it: the epochs before it, which the checkpoint does
    not hold, may have reached that one sooner."""
    if saved is not None and target is not None and saved["test_accuracy"] < target:
        return None
    return saved


def target_fields(run):
    """The summary's time-to-accuracy fields (collective: the evaluation time
    is averaged over ranks, so every rank's summary is the same). None where
    the target was not reached; {} without --target-accuracy."""
    target = run.cfg.target_accuracy
    if target is None:
        return {}
    reached = run.target
    eval_s, = global_sums(reached["eval_time"] if reached else 0.0)
    if reached is None:
        return dict(target_accuracy=target, time_to_target_s=None, eval_time_to_target_s=None,
                    steps_to_target=None, epochs_to_target=None)
    return dict(target_accuracy=target, time_to_target_s=reached["train_time"],
                eval_time_to_target_s=eval_s / comm.size(), steps_to_target=reached["steps"],
                epochs_to_target=reached["epochs"])


# ---------------------------------------------------------------- the summary
def wall_parts(run, wall):
    """Where this process's wall time went (collective: means over ranks):
    training loops, evaluations, checkpoint writes, and the rest (start-up:
    MPI, data, model, resume; the summary)."""
    train = run.train_time - run.resumed_times[0]
    evals, saves = global_sums(run.eval_time - run.resumed_times[1], run.save_time)
    evals, saves = evals / comm.size(), saves / comm.size()
    return dict(training=train, evaluation=evals, checkpoints=saves,
                start_up_and_other=max(wall - train - evals - saves, 0.0))


def summarize(run, rec, wall, extra):
    """The run's summary, the same on every rank; extra: the strategy's fields.
    b_simple: the last epoch's gradient noise scale (2+ ranks), else None."""
    hosts = comm.allgather_object(socket.gethostname())
    cfg = run.cfg
    return dict(
        test_accuracy=rec["test_accuracy"], test_loss=rec["test_loss"],
        samples_per_s=run.train_samples / run.train_time if run.train_time else 0.0,
        wall_s=wall, wall_parts_s=wall_parts(run, wall), b_simple=rec.get("b_simple"),
        ranks=comm.size(), nodes=len(set(hosts)),
        global_batch=cfg.global_batch, model=cfg.model, data=cfg.data, epochs=cfg.epochs,
        steps=run.global_step, mode=cfg.mode, params_sha256=params_digest(run.model),
        recipe=cfg.recipe, **target_fields(run), **extra)
