/*
 * dispatch.c - one collective on a team, blocking or from the engine: the
 * agreement check first (when enabled), then the algorithm (auto resolved
 * here by message size and topology), then the code that runs it: ring.c,
 * hierarchical.c, shared.c, mpi_coll.c or, for device memory, cuda/.
 */
#include <stdlib.h>
#include "common.h"

// ----------------------------------------------------------------------------
// algorithm choice

static size_t env_bytes(const char *name, size_t dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    size_t v = (size_t)strtoull(e, NULL, 10);
    return v ? v : dflt;
}

static size_t auto_mpi_below(void) {
    static size_t v = 0;
    if (!v) v = env_bytes("HPCDL_AUTO_MPI_BELOW", (size_t)64 << 10);
    return v;
}

static size_t auto_ring_above(void) {
    static size_t v = 0;
    if (!v) v = env_bytes("HPCDL_AUTO_RING_ABOVE", (size_t)2 << 20);
    return v;
}

// Where auto switches from hier to the ring on one node. 2 MiB, but 8 MiB
// under an MPICH-family MPI when the ranks fill the host's cores: there hier
// is steadier than the ring at 4 MiB (quiet, 2 ranks on 2 cores, the ring's
// yielding wait: ring 1.04-1.71 ms, hier 1.24-1.53 ms, MPICH's MPI_Allreduce
// 1.49-1.93 ms), while from 16 MiB the ring wins (5.1-5.5 ms against hier
// 6.9-7.4 and MPICH 6.2-6.5; benchmarks/allreduce-mpich.md). Under Open MPI
// the ring wins from 4 MiB. The same answer on every rank of a node: same
// MPI, same host.
static size_t one_node_ring_above(const hpcdl_team *t) {
#ifdef MPICH_VERSION
    static int env_set = -1; // read once: choose() runs on every collective
    if (env_set < 0) env_set = env_bytes("HPCDL_AUTO_RING_ABOVE", 0) != 0;
    if (t->full && !env_set) return (size_t)8 << 20;
#else
    (void)t;
#endif
    return auto_ring_above();
}

// Measured on one node (BENCHMARKS.md): the shared-memory path wins from the
// smallest messages up to a few MiB (no MPI matching, one spin barrier);
// above that MPI's single-copy point-to-point makes the ring move fewer bytes.
// Across nodes, small messages are latency-bound and MPI's trees win.
static hpcdl_algo choose(const hpcdl_team *t, size_t bytes) {
    int shm = t->local_size > 1 && t->uniform;
    if (t->cross_size == 1 && shm) // one node
        return bytes < one_node_ring_above(t) ? HPCDL_ALGO_HIER : HPCDL_ALGO_RING;
    if (bytes < auto_mpi_below()) return HPCDL_ALGO_MPI;
    return shm ? HPCDL_ALGO_HIER : HPCDL_ALGO_RING;
}

// Local call: the same answer on every rank of a uniform job.
hpcdl_algo hpcdl_choose_algo(const hpcdl_ctx *ctx, size_t bytes) {
    return choose(&ctx->main, bytes);
}

// An auto all-reduce of host memory small enough to ride inside the
// agreement check's exchange (small.c): one message latency instead of two
// collectives. Its inputs are all in the signature, so ranks that decide
// differently fail the check. Local call.
static int inline_fits(const hpcdl_team *t, const hpcdl_shared_buf *shared,
                       const hpcdl_where *where, size_t bytes, hpcdl_algo algo) {
    return algo == HPCDL_ALGO_AUTO && !shared && hpcdl_where_path(where) == 0 &&
           bytes <= hpcdl_small_bytes() && hpcdl_exchange_applies(t);
}

// ----------------------------------------------------------------------------
// dispatch. Each is collective over t; preconditions across ranks: the
// arguments of the public call (count or counts, dtype, op, root, algo), and
// for all-reduce the same shared buffer or none. With ctx->check on, a
// mismatch is an error on every rank before any data moves.

// Runs one all-reduce on team t (the caller's or the engine's); `used` gets
// the algorithm that really ran.
int hpcdl_dispatch_allreduce(hpcdl_ctx *ctx, hpcdl_team *t, const hpcdl_shared_buf *shared,
                             const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                             hpcdl_op op, hpcdl_algo algo, const hpcdl_where *where,
                             hpcdl_algo *used) {
    size_t bytes = count * hpcdl_dtype_size(dtype);
    if (ctx->check) { // the memory path too: device and host paths send other messages
        static const char *const names[] = {
            "valid", "count", "dtype", "op", "algorithm", "shared buffer (-1: none)",
            "memory path (0 host, 1 GPU staged, 2 GPU-direct; 3, 4: with IPC in a node)",
            "HPCDL_CUDA_STAGE_BYTES"};
        int64_t sig[] = {1, (int64_t)count, dtype, op, algo, hpcdl_shared_id(shared),
                         hpcdl_where_path(where), hpcdl_where_stage(where)};
        if (inline_fits(t, shared, where, bytes, algo)) { // the data rides in the check
            HPCDL_TRY(hpcdl_exchange_agree(t, "allreduce", sig, HPCDL_ALLREDUCE_SIG, names,
                                           send, bytes));
            t->t_agreed = MPI_Wtime();
            if (used) *used = HPCDL_USED_INLINE;
            return hpcdl_small_allreduce(t, recv, count, dtype, op);
        }
        HPCDL_TRY(hpcdl_check_agree(t, "allreduce", sig, HPCDL_ALLREDUCE_SIG, names));
    }
    t->t_agreed = MPI_Wtime();
    if (shared) {
        if (used) *used = HPCDL_USED_SHARED;
        return hpcdl_shared_allreduce(t, shared, count, dtype, op);
    }
    if (algo == HPCDL_ALGO_AUTO) algo = choose(t, bytes);
    // hier needs shared memory and equal nodes; without them it is the ring
    if (algo == HPCDL_ALGO_HIER && (t->local_size == 1 || !t->uniform)) algo = HPCDL_ALGO_RING;
    if (used) *used = algo;
#ifdef HPCDL_WITH_CUDA
    // device memory takes the CUDA path (cuda/): GPU-direct or pinned staging
    if (where->device >= 0)
        return hpcdl_cuda_allreduce(ctx, t, where, send, recv, count, dtype, op, algo);
#endif
    switch (algo) {
    case HPCDL_ALGO_MPI: return hpcdl_mpi_allreduce(t, send, recv, count, dtype, op);
    case HPCDL_ALGO_HIER: return hpcdl_hier_allreduce(t, send, recv, count, dtype, op);
    default: return hpcdl_ring_allreduce(t, t->world, send, recv, count, dtype, op);
    }
}

// The counts[] of reduce-scatter and all-gather enter the signature as one hash.
static uint64_t hash_counts(const size_t *counts, int n) {
    uint64_t h = 1469598103934665603ull; // FNV-1a over the counts
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)counts[i]) * 1099511628211ull;
    return h & 0x7fffffffffffffffull;
}

int hpcdl_dispatch_reduce_scatter(hpcdl_ctx *ctx, hpcdl_team *t, const void *send,
                                   void *recv, const size_t *counts, hpcdl_dtype dtype,
                                   hpcdl_op op, hpcdl_algo algo) {
    if (ctx->check) {
        static const char *const names[] = {"valid", "counts (hash)", "dtype", "op", "algorithm"};
        int64_t sig[] = {1, (int64_t)hash_counts(counts, t->size), dtype, op, algo};
        HPCDL_TRY(hpcdl_check_agree(t, "reduce_scatter", sig, 5, names));
    }
    if (algo == HPCDL_ALGO_MPI) return hpcdl_mpi_reduce_scatter(t, send, recv, counts, dtype, op);
    return hpcdl_ring_reduce_scatter(t, t->world, send, recv, counts, dtype, op);
}

int hpcdl_dispatch_allgatherv(hpcdl_ctx *ctx, hpcdl_team *t, const void *send, void *recv,
                              const size_t *counts, hpcdl_dtype dtype, hpcdl_algo algo) {
    if (ctx->check) {
        static const char *const names[] = {"valid", "counts (hash)", "dtype", "algorithm"};
        int64_t sig[] = {1, (int64_t)hash_counts(counts, t->size), dtype, algo};
        HPCDL_TRY(hpcdl_check_agree(t, "allgather", sig, 4, names));
    }
    if (algo == HPCDL_ALGO_MPI) return hpcdl_mpi_allgatherv(t, send, recv, counts, dtype);
    return hpcdl_ring_allgatherv(t, t->world, send, recv, counts, dtype);
}

int hpcdl_dispatch_broadcast(hpcdl_ctx *ctx, hpcdl_team *t, void *buf, size_t count,
                             hpcdl_dtype dtype, int root, hpcdl_algo algo) {
    if (ctx->check) {
        static const char *const names[] = {"valid", "count", "dtype", "root", "algorithm"};
        int64_t sig[] = {1, (int64_t)count, dtype, root, algo};
        HPCDL_TRY(hpcdl_check_agree(t, "broadcast", sig, 5, names));
    }
    if (root < 0 || root >= t->size)
        return hpcdl_fail(HPCDL_ERR_ARG, "broadcast: root %d is not a rank (0..%d)", root,
                          t->size - 1);
    if (algo == HPCDL_ALGO_MPI || (algo == HPCDL_ALGO_AUTO &&
                                   count * hpcdl_dtype_size(dtype) < auto_ring_above()))
        return hpcdl_mpi_broadcast(t, buf, count, dtype, root);
    return hpcdl_ring_broadcast(t, t->world, buf, count, dtype, root);
}
