"""optimizer.py - ZeroOptimizer: ZeRO stages 1 and 2 on the same Reducer as
DistributedOptimizer, as PyTorch keeps ZeroRedundancyOptimizer apart from DDP.
hvd.DistributedOptimizer(opt, zero_stage=1|2) returns one.

    stage 1   the Reducer all-reduces each bucket as at stage 0; each rank
              steps its 1/N of every bucket (sharding.py) and the parameters
              are all-gathered.
    stage 2   the Reducer's comm hook is a reduce-scatter (ReduceScatterHook):
              bucket buffers live from a step's first gradient until their
              reduce-scatter is done, at most REDUCE_IN_FLIGHT in flight.

state_dict() is collective (call it on every rank) and returns the unsharded
optimizer's dict; clip_grad_norm_() clips across shards. docs/zero.md.
"""
import torch

from ..optimizer import DataParallelOptimizer
from .layout import REDUCE_IN_FLIGHT
from .norms import clip_pieces_
from .sharding import ReduceScatterHook, Sharding


class ZeroOptimizer(DataParallelOptimizer):
    """A DataParallelOptimizer whose optimizer state (stage 1) and gradients
    (stage 2) are sharded over the ranks. On a rank outside process_set it
    is a plain optimizer (self.sharding is None)."""

    def __init__(self, optimizer, named_parameters=None, stage=1, process_set=None, **options):
        if stage not in (1, 2):
            raise ValueError("ZeroOptimizer shards at stage 1 or 2, got %r" % (stage,))
        self.zero_stage = stage
        super().__init__(optimizer, named_parameters, process_set, **options)
        self.reducer.sparse_error = ("zero_stage=%d does not support sparse gradients (%%s); "
                                     "use zero_stage=0" % stage)
        self.sharding = None
        if self.reducer.comm is not None:
            self.sharding = Sharding(self.reducer, self._opt, stage)
            if stage == 2:
                d = self.reducer.comm_hook
                self.reducer.set_comm_hook(ReduceScatterHook(self.sharding, d.op,
                                                             d.compression, d.predivide))

    def _layout(self, world):
        # stage 2's buffers are freed each step: not in node-shared memory (never
        # freed); hvd.join() cannot answer the all-gather after the step
        two = self.zero_stage == 2
        return dict(shared=world and not two, join=False, lazy=two,
                    keep_in_flight=REDUCE_IN_FLIGHT if two else None)

    def _reduced(self):
        if self.sharding is not None:
            self.sharding.attach_grads()

    def _step(self, closure):
        if self.sharding is None:
            return super()._step(closure)
        return self.sharding.step(closure)

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """At stage 2 the norm is summed over every rank's gradient shard
        (collective); otherwise as DistributedOptimizer's."""
        if self.zero_stage == 2 and self.sharding is not None:
            grads = [t.grad for t in self.sharding.pieces() if t.grad is not None]
            return clip_pieces_(grads, max_norm, norm_type, self.reducer.comm)
        return torch.nn.utils.clip_grad_norm_(self.local_parameters(), max_norm, norm_type)

    def local_parameters(self):
        """The parameters (stage 1) or this rank's pieces of them (stage 2)."""
        if self.sharding is None:
            return super().local_parameters()
        return self.sharding.pieces() if self.zero_stage == 2 else self.reducer.params

    def state_dict(self):
        if self.sharding is None:
            return super().state_dict()
        return self.sharding.state_dict()  # collective: every rank's pieces, joined

    def load_state_dict(self, state_dict):
        if self.sharding is None:
            return super().load_state_dict(state_dict)
        self.sharding.load_state_dict(state_dict)  # an unsharded dict; this rank keeps its part
        self.param_groups, self.state = self._opt.param_groups, self._opt.state

    # ------------------------------------------------------------ measures
    def state_bytes(self):
        """Bytes of optimizer-state tensors this rank holds (its shard)."""
        if self.sharding is None:
            return sum(v.numel() * v.element_size() for st in self._opt.state.values()
                       for v in st.values() if torch.is_tensor(v))
        return self.sharding.state_bytes()

    def grad_shards(self):
        """Stage 2: this rank's gradient blocks, one per bucket ([] otherwise)."""
        if self.sharding is None or self.zero_stage != 2:
            return []
        return [s.grad for s in self.sharding.shards]

    def grad_bytes(self):
        """Stage 2's gradient bytes on this rank: {"shard", "peak"} (sharding.py)."""
        return self.sharding.grad_bytes()
