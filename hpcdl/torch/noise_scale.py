"""noise_scale.py - the gradient noise scale measured during data-parallel
training, for the price of one 16-byte all-reduce per step that nothing waits
for (DistributedOptimizer(..., noise_scale=True); the estimator and its
smoothing are hpcdl/optim/noise_scale.py's).

A Meter sits on the Reducer's statistics seam (reducer.add_stats_hook), the
only place that sees both a rank's own gradient and the averaged one:

    before(grad)     as each bucket is submitted: this rank's gradient, the
                     small batch (B_small = b samples x backward passes)
    after(reduced)   once it is reduced: this rank's block of the averaged
                     gradient (the blocks of all ranks partition it, as
                     ZeRO's do; at stage 2 the reduce-scatter's block is
                     what the rank keeps), the big batch of N B_small samples
    end()            after the last bucket

and at the end of synchronize() one asynchronous all-reduce sums the pair
[sum |G_small|^2, sum of block |G_big|^2] over the ranks: the mean of the
ranks' |G_small|^2 and the whole |G_big|^2, the same numbers on every rank.
The round rides the engine's queue behind the buckets and is waited for only
when the step is settled: at the next synchronize() or when asked
(noise_scale()). Each rank squares its own gradient once and 1/N of the
averaged one.

A step counts once step() is called for it (commit()): a step the fp16 loss
scaler skipped never calls step(), and is dropped. With loss scaling the
squared norms are divided by the scale squared (set_loss_scale()); a step
whose norms overflowed does not count either.
"""
import math
import time

import torch

from ..optim.noise_scale import DEFAULT_BETA, Smoothed, squared_norm
from .zero.layout import block_counts
from .compression import TopKCompressor


def check_option(noise_scale):
    """DistributedOptimizer's noise_scale argument -> the EMA decay beta, or
    None when off. True means the default beta; a float in (0, 1) is beta."""
    if noise_scale is None or noise_scale is False:
        return None
    if noise_scale is True:
        return DEFAULT_BETA
    if isinstance(noise_scale, (int, float)) and 0.0 < float(noise_scale) < 1.0:
        return float(noise_scale)
    raise ValueError("noise_scale must be True, False or the smoothing factor beta in "
                     "(0, 1) (e.g. 0.99: a memory of ~100 steps), got %r" % (noise_scale,))


def check_compatible(op, compression):
    """ValueError unless the reduced gradient is the exact average of the ranks'."""
    if op != "average":
        raise ValueError("noise_scale needs op=Average (got %s): the estimate compares each "
                         "rank's gradient with their average" % op)
    if isinstance(compression, TopKCompressor):
        raise ValueError("noise_scale needs the whole averaged gradient; top-k compression "
                         "sends a part of it: use compression none, fp16 or bf16")


def check_batch(batch_size):
    """batch_size as an int >= 1, or a one-line ValueError."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("noise_scale(batch_size=...) takes the samples per rank per "
                         "backward pass, an int >= 1; got %r" % (batch_size,))
    return batch_size


def check_loss_scale(scale):
    """scale as a finite float > 0, or a one-line ValueError."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) \
            and math.isfinite(scale) and scale > 0:
        return float(scale)
    raise ValueError("set_loss_scale() takes the loss scale the loss was multiplied by, a "
                     "finite number > 0; got %r" % (scale,))


def attach(reducer, beta, blocks):
    """A Meter on reducer's statistics seam. blocks: the comm hook leaves each
    rank only its block of the average (ZeRO 2's reduce-scatter)."""
    meter = Meter(reducer.comm, beta, blocks)
    meter.registration = reducer.add_stats_hook(before=meter.before, after=meter.after,
                                                end=meter.end_of_sync)
    return meter


class Meter:
    """One optimizer's per-step squared norms and their smoothing."""

    def __init__(self, comm, beta, blocks=False):
        self.comm = comm                 # the optimizer's Communicator (its process set)
        self.ranks = comm.size
        self.blocks = blocks             # after() sees this rank's block, not the bucket
        self.smoothed = Smoothed(beta)
        self.loss_scale = 1.0            # the factor this step's loss was multiplied by
        self._local = self._block = 0.0  # this step's sums so far (0-d tensors on a GPU)
        self._pending = None             # [handle, pair, loss scale or None]: the last
                                         # synchronize()'s round; the scale once committed
        self.seconds = 0.0               # time spent in the callbacks (bench train)

    # ------------------------------------------------------------ during a step
    def before(self, grad, bucket, tail=None):
        """grad: this rank's own flat gradient of bucket, before it is reduced."""
        t0 = time.perf_counter()
        self._local = self._local + squared_norm(grad)
        self.seconds += time.perf_counter() - t0

    def after(self, reduced, bucket, tail=None):
        """reduced: the averaged bucket, or (blocks) this rank's block of it;
        only this rank's block is squared."""
        t0 = time.perf_counter()
        if not self.blocks:
            counts = block_counts(bucket.numel, self.ranks)
            lo = sum(counts[:self.comm.rank])
            reduced = reduced[lo:lo + counts[self.comm.rank]]
        self._block = self._block + squared_norm(reduced)
        self.seconds += time.perf_counter() - t0

    def end_of_sync(self):
        """After every bucket is reduced: queues the step's round; the
        previous step's, if any, is settled first (dropped if not committed)."""
        t0 = time.perf_counter()
        self.settle()
        pair = torch.tensor([float(self._local), float(self._block)], dtype=torch.float64)
        self._local = self._block = 0.0
        if self.ranks < 2:  # one batch size only: nothing to estimate
            return
        handle = self.comm.allreduce_async(pair, op="sum", name="noise_scale")
        self._pending = [handle, pair, None]
        self.seconds += time.perf_counter() - t0

    def commit(self):
        """step() was called: the synchronized step counts."""
        if self._pending is not None and self._pending[2] is None:
            self._pending[2] = float(self.loss_scale)

    def settle(self):
        """Waits for the last round and adds its step if it was committed
        (else drops it: a new step has begun, so it was skipped)."""
        if self._pending is None:
            return
        handle, pair, scale = self._pending
        self._pending = None
        handle.wait()
        if scale is None:  # synchronized but never stepped: a skipped step
            return
        small, big = pair.tolist()
        inv = 1.0 / (scale * scale)
        self.smoothed.add(small / self.ranks * inv, big * inv, self.ranks)

    def result(self, b_small):
        """NoiseScale for small batches of b_small samples, or None (no step
        yet, or one rank: no second batch size)."""
        if self._pending is not None and self._pending[2] is not None:
            self.settle()  # committed: add it now (an uncommitted one may still be)
        if self.ranks < 2:
            return None
        return self.smoothed.result(b_small)
