"""compression.py - what a tensor looks like on the wire during all-reduce.

Horovod's interface: compress(tensor) -> (tensor_to_send, ctx) and
decompress(reduced, ctx) -> tensor. Compression.none and .fp16 are Horovod's;
hpcdl adds .bf16 and .topk(ratio):

    hvd.allreduce(g, compression=hvd.Compression.fp16)
    topk = hvd.Compression.topk(0.01)            # one instance per model
    hvd.allreduce(g, name="fc.weight", compression=topk)

Top-k keeps error feedback (Stich et al. 2018; Lin et al. 2018, "Deep
Gradient Compression"): per tensor name it holds the residual, the part of
past gradients not yet sent. Each step it adds the residual to the new
gradient, sends the k entries largest in magnitude as a dense tensor whose
other entries are zero, and keeps the rest as the new residual, so that
    sum of sent tensors + residual == sum of inputs      (exactly).
Sending it dense keeps the all-reduce an all-reduce (ranks may pick
different entries); it shows the algorithm's effect on training, not a
saving in bytes. Its state_dict() / load_state_dict() carry the residuals
through a checkpoint (the stateless compressors have none).
"""
import math

import torch


class NoneCompressor:
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor, name=None):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor:
    """Floating tensors travel as `wire` (fp16 / bf16) and come back in their dtype."""
    wire = None

    @classmethod
    def compress(cls, tensor, name=None):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 keeps float32's range (no overflow of large gradients), 8-bit mantissa."""
    wire = torch.bfloat16


class TopKCompressor:
    """Sends the ratio * numel largest-magnitude entries, keeps the rest as residual.
    Stateful: use one instance per model and pass name= to every call."""
    needs_name = True  # callers pass name= so the residual follows the tensor

    def __init__(self, ratio):
        if not 0.0 < float(ratio) <= 1.0:
            raise ValueError("topk ratio must be in (0, 1], got %r" % (ratio,))
        self.ratio = float(ratio)
        self._residuals = {}   # name -> tensor not yet sent

    def compress(self, tensor, name=None):
        if not tensor.dtype.is_floating_point or tensor.numel() == 0:
            return tensor, None
        if name is None:
            raise ValueError("Compression.topk keeps a residual per tensor: pass name= "
                             "(the same name for the same tensor every step)")
        acc = tensor.detach().clone()
        residual = self._residuals.get(name)
        if residual is not None:
            if residual.shape != acc.shape:
                raise ValueError("topk: tensor %r changed shape from %s to %s"
                                 % (name, tuple(residual.shape), tuple(acc.shape)))
            acc += residual
        k = max(1, math.ceil(self.ratio * acc.numel()))
        flat = acc.view(-1)
        keep = flat.abs().topk(k, sorted=False).indices
        sent = torch.zeros_like(flat)
        sent[keep] = flat[keep]
        flat[keep] = 0           # acc is now the residual
        self._residuals[name] = acc
        return sent.view(tensor.shape), None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

    def state_dict(self):
        """This rank's residuals, name -> tensor (they differ per rank: a
        checkpoint keeps every rank's). Only stateful compressors have it."""
        return dict(self._residuals)

    def load_state_dict(self, state):
        """Continues from state_dict()'s result (of the same rank)."""
        self._residuals.update(state)

    def residual(self, name):
        """What has not been sent yet for name (None before its first step)."""
        return self._residuals.get(name)

    def reset(self):
        self._residuals.clear()


class Compression:
    """Horovod's namespace of compressors, plus hpcdl's bf16 and topk."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def topk(ratio):
        return TopKCompressor(ratio)


def compress(compression, tensor, name):
    """compression.compress(tensor), with name= for compressors that keep state."""
    if getattr(compression, "needs_name", False):
        return compression.compress(tensor, name=name)
    return compression.compress(tensor)
