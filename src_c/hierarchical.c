/*
 * hierarchical.c - all-reduce in two levels: shared memory inside a node,
 * the ring across nodes.
 *
 * The message is processed in pieces of at most one slot (P elements); each
 * piece is cut into L sub-slices, one per local rank (L = ranks per node):
 *
 *   1. copy-in:  local rank l copies its sub-slices j != l into its slot
 *   2. barrier
 *   3. reduce:   local rank l reduces sub-slice l across its own input and the
 *                L-1 other slots, straight into its output
 *   4. across:   ranks with local rank l (one per node) run the ring
 *                all-reduce on sub-slice l over the cross communicator
 *   5. publish:  local rank l copies the finished sub-slice l into its slot
 *   6. barrier
 *   7. copy-out: local rank l copies sub-slices j != l from slot j
 *
 * Pieces alternate between the two slots (parity), so piece p+1's copy-in
 * never overwrites data a slower rank still copies out of piece p: that rank
 * passed piece p+1's first barrier only after finishing piece p. The parity
 * runs on across calls (s->pieces), since calls may follow each other with
 * no barrier between them (the CUDA staging path all-reduces piece after
 * piece; a one-piece call restarting at slot 0 raced with its predecessor).
 *
 * Only 1/L of the data crosses the network per rank, and the L rings run in
 * parallel: inter-node time ~ 2(C-1)*alpha + 2(C-1)/C * (M/L) * beta for C nodes.
 */
#include <string.h>
#include "common.h"
#include "shm.h"

// Preconditions across ranks: same count, dtype, op; every node has the same
// number of local ranks (t->uniform). send may equal recv.
int hpcdl_hier_allreduce(hpcdl_team *t, const void *send, void *recv, size_t count,
                         hpcdl_dtype dtype, hpcdl_op op) {
    hpcdl_shm *s = t->shm;
    int L = t->local_size, l = t->local_rank;
    size_t esz = hpcdl_dtype_size(dtype), slot_elems = s->slot_bytes / esz;
    hpcdl_op ring_op = op == HPCDL_AVERAGE ? HPCDL_SUM : op; // divide once, at the end
    const char *in = send;
    char *out = recv;
    for (size_t base = 0; base < count; base += slot_elems) {
        size_t P = count - base < slot_elems ? count - base : slot_elems;
        char **slot = s->slot[s->pieces++ % 2];
        size_t lo = hpcdl_block_start(P, L, l), hi = hpcdl_block_start(P, L, l + 1);
        // 1. copy-in what the other local ranks need from this rank
        for (int j = 0; j < L; j++) {
            if (j == l) continue;
            size_t a = hpcdl_block_start(P, L, j), b = hpcdl_block_start(P, L, j + 1);
            memcpy(slot[l] + a * esz, in + (base + a) * esz, (b - a) * esz);
        }
        HPCDL_TRY(hpcdl_shm_barrier(t));
        // 3. reduce sub-slice l: own input first, then each other slot in order
        char *mine = out + (base + lo) * esz;
        const char *acc = in + (base + lo) * esz;
        for (int j = 0; j < L; j++) {
            if (j == l) continue;
            hpcdl_reduce_local(mine, acc, slot[j] + lo * esz, hi - lo, dtype, ring_op);
            acc = mine;
        }
        // 4. across nodes on this rank's sub-slice
        if (t->cross_size > 1)
            HPCDL_TRY(hpcdl_ring_allreduce(t, t->cross, mine, mine, hi - lo, dtype, ring_op));
        if (op == HPCDL_AVERAGE) hpcdl_divide_local(mine, hi - lo, dtype, t->size);
        // 5. publish, 6. barrier, 7. copy-out
        memcpy(slot[l] + lo * esz, mine, (hi - lo) * esz);
        HPCDL_TRY(hpcdl_shm_barrier(t));
        for (int j = 0; j < L; j++) {
            if (j == l) continue;
            size_t a = hpcdl_block_start(P, L, j), b = hpcdl_block_start(P, L, j + 1);
            memcpy(out + (base + a) * esz, slot[j] + a * esz, (b - a) * esz);
        }
    }
    return HPCDL_OK;
}
