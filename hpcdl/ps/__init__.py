"""hpcdl.ps - parameter-server training over MPI point-to-point: BSP, ASP and
SSP with a staleness bound. The design, the messages and the limits are in
docs/ps.md.

Ranks 0..K-1 (K = ps_ranks) are servers: each holds a contiguous shard of the
flat float32 parameter vector, its momentum, and applies SGD (momentum, weight
decay) to it. The other W = N - K ranks are workers: each computes gradients
on its own batches, pushes them to every server and pulls the parameters back.

    mode   a pull for a worker's step c is answered when        staleness s
    bsp    every worker has pushed step c - 1 (then one SGD step on their mean)
    ssp    the slowest worker has pushed at least c - s steps   s >= 0 (0 = bsp)
    asp    at once; every push is applied when it arrives

    ps = PSTrainer.create(model, mode="ssp", staleness=2, ps_ranks=1, momentum=0.9,
                          weight_decay=0.0, record=False)   # collective; every rank
    for epoch in range(1, epochs + 1):
        if ps.is_server:
            ps.serve()                     # until every worker ends the round
        else:
            rows = data.epoch_shard(n, G, ps.worker_rank, ps.num_workers, seed, epoch)
            for idx in rows:
                ps.step(lambda: loss_fn(model(x[idx]), y[idx]).backward(), lr=lr_now)
            ps.end_round()
        ps.sync_model()                    # collective: every rank holds the servers' model
        ...evaluate, report, checkpoint as usual (collectives over all ranks)...
    ps.close()

- Worker w reads the slice an all-reduce job of W ranks gives rank w, so BSP
  follows synchronous all-reduce SGD on the same global batch G (a multiple of W).
- lr travels with every push: each worker passes its own schedule's value;
  BSP requires the workers of a step to agree.
- ps.stats() / ps.gather_stats(): per-worker clock, wait time, staleness
  (clock - min_clock at each pull, its max and mean), per-server pushes and
  held-back pulls; with record=True servers also log every push and answer
  (clock.replay() checks a run against its bound).
- ps.state_dict() / ps.load_state_dict(state) between rounds: parameters,
  momentum, counters. A BSP run resumed from it matches an uninterrupted one
  exactly; ASP and SSP runs depend on timing and never repeat exactly.
- Bad settings (unknown mode, staleness < 0, ps_ranks < 1 or >= N) raise
  PSConfigError on every rank before any message is sent; check(size, mode,
  staleness, ps_ranks) does the same without MPI, for a CLI.
"""
from .config import MODES, OPTIMIZERS, PSConfigError, check, check_optimizer, num_workers

__all__ = ["MODES", "OPTIMIZERS", "PSConfigError", "PSTrainer", "check", "check_optimizer",
           "num_workers"]


def __getattr__(name):
    # PSTrainer loads torch and MPI: only when asked for, so a CLI can check
    # settings through hpcdl.ps without loading them
    if name == "PSTrainer":
        from .api import PSTrainer  # on use: loads MPI and numpy and torch and tqdm
        return PSTrainer
    raise AttributeError("module 'hpcdl.ps' has no attribute %r" % name)
