"""_shapes.py - what every rank learns of the others' tensors before data
moves, so that a rank with a different shape or dtype (or no tensor at all)
makes every rank raise instead of leaving the others waiting.

All-reduce, broadcast, reduce-scatter and all-gather send, ahead of their
data, one small all-gather of a fixed-width descriptor on the engine
(start_check, without blocking; all-to-all and Adasum wait for it before
they start, DistributedOptimizer sends one per step): the kind of operation, op, root, the
first tensor's dtype and shape, a checksum of every shape, and the data
items that follow (count, wire dtype). The check it returns (run by
synchronize) raises MismatchError on every rank, naming each rank's shape,
when they differ (Horovod's words: "Mismatched <op> tensor shapes"). The
same round is how join() works (_join.py): a rank that joined sends a
JOINED row instead and, from the others' rows, answers their data items
(zeros for all-reduce); the others' check then says when the operation
cannot run with a joined rank. For the hvd.* calls it costs nothing more
when join is unused: the round was already there."""
import zlib

import torch

from ..comm import MismatchError
from ..comm._types import op_code
from . import _handles
from .exceptions import HorovodInternalError

# every torch dtype, numbered the same way on every rank (same torch build)
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_CODES = {d: i for i, d in enumerate(_DTYPES)}


# ------------------------------------------------ descriptors, asynchronously
# fields of one rank's descriptor row
KIND, OP, ROOT, NTENS, DTYPE, NDIM, DIMS = 0, 1, 2, 3, 4, 5, 6
_SHOWN = 8                   # dimensions a descriptor spells out: DIMS .. DIMS + 7
CRC, NITEMS, ITEMS = DIMS + _SHOWN, DIMS + _SHOWN + 1, DIMS + _SHOWN + 2
SLOTS = 4                    # data items described: (count, wire dtype code) pairs
ROW_ELEMS = ITEMS + 2 * SLOTS
WIDTH = ROW_ELEMS + 1
# KIND values; a JOINED row has OP = 1 in the round where its rank joined
KINDS = ("joined", "allreduce", "broadcast", "reducescatter", "allgather", "alltoall",
         "barrier", "adasum", "optimizer")
JOINED = 0


def code(dtype):
    return _CODES[dtype]


def dtype_of(c):
    return _DTYPES[c]


def descriptor(kind, tensors, op=0, root=-1, items=(), row_elems=0, varying_rows=False):
    """One rank's row. tensors: a list (None when this rank has no valid
    tensor: its row then says so); op: a reduction op (name or code); items: the (count, torch dtype) of each
    data operation queued after the round; varying_rows: dimension 0 may
    differ across ranks (all-gather), so the checksum leaves it out."""
    row = [KINDS.index(kind), op_code(op), int(root)] + [0] * (WIDTH - 3)
    if tensors is None:
        row[NDIM] = -1
        return torch.tensor(row, dtype=torch.int64)
    first = tensors[0] if tensors else torch.empty(0)
    dims = list(first.shape[:_SHOWN]) + [-1] * (_SHOWN - min(first.dim(), _SHOWN))
    shapes = [(tuple(t.shape[1:] if varying_rows else t.shape), str(t.dtype))
              for t in tensors]
    row[NTENS:NDIM + 1] = [len(tensors), _CODES[first.dtype], first.dim()]
    row[DIMS:DIMS + _SHOWN] = dims
    row[CRC] = zlib.crc32(repr(shapes).encode())
    row[NITEMS] = len(items)
    for i, (count, dtype) in enumerate(list(items)[:SLOTS]):
        row[ITEMS + 2 * i:ITEMS + 2 * i + 2] = [int(count), _CODES[dtype]]
    row[ROW_ELEMS] = int(row_elems)
    return torch.tensor(row, dtype=torch.int64)


def joined_row(newly):
    row = [0] * WIDTH
    row[KIND], row[OP] = JOINED, int(bool(newly))
    return torch.tensor(row, dtype=torch.int64)


def start_round(on, row, name):
    """(comm handle, rows): queues the all-gather of this rank's row; rows
    (an on.size x WIDTH tensor) holds every rank's once the handle is done."""
    out = torch.empty(on.size * WIDTH, dtype=torch.int64)
    handle = _handles.start("allgather", row, out, counts=[WIDTH] * on.size,
                            name=name + ".shape", on=on)
    return handle, out.view(on.size, WIDTH)


def _spelled(row, want):
    if row[KIND] == JOINED:
        return "joined (hvd.join)"
    if row[NDIM] < 0:
        return "no valid tensor (see its error)"
    count, dtype, ndim, dims = row[NTENS], _DTYPES[row[DTYPE]], row[NDIM], \
        row[DIMS:DIMS + _SHOWN]
    shape = "%s [%s%s]" % (str(dtype).replace("torch.", ""),
                           ", ".join(str(d) for d in dims[:min(ndim, _SHOWN)]),
                           ", ..." if ndim > _SHOWN else "")
    shape = shape if count == 1 else "%d tensors, the first %s" % (count, shape)
    return shape if row[KIND] == want else "%s of %s" % (KINDS[row[KIND]], shape)


def _comparable(row, varying_rows):
    """The fields that must agree. op and root are left to the core's
    agreement check, which names them; dimension 0 when rows may vary."""
    row = [row[KIND], row[NTENS]] + row[DTYPE:]
    if varying_rows:
        del row[DIMS - 2]
    return row


def check_rows(rows, call, name, varying_rows=False):
    """Raises on every rank alike: MismatchError when the ranks that have
    not joined sent different rows; HorovodInternalError when some rank has
    joined and call is not an all-reduce (Horovod's rule and words)."""
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
    live = [r for r in rows if r[KIND] != JOINED]
    bad = [i for i, r in enumerate(rows) if r[KIND] != JOINED and r[NDIM] < 0]
    if bad:
        raise MismatchError("%s: rank(s) %s passed no valid tensor (see their error)"
                            % (call, bad))
    first = _comparable(live[0], varying_rows) if live else None
    if any(_comparable(r, varying_rows) != first for r in live):
        raise MismatchError(
            "Mismatched %s tensor shapes: every rank must pass the same %s and dtype "
            "(name %r); got %s" % (call, "shape (but for dimension 0)" if varying_rows
                                   else "shape", name, ", ".join(
                                       "rank %d: %s" % (i, _spelled(r, KINDS.index(call)))
                                       for i, r in enumerate(rows))))
    if len(live) < len(rows) and call != "allreduce":
        joined = [i for i, r in enumerate(rows) if r[KIND] == JOINED]
        raise HorovodInternalError(
            "%s is not supported with Join at this time (rank(s) %s called hvd.join(); "
            "only allreduce answers a joined rank, with zeros)"
            % (call.capitalize(), joined))


def start_check(on, tensors, call, name, **fields):
    """(comm handle, check): queues the descriptor round of tensors (a list)
    on Communicator on; check() raises as check_rows does. fields: op, root,
    items, row_elems of descriptor()."""
    handle, rows = start_round(on, descriptor(call, tensors, **fields), name)
    return handle, lambda: check_rows(rows, call, name)
