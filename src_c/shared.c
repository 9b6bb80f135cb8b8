/*
 * shared.c - buffers in the node's shared memory, all-reduced in place with
 * no staging copies.
 *
 * hpcdl_shared_alloc gives every local rank a buffer in one MPI-3 shared
 * window (collective over the node), so each rank can load and store the
 * others' buffers directly. Gradient fusion buckets live there.
 *
 * One node (the common case): work stealing. Submitting an all-reduce of
 * such a buffer publishes, from the caller's thread, "my input for
 * generation g is in place" plus its count, dtype and op in the buffer's
 * header. The engine of every rank then
 *
 *   1. waits until every local rank has published generation g,
 *   2. compares the published signatures (a mismatch fails on every rank),
 *   3. claims 256 KiB pieces from a shared counter until none are left; for
 *      each, sums the L buffers in rank order and stores the sum into all L,
 *   4. waits until every piece is done.
 *
 * Whichever engine has a core does the work: a rank still busy in its
 * backward pass contributes its data without its engine thread having to be
 * scheduled at all, so no step waits on a sleeping thread's wake-up. The
 * sum order is fixed (rank 0 first), so results do not depend on who
 * claimed which piece.
 *
 * Across nodes: local rank l sums sub-slice l of all L buffers, runs the
 * cross-node ring on it, stores it into every local buffer; two barriers.
 *
 * Buffers are never freed before exit (torch tensors may still view them
 * after hpcdl shuts down); MPI_Finalize releases them.
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "shm.h"

// Each rank's segment: a header, then the data. Header fields sit in their
// own cache lines: ready + sig (written by the owner), claim and done (only
// local rank 0's are used, by everyone).
#define HDR_BYTES 256
#define OFF_READY 0
#define OFF_SIG 8
#define OFF_CLAIM 64
#define OFF_DONE 128
#define PIECE_BYTES ((size_t)256 << 10)
#define DONE_ERR 0xffffffffu

struct hpcdl_shared_buf {
    MPI_Win win;
    size_t bytes;    // this rank's buffer
    int64_t id;      // allocation number, the same on every rank of the node
    char **peer;     // peer[j]: local rank j's data (peer[local_rank] is ours)
    char **hdr;      // hdr[j]: local rank j's header
    uint32_t gen;    // generations this rank has published
};

static uint64_t *field(const hpcdl_shared_buf *b, int j, size_t off) {
    return (uint64_t *)(b->hdr[j] + off);
}

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
    if (b) b->hdr = calloc((size_t)t->local_size, sizeof *b->hdr);
    if (!b || !b->peer || !b->hdr) {
        if (b) free(b->peer);
        if (b) free(b->hdr);
        if (b) free(b);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "shared buffer: out of memory");
    }
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true")); // pages near their rank
    char *mine = NULL;
    size_t asked = HDR_BYTES + bytes;
    int rc = MPI_Win_allocate_shared((MPI_Aint)asked, 1, info, t->local, &mine, &b->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        free(b->peer);
        free(b->hdr);
        free(b);
        return hpcdl_mpi_fail(rc, "MPI_Win_allocate_shared", __FILE__, __LINE__);
    }
    for (int j = 0; j < t->local_size; j++) {
        MPI_Aint sz;
        int disp;
        MPI_CHECK(MPI_Win_shared_query(b->win, j, &sz, &disp, &b->hdr[j]));
        b->peer[j] = b->hdr[j] + HDR_BYTES;
    }
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win)); // one passive epoch for life
    memset(mine, 0, asked);
    b->bytes = bytes;
    b->id = ctx->nshared;
    ctx->shared[ctx->nshared++] = b;
    MPI_CHECK(MPI_Barrier(t->local)); // every header is zero before anyone reads one
    *out = mine + HDR_BYTES;
    return HPCDL_OK;
}

// The registered buffer that is exactly [ptr, ptr + bytes) on this rank.
// Caller's thread only (the table grows there).
hpcdl_shared_buf *hpcdl_shared_find(const hpcdl_ctx *ctx, const hpcdl_team *t,
                                    const void *ptr, size_t bytes) {
    for (int i = 0; i < ctx->nshared; i++) {
        hpcdl_shared_buf *b = ctx->shared[i];
        if (b->peer[t->local_rank] == ptr && b->bytes == bytes && bytes > 0) return b;
    }
    return NULL;
}

int64_t hpcdl_shared_id(const hpcdl_shared_buf *b) { return b ? b->id : -1; }

// Caller's thread, at submission: this rank's input for the next generation
// is in place. The signature is a seqlock: its generation word is cleared
// while the fields change, so a reader never takes a half-written one.
uint32_t hpcdl_shared_publish(hpcdl_shared_buf *b, int local_rank, size_t count,
                              hpcdl_dtype dtype, hpcdl_op op) {
    uint32_t g = ++b->gen;
    int64_t *sig = (int64_t *)field(b, local_rank, OFF_SIG);
    __atomic_store_n(&sig[0], 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&sig[1], (int64_t)count, __ATOMIC_RELAXED);
    __atomic_store_n(&sig[2], (int64_t)dtype, __ATOMIC_RELAXED);
    __atomic_store_n(&sig[3], (int64_t)op, __ATOMIC_RELAXED);
    __atomic_store_n(&sig[0], (int64_t)g, __ATOMIC_RELEASE);
    __atomic_store_n(field(b, local_rank, OFF_READY), (uint64_t)g, __ATOMIC_RELEASE);
    return g;
}

// Local rank j's signature of generation gen into out[1..3]; 0 when it no
// longer holds that generation (j has its result and submitted again).
static int read_sig(const hpcdl_shared_buf *b, int j, uint32_t gen, int64_t out[4]) {
    int64_t *sig = (int64_t *)field(b, j, OFF_SIG);
    int64_t before = __atomic_load_n(&sig[0], __ATOMIC_ACQUIRE);
    for (int f = 1; f < 4; f++) out[f] = __atomic_load_n(&sig[f], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    out[0] = __atomic_load_n(&sig[0], __ATOMIC_RELAXED);
    return before == (int64_t)gen && out[0] == (int64_t)gen;
}

// ---------------------------------------------------------------------------
// work stealing on one node

// Waits politely (sleeps while this rank computes; spins, yields, then
// sleeps while its caller waits: hpcdl_backoff_pause) until cond(b, gen)
// holds, or with want_done > 0 until generation gen's done word reaches
// want_done pieces (or says error). Fails after the shared-memory timeout
// (past the stall inspector's shutdown time while it runs: it ends the job
// first, naming the rank), or (sig given) at once when a local peer entered
// an agreement check meanwhile: it runs a different collective, so this rank
// joins that check as the all-reduce it is, and the check fails everywhere.
typedef int (*wait_cond)(const hpcdl_shared_buf *b, int L, uint32_t gen);

static int all_ready(const hpcdl_shared_buf *b, int L, uint32_t gen) {
    for (int j = 0; j < L; j++)
        if (__atomic_load_n(field(b, j, OFF_READY), __ATOMIC_ACQUIRE) < gen) return 0;
    return 1;
}

static int wait_until(hpcdl_team *t, const hpcdl_shared_buf *b, uint32_t gen, wait_cond cond,
                      uint64_t want_done, const int64_t *sig) {
    int L = t->local_size;
    hpcdl_backoff pause = {0, 0};
    for (;;) {
        if (want_done) { // this generation's done word reached the piece count (or error)
            uint64_t d = __atomic_load_n(field(b, 0, OFF_DONE), __ATOMIC_ACQUIRE);
            uint32_t dg = (uint32_t)(d >> 32), dc = (uint32_t)d;
            // still an older generation: nobody has finished a piece of this one yet
            if (dg > gen || (dg == gen && (dc >= (uint32_t)want_done || dc == DONE_ERR)))
                return HPCDL_OK;
        } else if (cond(b, L, gen)) {
            return HPCDL_OK;
        }
        if (pause.n >= 200 && sig && hpcdl_shm_peer_ahead(t)) {
            // a peer that finished this generation and went on published its
            // flag before entering the next collective: look again first
            if (cond(b, L, gen)) return HPCDL_OK;
            static const char *const names[] = {"valid", "count", "dtype", "op", "algorithm",
                                                "shared buffer (-1: none)"};
            HPCDL_TRY(hpcdl_check_agree(t, "allreduce", sig, 6, names));
            return hpcdl_fail(HPCDL_ERR_MISMATCH, "allreduce of shared buffer %lld: another "
                              "local rank runs a different collective now. Hint: every rank "
                              "must call the same collectives in the same order.",
                              (long long)b->id);
        }
        // spin, then (the caller waits: nobody else needs this core) yield, then
        // sleep; the engine while its caller computes sleeps at once
        int polite = t->polite && !hpcdl_team_urgent(t);
        double waited = hpcdl_backoff_pause(&pause, 200, polite);
        if (waited > 0) HPCDL_TRY(hpcdl_team_check_peers(t)); // a lost peer (fault.c)
        double limit = t->shm->timeout_s;
        if (limit > 0 && waited > limit)
            return hpcdl_fail(HPCDL_ERR_STATE,
                              "allreduce of shared buffer %lld: waited %.0f s for the other "
                              "local ranks. Hint: a rank stopped submitting its gradients "
                              "or died; check every rank's output "
                              "(HPCDL_SHM_TIMEOUT_SECONDS sets this limit when the stall "
                              "inspector is off).",
                              (long long)b->id, limit);
    }
}

// The index of the first signature field (count, dtype, op) on which the
// local ranks disagree for generation gen, or -1. A rank whose signature is
// already of a later generation has its result: gen was checked then.
static int sig_mismatch(const hpcdl_shared_buf *b, int L, uint32_t gen, int64_t sigs[][4]) {
    for (int j = 0; j < L; j++)
        if (!read_sig(b, j, gen, sigs[j])) return -1;
    for (int j = 1; j < L; j++)
        for (int f = 1; f < 4; f++)
            if (sigs[j][f] != sigs[0][f]) return f;
    return -1;
}

// Next unclaimed piece of generation gen, or -1 when none is left. The word
// holds gen << 32 | next piece; the first claimer of a generation resets it.
static long claim_piece(uint64_t *w, uint32_t gen, uint32_t npieces) {
    uint64_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t g = (uint32_t)(cur >> 32), c = (uint32_t)cur;
        if (g > gen || (g == gen && c >= npieces)) return -1;
        uint64_t next = g < gen ? ((uint64_t)gen << 32) | 1 : cur + 1;
        if (__atomic_compare_exchange_n(w, &cur, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return g < gen ? 0 : (long)c;
    }
}

static void add_done(uint64_t *w, uint32_t gen, int error) {
    uint64_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t g = (uint32_t)(cur >> 32);
        if (g > gen) return; // stale (a caller re-submitted a buffer still in flight)
        uint64_t next = ((uint64_t)gen << 32) | (error ? DONE_ERR : 1);
        if (g == gen && !error) next = cur + 1;
        if (g == gen && (uint32_t)cur == DONE_ERR) return;
        if (__atomic_compare_exchange_n(w, &cur, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return;
    }
}

// Sums elements [lo, lo + n) of every local buffer in rank order into
// scratch, then stores the result into all of them.
static void reduce_piece(hpcdl_team *t, const hpcdl_shared_buf *b, char *scratch, size_t lo,
                         size_t n, hpcdl_dtype dtype, hpcdl_op op) {
    int L = t->local_size;
    size_t esz = hpcdl_dtype_size(dtype), off = lo * esz;
    hpcdl_op sum_op = op == HPCDL_AVERAGE ? HPCDL_SUM : op;
    hpcdl_reduce_local(scratch, b->peer[0] + off, b->peer[1] + off, n, dtype, sum_op);
    for (int j = 2; j < L; j++)
        hpcdl_reduce_local(scratch, scratch, b->peer[j] + off, n, dtype, sum_op);
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(scratch, n, dtype, t->size);
    for (int j = 0; j < L; j++) memcpy(b->peer[j] + off, scratch, n * esz);
}

int hpcdl_shared_steal_allreduce(hpcdl_team *t, const hpcdl_shared_buf *b, uint32_t gen,
                                 size_t count, hpcdl_dtype dtype, hpcdl_op op) {
    int L = t->local_size;
    int64_t sig[6] = {1, (int64_t)count, dtype, op, HPCDL_ALGO_AUTO, b->id};
    HPCDL_TRY(wait_until(t, b, gen, all_ready, 0, sig));
    t->t_agreed = MPI_Wtime();
    int64_t sigs[64][4];
    int bad = L <= 64 ? sig_mismatch(b, L, gen, sigs) : -1;
    uint64_t d0 = __atomic_load_n(field(b, 0, OFF_DONE), __ATOMIC_ACQUIRE);
    int failed = (uint32_t)(d0 >> 32) == gen && (uint32_t)d0 == DONE_ERR; // seen by another rank
    if (bad < 0 && !failed && count > 0) {
        size_t esz = hpcdl_dtype_size(dtype), per = PIECE_BYTES / esz;
        uint32_t npieces = (uint32_t)((count + per - 1) / per);
        if (!t->scratch && !(t->scratch = malloc(PIECE_BYTES)))
            return hpcdl_fail(HPCDL_ERR_NOMEM, "shared all-reduce: out of memory");
        long p;
        while ((p = claim_piece(field(b, 0, OFF_CLAIM), gen, npieces)) >= 0) {
            size_t lo = (size_t)p * per, n = count - lo < per ? count - lo : per;
            reduce_piece(t, b, t->scratch, lo, n, dtype, op);
            add_done(field(b, 0, OFF_DONE), gen, 0);
        }
        HPCDL_TRY(wait_until(t, b, gen, NULL, npieces, NULL));
        uint64_t d = __atomic_load_n(field(b, 0, OFF_DONE), __ATOMIC_ACQUIRE);
        if ((uint32_t)(d >> 32) != gen || (uint32_t)d != DONE_ERR) return HPCDL_OK;
    } else if (bad >= 0) {
        add_done(field(b, 0, OFF_DONE), gen, 1); // tell late engines without re-reading sigs
    } else if (!failed) {
        return HPCDL_OK; // count 0 everywhere
    }
    static const char *const names[] = {"generation", "count", "dtype", "op"};
    char msg[512];
    int pos = snprintf(msg, sizeof msg, "allreduce of shared buffer %lld: local ranks disagree "
                       "on %s:", (long long)b->id, names[bad < 0 ? 1 : bad]);
    if (bad < 0) // found by another rank; the signatures have moved on since
        pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " (see the other ranks' errors)");
    for (int j = 0; bad >= 0 && j < L && pos < (int)sizeof msg - 40; j++)
        pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " local rank %d=%lld", j,
                        (long long)sigs[j][bad]);
    return hpcdl_fail(HPCDL_ERR_MISMATCH, "%s. Hint: every rank must call the same collectives "
                      "in the same order with the same count, dtype and op.", msg);
}

// ---------------------------------------------------------------------------
// several nodes: owner computes

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
