"""_shapes.py - the shape agreement that all-gather and all-to-all need
before data moves: every rank learns every rank's shape, and a rank with a
different dtype or number of dimensions (or no tensor at all) makes every
rank raise, instead of leaving the others waiting. Two small all-gathers:
(ndim, dtype code), then the shapes.

All-reduce, broadcast and reduce-scatter need equal shapes, not only equal
counts (which the core's agreement check compares): start_check queues one
small all-gather of a fixed-size shape descriptor on the engine, ahead of
the data, without blocking, and the check it returns (run by synchronize)
raises MismatchError on every rank, naming each rank's shape, when they
differ. Horovod's words: "Mismatched <op> tensor shapes"."""
import zlib

import torch

from ..comm import MismatchError
from . import _handles

# every torch dtype, numbered the same way on every rank (same torch build)
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_CODES = {d: i for i, d in enumerate(_DTYPES)}


def gather_shapes(tensor, call, on=None):
    """Every rank's tensor shape (a list of tuples, in rank order) on
    Communicator on (default the world)."""
    w = on if on is not None else _handles.world()
    ok = isinstance(tensor, torch.Tensor)
    head = [tensor.dim(), _CODES[tensor.dtype]] if ok else [-1, -1]
    heads = w.allgather(torch.tensor(head, dtype=torch.int64)).view(w.size, 2).tolist()
    if not ok:
        raise TypeError("%s: expected a torch tensor, got %s" % (call, type(tensor).__name__))
    bad = [r for r, (ndim, _) in enumerate(heads) if ndim < 0]
    if bad:
        raise MismatchError("%s: rank(s) %s passed no tensor (see their error)" % (call, bad))
    if len({tuple(h) for h in heads}) > 1:
        seen = ", ".join("rank %d: %s %d-D" % (r, _DTYPES[c], n)
                         for r, (n, c) in enumerate(heads))
        raise MismatchError("%s: every rank must pass the same dtype and number of "
                            "dimensions; got %s" % (call, seen))
    ndim = heads[0][0]
    if ndim == 0:
        return [()] * w.size
    shapes = w.allgather(torch.tensor(tensor.shape, dtype=torch.int64))
    return [tuple(s) for s in shapes.view(w.size, ndim).tolist()]


def check_rows_agree(shapes, call):
    """Raises (on every rank alike) unless shapes differ only in dimension 0."""
    if len({s[1:] for s in shapes}) > 1:
        raise MismatchError("%s: tensors may differ only in their first dimension; shapes "
                            "by rank: %s" % (call, shapes))


# ------------------------------------------------ equal shapes, asynchronously
_SHOWN = 8                   # dimensions a descriptor spells out
_DESC = 4 + _SHOWN           # [tensors, dtype, ndim, dims..., crc of every shape and dtype]


def _descriptor(tensors):
    first = tensors[0] if tensors else torch.empty(0)
    dims = list(first.shape[:_SHOWN]) + [-1] * (_SHOWN - min(first.dim(), _SHOWN))
    crc = zlib.crc32(repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode())
    return torch.tensor([len(tensors), _CODES[first.dtype], first.dim()] + dims + [crc],
                        dtype=torch.int64)


def _spelled(row):
    count, dtype, ndim, dims = row[0], _DTYPES[row[1]], row[2], row[3:3 + _SHOWN]
    shape = "%s [%s%s]" % (str(dtype).replace("torch.", ""),
                           ", ".join(str(d) for d in dims[:min(ndim, _SHOWN)]),
                           ", ..." if ndim > _SHOWN else "")
    return shape if count == 1 else "%d tensors, the first %s" % (count, shape)


def start_check(on, tensors, call, name):
    """(comm handle, check): queues the descriptor all-gather of tensors (a
    list) on Communicator on; check() raises MismatchError when the ranks'
    shapes or dtypes differ."""
    desc = _descriptor(tensors)
    out = torch.empty(on.size * _DESC, dtype=torch.int64)
    handle = _handles.start("allgather", desc, out, counts=[_DESC] * on.size,
                            name=name + ".shape", on=on)

    def check():
        rows = out.view(on.size, _DESC).tolist()
        if any(r != rows[0] for r in rows):
            raise MismatchError(
                "Mismatched %s tensor shapes: every rank must pass the same shape and dtype "
                "(name %r); got %s" % (call, name, ", ".join(
                    "rank %d: %s" % (r, _spelled(row)) for r, row in enumerate(rows))))
    return handle, check
