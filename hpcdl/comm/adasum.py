"""adasum.py - the Adasum all-reduce (Maleki et al., "Scaling Distributed
Training with Adaptive Summation", MLSys 2021), Horovod's op=hvd.Adasum.

Two gradients a and b combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(equal vectors give a, orthogonal ones a + b; a zero vector gives the other).
N ranks combine along a binary tree: with p the largest power of two <= N,
rank r >= p first hands its vector to rank r - p, which combines (r - p, r);
then ranks 0..p-1 combine with partner r XOR d for d = 1, 2, 4, ... < p; the
result goes back to ranks >= p. Each tensor of a call is combined on its
own (Horovod's per-tensor rule), computed in float64.

Both partners of a pair compute adasum(lower rank's, higher rank's), so every
rank ends with bit-identical values. Each step moves whole vectors over MPI
point-to-point (log2 N steps): simple and exact; Horovod's vector-halving
variant moves fewer bytes for large tensors on many ranks."""
import numpy as np

_TAG = 7311  # the point-to-point tag on the Communicator's own mpi4py communicator


def combine(a, b, segments):
    """adasum(a, b) per segment (start, stop) of two float64 vectors."""
    out = np.empty_like(a)
    for lo, hi in segments:
        x, y = a[lo:hi], b[lo:hi]
        dot, xx, yy = float(np.dot(x, y)), float(np.dot(x, x)), float(np.dot(y, y))
        cx = 1.0 - dot / (2.0 * xx) if xx > 0 else 1.0
        cy = 1.0 - dot / (2.0 * yy) if yy > 0 else 1.0
        out[lo:hi] = cx * x + cy * y
    return out


def allreduce(mpi, rank, size, vec, segments):
    """Adasum over the ranks of mpi (an mpi4py communicator) of this rank's
    float64 vector vec (segments: one (start, stop) per tensor); returns the
    combined vector, the same on every rank. Collective; every rank passes
    vectors of the same length and the same segments."""
    p = 1 << (size.bit_length() - 1)
    vec = np.ascontiguousarray(vec, dtype=np.float64)
    if rank >= p:  # fold into rank - p, then wait for the answer
        mpi.Send(vec, dest=rank - p, tag=_TAG)
        out = np.empty_like(vec)
        mpi.Recv(out, source=rank - p, tag=_TAG)
        return out
    other = np.empty_like(vec)
    if rank + p < size:
        mpi.Recv(other, source=rank + p, tag=_TAG)
        vec = combine(vec, other, segments)
    d = 1
    while d < p:
        partner = rank ^ d
        mpi.Sendrecv(vec, dest=partner, sendtag=_TAG, recvbuf=other, source=partner,
                     recvtag=_TAG)
        vec = combine(vec, other, segments) if rank < partner else \
            combine(other, vec, segments)
        d <<= 1
    if rank + p < size:
        mpi.Send(vec, dest=rank + p, tag=_TAG)
    return vec
