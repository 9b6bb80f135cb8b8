/*
 * stall.c - the stall inspector. A heartbeat thread per context exchanges,
 * every fraction of a second, each rank's engine progress (operations
 * submitted and finished, names of the oldest unfinished ones, how long they
 * have waited) in one small MPI_Allgather on its own communicator. Every
 * rank so sees the same picture, and when operations have waited longer than
 * HPCDL_STALL_CHECK_TIME_SECONDS (default 60) while some ranks have not
 * submitted them, rank 0 warns, naming those ranks and the operations. After
 * HPCDL_STALL_SHUTDOWN_TIME_SECONDS (default 300; 0 = never; checked at
 * every heartbeat, whatever the check time) every rank
 * reaches the same verdict and the job ends (MPI_Abort) instead of hanging:
 * a hung job burns its whole allocation, while a rank legitimately alone for
 * five minutes (evaluation on rank 0 only) is rare, and the message says how
 * to allow longer. Why 300: torch.distributed times out a collective after
 * 10 minutes (NCCL) or 30 (gloo), but that clock also runs while ranks move
 * data slowly; this one runs only while some rank has not even submitted the
 * operation others wait in. Horovod's default is never, which leaves a hung
 * job to its time limit. Meanwhile the node's shared-memory waits leave the
 * ending to this verdict (hpcdl_shm_defer), so a stalled job always ends
 * with it: which rank, which operation. Blocking collectives count as
 * operations too (engine.c). HPCDL_STALL_CHECK_DISABLE=1 turns it off.
 * Shutdown is collective: the thread keeps exchanging until every rank has
 * asked to stop, so a rank that shuts down (or returns from its script)
 * while others wait in collectives it never submitted is seen within a
 * heartbeat and ends the job, named.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common.h"
#include "engine.h"
#include "shm.h"

struct hpcdl_stall {
    pthread_t thread;
    MPI_Comm comm;       // own duplicate: heartbeats never match other traffic
    double interval_s;   // between heartbeats
    double check_s;      // warn after this long
    double shutdown_s;   // abort after this long; 0 = never
    double last_warn;    // MPI_Wtime of the last warning
    int stop;            // guarded by mu
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double env_seconds(const char *name, double dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double x = strtod(v, &end);
    return *end == '\0' && x >= 0 ? x : dflt;
}

// ----------------------------------------------------------------------------
// the verdict (same data on every rank, so the same verdict everywhere)

// Appends to msg at pos and returns the new end, never past len - 1: a long
// list (many ranks behind, four 47-character names each) is cut, not overrun.
static int append(char *msg, size_t len, int pos, const char *fmt, ...) {
    if (pos >= (int)len - 1) return pos;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg + pos, len - (size_t)pos, fmt, ap);
    va_end(ap);
    return k < 0 ? pos : (pos + k < (int)len - 1 ? pos + k : (int)len - 1);
}

// " rank R is missing NAME ... (operations submitted so far: a on rank R, b on
// rank L);" for each rank behind the lead L (the rank that submitted most),
// from the lead's pending names. a and b count operations (collectives), not
// ranks: the words say so, since "(submitted 2 of 4)" read as 2 of 4 ranks.
static int describe_missing(const hpcdl_progress *all, int n, char *msg, size_t len) {
    int lead = 0, pos = 0;
    for (int r = 1; r < n; r++)
        if (all[r].submitted > all[lead].submitted) lead = r;
    for (int r = 0; r < n && pos < (int)len - 120; r++) {
        if (all[r].submitted >= all[lead].submitted) continue;
        pos = append(msg, len, pos, " rank %d is missing", r);
        for (int64_t k = all[r].submitted + 1; k <= all[lead].submitted; k++) {
            int64_t idx = k - all[lead].completed - 1; // position in the lead's pending list
            if (idx < 0 || idx >= HPCDL_PROGRESS_NAMES) continue;
            pos = append(msg, len, pos, " %.*s", 47, all[lead].pending[idx]);
        }
        pos = append(msg, len, pos,
                     " (operations submitted so far: %lld on rank %d, %lld on rank %d);",
                     (long long)all[r].submitted, r, (long long)all[lead].submitted, lead);
    }
    return pos;
}

static void describe_stall(const hpcdl_progress *all, int n, double waited, char *msg,
                           size_t len) {
    int pos = snprintf(msg, len, "stall inspector: operations have waited %.0f s for ranks "
                       "that have not submitted them:", waited);
    pos += describe_missing(all, n, msg + pos, len - (size_t)pos);
    snprintf(msg + pos, len - (size_t)pos, " Hint: every rank must submit the same "
             "collectives in the same order; is one rank stuck, slower, or on another "
             "code path?");
}

// A rank that shuts its context down (hvd.shutdown(), or hpcdl's shutdown at
// exit after the script returned) submits nothing more, so when the counts
// differ and one of the ranks behind is stopping, or every rank is stopping,
// some operation can never finish: the job ends at once instead of waiting
// for the shutdown time (Horovod: "shut down ... after one of the ranks
// finished execution"). One rank that is still working says why.
static void inspect_finished(const hpcdl_progress *all, int n, int64_t max_sub, int rank) {
    int gone = -1, stopping = 0, teller = -1;
    for (int r = 0; r < n; r++) {
        stopping += all[r].stopping != 0;
        if (all[r].stopping && all[r].submitted < max_sub && gone < 0) gone = r;
        if (!all[r].stopping && teller < 0) teller = r;
    }
    if (gone < 0 && (stopping < n || n == 0)) return;
    int differ = 0;
    for (int r = 1; r < n; r++) differ |= all[r].submitted != all[0].submitted;
    if (!differ) return;
    if (gone < 0) gone = 0;
    if (rank == (teller < 0 ? 0 : teller)) {
        char missing[1024];
        describe_missing(all, n, missing, sizeof missing);
        fprintf(stderr, "[rank %d] error: rank %d finished (its hpcdl shut down: the script "
                "returned, exited or called shutdown()) while other ranks wait in collectives "
                "it will never run:%s Ending the job now instead of letting it hang. Hint: "
                "every rank must run the same collectives; a rank done early must keep taking "
                "part until all are done (hvd.join(), or the same number of steps on every "
                "rank).\n", rank, gone, missing);
        fflush(stderr);
    }
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static void inspect(hpcdl_ctx *ctx, struct hpcdl_stall *s, const hpcdl_progress *all, int n) {
    int64_t max_sub = 0;
    double waited = 0;
    for (int r = 0; r < n; r++) {
        if (all[r].submitted > max_sub) max_sub = all[r].submitted;
        if (all[r].waited_s > waited) waited = all[r].waited_s;
    }
    int rank = ctx->main.rank;
    inspect_finished(all, n, max_sub, rank);
    int behind = 0;
    for (int r = 0; r < n; r++) behind += all[r].submitted < max_sub;
    int ending = s->shutdown_s > 0 && waited >= s->shutdown_s;
    if (!behind || (waited < s->check_s && !ending)) return;
    char msg[1024];
    describe_stall(all, n, waited, msg, sizeof msg);
    double now = MPI_Wtime();
    if (rank == 0 && !ending && now - s->last_warn >= s->check_s) {
        fprintf(stderr, "[rank 0] warning: %s\n", msg);
        fflush(stderr);
        s->last_warn = now;
    }
    if (ending) { // whatever the check period: the heartbeat is at most 1 s apart
        fprintf(stderr, "[rank %d] error: %s Ending the job: stalled for longer than "
                "HPCDL_STALL_SHUTDOWN_TIME_SECONDS=%g (set it higher, or 0 for never, if a "
                "rank may legitimately work alone that long).\n", rank, msg, s->shutdown_s);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

// ----------------------------------------------------------------------------
// the heartbeat thread

static int wait_interval(struct hpcdl_stall *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)(s->interval_s * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&s->mu);
    while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {
    }
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static void *stall_main(void *arg) {
    hpcdl_ctx *ctx = arg;
    struct hpcdl_stall *s = ctx->stall;
    int n = ctx->main.size;
    hpcdl_progress *all = calloc((size_t)n, sizeof *all);
    for (;;) {
        hpcdl_progress me;
        int stopping = wait_interval(s);
        hpcdl_engine_progress(ctx, &me);
        me.stopping = stopping;
        if (!all || MPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE,
                                  s->comm) != MPI_SUCCESS)
            break; // no inspector rather than a broken one; collectives still report errors
        inspect(ctx, s, all, n);
        int everyone = 1;
        for (int r = 0; r < n; r++) everyone &= all[r].stopping;
        if (everyone) break;
    }
    free(all);
    return NULL;
}

// Collective over the context's communicator.
int hpcdl_stall_start(hpcdl_ctx *ctx, MPI_Comm comm) {
    const char *off = getenv("HPCDL_STALL_CHECK_DISABLE");
    if ((off && *off && strcmp(off, "0")) || !ctx->thread_multiple || ctx->main.size == 1)
        return HPCDL_OK;
    struct hpcdl_stall *s = calloc(1, sizeof *s);
    if (!s) return hpcdl_fail(HPCDL_ERR_NOMEM, "stall inspector: out of memory");
    s->check_s = env_seconds("HPCDL_STALL_CHECK_TIME_SECONDS", 60);
    s->shutdown_s = env_seconds("HPCDL_STALL_SHUTDOWN_TIME_SECONDS", 300);
    double first = s->shutdown_s > 0 && s->shutdown_s < s->check_s ? s->shutdown_s : s->check_s;
    s->interval_s = first / 4 < 0.05 ? 0.05 : first / 4 > 1 ? 1 : first / 4;
    MPI_CHECK(MPI_Comm_dup(comm, &s->comm));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    ctx->stall = s;
    if (pthread_create(&s->thread, NULL, stall_main, ctx) != 0) {
        ctx->stall = NULL;
        MPI_Comm_free(&s->comm);
        free(s);
        return HPCDL_OK;
    }
    hpcdl_shm_defer(ctx->main.shm, s->shutdown_s); // the verdict ends a stall, not a wait
    hpcdl_shm_defer(ctx->eng.shm, s->shutdown_s);
    return HPCDL_OK;
}

// Collective: returns once every rank has asked its heartbeat thread to stop.
void hpcdl_stall_stop(hpcdl_ctx *ctx) {
    struct hpcdl_stall *s = ctx->stall;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    MPI_Comm_free(&s->comm);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    ctx->stall = NULL;
}

// Local call: the heartbeat's communicator, for fault.c to revoke when a
// peer is lost (the exchange then fails and the thread ends); MPI_COMM_NULL
// when the inspector is off.
MPI_Comm hpcdl_stall_comm(const hpcdl_ctx *ctx) {
    return ctx->stall ? ctx->stall->comm : MPI_COMM_NULL;
}
