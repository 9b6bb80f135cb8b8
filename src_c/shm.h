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
    double timeout_s;    // a barrier waiting longer than this fails
    unsigned long spin_limit; // busy-wait iterations before yielding the core
};

int hpcdl_shm_barrier(hpcdl_team *t);
int hpcdl_shm_peer_ahead(const hpcdl_team *t);
// Local rank j's agreement-check signature (8 int64) for barrier parity p.
int64_t *hpcdl_shm_sig(const hpcdl_shm *s, int local_rank, int parity);
void hpcdl_shm_free_struct(hpcdl_shm *s);

#endif // HPCDL_SHM_H
