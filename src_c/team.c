/*
 * team.c - a team: the communicators one thread uses (world, the node's
 * ranks, the ranks with the same local rank on every node), the node's
 * shared-memory segment, and how the thread waits for a message (spinning on
 * the caller's thread, testing and sleeping on the engine's).
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
#include "shm.h"

// ----------------------------------------------------------------------------
// creating and freeing

// Collective over comm. t->crowded: 1 when this host runs more of comm's
// ranks than it has online cores, or HPCDL_WAIT=yield; HPCDL_WAIT=spin forces
// 0. t->full: its ranks fill the cores (>=). *spans: 1 when comm's ranks are
// on more than one host. Host = shared memory, whatever virtual nodes
// HPCDL_LOCAL_SIZE makes.
static int host_facts(MPI_Comm comm, hpcdl_team *t, int *spans) {
    const char *w = getenv("HPCDL_WAIT");
    MPI_Comm host;
    int n, size;
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    MPI_CHECK(MPI_Comm_size(host, &n));
    MPI_CHECK(MPI_Comm_free(&host));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    t->full = cores > 0 && n >= cores;
    t->crowded = cores > 0 && n > cores;
    if (w && !strcmp(w, "yield")) t->crowded = 1;
    if (w && !strcmp(w, "spin")) t->crowded = 0;
    t->spin = w && !strcmp(w, "spin");
    int any_short = n < size; // some host holds fewer than all ranks
    MPI_CHECK(MPI_Allreduce(&any_short, spans, 1, MPI_INT, MPI_MAX, comm));
    return HPCDL_OK;
}

// The ring's default chunk. On one host 256 KiB: small enough that the
// reduction of one chunk hides behind the copy of the next. Across hosts
// 4 MiB: a step keeps two chunks in flight, and with 256 KiB that is 4 ms of
// a 1 Gbit/s link; a rank that waits longer for a core (hosts sharing cores,
// a busy node) lets the link drain. 8 MiB in flight covers ~67 ms at 1 Gbit/s
// (benchmarks/vcluster.md: 3 hosts x 1, 16 MiB, ring 1.56x -> 1.29x the floor).
static size_t default_chunk(int spans) {
    return spans ? (size_t)4 << 20 : (size_t)256 << 10;
}

// Collective over comm. local_size > 0 makes virtual nodes of that many ranks.
// Preconditions across ranks: the same local_size (it must divide the size).
int hpcdl_team_create(hpcdl_team *t, MPI_Comm comm, int local_size) {
    memset(t, 0, sizeof *t);
    MPI_CHECK(MPI_Comm_dup(comm, &t->world));
    MPI_CHECK(MPI_Comm_set_errhandler(t->world, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(t->world, &t->rank));
    MPI_CHECK(MPI_Comm_size(t->world, &t->size));
    int spans;
    HPCDL_TRY(host_facts(t->world, t, &spans));
    t->chunk_bytes = default_chunk(spans);
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

// Collective over the team's communicators (MPI_Comm_free is).
int hpcdl_team_free(hpcdl_team *t) {
    hpcdl_shm_free(t);
    free(t->scratch);
    t->scratch = NULL;
    free(t->xbuf);
    t->xbuf = NULL;
    if (t->cross != MPI_COMM_NULL && t->cross) MPI_CHECK(MPI_Comm_free(&t->cross));
    if (t->local != MPI_COMM_NULL && t->local) MPI_CHECK(MPI_Comm_free(&t->local));
    if (t->world != MPI_COMM_NULL && t->world) MPI_CHECK(MPI_Comm_free(&t->world));
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// waiting (the policy is described at hpcdl_team_wait in common.h)

// Local call. Returns an MPI error code, for MPI_CHECK.
int hpcdl_team_wait(const hpcdl_team *t, MPI_Request *req) {
    return hpcdl_team_wait_status(t, req, MPI_STATUS_IGNORE);
}

int hpcdl_team_wait_status(const hpcdl_team *t, MPI_Request *req, MPI_Status *status) {
    if (!t->polite && t->spin) return MPI_Wait(req, status);
    long sleep_ns = 2000;
    hpcdl_backoff pause = {0, 0};
    for (unsigned spins = 0;; spins++) {
        int done = 0, rc = MPI_Test(req, &done, status);
        if (rc != MPI_SUCCESS || done) return rc;
        if (spins < 64) continue; // a message due any moment: keep testing
        // the caller's thread: the peer we wait for may need this core (a host
        // with more ranks than cores, or another process on one of them). A
        // spinning MPI_Wait holds it for a whole time slice: 2 ranks on 2
        // cores at load 11-12, ring 16 MiB, median 121-149 ms with MPI_Wait,
        // 23-55 ms yielding. With the core free, sched_yield returns at once,
        // so after 1 ms the wait sleeps (hpcdl_backoff_pause): a peer that
        // is late by seconds (stalled) no longer costs a whole core.
        // The engine whose caller waits for it (its core is ours) does the same.
        if (!t->polite || hpcdl_team_urgent(t)) {
            hpcdl_backoff_pause(&pause, 0, 0);
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
