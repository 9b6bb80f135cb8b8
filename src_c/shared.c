/*
 * shared.c - buffers in the node's shared memory, all-reduced in place with
 * no staging copies.
 *
 * hpcdl_shared_alloc gives every local rank a buffer in one MPI-3 shared
 * window (collective over the node), so each rank can load and store the
 * others' buffers directly. Gradient fusion buckets live there. An in-place
 * all-reduce of such a buffer (hpcdl_dispatch_allreduce finds it by address)
 * then runs as:
 *
 *   1. barrier:  every local rank's buffer holds its input
 *   2. reduce:   local rank l sums sub-slice l of all L buffers into its own
 *   3. across:   the ring over the cross communicator on that sub-slice
 *   4. scatter:  local rank l stores the finished sub-slice l into the other
 *                L-1 buffers
 *   5. barrier:  every buffer holds the whole result
 *
 * Two synchronisations per bucket whatever its size (the staged
 * hierarchical path needs two per 4 MiB slot, the MPI ring one per 256 KiB
 * chunk), and each rank moves about 2M bytes instead of ~4M. That matters
 * most when ranks share cores with their own compute: every wait on a busy
 * peer costs a scheduler time slice.
 *
 * Ranks touch disjoint sub-slices between the barriers, so no rank writes
 * where another reads. Buffers are never freed before exit (torch tensors
 * may still view them after hpcdl shuts down); MPI_Finalize releases them.
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "shm.h"

struct hpcdl_shared_buf {
    MPI_Win win;
    size_t bytes;    // this rank's buffer
    int64_t id;      // allocation number, the same on every rank of the node
    char **peer;     // peer[j]: local rank j's buffer (peer[local_rank] is ours)
};

// Collective over the node's ranks (ctx->main.local), caller's thread.
int hpcdl_shared_alloc_locked(hpcdl_ctx *ctx, size_t bytes, void **out) {
    hpcdl_team *t = &ctx->main;
    *out = NULL;
    if (t->local_size < 2 || !t->uniform)
        return hpcdl_fail(HPCDL_ERR_STATE, "shared buffers need >= 2 ranks on every node "
                                           "and the same number on each (local_size %d)",
                          t->local_size);
    if (ctx->nshared == ctx->cap_shared) {
        int cap = ctx->cap_shared ? 2 * ctx->cap_shared : 16;
        hpcdl_shared_buf **grown = realloc(ctx->shared, sizeof *grown * (size_t)cap);
        if (!grown) return hpcdl_fail(HPCDL_ERR_NOMEM, "shared buffer: out of memory");
        ctx->shared = grown;
        ctx->cap_shared = cap;
    }
    hpcdl_shared_buf *b = calloc(1, sizeof *b);
    if (b) b->peer = calloc((size_t)t->local_size, sizeof *b->peer);
    if (!b || !b->peer) {
        if (b) free(b);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "shared buffer: out of memory");
    }
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true")); // pages near their rank
    char *mine = NULL;
    size_t asked = bytes ? bytes : 1;
    int rc = MPI_Win_allocate_shared((MPI_Aint)asked, 1, info, t->local, &mine, &b->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        free(b->peer);
        free(b);
        return hpcdl_mpi_fail(rc, "MPI_Win_allocate_shared", __FILE__, __LINE__);
    }
    for (int j = 0; j < t->local_size; j++) {
        MPI_Aint sz;
        int disp;
        MPI_CHECK(MPI_Win_shared_query(b->win, j, &sz, &disp, &b->peer[j]));
    }
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win)); // one passive epoch for life
    memset(mine, 0, asked);
    b->bytes = bytes;
    b->id = ctx->nshared;
    ctx->shared[ctx->nshared++] = b;
    *out = mine;
    return HPCDL_OK;
}

// The registered buffer that is exactly [ptr, ptr + bytes) on this rank.
const hpcdl_shared_buf *hpcdl_shared_find(const hpcdl_ctx *ctx, const hpcdl_team *t,
                                          const void *ptr, size_t bytes) {
    for (int i = 0; i < ctx->nshared; i++) {
        const hpcdl_shared_buf *b = ctx->shared[i];
        if (b->peer[t->local_rank] == ptr && b->bytes == bytes && bytes > 0) return b;
    }
    return NULL;
}

int64_t hpcdl_shared_id(const hpcdl_shared_buf *b) { return b ? b->id : -1; }

// Preconditions across ranks (the agreement check's): the same buffer id,
// count, dtype and op on every rank; every node has the same local_size.
int hpcdl_shared_allreduce(hpcdl_team *t, const hpcdl_shared_buf *b, size_t count,
                           hpcdl_dtype dtype, hpcdl_op op) {
    int L = t->local_size, l = t->local_rank;
    size_t esz = hpcdl_dtype_size(dtype);
    size_t lo = hpcdl_block_start(count, L, l), hi = hpcdl_block_start(count, L, l + 1);
    hpcdl_op ring_op = op == HPCDL_AVERAGE ? HPCDL_SUM : op; // divide once, at the end
    HPCDL_TRY(hpcdl_shm_barrier(t));
    char *mine = b->peer[l] + lo * esz;
    for (int j = 0; j < L; j++)
        if (j != l) hpcdl_reduce_local(mine, mine, b->peer[j] + lo * esz, hi - lo, dtype, ring_op);
    if (t->cross_size > 1)
        HPCDL_TRY(hpcdl_ring_allreduce(t, t->cross, mine, mine, hi - lo, dtype, ring_op));
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(mine, hi - lo, dtype, t->size);
    for (int j = 0; j < L; j++)
        if (j != l) memcpy(b->peer[j] + lo * esz, mine, (hi - lo) * esz);
    return hpcdl_shm_barrier(t);
}
