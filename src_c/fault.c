/*
 * fault.c - a lost peer under ULFM, MPI's fault tolerance (Open MPI 5's ftmpi
 * extension, a job started with `mpiexec --with-ft ulfm`).
 *
 * Without ULFM a rank that dies ends the MPI job. With it, MPI calls that
 * involve the dead rank return an error class instead (MPIX_ERR_PROC_FAILED),
 * and calls that only wait for a survivor who already left keep waiting:
 * the ULFM way out is to revoke the communicator, which makes every pending
 * and later call on it return MPIX_ERR_REVOKED on every member. So the first
 * thread of a rank that sees such an error revokes every communicator of its
 * context (both teams' world, local and cross, and the stall inspector's):
 *
 *   rank 1: MPI_Irecv from rank 3 -> PROC_FAILED -> revoke all -> error
 *   rank 0: waits for rank 1 in the ring          -> REVOKED   -> revoke all -> error
 *   rank 2: spins in shared memory for rank 3     -> check_peers sees it -> ...
 *
 * Revoking is idempotent and spreads through each communicator, so every
 * survivor leaves within a few message latencies, whatever it waited in.
 * The context is then lost: its operation and every later one (the engine's
 * queued items too) fail with HPCDL_ERR_PROC_FAILED and one message naming
 * the lost ranks (MPIX_Comm_get_failed). The caller shrinks its communicator
 * and builds a new context (hpcdl.comm.Communicator.shrink); the old one is
 * abandoned without communication (hpcdl_ctx_abandon).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
#include "engine.h"
#include "shm.h"

int hpcdl_built_with_ulfm(void) {
#ifdef HPCDL_ULFM
    return 1;
#else
    return 0;
#endif
}

int hpcdl_ft_in_force(void) {
#ifdef HPCDL_ULFM
    const char *v = getenv("OMPI_MCA_mpi_ft_enable"); // set by mpiexec --with-ft ulfm
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "enabled"));
#else
    return 0;
#endif
}

// Collective over the context: with ULFM in force, the teams look for lost
// peers in their shared-memory waits, and every rank's host name is known.
int hpcdl_ft_setup(hpcdl_ctx *ctx) {
    if (!hpcdl_ft_in_force()) return HPCDL_OK;
    ctx->main.ft = ctx->eng.ft = 1;
    int n = ctx->main.size;
    ctx->hosts = calloc((size_t)n, sizeof *ctx->hosts);
    if (!ctx->hosts) return hpcdl_fail(HPCDL_ERR_NOMEM, "context: out of memory");
    char me[32] = "";
    gethostname(me, sizeof me - 1);
    me[strcspn(me, ".")] = '\0'; // the short name, as hostfiles write it
    MPI_CHECK(MPI_Allgather(me, 32, MPI_CHAR, ctx->hosts, 32, MPI_CHAR, ctx->main.world));
    return HPCDL_OK;
}

#ifdef HPCDL_ULFM
// ----------------------------------------------------------------------------
// revoking and naming (ULFM builds)

static void revoke_all(hpcdl_ctx *ctx) {
    MPI_Comm comms[] = {ctx->main.world, ctx->main.local, ctx->main.cross, ctx->eng.world,
                        ctx->eng.local, ctx->eng.cross, hpcdl_stall_comm(ctx)};
    for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++)
        if (comms[i] && comms[i] != MPI_COMM_NULL)
            (void)MPIX_Comm_revoke(comms[i]); // already revoked by a peer: no matter
}

// The failed ranks this rank knows of, as ranks of main.world; at most max.
static int known_failed(hpcdl_ctx *ctx, int *out, int max) {
    MPI_Group failed, world;
    int n = 0;
    if (MPIX_Comm_get_failed(ctx->main.world, &failed) != MPI_SUCCESS) return 0;
    MPI_Group_size(failed, &n);
    if (n > max) n = max;
    if (n > 0 && MPI_Comm_group(ctx->main.world, &world) == MPI_SUCCESS) {
        int idx[16];
        for (int i = 0; i < n; i++) idx[i] = i;
        MPI_Group_translate_ranks(failed, n, idx, world, out);
        MPI_Group_free(&world);
    }
    MPI_Group_free(&failed);
    return n;
}

// A rank that only saw the revocation learns who failed from the runtime's
// notification, which MPI's progress engine delivers within milliseconds: a
// probe on MPI_COMM_SELF drives it. Waits up to 10 s of wall time: on a
// loaded machine the notice was seen to take over 2 s (a wait counted in
// sleeps stretches too, so the bound is a clock); a named rank returns at once.
static int name_failed(hpcdl_ctx *ctx, int *out, int max) {
    int n = 0;
    double until = MPI_Wtime() + 10.0;
    while ((n = known_failed(ctx, out, max)) == 0 && MPI_Wtime() < until) {
        int flag = 0;
        (void)MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return n;
}
#endif

// "allreduce 'grad.bucket.4'" (the name only when it says more than the kind)
static void op_text(char *buf, size_t len, const char *what, const char *name) {
    if (name && *name && strcmp(name, what)) snprintf(buf, len, "%s '%.63s'", what, name);
    else snprintf(buf, len, "%s", what);
}

// ctx->lost_msg: "rank 3 (node2) lost during allreduce 'grad.bucket.4'".
static void describe_lost(hpcdl_ctx *ctx, const char *op) {
    int pos = 0;
    size_t len = sizeof ctx->lost_msg;
    if (ctx->nlost == 0)
        pos = snprintf(ctx->lost_msg, len, "a peer rank (not yet named by MPI) lost");
    for (int i = 0; i < ctx->nlost && pos < (int)len - 80; i++) {
        int r = ctx->lost_ranks[i];
        pos += snprintf(ctx->lost_msg + pos, len - (size_t)pos, "%s%d", i ? ", " : (ctx->nlost > 1 ? "ranks " : "rank "), r);
        if (ctx->hosts && r >= 0 && r < ctx->main.size)
            pos += snprintf(ctx->lost_msg + pos, len - (size_t)pos, " (%.31s)", ctx->hosts[r]);
    }
    if (ctx->nlost > 0) pos += snprintf(ctx->lost_msg + pos, len - (size_t)pos, " lost");
    snprintf(ctx->lost_msg + pos, len - (size_t)pos, " during %s", op);
}

static const char *const lost_hint =
    "Hint: the other ranks got the same error; they can go on without the lost ranks "
    "(hpcdl.comm.Communicator.shrink(), docs/fault-tolerance.md), or end the job.";

// ----------------------------------------------------------------------------
// the context's state

static void wait_written(hpcdl_ctx *ctx) {
    while (__atomic_load_n(&ctx->lost, __ATOMIC_ACQUIRE) == 1) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

int hpcdl_ft_refuse(hpcdl_ctx *ctx, const char *what, const char *name) {
    if (__atomic_load_n(&ctx->lost, __ATOMIC_ACQUIRE) == 0) return HPCDL_OK;
    wait_written(ctx);
    char op[96];
    op_text(op, sizeof op, what, name);
    return hpcdl_fail(HPCDL_ERR_PROC_FAILED, "%s; %s did not run. %s", ctx->lost_msg, op,
                      lost_hint);
}

int hpcdl_ft_result(hpcdl_ctx *ctx, int rc, const char *what, const char *name) {
    if (rc == HPCDL_OK) return rc;
    int expect = 0;
    if (rc != HPCDL_ERR_PROC_FAILED && __atomic_load_n(&ctx->lost, __ATOMIC_ACQUIRE) == 0)
        return rc; // an ordinary error (a mismatch, a bad buffer): the context lives on
    if (!__atomic_compare_exchange_n(&ctx->lost, &expect, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return hpcdl_ft_refuse(ctx, what, name); // the other thread got there first
    char seen[256], op[96];
    snprintf(seen, sizeof seen, "%s", hpcdl_last_error());
    op_text(op, sizeof op, what, name);
#ifdef HPCDL_ULFM
    if (!ctx->thread_multiple) pthread_mutex_lock(&ctx->mpi_lock);
    revoke_all(ctx);
    ctx->nlost = name_failed(ctx, ctx->lost_ranks, 16);
    if (!ctx->thread_multiple) pthread_mutex_unlock(&ctx->mpi_lock);
#endif
    describe_lost(ctx, op);
    __atomic_store_n(&ctx->lost, 2, __ATOMIC_RELEASE);
    return hpcdl_fail(HPCDL_ERR_PROC_FAILED, "%s on rank %d (MPI: %s). %s", ctx->lost_msg,
                      ctx->main.rank, seen, lost_hint);
}

int hpcdl_team_check_peers(hpcdl_team *t) {
#ifdef HPCDL_ULFM
    if (!t->ft) return HPCDL_OK;
    double now = MPI_Wtime();
    if (now < t->ft_next) return HPCDL_OK;
    t->ft_next = now + 0.01;
    int flag = 0, n = 0;
    // drives MPI's progress, which is where a peer's revocation arrives; on a
    // revoked communicator, or one with an unacknowledged failure, it fails
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, t->local, &flag, MPI_STATUS_IGNORE));
    MPI_Group failed;
    MPI_CHECK(MPIX_Comm_get_failed(t->world, &failed));
    MPI_Group_size(failed, &n);
    MPI_Group_free(&failed);
    if (n > 0)
        return hpcdl_fail(HPCDL_ERR_PROC_FAILED, "a peer failed while local rank %d waited in "
                          "shared memory", t->local_rank);
    MPI_CHECK(MPIX_Comm_is_revoked(t->world, &flag));
    if (flag)
        return hpcdl_fail(HPCDL_ERR_PROC_FAILED, "the communicator was revoked while local "
                          "rank %d waited in shared memory", t->local_rank);
#else
    (void)t;
#endif
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// public calls

int hpcdl_ctx_is_lost(const hpcdl_ctx *ctx) {
    return __atomic_load_n(&ctx->lost, __ATOMIC_ACQUIRE) != 0;
}

int hpcdl_lost_ranks(const hpcdl_ctx *ctx, int *ranks, int max) {
    if (__atomic_load_n(&ctx->lost, __ATOMIC_ACQUIRE) != 2) return 0;
    int n = ctx->nlost < max ? ctx->nlost : max;
    memcpy(ranks, ctx->lost_ranks, sizeof(int) * (size_t)(n > 0 ? n : 0));
    return n;
}

void hpcdl_ctx_revoke(hpcdl_ctx *ctx, const char *why) {
    int expect = 0;
    if (!__atomic_compare_exchange_n(&ctx->lost, &expect, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
#ifdef HPCDL_ULFM
    revoke_all(ctx);
#endif
    snprintf(ctx->lost_msg, sizeof ctx->lost_msg, "the context was revoked (%s)",
             why ? why : "by the caller");
    __atomic_store_n(&ctx->lost, 2, __ATOMIC_RELEASE);
}

// A known Open MPI 5 issue (open-mpi/ompi#11404, #9434): after a lost rank,
// MPI_Finalize's runtime fence may wait for the dead process forever, so a
// survivor that did all its work hangs at exit (seen here in about 1 of 27
// runs). After a loss the process gets this long for MPI_Finalize, then ends.
static void *exit_watchdog(void *arg) {
    double s = *(double *)arg;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
    fprintf(stderr, "hpcdl: MPI_Finalize did not return within %g s after a lost rank (an "
            "Open MPI issue: its fence waits for the dead process); ending this rank with "
            "status 0\n", s);
    fflush(stderr);
    _exit(0);
    return NULL;
}

void hpcdl_exit_watchdog(double seconds) {
    static double s;
    s = seconds > 0 ? seconds : 10;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, exit_watchdog, &s) != 0) { /* no watchdog: MPI decides */ }
    pthread_attr_destroy(&attr);
}

// The teams' communicators and shared-memory windows are left to
// MPI_Finalize: freeing them is collective, and a lost peer never joins.
// Shared buffers (shared.c) stay too: Python views may still point into them.
void hpcdl_ctx_abandon(hpcdl_ctx *ctx) {
    if (!ctx) return;
    hpcdl_ctx_revoke(ctx, "abandoned"); // threads still in MPI calls leave them
    hpcdl_stall_stop(ctx);              // its last exchange fails on the revoked comm
    hpcdl_engine_stop(ctx);             // queued items fail at once (hpcdl_ft_refuse)
    hpcdl_team *teams[2] = {&ctx->main, &ctx->eng};
    for (int i = 0; i < 2; i++) {
        hpcdl_shm_free_struct(teams[i]->shm);
        free(teams[i]->scratch);
        free(teams[i]->xbuf);
    }
    free(ctx->shared);
    free(ctx->hosts);
    pthread_mutex_destroy(&ctx->mpi_lock);
    free(ctx);
}
