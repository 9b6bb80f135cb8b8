/*
 * context.c - creating the context (teams of communicators, node topology,
 * shared memory, engine) and the blocking collectives: argument checks, the
 * cross-rank agreement check, then the chosen algorithm.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common.h"
#include "engine.h"
#include "shm.h"

// ----------------------------------------------------------------------------
// teams

// Collective over comm. local_size > 0 makes virtual nodes of that many ranks.
int hpcdl_team_create(hpcdl_team *t, MPI_Comm comm, int local_size) {
    memset(t, 0, sizeof *t);
    t->chunk_bytes = (size_t)256 << 10;
    MPI_CHECK(MPI_Comm_dup(comm, &t->world));
    MPI_CHECK(MPI_Comm_set_errhandler(t->world, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(t->world, &t->rank));
    MPI_CHECK(MPI_Comm_size(t->world, &t->size));
    if (local_size > 0) {
        if (t->size % local_size != 0)
            return hpcdl_fail(HPCDL_ERR_ARG,
                              "HPCDL_LOCAL_SIZE=%d does not divide the %d ranks. Hint: "
                              "pick a divisor of the rank count, or unset it to split "
                              "by shared memory.", local_size, t->size);
        MPI_CHECK(MPI_Comm_split(t->world, t->rank / local_size, t->rank, &t->local));
    } else {
        MPI_CHECK(MPI_Comm_split_type(t->world, MPI_COMM_TYPE_SHARED, t->rank,
                                      MPI_INFO_NULL, &t->local));
    }
    MPI_CHECK(MPI_Comm_set_errhandler(t->local, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(t->local, &t->local_rank));
    MPI_CHECK(MPI_Comm_size(t->local, &t->local_size));
    MPI_CHECK(MPI_Comm_split(t->world, t->local_rank, t->rank, &t->cross));
    MPI_CHECK(MPI_Comm_set_errhandler(t->cross, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(t->cross, &t->cross_rank));
    MPI_CHECK(MPI_Comm_size(t->cross, &t->cross_size));
    int minmax[2] = {-t->local_size, t->local_size};
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_INT, MPI_MAX, t->world));
    t->uniform = -minmax[0] == minmax[1];
    if (t->local_size > 1) HPCDL_TRY(hpcdl_shm_create(t));
    return HPCDL_OK;
}

int hpcdl_team_free(hpcdl_team *t) {
    hpcdl_shm_free(t);
    free(t->scratch);
    t->scratch = NULL;
    if (t->cross != MPI_COMM_NULL && t->cross) MPI_CHECK(MPI_Comm_free(&t->cross));
    if (t->local != MPI_COMM_NULL && t->local) MPI_CHECK(MPI_Comm_free(&t->local));
    if (t->world != MPI_COMM_NULL && t->world) MPI_CHECK(MPI_Comm_free(&t->world));
    return HPCDL_OK;
}

int hpcdl_team_wait(const hpcdl_team *t, MPI_Request *req) {
    if (!t->polite) return MPI_Wait(req, MPI_STATUS_IGNORE);
    long sleep_ns = 2000;
    for (unsigned spins = 0;; spins++) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if (spins < 64) continue; // a message due any moment: keep testing
        if (hpcdl_team_urgent(t)) { // the caller waits for us: its core is ours
            if ((spins & 63) == 0) sched_yield(); // still let other work on it run
            sleep_ns = 2000;
            continue;
        }
        // back off exponentially to 0.5 ms: a long wait (a peer still in its
        // backward pass) must not wake this core thousands of times a second
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 500000 && (spins & 15) == 0) sleep_ns *= 2;
    }
}

// ----------------------------------------------------------------------------
// context

int hpcdl_ctx_create(MPI_Comm comm, int local_size, hpcdl_ctx **out) {
    *out = NULL;
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&provided));
    hpcdl_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return hpcdl_fail(HPCDL_ERR_NOMEM, "context: out of memory");
    ctx->check = 1;
    ctx->thread_multiple = provided == MPI_THREAD_MULTIPLE;
    pthread_mutex_init(&ctx->mpi_lock, NULL);
    int rc = hpcdl_team_create(&ctx->main, comm, local_size);
    if (rc == HPCDL_OK) rc = hpcdl_team_create(&ctx->eng, comm, local_size);
    const char *polite = getenv("HPCDL_ENGINE_POLITE");
    ctx->eng.polite = !(polite && !strcmp(polite, "0"));
    ctx->eng.urgent = &ctx->waiters;
    if (rc == HPCDL_OK) rc = hpcdl_engine_start(ctx);
    if (rc == HPCDL_OK) rc = hpcdl_stall_start(ctx, comm);
    if (rc != HPCDL_OK) {
        free(ctx); // communicators of a half-built context are left to MPI_Finalize
        return rc;
    }
    *out = ctx;
    return HPCDL_OK;
}

int hpcdl_ctx_destroy(hpcdl_ctx *ctx) {
    if (!ctx) return HPCDL_OK;
    hpcdl_stall_stop(ctx);
    hpcdl_engine_stop(ctx);
    int rc = hpcdl_team_free(&ctx->eng);
    int rc2 = hpcdl_team_free(&ctx->main);
    pthread_mutex_destroy(&ctx->mpi_lock);
    free(ctx);
    return rc != HPCDL_OK ? rc : rc2;
}

int hpcdl_rank(const hpcdl_ctx *c) { return c->main.rank; }
int hpcdl_size(const hpcdl_ctx *c) { return c->main.size; }
int hpcdl_local_rank(const hpcdl_ctx *c) { return c->main.local_rank; }
int hpcdl_local_size(const hpcdl_ctx *c) { return c->main.local_size; }
int hpcdl_cross_rank(const hpcdl_ctx *c) { return c->main.cross_rank; }
int hpcdl_cross_size(const hpcdl_ctx *c) { return c->main.cross_size; }
void hpcdl_set_check(hpcdl_ctx *c, int enabled) { c->check = enabled != 0; }

void hpcdl_set_chunk_bytes(hpcdl_ctx *c, size_t bytes) {
    if (bytes < 64) bytes = 64;
    c->main.chunk_bytes = bytes;
    c->eng.chunk_bytes = bytes;
}

// ----------------------------------------------------------------------------
// MPI's own collectives, for algo = mpi

static void half_op(void *in, void *inout, int *len, MPI_Datatype *dt, hpcdl_dtype d,
                    hpcdl_op op) {
    (void)dt;
    hpcdl_reduce_local(inout, inout, in, (size_t)*len, d, op);
}
#define HALF_OP_FN(D, O, NAME)                                                 \
    static void NAME(void *in, void *inout, int *len, MPI_Datatype *dt) {      \
        half_op(in, inout, len, dt, D, O);                                     \
    }
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_SUM, f16_sum)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_MIN, f16_min)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_MAX, f16_max)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_PROD, f16_prod)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_SUM, bf16_sum)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_MIN, bf16_min)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_MAX, bf16_max)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_PROD, bf16_prod)

MPI_Datatype hpcdl_mpi_dtype(hpcdl_dtype d) {
    switch (d) {
    case HPCDL_FLOAT32: return MPI_FLOAT;
    case HPCDL_FLOAT64: return MPI_DOUBLE;
    case HPCDL_INT32: return MPI_INT32_T;
    case HPCDL_INT64: return MPI_INT64_T;
    default: return MPI_UINT16_T; // 16-bit floats travel as raw bits
    }
}

// MPI has no 16-bit float ops: user-defined ones are created once and kept.
int hpcdl_mpi_op(hpcdl_dtype d, hpcdl_op op, MPI_Op *out) {
    static MPI_Op half_ops[2][HPCDL_NUM_OPS];
    static int created[2][HPCDL_NUM_OPS];
    static MPI_User_function *fns[2][HPCDL_NUM_OPS] = {
        {f16_sum, f16_sum, f16_min, f16_max, f16_prod},
        {bf16_sum, bf16_sum, bf16_min, bf16_max, bf16_prod}};
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (d == HPCDL_FLOAT16 || d == HPCDL_BFLOAT16) {
        int h = d == HPCDL_BFLOAT16;
        pthread_mutex_lock(&lock);
        int rc = MPI_SUCCESS;
        if (!created[h][op]) rc = MPI_Op_create(fns[h][op], 1, &half_ops[h][op]);
        if (rc == MPI_SUCCESS) created[h][op] = 1;
        pthread_mutex_unlock(&lock);
        MPI_CHECK(rc);
        *out = half_ops[h][op];
        return HPCDL_OK;
    }
    switch (op) {
    case HPCDL_SUM:
    case HPCDL_AVERAGE: *out = MPI_SUM; break;
    case HPCDL_MIN: *out = MPI_MIN; break;
    case HPCDL_MAX: *out = MPI_MAX; break;
    default: *out = MPI_PROD; break;
    }
    return HPCDL_OK;
}

// MPI_Allreduce in pieces of at most 2^30 elements (MPI counts are int), on
// host or (CUDA-aware MPI) device buffers. AVERAGE reduces like SUM here: the
// division is the caller's, who knows where the data lives.
int hpcdl_mpi_allreduce_pieces(hpcdl_team *t, const void *send, void *recv, size_t count,
                               hpcdl_dtype dtype, hpcdl_op op) {
    MPI_Op mop;
    HPCDL_TRY(hpcdl_mpi_op(dtype, op, &mop));
    size_t esz = hpcdl_dtype_size(dtype), piece = (size_t)1 << 30;
    for (size_t base = 0; base < count; base += piece) {
        int n = (int)(count - base < piece ? count - base : piece);
        char *r = (char *)recv + base * esz;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + base * esz;
        if (t->polite) {
            MPI_Request rq;
            MPI_CHECK(MPI_Iallreduce(s, r, n, hpcdl_mpi_dtype(dtype), mop, t->world, &rq));
            MPI_CHECK(hpcdl_team_wait(t, &rq));
        } else {
            MPI_CHECK(MPI_Allreduce(s, r, n, hpcdl_mpi_dtype(dtype), mop, t->world));
        }
    }
    return HPCDL_OK;
}

static int mpi_allreduce(hpcdl_team *t, const void *send, void *recv, size_t count,
                         hpcdl_dtype dtype, hpcdl_op op) {
    HPCDL_TRY(hpcdl_mpi_allreduce_pieces(t, send, recv, count, dtype, op));
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(recv, count, dtype, t->size);
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// agreement check: one small all-reduce of (sig, -sig) with MAX gives the max
// and min of every field; only when they differ are the values gathered to
// name the ranks. Every rank builds the same message, so all of them fail.

#define MAX_SIG 8

static void describe(char *buf, size_t len, const char *field, int64_t v) {
    if (!strcmp(field, "dtype")) snprintf(buf, len, "%s", hpcdl_dtype_name((hpcdl_dtype)v));
    else if (!strcmp(field, "op")) snprintf(buf, len, "%s", hpcdl_op_name((hpcdl_op)v));
    else if (!strcmp(field, "algorithm")) snprintf(buf, len, "%s", hpcdl_algo_name((hpcdl_algo)v));
    else if (!strcmp(field, "valid")) snprintf(buf, len, "%s", v ? "ok" : "bad buffer");
    else snprintf(buf, len, "%lld", (long long)v);
}

static int mismatch(const hpcdl_team *t, const char *what, const int64_t *all, int nsig,
                    int bad, const char *const *names) {
    char msg[900], val[48];
    int pos = snprintf(msg, sizeof msg, "%s: ranks disagree on %s:", what, names[bad]);
    for (int r = 0; r < t->size && pos < (int)sizeof msg - 64; r++) {
        if (r >= 16 && r < t->size - 1) { // long jobs: first 16 and the last
            if (r == 16) pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " ...");
            continue;
        }
        describe(val, sizeof val, names[bad], all[(size_t)r * (size_t)nsig + (size_t)bad]);
        pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " rank %d=%s%s", r, val,
                        r < t->size - 1 ? "," : "");
    }
    return hpcdl_fail(HPCDL_ERR_MISMATCH,
                      "%s. Hint: every rank must call the same collectives in the same "
                      "order with the same count, dtype and op.", msg);
}

// All ranks on one node: the signatures meet in shared memory at one spin
// barrier (~0.3 us) instead of an MPI all-reduce. Slots alternate with the
// barrier's parity, so a fast rank writing its next signature never
// overwrites one a slower rank is still reading (it cannot pass the next
// barrier before that rank does).
static int check_agree_shm(const hpcdl_team *t, const char *what, const int64_t *sig,
                           int nsig, const char *const *names) {
    hpcdl_shm *s = t->shm;
    int parity = (int)((s->epoch + 1) & 1);
    memcpy(hpcdl_shm_sig(s, t->local_rank, parity), sig, sizeof(int64_t) * (size_t)nsig);
    HPCDL_TRY(hpcdl_shm_barrier((hpcdl_team *)t));
    int bad = -1;
    for (int i = 0; i < nsig && bad < 0; i++)
        for (int j = 0; j < t->local_size; j++)
            if (hpcdl_shm_sig(s, j, parity)[i] != hpcdl_shm_sig(s, 0, parity)[i]) bad = i;
    if (bad < 0) return HPCDL_OK;
    int64_t all[MAX_SIG * 64];
    for (int j = 0; j < t->local_size; j++)
        memcpy(all + (size_t)j * (size_t)nsig, hpcdl_shm_sig(s, j, parity),
               sizeof(int64_t) * (size_t)nsig);
    return mismatch(t, what, all, nsig, bad, names);
}

int hpcdl_check_agree(const hpcdl_team *t, const char *what, const int64_t *sig, int nsig,
                      const char *const *names) {
    if (t->shm && t->cross_size == 1 && t->local_size <= 64)
        return check_agree_shm(t, what, sig, nsig, names);
    int64_t mm[2 * MAX_SIG];
    for (int i = 0; i < nsig; i++) {
        mm[i] = sig[i];
        mm[nsig + i] = -sig[i];
    }
    if (t->polite) { // the engine: other ranks may arrive much later
        MPI_Request rq;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, mm, 2 * nsig, MPI_INT64_T, MPI_MAX, t->world,
                                 &rq));
        MPI_CHECK(hpcdl_team_wait(t, &rq));
    } else {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * nsig, MPI_INT64_T, MPI_MAX, t->world));
    }
    int bad = -1;
    for (int i = 0; i < nsig && bad < 0; i++)
        if (mm[i] != -mm[nsig + i]) bad = i;
    if (bad < 0) return HPCDL_OK;
    int64_t *all = malloc(sizeof(int64_t) * (size_t)nsig * (size_t)t->size);
    if (!all) return hpcdl_fail(HPCDL_ERR_NOMEM, "agreement check: out of memory");
    int rc = MPI_Allgather(sig, nsig, MPI_INT64_T, all, nsig, MPI_INT64_T, t->world);
    if (rc == MPI_SUCCESS) rc = mismatch(t, what, all, nsig, bad, names);
    else rc = hpcdl_mpi_fail(rc, "MPI_Allgather", __FILE__, __LINE__);
    free(all);
    return rc;
}

// ----------------------------------------------------------------------------
// algorithm choice and dispatch

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

// Measured on one node (BENCHMARKS.md): the shared-memory path wins from the
// smallest messages up to a few MiB (no MPI matching, one spin barrier);
// above that MPI's single-copy point-to-point makes the ring move fewer bytes.
// Across nodes, small messages are latency-bound and MPI's trees win.
static hpcdl_algo choose(const hpcdl_team *t, size_t bytes) {
    int shm = t->local_size > 1 && t->uniform;
    if (t->cross_size == 1 && shm) // one node
        return bytes < auto_ring_above() ? HPCDL_ALGO_HIER : HPCDL_ALGO_RING;
    if (bytes < auto_mpi_below()) return HPCDL_ALGO_MPI;
    return shm ? HPCDL_ALGO_HIER : HPCDL_ALGO_RING;
}

hpcdl_algo hpcdl_choose_algo(const hpcdl_ctx *ctx, size_t bytes) {
    return choose(&ctx->main, bytes);
}

// Runs one all-reduce on team t (the caller's or the engine's); `used` gets
// the algorithm that really ran. Agreement check first when enabled.
int hpcdl_dispatch_allreduce(hpcdl_ctx *ctx, hpcdl_team *t, const hpcdl_shared_buf *shared,
                             const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                             hpcdl_op op, hpcdl_algo algo, hpcdl_algo *used) {
    size_t bytes = count * hpcdl_dtype_size(dtype);
    if (ctx->check) {
        static const char *const names[] = {"valid", "count", "dtype", "op", "algorithm",
                                            "shared buffer (-1: none)"};
        int64_t sig[] = {1, (int64_t)count, dtype, op, algo, hpcdl_shared_id(shared)};
        HPCDL_TRY(hpcdl_check_agree(t, "allreduce", sig, 6, names));
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
    if (hpcdl_is_device_ptr(recv) || (send != recv && hpcdl_is_device_ptr(send)))
        return hpcdl_cuda_allreduce(ctx, t, send, recv, count, dtype, op, algo);
#endif
    switch (algo) {
    case HPCDL_ALGO_MPI: return mpi_allreduce(t, send, recv, count, dtype, op);
    case HPCDL_ALGO_HIER: return hpcdl_hier_allreduce(t, send, recv, count, dtype, op);
    default: return hpcdl_ring_allreduce(t, t->world, send, recv, count, dtype, op);
    }
}

// ----------------------------------------------------------------------------
// public blocking collectives

int hpcdl_check_enums(const char *what, hpcdl_dtype d, hpcdl_op op, hpcdl_algo a) {
    if ((unsigned)d >= HPCDL_NUM_DTYPES || (unsigned)op >= HPCDL_NUM_OPS ||
        (unsigned)a >= HPCDL_NUM_ALGOS)
        return hpcdl_fail(HPCDL_ERR_ARG, "%s: dtype %d, op %d or algorithm %d out of range",
                          what, (int)d, (int)op, (int)a);
    return HPCDL_OK;
}

// Serialises MPI between the caller's and the engine's thread when MPI did
// not grant MPI_THREAD_MULTIPLE.
#define LOCKED(ctx, expr)                                                      \
    ({                                                                         \
        if (!(ctx)->thread_multiple) pthread_mutex_lock(&(ctx)->mpi_lock);     \
        int rc_ = (expr);                                                      \
        if (!(ctx)->thread_multiple) pthread_mutex_unlock(&(ctx)->mpi_lock);   \
        rc_;                                                                   \
    })

int hpcdl_shared_alloc(hpcdl_ctx *ctx, size_t bytes, void **ptr) {
    return LOCKED(ctx, hpcdl_shared_alloc_locked(ctx, bytes, ptr));
}

int hpcdl_allreduce(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                    hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("allreduce", dtype, op, algo));
    hpcdl_team *t = &ctx->main;
    hpcdl_shared_buf *shared =
        hpcdl_shared_for(ctx, t, send, recv, count * hpcdl_dtype_size(dtype), algo);
    if (shared && t->cross_size == 1) { // one node: publish, then work stealing
        uint32_t gen = hpcdl_shared_publish(shared, t->local_rank, count, dtype, op);
        return LOCKED(ctx, hpcdl_shared_steal_allreduce(t, shared, gen, count, dtype, op));
    }
    return LOCKED(ctx, hpcdl_dispatch_allreduce(ctx, t, shared, send, recv, count, dtype,
                                                op, algo, NULL));
}

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
    if (algo == HPCDL_ALGO_MPI) {
        MPI_Op mop;
        HPCDL_TRY(hpcdl_mpi_op(dtype, op, &mop));
        int *rc = malloc(sizeof(int) * (size_t)t->size);
        if (!rc) return hpcdl_fail(HPCDL_ERR_NOMEM, "reduce_scatter: out of memory");
        for (int i = 0; i < t->size; i++) rc[i] = (int)counts[i];
        int err = MPI_Reduce_scatter(send, recv, rc, hpcdl_mpi_dtype(dtype), mop, t->world);
        free(rc);
        if (err != MPI_SUCCESS) return hpcdl_mpi_fail(err, "MPI_Reduce_scatter", __FILE__, __LINE__);
        if (op == HPCDL_AVERAGE) hpcdl_divide_local(recv, counts[t->rank], dtype, t->size);
        return HPCDL_OK;
    }
    return hpcdl_ring_reduce_scatter(t, t->world, send, recv, counts, dtype, op);
}

int hpcdl_reduce_scatter(hpcdl_ctx *ctx, const void *send, void *recv,
                         const size_t *recvcounts, hpcdl_dtype dtype, hpcdl_op op,
                         hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("reduce_scatter", dtype, op, algo));
    return LOCKED(ctx, hpcdl_dispatch_reduce_scatter(ctx, &ctx->main, send, recv, recvcounts,
                                                     dtype, op, algo));
}

int hpcdl_dispatch_allgatherv(hpcdl_ctx *ctx, hpcdl_team *t, const void *send, void *recv,
                              const size_t *counts, hpcdl_dtype dtype, hpcdl_algo algo) {
    if (ctx->check) {
        static const char *const names[] = {"valid", "counts (hash)", "dtype", "algorithm"};
        int64_t sig[] = {1, (int64_t)hash_counts(counts, t->size), dtype, algo};
        HPCDL_TRY(hpcdl_check_agree(t, "allgather", sig, 4, names));
    }
    if (algo == HPCDL_ALGO_MPI) {
        int *rc = malloc(sizeof(int) * 2 * (size_t)t->size);
        if (!rc) return hpcdl_fail(HPCDL_ERR_NOMEM, "allgather: out of memory");
        int *displs = rc + t->size, off = 0;
        for (int i = 0; i < t->size; i++) {
            rc[i] = (int)counts[i];
            displs[i] = off;
            off += rc[i];
        }
        int err = MPI_Allgatherv(send, rc[t->rank], hpcdl_mpi_dtype(dtype), recv, rc, displs,
                                 hpcdl_mpi_dtype(dtype), t->world);
        free(rc);
        if (err != MPI_SUCCESS) return hpcdl_mpi_fail(err, "MPI_Allgatherv", __FILE__, __LINE__);
        return HPCDL_OK;
    }
    return hpcdl_ring_allgatherv(t, t->world, send, recv, counts, dtype);
}

int hpcdl_allgatherv(hpcdl_ctx *ctx, const void *send, void *recv, const size_t *counts,
                     hpcdl_dtype dtype, hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("allgather", dtype, HPCDL_SUM, algo));
    return LOCKED(ctx, hpcdl_dispatch_allgatherv(ctx, &ctx->main, send, recv, counts, dtype,
                                                 algo));
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
                                   count * hpcdl_dtype_size(dtype) < auto_ring_above())) {
        size_t esz = hpcdl_dtype_size(dtype), piece = (size_t)1 << 30;
        for (size_t base = 0; base < count; base += piece) {
            int n = (int)(count - base < piece ? count - base : piece);
            MPI_Request rq;
            MPI_CHECK(MPI_Ibcast((char *)buf + base * esz, n, hpcdl_mpi_dtype(dtype), root,
                                 t->world, &rq));
            MPI_CHECK(hpcdl_team_wait(t, &rq));
        }
        return HPCDL_OK;
    }
    return hpcdl_ring_broadcast(t, t->world, buf, count, dtype, root);
}

int hpcdl_broadcast(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype dtype, int root,
                    hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("broadcast", dtype, HPCDL_SUM, algo));
    return LOCKED(ctx, hpcdl_dispatch_broadcast(ctx, &ctx->main, buf, count, dtype, root, algo));
}

// A rank whose buffer failed validation joins the agreement check with
// valid = 0, so every other rank fails too instead of waiting for it.
int hpcdl_check_invalid(const hpcdl_team *t, const char *what, int nsig) {
    static const char *const names[] = {"valid", "x", "x", "x", "x", "x"};
    int64_t sig[6] = {0, 0, 0, 0, 0, 0};
    if (nsig < 1 || nsig > 6) nsig = 5;
    return hpcdl_check_agree(t, what, sig, nsig, names);
}

int hpcdl_report_invalid(hpcdl_ctx *ctx, const char *what, int nsig) {
    return LOCKED(ctx, hpcdl_check_invalid(&ctx->main, what, nsig));
}
