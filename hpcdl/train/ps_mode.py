"""ps_mode.py - the trainer's parameter-server strategy (`hpcdl train --mode
ps-bsp|ps-asp|ps-ssp`): gradients meet on hpcdl.ps's servers instead of in
an all-reduce.

Ranks 0..K-1 serve the parameters (K = --ps-ranks), the other W ranks are
workers. Worker w reads the slice of each global batch that an all-reduce job
of W ranks gives rank w (so ps-bsp follows synchronous SGD on the same global
batch), pushes its gradients with the current lr and pulls the parameters
back, waiting as the mode requires. An epoch is one round; after it every rank
gets the servers' model, so evaluation, reporting and checkpoints are the
shared loop's (trainer.py). Limits: SGD with momentum and weight decay in
fp32, no compression; signals and checkpoints take effect between epochs;
only ps-bsp resumes bit-exactly (asp and ssp depend on timing).

State saved: the servers' shards, momentum and counters (PSTrainer.state_dict,
gathered on every rank) and the lr schedule's position, as a one-file save
directory beside checkpoint.pt (train/checkpoint.py).
"""
import torch
import torch.nn.functional as F

from . import build
from .errors import ConfigError


class ParameterServer:
    """Gradients are pushed to the servers' shards; parameters pulled back."""

    save_prefix = "state"

    def __init__(self, cfg):
        self.cfg = cfg
        torch.set_num_threads(1)
        self.device = torch.device("cpu")
        self.ps = self.opt = self.sched = None

    # ------------------------------------------------------------ set-up
    def build(self, model, steps):
        """The PSTrainer (collective: rank 0's weights broadcast, a private
        communicator for the servers' messages) and the lr schedule."""
        from ..ps import PSConfigError, PSTrainer  # on use: loads MPI
        cfg = self.cfg
        self.model = model
        try:
            self.ps = PSTrainer.create(model, mode=cfg.mode[3:], staleness=cfg.staleness
                                       if cfg.mode == "ps-ssp" else None,
                                       ps_ranks=cfg.ps_ranks, momentum=cfg.momentum,
                                       weight_decay=cfg.weight_decay)
        except PSConfigError as e:
            raise ConfigError(str(e))
        # which slice of each global batch this rank reads: worker w reads an
        # all-reduce job's rank w (servers read none; rank 0's rows for the count)
        self.data_rank, self.data_ranks = self.ps.worker_rank or 0, self.ps.num_workers
        # the lr schedule runs on every rank (servers step it too, so rank 0's
        # checkpoint holds the workers' position); workers send its lr with each push
        self.opt = torch.optim.SGD(model.parameters(), lr=build.peak_lr(cfg))
        self.sched = build.build_schedule(cfg, self.opt, steps)
        self.opt.step()  # no gradients, so a no-op; torch then does not warn that the
        #                  schedule steps before the optimizer (this one only holds the lr)

    def start_fresh(self):
        pass  # PSTrainer.create broadcast rank 0's weights already

    def describe(self, ds):
        cfg, ps = self.cfg, self.ps
        return ("%s on %s, %s with %d server(s) and %d worker(s), global batch %d (%d per "
                "worker), lr %g, seed %d" % (cfg.model, cfg.data, cfg.mode, ps.num_servers,
                                             ps.num_workers, cfg.global_batch,
                                             cfg.global_batch // ps.num_workers,
                                             build.peak_lr(cfg), cfg.seed))

    def lr(self):
        return self.opt.param_groups[0]["lr"]

    # ------------------------------------------------------------ training
    def train_round(self, ds, rows):
        """One epoch as one round of the servers (the ranks may stop only
        before it): yields (summed loss, correct, samples) per step a worker
        takes; a server serves the round and yields nothing."""
        ps = self.ps
        if ps.is_server:
            ps.serve()
            for _ in rows:
                self.sched.step()
        else:
            self.model.train()
            for x, y in ds.train_batches(rows):
                def closure():
                    logits = self.model(x)
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    return loss.item() * len(y), (logits.argmax(1) == y).sum().item()
                lsum, c = ps.step(closure, lr=self.lr())
                self.sched.step()
                yield lsum, c, len(y)
            ps.end_round()
        ps.sync_model()

    def end_epoch(self, run):
        return {}  # sync_model gave every rank the servers' model and worker 0's buffers

    def finish(self):
        """Collective, after the last epoch: the summary's extra fields; frees
        the servers' communicator."""
        stats = self.ps.gather_stats()
        self.ps.close()
        cfg = self.cfg
        return dict(optimizer="sgd", precision="fp32", ps_ranks=cfg.ps_ranks,
                    staleness=cfg.staleness,
                    max_staleness=max((s.get("max_staleness", 0) for s in stats), default=0),
                    skipped_steps=0)

    # ------------------------------------------------------------ checkpoints
    def save(self, dirs):
        """Collective: written by dirs as a one-file save directory beside
        checkpoint.pt, which names it (checkpoint.py)."""
        return dirs.save_state({"ps": self.ps.state_dict(),
                                "scheduler": self.sched.state_dict()})

    def restore(self, state, dirs):
        self.ps.load_state_dict(state["ps"])
        self.sched.load_state_dict(state["scheduler"])
