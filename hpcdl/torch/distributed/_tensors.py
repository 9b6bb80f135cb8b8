"""_tensors.py - torch tensors as hpcdl's core takes them, and torch's ReduceOp
as hpcdl's op names.

The core moves and reduces contiguous host buffers of float32, float64,
float16, bfloat16, int32 and int64 (all-reduce also device buffers, in a core
built with nvcc). core_view(t) returns a tensor the core can take for t plus
a finish step that copies the result back, or None when the view shares t's
memory (the common case: no copy at all):

- data movement (broadcast, all-gather): any dtype, by reinterpreting its
  bytes as an integer/half type of the same element size; 1-byte dtypes
  (bool, uint8, int8, float8) are widened to int32 and narrowed back.
- reduction: the six dtypes as they are; complex as its real pairs (sum and
  average); bool, uint8, int8, int16 widened to int64 (sums wrap as in torch).
- non-contiguous tensors, and device tensors for the calls the core has no
  device path for, are staged through a contiguous host copy.
"""
import torch
from torch.distributed import ReduceOp

from ...comm._types import DTYPES

CORE_DTYPES = {getattr(torch, name) for name in DTYPES}
_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.float16}
_WIDEN_FOR_REDUCE = {torch.bool, torch.uint8, torch.int8, torch.int16}

# torch's ReduceOp -> hpcdl's op name; the rest cannot be honoured
_OPS = ((ReduceOp.SUM, "sum"), (ReduceOp.AVG, "average"), (ReduceOp.MIN, "min"),
        (ReduceOp.MAX, "max"), (ReduceOp.PRODUCT, "prod"))


# bitwise ops: not in the core; all_reduce and reduce all-gather the tensors
# and fold them here (integer and bool tensors; gloo offers them too)
_BITWISE = ((ReduceOp.BAND, torch.bitwise_and), (ReduceOp.BOR, torch.bitwise_or),
            (ReduceOp.BXOR, torch.bitwise_xor))


def reduce_op(op):
    """hpcdl's name for a torch ReduceOp; ValueError for BAND/BOR/BXOR (see
    bitwise_fold) and PREMUL_SUM."""
    for torch_op, name in _OPS:
        if op == torch_op:
            return name
    raise ValueError("the hpcdl backend cannot reduce with %s here: it supports SUM, AVG, MIN, "
                     "MAX and PRODUCT, and BAND/BOR/BXOR in all_reduce and reduce only "
                     "(PREMUL_SUM is not in hpcdl's core)" % _op_name(op))


def bitwise_fold(op):
    """torch's elementwise function for a bitwise ReduceOp, else None."""
    for torch_op, fold in _BITWISE:
        if op == torch_op:
            return fold
    return None


def _op_name(op):
    for name in ("BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"):
        if hasattr(ReduceOp, name) and op == getattr(ReduceOp, name):
            return "ReduceOp." + name
    return repr(op)


def core_view(t, op=None, device_ok=False):
    """(tensor for the core, finish or None). op: hpcdl op name for a reduction,
    None for data movement. device_ok: the core takes this call's device buffers."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("the hpcdl backend takes torch tensors, not %s" % type(t).__name__)
    staged, copy_back = t, None
    if (t.device.type != "cpu" and not device_ok) or not t.is_contiguous():
        staged = t.detach().to("cpu" if not device_ok else t.device).contiguous()
        copy_back = lambda: t.copy_(staged)  # noqa: E731
    work, widened_back = _dtype_view(staged, op)
    return work, chain(widened_back, copy_back)


def _dtype_view(t, op):
    if t.dtype in CORE_DTYPES:
        return t, None
    if op is None:  # movement: any dtype, by its bytes
        word = _WORDS.get(t.element_size())
        if word is not None:
            return t.view(word), None
        wide = t.view(torch.uint8).to(torch.int32)
        return wide, lambda: t.copy_(wide.to(torch.uint8).view(t.dtype))
    if t.is_complex() and op in ("sum", "average"):
        return torch.view_as_real(t), None
    if t.dtype in _WIDEN_FOR_REDUCE:
        wide = t.to(torch.int64)
        return wide, lambda: t.copy_(wide)
    raise TypeError("the hpcdl backend cannot reduce %s tensors with %s; it reduces %s%s"
                    % (t.dtype, op, ", ".join(sorted(DTYPES)),
                       " (complex: sum and average only)" if t.is_complex() else ""))


def chain(*steps):
    """One finish step running the given ones (None skipped) in order, or None."""
    steps = [s for s in steps if s is not None]
    if not steps:
        return None
    return lambda: [s() for s in steps]


def word_dtype(t):
    """The dtype the core moves t's elements as (see _dtype_view)."""
    if t.dtype in CORE_DTYPES:
        return t.dtype
    return _WORDS.get(t.element_size(), torch.int32)


def unword(chunk, like):
    """A chunk moved as word_dtype(like), back as like's dtype and shape."""
    if chunk.dtype != like.dtype:
        if chunk.element_size() == like.element_size():
            chunk = chunk.view(like.dtype)
        else:
            chunk = chunk.to(torch.uint8).view(like.dtype)
    return chunk.reshape(like.shape)


def host_flat(t):
    """t as a contiguous 1-D host tensor (a view when it already is one)."""
    return t.detach().reshape(-1).contiguous().cpu()
