"""_shapes.py - the shape agreement that all-gather and all-to-all need
before data moves: every rank learns every rank's shape, and a rank with a
different dtype or number of dimensions (or no tensor at all) makes every
rank raise, instead of leaving the others waiting. Two small all-gathers:
(ndim, dtype code), then the shapes."""
import torch

from ..comm import MismatchError
from . import _handles

# every torch dtype, numbered the same way on every rank (same torch build)
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_CODES = {d: i for i, d in enumerate(_DTYPES)}


def gather_shapes(tensor, call):
    """Every rank's tensor shape (a list of tuples, in rank order)."""
    w = _handles.world()
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
