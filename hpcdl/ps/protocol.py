"""protocol.py - the parameter server's messages: who sends what, with which
tag, and how the flat parameter vector is cut into server shards.

Ranks 0..K-1 are servers, ranks K..N-1 workers (W = N - K). Server j holds
shard j = flat[lo_j:hi_j] of the P-element float32 parameter vector: K
contiguous, near-equal pieces. All traffic runs on a private duplicate of the
job's communicator, so these tags cannot match anyone else's messages.

A request (worker -> server j) is a HEADER, then for a push the shard's data:

    tag REQUEST  float64[4]  (kind, clock, lr, 0)
    tag GRAD     float32[hi_j - lo_j]   only when kind == PUSH: d loss / d shard

    kind PUSH       the gradient of the worker's step `clock` (0-based), lr to use
    kind PULL       "send me the shard for my step `clock`"; the server may hold
                    the answer back (BSP / SSP) until the other workers catch up
    kind ROUND_END  the worker made `clock` steps and sends nothing more this round

An answer to a PULL (server j -> worker):

    tag REPLY    float64[4]  (PARAMS, version, min_clock, 0)
    tag PARAMS   float32[hi_j - lo_j]   the shard's values

or, when the pull can never be answered (the workers it waits for have ended
the round), the same two messages with kind ERROR, and the server raises.

version counts the updates applied to the shard (BSP: steps; ASP / SSP: pushes),
min_clock is the smallest number of pushes any worker has made to it. MPI keeps
messages with the same source, tag and communicator in order, and a server
reads a worker's next header only after the previous push's data, so one
worker's requests are handled in the order it sent them.
"""
import numpy as np

# tags on the private communicator
TAG_REQUEST, TAG_GRAD, TAG_REPLY, TAG_PARAMS = 11, 12, 13, 14

# header kinds (float64 so that clock and lr travel exactly)
PUSH, PULL, ROUND_END, PARAMS, ERROR = 1, 2, 3, 4, 5
HEADER_LEN = 4


def header(kind=0, a=0, b=0.0):
    """A header buffer: (kind, a, b, 0) as float64[HEADER_LEN]."""
    return np.array([kind, a, b, 0.0], dtype=np.float64)


def set_header(buf, kind, a, b=0.0):
    buf[0], buf[1], buf[2] = kind, a, b
    return buf


def read_header(buf):
    """(kind, a as int, b) from a received header."""
    return int(buf[0]), int(buf[1]), float(buf[2])


def shard_bounds(num_params, num_servers):
    """[(lo, hi)] for each server: contiguous, sizes differ by at most one,
    the larger ones first (like numpy.array_split)."""
    q, r = divmod(num_params, num_servers)
    bounds, lo = [], 0
    for j in range(num_servers):
        hi = lo + q + (1 if j < r else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds
