"""functions.py - making every rank start from the same state, Horovod-style:

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    epoch = hvd.broadcast_object(epoch, root_rank=0)
    everyone = hvd.allgather_object(local_metrics)

Parameters travel fused: tensors of one wire dtype are packed into buffers
of up to BUCKET_BYTES, one broadcast each. Optimizer state travels as its
structure (a pickle, scalars such as lr and step included) plus its tensors
(fused the same way), and is loaded on the other ranks with load_state_dict,
so a fresh optimizer needs no warm-up step. Objects travel as pickles
(cloudpickle when installed) through hpcdl's collectives.
"""
import math
import pickle

import torch

from ._handles import synchronize
from ._wire import from_wire, to_wire, wire_dtype, wire_shape
from .gather_ops import allgather, broadcast_, broadcast_async_
from .mpi_ops import rank
from .process_sets import global_process_set

BUCKET_BYTES = 64 << 20

try:
    import cloudpickle as _pickler  # as Horovod: lambdas and local classes pickle too
except ImportError:
    _pickler = pickle


# -------------------------------------------------------------- parameters
def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every rank's tensors with root_rank's. params: a state_dict
    (or any name -> tensor dict; sorted by name) or a list of tensors or of
    (name, tensor) pairs such as model.named_parameters()."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    tensors = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise TypeError("broadcast_parameters: %r is a %s, not a tensor"
                            % (name, type(p).__name__))
        tensors.append(p.data)
    broadcast_tensors_(tensors, root_rank, process_set=process_set)


def _buckets(tensors):
    """Lists of tensors sharing (wire dtype, device type), each <= BUCKET_BYTES
    (or one larger tensor), in an order every rank derives alike."""
    buckets, current = [], {}
    for t in tensors:
        key, nbytes = (wire_dtype(t.dtype), t.device.type), t.numel() * t.element_size()
        b = current.get(key)
        if b is None or (b[0] and b[1] + nbytes > BUCKET_BYTES):
            b = current[key] = [[], 0]
            buckets.append(b)
        b[0].append(t)
        b[1] += nbytes
    return [b[0] for b in buckets]


def broadcast_tensors_(tensors, root_rank, name="broadcast_parameters",
                       process_set=global_process_set):
    """In-place broadcast of a list of tensors (the same list on every rank
    of process_set; root_rank a global rank)."""
    pending = []
    for i, group in enumerate(_buckets(tensors)):
        flat = torch.cat([to_wire(t.detach()).reshape(-1) for t in group])
        pending.append((group, flat, broadcast_async_(flat, root_rank, "%s.%d" % (name, i),
                                                      process_set=process_set)))
    for group, flat, handle in pending:
        synchronize(handle)
        if rank() == root_rank:
            continue
        offset = 0
        for t in group:
            shape = wire_shape(t)
            n = math.prod(shape)
            t.detach().copy_(from_wire(flat[offset:offset + n].view(shape), t.dtype))
            offset += n


# --------------------------------------------------------- optimizer state
class _Slot:
    """Stands for the i-th tensor of a state_dict while its structure travels."""

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, tuple(shape), dtype


def _take_tensors(obj, found):
    """obj with every tensor replaced by a _Slot; the tensors go to found."""
    if isinstance(obj, torch.Tensor):
        found.append(obj.detach().cpu())
        return _Slot(len(found) - 1, obj.shape, obj.dtype)
    if isinstance(obj, dict):
        return {k: _take_tensors(v, found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_take_tensors(v, found) for v in obj)
    return obj


def _put_tensors(obj, tensors):
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _put_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_put_tensors(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Gives every rank root_rank's optimizer state: per-parameter state
    (momentum buffers, Adam moments, step) and param_groups options (lr,
    momentum, betas, ...). Every rank's optimizer must have the same
    parameter groups; state tensors land on each parameter's device."""
    tensors = []
    # a ZeRO optimizer's state_dict() is collective (it joins every rank's shard)
    full = optimizer.state_dict() if rank() == root_rank or getattr(
        optimizer, "zero_stage", 0) else None
    skeleton = _take_tensors(full, tensors) if rank() == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank, name="optimizer_state.structure",
                                process_set=process_set)
    if rank() != root_rank:
        slots = []
        _collect_slots(skeleton, slots)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in sorted(slots, key=_index)]
    broadcast_tensors_(tensors, root_rank, name="optimizer_state", process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(_put_tensors(skeleton, tensors))


def _index(slot):
    return slot.index


def _collect_slots(obj, slots):
    if isinstance(obj, _Slot):
        slots.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, slots)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, slots)


# ----------------------------------------------------------------- objects
def _to_words(payload):
    """bytes -> int64 tensor (zero-padded to 8-byte words): hpcdl moves int64."""
    padded = bytearray(payload) + bytes(-len(payload) % 8)
    if not padded:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(padded, dtype=torch.uint8).view(torch.int64).clone()


def _from_words(words, nbytes):
    return words.view(torch.uint8).numpy().tobytes()[:nbytes]


def _dumps(obj):
    """(payload, error): a pickling failure is reported to the other ranks."""
    try:
        return _pickler.dumps(obj), None
    except Exception as e:  # noqa: BLE001 - any pickling failure
        return b"", e


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj, on every rank (pickled, then broadcast)."""
    name = name or type(obj).__name__
    payload, err = _dumps(obj) if rank() == root_rank else (b"", None)
    nbytes = torch.tensor([-1 if err else len(payload)], dtype=torch.int64)
    broadcast_(nbytes, root_rank, name + ".size", process_set=process_set)
    if err is not None:
        raise err
    if nbytes.item() < 0:
        raise RuntimeError("broadcast_object: rank %d could not pickle its object "
                           "(see its error)" % root_rank)
    words = _to_words(payload) if rank() == root_rank else \
        torch.empty(-(-nbytes.item() // 8), dtype=torch.int64)
    broadcast_(words, root_rank, name + ".data", process_set=process_set)
    return obj if rank() == root_rank else pickle.loads(_from_words(words, nbytes.item()))


def allgather_object(obj, name=None, process_set=global_process_set):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    name = name or type(obj).__name__
    payload, err = _dumps(obj)
    sizes = allgather(torch.tensor([-1 if err else len(payload)], dtype=torch.int64),
                      name=name + ".size", process_set=process_set).tolist()
    if err is not None:
        raise err
    if min(sizes) < 0:
        raise RuntimeError("allgather_object: rank(s) %s could not pickle their object"
                           % [r for r, s in enumerate(sizes) if s < 0])
    words = allgather(_to_words(payload), name=name + ".data", process_set=process_set)
    out, offset = [], 0
    for n in sizes:
        w = -(-n // 8)
        out.append(pickle.loads(_from_words(words[offset:offset + w], n)))
        offset += w
    return out
