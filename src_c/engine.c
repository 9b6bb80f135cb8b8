/*
 * engine.c - one background thread owns the non-blocking collectives.
 *
 * The caller's thread queues work items (hpcdl_allreduce_async) and gets a
 * handle; the engine pops them in FIFO order and runs them on its own team
 * of communicators, so every rank executes them in submission order and no
 * message can match a blocking call made meanwhile on the caller's thread.
 * Finished items stay until hpcdl_wait releases them; each leaves one
 * timeline record (name, bytes, algorithm, submit / start / end times).
 *
 * Without MPI_THREAD_MULTIPLE the two threads take turns through
 * ctx->mpi_lock; below MPI_THREAD_SERIALIZED there is no thread at all and
 * work runs at submission (still correct, just not overlapped).
 */
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "engine.h"

#define TIMELINE_CAP 65536

typedef enum { W_ALLREDUCE, W_REDUCE_SCATTER, W_ALLGATHERV, W_BROADCAST } work_kind;
static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather",
                                         "broadcast"};

typedef struct work {
    hpcdl_handle h;
    work_kind kind;
    const void *send;
    void *recv;
    size_t count;         // all-reduce, broadcast: elements; others: sum of counts
    size_t *counts;       // reduce-scatter, all-gather: one per rank (owned copy)
    int root;             // broadcast
    hpcdl_dtype dtype;
    hpcdl_op op;
    hpcdl_algo algo;
    int valid;            // 0: this rank's buffer failed validation
    int own_rc;           // !valid: this rank's own error (message in err), or 0
    hpcdl_where where;    // all-reduce: host or GPU, and the producer's ready event
    hpcdl_shared_buf *shared; // all-reduce of a node shared buffer (shared.c)
    uint32_t gen;         // its generation, published at submission (one node)
    char name[64];
    int done, status;
    int used_algo;
    char err[1024];
    double t_submit, t_start, t_agreed, t_end;
    struct work *qnext;   // pending queue
    struct work *anext;   // every item not yet released by hpcdl_wait
} work;

struct hpcdl_engine {
    pthread_t thread;
    int threaded;           // 0: work runs at submission
    pthread_mutex_t mu;
    pthread_cond_t cv_work; // queue became non-empty, or stop
    pthread_cond_t cv_done; // an item finished
    work *qhead, *qtail;
    work *all;
    int stop;
    hpcdl_handle next_handle;
    hpcdl_timeline_rec *tl; // ring buffer of finished records
    size_t tl_head, tl_len;
    work *running;          // the item the engine thread works on, if any
    int64_t submitted, completed;
    int blocking;           // the caller's thread is in a blocking collective
    double blocking_since;  // its MPI_Wtime at entry
    char blocking_name[48];
};

// ----------------------------------------------------------------------------
// running one item (engine thread, or caller's thread when not threaded)

// fields of each kind's agreement-check signature (dispatch.c)
static int sig_fields(work_kind k) {
    return k == W_ALLGATHERV ? 4 : k == W_ALLREDUCE ? HPCDL_ALLREDUCE_SIG : 5;
}

static int dispatch(hpcdl_ctx *ctx, work *w, hpcdl_algo *used) {
    hpcdl_team *t = &ctx->eng;
    if (!w->valid) // join the agreement check as the rank with a bad buffer
        return hpcdl_check_invalid(t, kind_names[w->kind], sig_fields(w->kind));
    switch (w->kind) {
    case W_ALLREDUCE:
        if (w->shared && t->cross_size == 1) { // published at submission (shared.c)
            *used = HPCDL_USED_SHARED;
            return hpcdl_shared_steal_allreduce(t, w->shared, w->gen, w->count, w->dtype,
                                                w->op);
        }
        return hpcdl_dispatch_allreduce(ctx, t, w->shared, w->send, w->recv, w->count,
                                        w->dtype, w->op, w->algo, &w->where, used);
    case W_REDUCE_SCATTER:
        return hpcdl_dispatch_reduce_scatter(ctx, t, w->send, w->recv, w->counts, w->dtype,
                                             w->op, w->algo);
    case W_ALLGATHERV:
        return hpcdl_dispatch_allgatherv(ctx, t, w->send, w->recv, w->counts, w->dtype,
                                         w->algo);
    default:
        return hpcdl_dispatch_broadcast(ctx, t, w->recv, w->count, w->dtype, w->root, w->algo);
    }
}

static void run_work(hpcdl_ctx *ctx, work *w) {
    w->t_start = MPI_Wtime();
    if (!ctx->thread_multiple) pthread_mutex_lock(&ctx->mpi_lock);
    hpcdl_algo used = w->algo;
    ctx->eng.t_agreed = 0;
    w->status = hpcdl_ft_refuse(ctx, kind_names[w->kind], w->name); // a lost peer (fault.c)
    if (w->status == HPCDL_OK) w->status = dispatch(ctx, w, &used);
    w->t_agreed = ctx->eng.t_agreed > 0 ? ctx->eng.t_agreed : w->t_start;
    if (!ctx->thread_multiple) pthread_mutex_unlock(&ctx->mpi_lock);
    w->status = hpcdl_ft_result(ctx, w->status, kind_names[w->kind], w->name);
    w->t_end = MPI_Wtime();
    w->used_algo = used;
    hpcdl_where_release(&w->where);
    if (w->own_rc && w->status != HPCDL_ERR_PROC_FAILED)
        w->status = w->own_rc; // its own message is in err already
    else if (w->status != HPCDL_OK) snprintf(w->err, sizeof w->err, "%s", hpcdl_last_error());
}

static void record(hpcdl_engine *e, const work *w) {
    size_t idx = (e->tl_head + e->tl_len) % TIMELINE_CAP;
    if (e->tl_len == TIMELINE_CAP) e->tl_head = (e->tl_head + 1) % TIMELINE_CAP; // drop oldest
    else e->tl_len++;
    hpcdl_timeline_rec *r = &e->tl[idx];
    r->handle = w->h;
    memcpy(r->name, w->name, sizeof r->name);
    r->bytes = w->count * hpcdl_dtype_size(w->dtype);
    r->algo = w->used_algo;
    r->t_submit = w->t_submit;
    r->t_start = w->t_start;
    r->t_agreed = w->t_agreed;
    r->t_end = w->t_end;
    r->status = w->status;
}

#ifdef __linux__
// Asks the scheduler for short time slices (Linux >= 6.12, EEVDF; older
// kernels ignore the hint). The engine sleeps while this rank's backward pass
// runs on the same core; a short slice gives it an early deadline, so when a
// peer's message arrives it preempts the compute thread at once instead of
// waiting out the compute thread's slice (milliseconds per wake-up otherwise).
// HPCDL_ENGINE_SLICE_US sets it (default 100, 0 = leave the default).
static void request_short_slice(void) {
    const char *env = getenv("HPCDL_ENGINE_SLICE_US");
    long us = env && *env ? atol(env) : 100;
    if (us <= 0) return;
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } attr = {sizeof attr, SCHED_OTHER, 0, 0, 0, (uint64_t)us * 1000, 0, 0};
    (void)syscall(SYS_sched_setattr, 0, &attr, 0); // a hint: failure changes nothing
}
#endif

static void *engine_main(void *arg) {
    hpcdl_ctx *ctx = arg;
    hpcdl_engine *e = ctx->engine;
#ifdef __linux__
    // the engine's short polite sleeps (team wait) should last microseconds,
    // not the default 50 us timer slack
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    request_short_slice();
#endif
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->qhead && !e->stop) pthread_cond_wait(&e->cv_work, &e->mu);
        if (!e->qhead) break; // stop requested and queue drained
        work *w = e->qhead;
        e->qhead = w->qnext;
        if (!e->qhead) e->qtail = NULL;
        e->running = w;
        pthread_mutex_unlock(&e->mu); // the collective runs without the queue lock
        run_work(ctx, w);
        pthread_mutex_lock(&e->mu);
        e->running = NULL;
        e->completed++;
        w->done = 1;
        record(e, w);
        pthread_cond_broadcast(&e->cv_done);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static void free_work(work *w) {
    hpcdl_where_release(&w->where);
    free(w->counts);
    free(w);
}

// ----------------------------------------------------------------------------
// start / stop

int hpcdl_engine_start(hpcdl_ctx *ctx) {
    hpcdl_engine *e = calloc(1, sizeof *e);
    if (!e) return hpcdl_fail(HPCDL_ERR_NOMEM, "engine: out of memory");
    e->tl = calloc(TIMELINE_CAP, sizeof *e->tl);
    if (!e->tl) {
        free(e);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "engine: out of memory");
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_work, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    e->next_handle = 1;
    ctx->engine = e;
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    e->threaded = provided >= MPI_THREAD_SERIALIZED;
    if (e->threaded && pthread_create(&e->thread, NULL, engine_main, ctx) != 0)
        e->threaded = 0; // no thread: still correct, just not overlapped
    return HPCDL_OK;
}

void hpcdl_engine_stop(hpcdl_ctx *ctx) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return;
    if (e->threaded) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv_work);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (work *w = e->all, *next; w; w = next) {
        next = w->anext;
        free_work(w);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv_work);
    pthread_cond_destroy(&e->cv_done);
    free(e->tl);
    free(e);
    ctx->engine = NULL;
}

// ----------------------------------------------------------------------------
// public API

static int submit(hpcdl_ctx *ctx, work *w, hpcdl_handle *out) {
    hpcdl_engine *e = ctx->engine;
    if (!e) {
        const char *what = kind_names[w->kind];
        free_work(w);
        return hpcdl_fail(HPCDL_ERR_STATE, "%s: the context was shut down", what);
    }
    w->t_submit = MPI_Wtime();
    pthread_mutex_lock(&e->mu);
    w->h = e->next_handle++;
    e->submitted++;
    w->anext = e->all;
    e->all = w;
    *out = w->h;
    if (e->threaded) {
        if (e->qtail) e->qtail->qnext = w;
        else e->qhead = w;
        e->qtail = w;
        pthread_cond_signal(&e->cv_work);
        pthread_mutex_unlock(&e->mu);
        return HPCDL_OK;
    }
    pthread_mutex_unlock(&e->mu);
    run_work(ctx, w);
    pthread_mutex_lock(&e->mu);
    e->completed++;
    w->done = 1;
    record(e, w);
    pthread_mutex_unlock(&e->mu);
    return HPCDL_OK;
}

static work *new_work(work_kind kind, hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                      const char *name) {
    work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->kind = kind;
    w->dtype = dtype;
    w->op = op;
    w->algo = algo;
    w->valid = 1;
    w->where.device = -1;
    snprintf(w->name, sizeof w->name, "%s", name ? name : kind_names[kind]);
    return w;
}

#define NEW_WORK_OR_FAIL(w, kind, what, d, o, a, name)                          \
    HPCDL_TRY(hpcdl_check_enums(what, d, o, a));                               \
    work *w = new_work(kind, d, o, a, name);                                   \
    if (!w) return hpcdl_fail(HPCDL_ERR_NOMEM, "%s: out of memory", what)

int hpcdl_allreduce_mem_async(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                              hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                              const hpcdl_mem *mem, const char *name, hpcdl_handle *out) {
    NEW_WORK_OR_FAIL(w, W_ALLREDUCE, "allreduce_async", dtype, op, algo, name);
    w->send = send;
    w->recv = recv;
    w->count = count;
    hpcdl_team *t = &ctx->eng;
    size_t bytes = count * hpcdl_dtype_size(dtype);
    // on the caller's thread: the ready event must be recorded now, on the
    // stream that produced send, not when the engine gets to it
    w->own_rc = hpcdl_where_resolve(send, recv, bytes, mem, &w->where);
    if (w->own_rc != HPCDL_OK) { // peers fail in the agreement check, we with our reason
        w->valid = 0;
        snprintf(w->err, sizeof w->err, "%s", hpcdl_last_error());
        return submit(ctx, w, out);
    }
    if (w->where.device < 0) w->shared = hpcdl_shared_for(ctx, t, send, recv, bytes, algo);
    if (w->shared && t->cross_size == 1 && ctx->engine) // peers may start on it from now on
        w->gen = hpcdl_shared_publish(w->shared, t->local_rank, count, dtype, op);
    return submit(ctx, w, out);
}

int hpcdl_allreduce_async(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                          hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo, const char *name,
                          hpcdl_handle *out) {
    return hpcdl_allreduce_mem_async(ctx, send, recv, count, dtype, op, algo, NULL, name, out);
}

// counts are copied: the caller's array may be gone before the engine runs
static int with_counts(hpcdl_ctx *ctx, work *w, const size_t *counts, hpcdl_handle *out) {
    int n = ctx->eng.size;
    w->counts = malloc(sizeof(size_t) * (size_t)n);
    if (!w->counts) {
        const char *what = kind_names[w->kind];
        free(w);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "%s: out of memory", what);
    }
    memcpy(w->counts, counts, sizeof(size_t) * (size_t)n);
    for (int i = 0; i < n; i++) w->count += counts[i];
    return submit(ctx, w, out);
}

int hpcdl_reduce_scatter_async(hpcdl_ctx *ctx, const void *send, void *recv,
                               const size_t *recvcounts, hpcdl_dtype dtype, hpcdl_op op,
                               hpcdl_algo algo, const char *name, hpcdl_handle *out) {
    NEW_WORK_OR_FAIL(w, W_REDUCE_SCATTER, "reduce_scatter_async", dtype, op, algo, name);
    w->send = send;
    w->recv = recv;
    return with_counts(ctx, w, recvcounts, out);
}

int hpcdl_allgatherv_async(hpcdl_ctx *ctx, const void *send, void *recv, const size_t *counts,
                           hpcdl_dtype dtype, hpcdl_algo algo, const char *name,
                           hpcdl_handle *out) {
    NEW_WORK_OR_FAIL(w, W_ALLGATHERV, "allgather_async", dtype, HPCDL_SUM, algo, name);
    w->send = send;
    w->recv = recv;
    return with_counts(ctx, w, counts, out);
}

int hpcdl_broadcast_async(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype dtype,
                          int root, hpcdl_algo algo, const char *name, hpcdl_handle *out) {
    NEW_WORK_OR_FAIL(w, W_BROADCAST, "broadcast_async", dtype, HPCDL_SUM, algo, name);
    w->recv = buf;
    w->count = count;
    w->root = root;
    return submit(ctx, w, out);
}

int hpcdl_async_invalid(hpcdl_ctx *ctx, const char *what, const char *name,
                        hpcdl_handle *out) {
    work_kind kind = W_ALLREDUCE;
    for (int k = 0; k < 4; k++)
        if (what && !strncmp(what, kind_names[k], strlen(kind_names[k]))) kind = (work_kind)k;
    work *w = new_work(kind, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO, name);
    if (!w) return hpcdl_fail(HPCDL_ERR_NOMEM, "%s: out of memory", what);
    w->valid = 0;
    return submit(ctx, w, out);
}

// For the stall inspector: counts, and the oldest unfinished items' names.
void hpcdl_engine_progress(hpcdl_ctx *ctx, hpcdl_progress *out) {
    hpcdl_engine *e = ctx->engine;
    memset(out, 0, sizeof *out);
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    out->submitted = e->submitted;
    out->completed = e->completed;
    int k = 0;
    const work *oldest = e->running ? e->running : e->qhead;
    if (oldest) out->waited_s = MPI_Wtime() - oldest->t_submit;
    else if (e->blocking) out->waited_s = MPI_Wtime() - e->blocking_since;
    if (e->running) snprintf(out->pending[k++], sizeof out->pending[0], "%.47s", e->running->name);
    for (const work *w = e->qhead; w && k < HPCDL_PROGRESS_NAMES; w = w->qnext)
        snprintf(out->pending[k++], sizeof out->pending[0], "%.47s", w->name);
    if (e->blocking && k < HPCDL_PROGRESS_NAMES) // submitted last: the caller waits in it
        snprintf(out->pending[k++], sizeof out->pending[0], "%.47s", e->blocking_name);
    pthread_mutex_unlock(&e->mu);
}

void hpcdl_engine_blocking_begin(hpcdl_ctx *ctx, const char *name) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->submitted++;
    e->blocking = 1;
    e->blocking_since = MPI_Wtime();
    snprintf(e->blocking_name, sizeof e->blocking_name, "%s (blocking)", name);
    pthread_mutex_unlock(&e->mu);
}

void hpcdl_engine_blocking_end(hpcdl_ctx *ctx) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->completed++;
    e->blocking = 0;
    pthread_mutex_unlock(&e->mu);
}

static work *find(hpcdl_engine *e, hpcdl_handle h, work ***link) {
    for (work **p = &e->all; *p; p = &(*p)->anext)
        if ((*p)->h == h) {
            if (link) *link = p;
            return *p;
        }
    return NULL;
}

int hpcdl_poll(hpcdl_ctx *ctx, hpcdl_handle h) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return hpcdl_fail(HPCDL_ERR_STATE, "poll: the context was shut down");
    pthread_mutex_lock(&e->mu);
    work *w = find(e, h, NULL);
    int done = w ? w->done : -1;
    pthread_mutex_unlock(&e->mu);
    if (done < 0) return hpcdl_fail(HPCDL_ERR_STATE, "poll: unknown handle %lld", (long long)h);
    return done;
}

int hpcdl_wait(hpcdl_ctx *ctx, hpcdl_handle h, char *errbuf, size_t errlen) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return hpcdl_fail(HPCDL_ERR_STATE, "wait: the context was shut down");
    pthread_mutex_lock(&e->mu);
    work **link = NULL, *w = find(e, h, &link);
    if (!w) {
        pthread_mutex_unlock(&e->mu);
        return hpcdl_fail(HPCDL_ERR_STATE, "wait: unknown handle %lld (already waited for?)",
                          (long long)h);
    }
    if (!w->done) {
        // tells the engine's waits that this thread's core is free (see
        // hpcdl_team_urgent): from here on it spins instead of sleeping
        __atomic_add_fetch(&ctx->waiters, 1, __ATOMIC_RELAXED);
        while (!w->done) pthread_cond_wait(&e->cv_done, &e->mu);
        __atomic_sub_fetch(&ctx->waiters, 1, __ATOMIC_RELAXED);
    }
    *link = w->anext;
    pthread_mutex_unlock(&e->mu);
    int status = w->status;
    if (status != HPCDL_OK) hpcdl_fail(status, "%s", w->err);
    if (errbuf && errlen) snprintf(errbuf, errlen, "%s", status == HPCDL_OK ? "" : w->err);
    free_work(w);
    return status;
}

size_t hpcdl_timeline_drain(hpcdl_ctx *ctx, hpcdl_timeline_rec *out, size_t max) {
    hpcdl_engine *e = ctx->engine;
    if (!e) return 0;
    pthread_mutex_lock(&e->mu);
    size_t n = e->tl_len < max ? e->tl_len : max;
    for (size_t i = 0; i < n; i++) out[i] = e->tl[(e->tl_head + i) % TIMELINE_CAP];
    e->tl_head = (e->tl_head + n) % TIMELINE_CAP;
    e->tl_len -= n;
    pthread_mutex_unlock(&e->mu);
    return n;
}
