/*
 * context.c - the context a C or Python user holds: creating it (two teams of
 * communicators, the engine thread, the stall inspector) and destroying it,
 * its topology and settings, and the public blocking collectives, which
 * check their arguments and run on the caller's team (dispatch.c).
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "engine.h"

// ----------------------------------------------------------------------------
// context

// Collective over comm. Preconditions across ranks: the same local_size.
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
    if (rc == HPCDL_OK) rc = hpcdl_ft_setup(ctx);
    if (rc == HPCDL_OK) rc = hpcdl_engine_start(ctx);
    if (rc == HPCDL_OK) rc = hpcdl_stall_start(ctx, comm);
    if (rc != HPCDL_OK) {
        free(ctx); // communicators of a half-built context are left to MPI_Finalize
        return rc;
    }
    *out = ctx;
    return HPCDL_OK;
}

// Collective over the context (frees its communicators): every rank, after
// its last collective on it. A lost context (fault.c) is abandoned instead.
int hpcdl_ctx_destroy(hpcdl_ctx *ctx) {
    if (!ctx) return HPCDL_OK;
    if (hpcdl_ctx_is_lost(ctx)) { // a peer is gone: nothing collective can finish
        hpcdl_ctx_abandon(ctx);
        return HPCDL_OK;
    }
    hpcdl_stall_stop(ctx);
    hpcdl_engine_stop(ctx);
    int rc = hpcdl_team_free(&ctx->eng);
    int rc2 = hpcdl_team_free(&ctx->main);
    pthread_mutex_destroy(&ctx->mpi_lock);
    free(ctx->hosts);
    free(ctx);
    return rc != HPCDL_OK ? rc : rc2;
}

// local calls
int hpcdl_rank(const hpcdl_ctx *c) { return c->main.rank; }
int hpcdl_size(const hpcdl_ctx *c) { return c->main.size; }
int hpcdl_local_rank(const hpcdl_ctx *c) { return c->main.local_rank; }
int hpcdl_local_size(const hpcdl_ctx *c) { return c->main.local_size; }
int hpcdl_cross_rank(const hpcdl_ctx *c) { return c->main.cross_rank; }
int hpcdl_cross_size(const hpcdl_ctx *c) { return c->main.cross_size; }
void hpcdl_set_check(hpcdl_ctx *c, int enabled) { c->check = enabled != 0; }

void hpcdl_blocking_begin(hpcdl_ctx *c, const char *name) { hpcdl_engine_blocking_begin(c, name); }

void hpcdl_blocking_end(hpcdl_ctx *c) { hpcdl_engine_blocking_end(c); }

void hpcdl_set_chunk_bytes(hpcdl_ctx *c, size_t bytes) {
    if (bytes < 64) bytes = 64;
    c->main.chunk_bytes = bytes;
    c->eng.chunk_bytes = bytes;
}

// ----------------------------------------------------------------------------
// public blocking collectives. Each is collective over the context; the
// preconditions across ranks are those in hpcdl.h (same calls in the same
// order, same count, dtype, op, algo), checked by the agreement check.

// Local call: enums in range, before anything reaches MPI.
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

// This rank's own failure (err, message set) before the collective: its
// peers are told through the agreement check, then the rank returns its own
// message rather than the check's.
int hpcdl_fail_together(hpcdl_ctx *ctx, hpcdl_team *t, const char *what, int nsig, int err) {
    char own[1024];
    snprintf(own, sizeof own, "%s", hpcdl_last_error());
    if (ctx->check) (void)LOCKED(ctx, hpcdl_check_invalid(t, what, nsig));
    return hpcdl_fail(err, "%s", own);
}

// A blocking collective, counted for the stall inspector while it runs;
// on a context that lost a peer (fault.c) it fails without running, and a
// lost peer seen while it runs makes the context lost.
#define TRACKED(ctx, name, expr)                                               \
    ({                                                                         \
        int rc__ = hpcdl_ft_refuse(ctx, name, NULL);                           \
        if (rc__ == HPCDL_OK) {                                                \
            hpcdl_engine_blocking_begin(ctx, name);                            \
            rc__ = hpcdl_ft_result(ctx, (expr), name, NULL);                   \
            hpcdl_engine_blocking_end(ctx);                                    \
        }                                                                      \
        rc__;                                                                  \
    })

static int allreduce_mem(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                         hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                         const hpcdl_mem *mem) {
    hpcdl_team *t = &ctx->main;
    size_t bytes = count * hpcdl_dtype_size(dtype);
    hpcdl_where where;
    int rc = hpcdl_where_resolve(send, recv, bytes, mem, &where);
    if (rc != HPCDL_OK) return hpcdl_fail_together(ctx, t, "allreduce", HPCDL_ALLREDUCE_SIG, rc);
    hpcdl_shared_buf *shared =
        where.device < 0 ? hpcdl_shared_for(ctx, t, send, recv, bytes, algo) : NULL;
    if (shared && t->cross_size == 1) { // one node: publish, then work stealing
        uint32_t gen = hpcdl_shared_publish(shared, t->local_rank, count, dtype, op);
        return LOCKED(ctx, hpcdl_shared_steal_allreduce(t, shared, gen, count, dtype, op));
    }
    rc = LOCKED(ctx, hpcdl_dispatch_allreduce(ctx, t, shared, send, recv, count, dtype, op,
                                              algo, &where, NULL));
    hpcdl_where_release(&where);
    return rc;
}

int hpcdl_allreduce_mem(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                        const hpcdl_mem *mem) {
    HPCDL_TRY(hpcdl_check_enums("allreduce", dtype, op, algo));
    return TRACKED(ctx, "allreduce", allreduce_mem(ctx, send, recv, count, dtype, op, algo,
                                                   mem));
}

int hpcdl_allreduce(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                    hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo) {
    return hpcdl_allreduce_mem(ctx, send, recv, count, dtype, op, algo, NULL);
}

int hpcdl_reduce_scatter(hpcdl_ctx *ctx, const void *send, void *recv,
                         const size_t *recvcounts, hpcdl_dtype dtype, hpcdl_op op,
                         hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("reduce_scatter", dtype, op, algo));
    return TRACKED(ctx, "reduce_scatter",
                   LOCKED(ctx, hpcdl_dispatch_reduce_scatter(ctx, &ctx->main, send, recv,
                                                             recvcounts, dtype, op, algo)));
}

int hpcdl_allgatherv(hpcdl_ctx *ctx, const void *send, void *recv, const size_t *counts,
                     hpcdl_dtype dtype, hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("allgather", dtype, HPCDL_SUM, algo));
    return TRACKED(ctx, "allgather",
                   LOCKED(ctx, hpcdl_dispatch_allgatherv(ctx, &ctx->main, send, recv, counts,
                                                         dtype, algo)));
}

int hpcdl_broadcast(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype dtype, int root,
                    hpcdl_algo algo) {
    HPCDL_TRY(hpcdl_check_enums("broadcast", dtype, HPCDL_SUM, algo));
    return TRACKED(ctx, "broadcast", LOCKED(ctx, hpcdl_dispatch_broadcast(ctx, &ctx->main, buf,
                                                                           count, dtype, root,
                                                                           algo)));
}

// A rank whose arguments failed validation (in Python) joins the agreement
// check with valid = 0 (agree.c), so the others fail instead of waiting.
int hpcdl_report_invalid(hpcdl_ctx *ctx, const char *what, int nsig) {
    return TRACKED(ctx, what, LOCKED(ctx, hpcdl_check_invalid(&ctx->main, what, nsig)));
}
