/*
 * shm.h - the node's shared-memory segment (see shm.c) as the hierarchical
 * all-reduce sees it: per local rank a flag and two staging slots.
 */
#ifndef HPCDL_SHM_H
#define HPCDL_SHM_H

#include "common.h"

struct hpcdl_shm {
    MPI_Win win;         // the MPI-3 shared window that owns the memory
    size_t slot_bytes;   // bytes per slot, equal on every rank
    uint64_t **seq;      // seq[j]: local rank j's barrier flag
    char **slot[2];      // slot[p][j]: local rank j's slot of parity p
    uint64_t epoch;      // barriers passed by this rank
    uint64_t pieces;     // hier pieces run so far: their slot parity continues across calls
    double timeout_s;    // a barrier waiting longer than this fails; 0 = never (the
                         // stall inspector ends the job first: hpcdl_shm_defer)
    unsigned long spin_limit; // busy-wait iterations before yielding the core
};

// How a wait for a local peer spends its time (hpcdl_backoff_pause).
typedef struct {
    unsigned long n; // pauses so far
    double t0;       // CLOCK_MONOTONIC seconds at the end of the spin phase (0: still in it)
} hpcdl_backoff;

// Local call, once each time the awaited condition was found false: spins
// (cpu_relax) for the first spin_limit pauses, then yields the core until the
// wait has lasted YIELD_S (a peer due any moment, or one that needs this
// core), then sleeps for 1/16 of the time waited so far (at most SLEEP_MAX_S),
// so a long wait (a stalled peer) costs almost no CPU and ends at most ~6%
// late. polite (the engine while its caller computes): no yield phase, sleeps
// at once. Returns the seconds waited since the spin phase ended (0 in it).
double hpcdl_backoff_pause(hpcdl_backoff *b, unsigned long spin_limit, int polite);

int hpcdl_shm_barrier(hpcdl_team *t);
// Local call: the stall inspector runs (stall.c) and ends a stalled job with
// its diagnosis after shutdown_s (0 = never), so this node's waits must not
// end it first with a vaguer message: their timeout becomes shutdown_s + 60
// (a backstop, if the inspector could not run), or never.
void hpcdl_shm_defer(hpcdl_shm *s, double shutdown_s);
int hpcdl_shm_peer_ahead(const hpcdl_team *t);
// Local rank j's agreement-check signature (8 int64) for barrier parity p.
int64_t *hpcdl_shm_sig(const hpcdl_shm *s, int local_rank, int parity);
void hpcdl_shm_free_struct(hpcdl_shm *s);

#endif // HPCDL_SHM_H
