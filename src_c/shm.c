/*
 * shm.c - the node's shared-memory segment: an MPI-3 shared window in which
 * every local rank owns a flag line and two staging slots, plus a spin
 * barrier on those flags (far cheaper than MPI_Barrier for the many small
 * synchronisations of the hierarchical all-reduce).
 *
 * Layout of local rank j's part:
 *   [ seq flag (64 B) | signature, parity 0 (64 B) | parity 1 (64 B) | pad | slot 0 | slot 1 ]
 * Slot size: HPCDL_SHM_SLOT_BYTES (default 4 MiB); the same on every rank.
 */
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <time.h>
#include "common.h"
#include "shm.h"

// Per local rank: the barrier flag in its own cache line, then two lines of
// agreement-check signatures (by barrier parity), then the slots.
#define FLAG_BYTES 256

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

static size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return (*end == '\0' && x > 0) ? (size_t)x : dflt;
}

// Collective over t->local.
int hpcdl_shm_create(hpcdl_team *t) {
    hpcdl_shm *s = calloc(1, sizeof *s);
    if (!s) return hpcdl_fail(HPCDL_ERR_NOMEM, "shared memory: out of memory");
    int L = t->local_size;
    s->slot_bytes = env_size("HPCDL_SHM_SLOT_BYTES", (size_t)4 << 20);
    s->slot_bytes -= s->slot_bytes % 64;
    if (s->slot_bytes < 64) s->slot_bytes = 64;
    s->timeout_s = (double)env_size("HPCDL_SHM_TIMEOUT_SECONDS", 600);
    // More local ranks than cores: a spinning rank only delays the one it
    // waits for, so yield at once. Otherwise spin briefly (a few us) first.
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->spin_limit = (ncpu > 0 && L > ncpu) ? 1 : 100;
    s->seq = calloc((size_t)L, sizeof *s->seq);
    s->slot[0] = calloc((size_t)L, sizeof(char *));
    s->slot[1] = calloc((size_t)L, sizeof(char *));
    if (!s->seq || !s->slot[0] || !s->slot[1]) {
        hpcdl_shm_free_struct(s);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "shared memory: out of memory");
    }
    MPI_Info info;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true")); // NUMA-local pages
    char *mine = NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)(FLAG_BYTES + 2 * s->slot_bytes), 1, info,
                                     t->local, &mine, &s->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        hpcdl_shm_free_struct(s);
        return hpcdl_mpi_fail(rc, "MPI_Win_allocate_shared", __FILE__, __LINE__);
    }
    for (int j = 0; j < L; j++) {
        MPI_Aint sz;
        int disp;
        char *p;
        MPI_CHECK(MPI_Win_shared_query(s->win, j, &sz, &disp, &p));
        s->seq[j] = (uint64_t *)p;
        s->slot[0][j] = p + FLAG_BYTES;
        s->slot[1][j] = p + FLAG_BYTES + s->slot_bytes;
    }
    __atomic_store_n(s->seq[t->local_rank], 0, __ATOMIC_RELEASE);
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win)); // one passive epoch for life
    MPI_CHECK(MPI_Barrier(t->local)); // every flag is zero before anyone spins on it
    t->shm = s;
    return HPCDL_OK;
}

void hpcdl_shm_free_struct(hpcdl_shm *s) {
    if (!s) return;
    free(s->seq);
    free(s->slot[0]);
    free(s->slot[1]);
    free(s);
}

// 1 when a local peer has entered a barrier this rank has not (it runs a
// collective that this rank is not running now).
int hpcdl_shm_peer_ahead(const hpcdl_team *t) {
    const hpcdl_shm *s = t->shm;
    for (int j = 0; j < t->local_size; j++)
        if (j != t->local_rank && __atomic_load_n(s->seq[j], __ATOMIC_ACQUIRE) > s->epoch)
            return 1;
    return 0;
}

int64_t *hpcdl_shm_sig(const hpcdl_shm *s, int local_rank, int parity) {
    return (int64_t *)((char *)s->seq[local_rank] + 64 + 64 * parity);
}

// Collective over t->local.
void hpcdl_shm_free(hpcdl_team *t) {
    hpcdl_shm *s = t->shm;
    if (!s) return;
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
    hpcdl_shm_free_struct(s);
    t->shm = NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// waiting for a peer: spin, then yield, then sleep in proportion to the wait

// The yield phase keeps small collectives as fast as a pure spin (a peer a
// few microseconds behind, or one that needs this core to get there); past
// it, a peer is late by milliseconds at least (still computing, or stalled:
// issue 38 saw a waiting rank burn 90% of a core for 10 minutes), and a
// sleep of 1/16 of the wait so far costs at most ~6% of the wait.
#define YIELD_S 1e-3
#define SLEEP_MAX_S 1e-3
#define SLEEP_MIN_S 2e-6

double hpcdl_backoff_pause(hpcdl_backoff *b, unsigned long spin_limit, int polite) {
    if (++b->n < spin_limit) {
        cpu_relax();
        return 0;
    }
    double now = now_s();
    if (b->t0 == 0) b->t0 = now;
    double waited = now - b->t0;
    if (!polite && waited < YIELD_S) {
        sched_yield();
        return waited;
    }
    double nap = waited / 16;
    nap = nap < SLEEP_MIN_S ? SLEEP_MIN_S : nap > SLEEP_MAX_S ? SLEEP_MAX_S : nap;
    struct timespec ts = {0, (long)(nap * 1e9)};
    nanosleep(&ts, NULL);
    return waited;
}

void hpcdl_shm_defer(hpcdl_shm *s, double shutdown_s) {
    if (!s) return;
    if (shutdown_s <= 0) s->timeout_s = 0;
    else if (s->timeout_s < shutdown_s + 60) s->timeout_s = shutdown_s + 60;
}

// Every local rank raises its flag to the next epoch, then waits until all
// flags reach it. Release/acquire order makes the slots written before the
// barrier visible to every rank after it. Spins briefly, then yields, then
// sleeps (hpcdl_backoff_pause), so oversubscribed ranks (more ranks than
// cores) still make progress and a long wait (a peer still in backward, or
// stalled) leaves the core; the engine's team sleeps at once unless its
// caller waits for it.
int hpcdl_shm_barrier(hpcdl_team *t) {
    hpcdl_shm *s = t->shm;
    uint64_t epoch = ++s->epoch;
    __atomic_store_n(s->seq[t->local_rank], epoch, __ATOMIC_RELEASE);
    hpcdl_backoff b = {0, 0};
    for (int j = 0; j < t->local_size; j++) {
        while (__atomic_load_n(s->seq[j], __ATOMIC_ACQUIRE) < epoch) {
            int polite = t->polite && !hpcdl_team_urgent(t);
            double waited = hpcdl_backoff_pause(&b, s->spin_limit, polite);
            if (waited > 0) HPCDL_TRY(hpcdl_team_check_peers(t)); // a lost peer (fault.c)
            if (s->timeout_s > 0 && waited > s->timeout_s)
                return hpcdl_fail(HPCDL_ERR_STATE,
                                  "shared-memory barrier: local rank %d waited %.0f s "
                                  "for local rank %d. Hint: a rank stopped calling "
                                  "collectives or died; check every rank's output "
                                  "(HPCDL_SHM_TIMEOUT_SECONDS sets this limit when the "
                                  "stall inspector is off).",
                                  t->local_rank, s->timeout_s, j);
        }
    }
    return HPCDL_OK;
}
