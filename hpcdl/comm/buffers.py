"""buffers.py - turns numpy arrays and torch tensors into what the C core
takes (address, element count, dtype code), zero-copy, after checking dtype,
contiguity and device, and says where an all-reduce's buffers live (Where),
so that the core never has to guess. Nothing here touches MPI."""
import contextlib
from dataclasses import dataclass

import numpy as np

from ._types import DTYPES


@dataclass
class BufferInfo:
    ptr: int           # address of the first element
    count: int         # number of elements
    dtype: str         # one of _types.DTYPES
    device: str        # "cpu" or "cuda:N"
    obj: object        # the array or tensor (kept alive by whoever holds this)


_TORCH_DTYPES = None


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch  # on use: loads torch
        _TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64",
                         torch.float16: "float16", torch.bfloat16: "bfloat16",
                         torch.int32: "int32", torch.int64: "int64"}
    return _TORCH_DTYPES


def _is_torch(obj):
    mod = type(obj).__module__
    return mod.startswith("torch") and hasattr(obj, "data_ptr")


def describe(buf, what="buffer", cuda_ok=False):
    """BufferInfo for a numpy array or torch tensor, or TypeError / ValueError."""
    if isinstance(buf, np.ndarray):
        name = buf.dtype.name
        if name not in DTYPES:
            raise TypeError("%s has dtype %s; hpcdl supports %s"
                            % (what, name, ", ".join(DTYPES)))
        if not buf.flags.c_contiguous:
            raise TypeError("%s is not C-contiguous; pass np.ascontiguousarray(x) "
                            "(hpcdl never copies behind your back)" % what)
        if not buf.flags.writeable:
            raise ValueError("%s is read-only; collectives write into their buffers" % what)
        return BufferInfo(buf.__array_interface__["data"][0], buf.size, name, "cpu", buf)
    if _is_torch(buf):
        name = _torch_dtypes().get(buf.dtype)
        if name is None:
            raise TypeError("%s has dtype %s; hpcdl supports %s"
                            % (what, buf.dtype, ", ".join(DTYPES)))
        if not buf.is_contiguous():
            raise TypeError("%s is not contiguous; pass t.contiguous()" % what)
        device = str(buf.device)
        if buf.device.type == "cuda" and not cuda_ok:
            raise ValueError("%s is on %s, but this call takes CPU tensors only (hpcdl's "
                             "device path covers all-reduce, and only in a core built with "
                             "nvcc); move it to the CPU" % (what, device))
        if buf.device.type not in ("cpu", "cuda"):
            raise ValueError("%s is on %s; hpcdl handles cpu and cuda tensors" % (what, device))
        return BufferInfo(buf.data_ptr(), buf.numel(), name, device, buf)
    raise TypeError("%s must be a numpy array or a torch tensor, not %s"
                    % (what, type(buf).__name__))


@dataclass(frozen=True)
class Where:
    """Where an all-reduce's buffers live, told to the core (its hpcdl_mem):
    device -1 for host memory (the core then makes no CUDA call at all), else
    the GPU's index and the address of the cudaStream_t producing the data,
    torch's current stream at the call: the core waits for the work queued on
    it so far, not for the legacy default stream."""
    device: int
    stream: int


def where(send, recv):
    """Where for two BufferInfo; ValueError when they are on different devices."""
    if send.device != recv.device:
        raise ValueError("allreduce: send is on %s but recv on %s; put both on the same "
                         "device" % (send.device, recv.device))
    if not send.device.startswith("cuda"):
        return Where(-1, 0)
    import torch  # on use: loads torch
    dev = send.obj.device.index
    return Where(dev, torch.cuda.current_stream(dev).cuda_stream)


def device_guard(device):
    """The core takes device buffers only on a thread whose current device is
    theirs, and never switches a user's thread itself: torch's guard sets it
    for the call and restores it after."""
    if device < 0:
        return contextlib.nullcontext()
    import torch  # on use: loads torch
    return torch.cuda.device(device)


def empty_like(buf, count):
    """A new 1-D buffer of count elements, same kind, dtype and device as buf."""
    if isinstance(buf, np.ndarray):
        return np.empty(count, dtype=buf.dtype)
    import torch  # on use: loads torch
    return torch.empty(count, dtype=buf.dtype, device=buf.device)
