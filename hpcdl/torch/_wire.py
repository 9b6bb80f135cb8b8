"""_wire.py - the dtypes tensors travel in. hpcdl's core moves float32/64,
float16, bfloat16, int32 and int64; other torch dtypes are widened for the
trip (bool, uint8, int8, int16 -> int32; uint16, uint32 -> int64) or, for
complex, sent as their (real, imag) float pairs, and turned back after.
Also: scaling that respects integer dtypes, and element counts per row."""
import math

import torch

CORE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
               torch.int32, torch.int64)
_WIDEN = {torch.bool: torch.int32, torch.uint8: torch.int32, torch.int8: torch.int32,
          torch.int16: torch.int32}
for _name, _to in (("uint16", torch.int64), ("uint32", torch.int64)):
    if hasattr(torch, _name):  # torch >= 2.3
        _WIDEN[getattr(torch, _name)] = _to


def is_direct(t):
    """True when the core can use t's memory as it is."""
    return t.dtype in CORE_DTYPES and t.is_contiguous()


def to_wire(t):
    """t in a dtype the core moves (t itself when it already is one)."""
    if t.dtype in CORE_DTYPES:
        return t
    if t.is_complex():
        return torch.view_as_real(t.contiguous())
    if t.dtype not in _WIDEN:
        raise TypeError("hpcdl cannot send %s tensors; cast to one of %s"
                        % (t.dtype, ", ".join(str(d) for d in CORE_DTYPES)))
    return t.to(_WIDEN[t.dtype])


def owned_wire(t):
    """A contiguous wire-dtype copy of t that never shares t's memory."""
    t = t.detach()
    w = to_wire(t)
    if w.data_ptr() == t.data_ptr() or not w.is_contiguous():
        w = w.clone(memory_format=torch.contiguous_format)
    return w


def owned_host_wire(t):
    """owned_wire(t) in host memory. hpcdl's core moves device memory for
    all-reduce only (docs/cuda.md); all-gather, broadcast and reduce-scatter of
    CUDA tensors go through a host copy, as Horovod's do over an MPI that is
    not CUDA-aware. .cpu() waits for torch's current stream, so the copy holds
    what the producer wrote."""
    if t.device.type == "cpu":
        return owned_wire(t)
    return to_wire(t.detach().cpu()).contiguous()  # .cpu() made new memory: ours


def on_host(t):
    """True when the core can use t's memory for a non-all-reduce collective."""
    return t.device.type == "cpu" and is_direct(t)


def from_wire(w, dtype):
    """Inverse of to_wire: w (a wire tensor) back in dtype, shape included."""
    if w.dtype == dtype:
        return w
    if dtype.is_complex:
        return torch.view_as_complex(w.contiguous())
    return w.to(dtype)


def deliver(tensor, t, wire, inplace):
    """The result of an op that ran on `wire` for the caller's `tensor` (t is
    its detached view): the tensor itself when the op ran on it directly,
    else the wire copied back into it (inplace) or returned as a new tensor."""
    if wire is t:
        return tensor
    out = from_wire(wire, t.dtype).view(t.shape)
    if out.device != t.device:  # staged through the host (owned_host_wire)
        out = out.to(t.device)
    if inplace:
        t.copy_(out)
        return tensor
    return out


def wire_dtype(dtype):
    if dtype in CORE_DTYPES:
        return dtype
    if dtype.is_complex:
        return torch.float32 if dtype == torch.complex64 else torch.float64
    return _WIDEN.get(dtype, dtype)


_HALF = (torch.float16, torch.bfloat16)


def scale_(t, factor, gpu=None):
    """t *= factor in place; integer tensors are truncated back to their dtype.
    16-bit floats of a GPU tensor (gpu: whether the caller's tensor is on one,
    default t's own device) are scaled by the factor rounded to their dtype,
    as Horovod's GPU kernels do; on the CPU the factor stays a float32."""
    if factor == 1.0:
        return t
    if t.dtype in _HALF and (t.is_cuda if gpu is None else gpu):
        factor = torch.tensor(factor, dtype=t.dtype).item()
    if t.dtype.is_floating_point or t.is_complex():
        return t.mul_(factor)
    return t.copy_(t.to(torch.float64) * factor)


def row_elems(shape):
    """Elements in one row (everything past the first dimension)."""
    return math.prod(shape[1:])


def wire_shape(t):
    """The shape t has on the wire (complex: a trailing (real, imag) pair)."""
    return tuple(t.shape) + ((2,) if t.is_complex() else ())
