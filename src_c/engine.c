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
#include "engine.h"

#define TIMELINE_CAP 65536

typedef struct work {
    hpcdl_handle h;
    const void *send;
    void *recv;
    size_t count;
    hpcdl_dtype dtype;
    hpcdl_op op;
    hpcdl_algo algo;
    int valid;            // 0: this rank's buffer failed validation
    char name[64];
    int done, status;
    int used_algo;
    char err[1024];
    double t_submit, t_start, t_end;
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
};

// ----------------------------------------------------------------------------
// running one item (engine thread, or caller's thread when not threaded)

static void run_work(hpcdl_ctx *ctx, work *w) {
    w->t_start = MPI_Wtime();
    if (!ctx->thread_multiple) pthread_mutex_lock(&ctx->mpi_lock);
    hpcdl_algo used = w->algo;
    if (!w->valid) {
        static const char *const names[] = {"valid", "x", "x", "x", "x"};
        int64_t sig[5] = {0, 0, 0, 0, 0};
        w->status = hpcdl_check_agree(&ctx->eng, "allreduce_async", sig, 5, names);
    } else {
        w->status = hpcdl_dispatch_allreduce(ctx, &ctx->eng, w->send, w->recv, w->count,
                                             w->dtype, w->op, w->algo, &used);
    }
    if (!ctx->thread_multiple) pthread_mutex_unlock(&ctx->mpi_lock);
    w->t_end = MPI_Wtime();
    w->used_algo = used;
    if (w->status != HPCDL_OK) snprintf(w->err, sizeof w->err, "%s", hpcdl_last_error());
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
    r->t_end = w->t_end;
    r->status = w->status;
}

static void *engine_main(void *arg) {
    hpcdl_ctx *ctx = arg;
    hpcdl_engine *e = ctx->engine;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->qhead && !e->stop) pthread_cond_wait(&e->cv_work, &e->mu);
        if (!e->qhead) break; // stop requested and queue drained
        work *w = e->qhead;
        e->qhead = w->qnext;
        if (!e->qhead) e->qtail = NULL;
        pthread_mutex_unlock(&e->mu); // the collective runs without the queue lock
        run_work(ctx, w);
        pthread_mutex_lock(&e->mu);
        w->done = 1;
        record(e, w);
        pthread_cond_broadcast(&e->cv_done);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
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
        free(w);
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
        free(w);
        return hpcdl_fail(HPCDL_ERR_STATE, "allreduce_async: the context was shut down");
    }
    w->t_submit = MPI_Wtime();
    pthread_mutex_lock(&e->mu);
    w->h = e->next_handle++;
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
    w->done = 1;
    record(e, w);
    pthread_mutex_unlock(&e->mu);
    return HPCDL_OK;
}

int hpcdl_allreduce_async(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                          hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo, const char *name,
                          hpcdl_handle *out) {
    if ((unsigned)dtype >= HPCDL_NUM_DTYPES || (unsigned)op >= HPCDL_NUM_OPS ||
        (unsigned)algo >= HPCDL_NUM_ALGOS)
        return hpcdl_fail(HPCDL_ERR_ARG, "allreduce_async: dtype, op or algorithm out of range");
    work *w = calloc(1, sizeof *w);
    if (!w) return hpcdl_fail(HPCDL_ERR_NOMEM, "allreduce_async: out of memory");
    *w = (work){.send = send, .recv = recv, .count = count, .dtype = dtype, .op = op,
                .algo = algo, .valid = 1};
    snprintf(w->name, sizeof w->name, "%s", name ? name : "allreduce");
    return submit(ctx, w, out);
}

int hpcdl_allreduce_async_invalid(hpcdl_ctx *ctx, const char *name, hpcdl_handle *out) {
    work *w = calloc(1, sizeof *w);
    if (!w) return hpcdl_fail(HPCDL_ERR_NOMEM, "allreduce_async: out of memory");
    snprintf(w->name, sizeof w->name, "%s", name ? name : "allreduce");
    return submit(ctx, w, out);
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
    while (!w->done) pthread_cond_wait(&e->cv_done, &e->mu);
    *link = w->anext;
    pthread_mutex_unlock(&e->mu);
    int status = w->status;
    if (status != HPCDL_OK) hpcdl_fail(status, "%s", w->err);
    if (errbuf && errlen) snprintf(errbuf, errlen, "%s", status == HPCDL_OK ? "" : w->err);
    free(w);
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
