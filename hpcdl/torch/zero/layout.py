"""layout.py - how ZeRO splits each fusion bucket over ranks (no MPI here).

A bucket is a flat buffer of M elements holding its parameters one after
another. It is cut into N contiguous blocks, rank r owning block r, with the
sizes the reduce-scatter and all-gather use (the first M % N ranks own one
element more), so a parameter may be split between ranks and a rank may own
no element of a small bucket:

    bucket   [ p0 ........ | p1 .... | p2 .. ]     M elements
    ranks    [ rank 0    | rank 1    | rank 2 ]    counts = even split of M
    pieces   rank 1 owns the tail of p0 and the head of p1

A Piece is one parameter's part of one rank's block: flat indices
[start, stop) of the parameter, at offset `at` within the rank's block.
"""
from dataclasses import dataclass

from ...utils import settings

# full-size gradient reduce-scatters a rank keeps in flight during backward
# (stage 2's buckets, stage 3's units): each finished one frees its full
# buffer at once, and beyond this many the oldest is waited for in backward
# (HPCDL_ZERO_IN_FLIGHT: more overlap on a slow link, for more memory)
REDUCE_IN_FLIGHT = settings.get("HPCDL_ZERO_IN_FLIGHT")


def block_counts(numel, size):
    """Elements of each rank's block: an even split, the first numel % size
    ranks one more (the split Communicator.reduce_scatter makes by default)."""
    q, extra = divmod(numel, size)
    return [q + (1 if r < extra else 0) for r in range(size)]


@dataclass
class Piece:
    index: int      # the parameter's position in the bucket
    start: int      # first flat element of the parameter in this piece
    stop: int       # one past the last
    at: int         # offset of the piece within the rank's block

    @property
    def numel(self):
        return self.stop - self.start


def pieces_of(numels, counts, rank):
    """The pieces of rank's block, in bucket order. numels: the bucket's
    parameters' element counts; counts: block_counts of their sum."""
    lo = sum(counts[:rank])
    hi = lo + counts[rank]
    pieces, offset = [], 0
    for i, n in enumerate(numels):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append(Piece(i, a - offset, b - offset, a - lo))
        offset += n
    return pieces
