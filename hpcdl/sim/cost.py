"""cost.py - the alpha-beta (Hockney) cost model of each collective.

One message of m bytes between two ranks takes  alpha + m * beta  seconds:
alpha is the latency (start-up cost of a message), beta the time per byte
(1 / bandwidth). Reductions may add gamma seconds per byte reduced (the
arithmetic; 0 gives the pure alpha-beta form). Names used below:

    N      ranks taking part
    M      bytes of the message (the whole gradient for an all-reduce; one
           rank's block for an all-gather)
    log N  ceil(log2 N): the rounds of a binomial tree or of recursive
           doubling; for N not a power of two the tree needs one round more
           than log2 N, hence the ceiling (log 5 = 3)
    L      ranks per node, K = N / L nodes (hierarchical all-reduce)

Every function returns seconds, and 0 for N = 1 (one rank sends nothing).
Links are full duplex: a rank may send one message and receive another at
the same time, each at the full rate (ring steps rely on it).
"""


def _check(n, nbytes):
    if int(n) != n or n < 1:
        raise ValueError("the number of ranks must be a positive integer (got %r)" % (n,))
    if nbytes < 0:
        raise ValueError("the message size must be >= 0 bytes (got %r)" % (nbytes,))


def log2_rounds(n):
    """ceil(log2 n): rounds of a binomial tree over n ranks (0 for n = 1)."""
    _check(n, 0)
    return (int(n) - 1).bit_length()


def parameter_server(n, nbytes, alpha, beta, gamma=0.0):
    """All-reduce through one parameter server: 2 alpha + 2 (N-1) M beta
    (+ (N-1) M gamma).

    The N-1 workers send their M-byte gradients to the server, which sums
    them and sends the result back to each: the server's link carries
    (N-1) M bytes in each direction, one after the other, so the time grows
    linearly with N. The latencies of the N-1 messages overlap (2 alpha)."""
    _check(n, nbytes)
    if n == 1:
        return 0.0
    return 2 * alpha + 2 * (n - 1) * nbytes * beta + (n - 1) * nbytes * gamma


def ring_allreduce(n, nbytes, alpha, beta, gamma=0.0):
    """Ring all-reduce: 2 (N-1) alpha + 2 ((N-1)/N) M beta (+ ((N-1)/N) M gamma).

    Reduce-scatter then all-gather, N-1 steps each; at every step each rank
    sends one block of M/N bytes to its right neighbour while receiving one
    from its left (Patarasuk & Yuan). The bandwidth term hardly grows with N:
    the bandwidth optimum. The latency term does, linearly."""
    _check(n, nbytes)
    frac = (n - 1) / n
    return 2 * (n - 1) * alpha + 2 * frac * nbytes * beta + frac * nbytes * gamma


def tree_allreduce(n, nbytes, alpha, beta, gamma=0.0):
    """Binomial-tree all-reduce (reduce to a root, then broadcast):
    2 alpha log N + 2 log N M beta (+ log N M gamma).

    Each of the 2 log N rounds moves the whole M-byte message: few
    latencies, but log N times the ring's bytes."""
    _check(n, nbytes)
    rounds = log2_rounds(n)
    return 2 * rounds * alpha + 2 * rounds * nbytes * beta + rounds * nbytes * gamma


def broadcast(n, nbytes, alpha, beta):
    """Binomial-tree broadcast of M bytes from one root: alpha log N + log N M beta."""
    _check(n, nbytes)
    rounds = log2_rounds(n)
    return rounds * alpha + rounds * nbytes * beta


def allgather(n, nbytes, alpha, beta):
    """All-gather by recursive doubling, every rank contributing M bytes:
    alpha log N + (N-1) M beta.

    Round k exchanges 2^k blocks with the partner at distance 2^k; in all,
    each rank receives the N-1 blocks it lacks."""
    _check(n, nbytes)
    return log2_rounds(n) * alpha + (n - 1) * nbytes * beta


def hierarchical_allreduce(n, nbytes, per_node, alpha_intra, beta_intra, alpha_inter,
                           beta_inter, gamma=0.0):
    """Hierarchical all-reduce over K = N/L nodes of L ranks:

        intra reduce-scatter   (L-1) a_i + ((L-1)/L) M b_i   (+ ((L-1)/L) M gamma)
        inter ring on M/L      2 (K-1) a_e + 2 ((K-1)/K) (M/L) b_e  (+ ((K-1)/K) (M/L) gamma)
        intra all-gather       (L-1) a_i + ((L-1)/L) M b_i

    Each node first reduces its data so that local rank l owns slice l
    (M/L bytes); the L rings of ranks with the same local rank then run
    across nodes at once, each on its own slice; finally the node gathers
    the slices. The slow inter-node links carry 1/L of the ring's bytes.
    N must fill whole nodes (N = K L); N <= L is one node (no inter term)."""
    _check(n, nbytes)
    if int(per_node) != per_node or per_node < 1:
        raise ValueError("ranks per node must be a positive integer (got %r)" % (per_node,))
    local = min(int(per_node), int(n))
    if n % local:
        raise ValueError("%d ranks do not fill nodes of %d ranks each: give a rank count "
                         "that is a multiple of the ranks per node" % (n, local))
    nodes = n // local
    fi, fe = (local - 1) / local, (nodes - 1) / nodes
    intra = 2 * ((local - 1) * alpha_intra + fi * nbytes * beta_intra) + fi * nbytes * gamma
    inter = ring_allreduce(nodes, nbytes / local, alpha_inter, beta_inter, gamma)
    return intra + inter


# flat all-reduce algorithms by name, all called (n, nbytes, alpha, beta, gamma)
ALLREDUCE = {"ps": parameter_server, "ring": ring_allreduce, "tree": tree_allreduce}
# one-line formulas for tables (a = alpha, b = beta; gamma terms left out)
FORMULAS = {
    "ps": "2a + 2(N-1)Mb",
    "ring": "2(N-1)a + 2((N-1)/N)Mb",
    "tree": "2a log N + 2 log N Mb",
    "hier": "2(L-1)a_i + 2((L-1)/L)Mb_i + 2(K-1)a_e + 2((K-1)/K)(M/L)b_e",
    "broadcast": "a log N + log N Mb",
    "allgather": "a log N + (N-1)Mb",
}

