"""zero.py - the trainer's ZeRO strategy (`hpcdl train --zero 1|2`): the
all-reduce strategy with DistributedOptimizer(zero_stage=1|2), so each rank
keeps the optimizer state (and at stage 2 the averaged gradients) of only its
1/N of every fusion bucket; the updated parameters are all-gathered after
each step, so every rank still holds the whole model for forward and backward.

Everything else is allreduce.py's: the data slices, the fp16 loss scale (its
overflow check reads this rank's gradient shard, agreed by every rank), the
checkpoint. The optimizer's state_dict() is consolidated (collective), so a
checkpoint holds the unsharded optimizer: it resumes under any --zero stage
and any rank count, and a run resumed on the same ranks ends with exactly the
parameters of one that never stopped.
"""
from .. import comm
from .allreduce import AllReduce


class Zero(AllReduce):
    """AllReduce with a sharded optimizer (cfg.zero is 1 or 2)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.zero_stage = cfg.zero

    def describe(self, ds):
        return "%s, ZeRO stage %d" % (super().describe(ds), self.zero_stage)

    def state_bytes(self):
        """Optimizer-state bytes this rank holds (its shard)."""
        return self.opt._zero.state_bytes()

    def finish(self):
        """The summary's fields, plus the stage and the largest per-rank state."""
        extra = super().finish()
        every = comm.allgather_object(self.state_bytes())
        return dict(extra, zero_stage=self.zero_stage, optimizer_state_bytes=max(every))
