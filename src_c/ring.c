/*
 * ring.c - bandwidth-optimal ring collectives over MPI point-to-point
 * (Patarasuk & Yuan 2009), pipelined in chunks.
 *
 * N ranks in a ring, rank r sends to r+1 and receives from r-1. The buffer is
 * cut into N blocks (block i = [off[i], off[i+1])).
 *
 *   reduce-scatter, steps s = 0 .. N-2:
 *       send block (r - s - 1), receive block (r - s - 2) and reduce it with
 *       this rank's own contribution; after N-1 steps rank r holds the fully
 *       reduced block r.
 *   all-gather, steps s = 0 .. N-2:
 *       send block (r - s), receive block (r - s - 1) into place.
 *
 *       step 0 of reduce-scatter, N = 4 (a,b,c,d = blocks 0..3):
 *         r0 --d--> r1 --a--> r2 --b--> r3 --c--> r0
 *
 * Cost: 2(N-1) steps of M/N bytes: each rank sends 2(N-1)/N * M bytes, the
 * bandwidth optimum; time ~ 2(N-1)*alpha + 2(N-1)/N * M * beta.
 *
 * Inside a step each block travels as chunks of chunk_bytes: the reduction of
 * chunk k runs while chunk k+1 is on the wire (double-buffered receive).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"

enum { TAG_RS = 7301, TAG_AG = 7302, TAG_BC = 7303 };

// ----------------------------------------------------------------------------
// one step (hpcdl_step in common.h): send sn bytes to `to` while receiving rn
// bytes from `from`. Received chunks land in dst; with own != NULL they are
// combined instead: dst = received op own, by s->reduce (the host's
// hpcdl_reduce_local when NULL; the CUDA path passes a kernel launch).
// Chunks are element-aligned. The GPU-direct ring (cuda/) runs this same step
// on device buffers.

static int reduce_host(const hpcdl_step *s, void *dst, const void *recvd, const void *own,
                       size_t count) {
    hpcdl_reduce_local(dst, recvd, own, count, s->dtype, s->op);
    return HPCDL_OK;
}

// The step's body; rq[k % 2][send, recv] are its requests in flight.
static int step(const hpcdl_step *a, const char *src, size_t sn, char *dst, size_t rn,
                const char *own, MPI_Request rq[2][2]) {
    size_t esz = hpcdl_dtype_size(a->dtype);
    size_t ns = (sn + a->chunk - 1) / a->chunk, nr = (rn + a->chunk - 1) / a->chunk;
    size_t nk = ns > nr ? ns : nr;
    hpcdl_step_reduce_fn reduce = a->reduce ? a->reduce : reduce_host;
    for (size_t k = 0; k <= nk; k++) {
        // post chunk k (so it flies while chunk k-1 is reduced below); tmp[k % 2]
        // is free: chunk k-2's reduction has finished
        if (k < nk) {
            size_t so = k * a->chunk, ro = k * a->chunk;
            if (so < sn) {
                int len = (int)(sn - so < a->chunk ? sn - so : a->chunk);
                MPI_CHECK(MPI_Isend(src + so, len, MPI_BYTE, a->to, a->tag, a->comm,
                                    &rq[k % 2][0]));
            }
            if (ro < rn) {
                int len = (int)(rn - ro < a->chunk ? rn - ro : a->chunk);
                char *into = own ? a->tmp[k % 2] : dst + ro;
                MPI_CHECK(MPI_Irecv(into, len, MPI_BYTE, a->from, a->tag, a->comm,
                                    &rq[k % 2][1]));
            }
        }
        // finish chunk k-1: reduce it while chunk k is in flight
        if (k > 0) {
            size_t j = k - 1, ro = j * a->chunk;
            size_t len = ro < rn ? (rn - ro < a->chunk ? rn - ro : a->chunk) : 0;
            MPI_Status st;
            int got = 0;
            MPI_CHECK(hpcdl_team_wait_status(a->team, &rq[j % 2][1], &st));
            // a shorter message than posted is no MPI error, but it means the
            // ranks disagree on the sizes: fail rather than reduce stale bytes
            if (len && (MPI_Get_count(&st, MPI_BYTE, &got) != MPI_SUCCESS || (size_t)got != len))
                return hpcdl_fail(HPCDL_ERR_MISMATCH, "ring step: received %d bytes from rank "
                                  "%d, expected %zu; the ranks disagree on the buffer size "
                                  "(run with the agreement check on to see which)", got,
                                  a->from, len);
            if (own && len) HPCDL_TRY(reduce(a, dst + ro, a->tmp[j % 2], own + ro, len / esz));
            MPI_CHECK(hpcdl_team_wait(a->team, &rq[j % 2][0]));
        }
    }
    return HPCDL_OK;
}

// Preconditions across ranks: `to` receives, with the same tag and chunk
// size, as many bytes as this rank sends (its rn is this rank's sn). On an
// error nothing is left posted: receives are cancelled (a late message must
// not land in dst, or match a later call's receive), sends cancelled or left
// to MPI to finish (a send cannot always be cancelled, and waiting for it
// would hang when the peer failed too).
int hpcdl_ring_step(const hpcdl_step *a, const char *src, size_t sn, char *dst, size_t rn,
                    const char *own) {
    MPI_Request rq[2][2] = {{MPI_REQUEST_NULL, MPI_REQUEST_NULL},
                            {MPI_REQUEST_NULL, MPI_REQUEST_NULL}}; // [k%2][send,recv]
    int rc = step(a, src, sn, dst, rn, own, rq);
    if (rc == HPCDL_OK) return rc;
    for (int k = 0; k < 2; k++) {
        if (rq[k][1] != MPI_REQUEST_NULL) {
            (void)MPI_Cancel(&rq[k][1]);
            (void)MPI_Wait(&rq[k][1], MPI_STATUS_IGNORE);
        }
        if (rq[k][0] != MPI_REQUEST_NULL) {
            int done = 0;
            (void)MPI_Cancel(&rq[k][0]);
            (void)MPI_Test(&rq[k][0], &done, MPI_STATUS_IGNORE);
            if (!done) (void)MPI_Request_free(&rq[k][0]);
        }
    }
    return rc;
}

static size_t chunk_for(const hpcdl_team *t, hpcdl_dtype dtype) {
    size_t esz = hpcdl_dtype_size(dtype), c = t->chunk_bytes;
    if (c > (size_t)INT_MAX / 2) c = (size_t)INT_MAX / 2; // MPI counts are int
    c -= c % esz;
    return c < esz ? esz : c;
}

// ----------------------------------------------------------------------------
// the two phases over block offsets off[0..N] (elements)

// Reduce-scatter. Partial sums of block b land in blockdst(b, s); the final
// one (block r, last step) lands in `out`. For N == 1 just copies.
static int reduce_scatter_phase(hpcdl_team *t, MPI_Comm comm, const char *send,
                                char *recv_full, char *out, const size_t *off,
                                hpcdl_dtype dtype, hpcdl_op op) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    size_t esz = hpcdl_dtype_size(dtype), maxblk = 0;
    if (n == 1) {
        if (out != send) memmove(out, send, (off[1] - off[0]) * esz);
        return HPCDL_OK;
    }
    for (int i = 0; i < n; i++)
        if (off[i + 1] - off[i] > maxblk) maxblk = off[i + 1] - off[i];
    hpcdl_step a = {t, comm, (r + 1) % n, hpcdl_mod(r - 1, n), TAG_RS, dtype, op,
                    chunk_for(t, dtype), {NULL, NULL}, NULL, NULL};
    // a chunk larger than the largest block only costs scratch (4 MiB chunks
    // across hosts); maxblk is the same on every rank, so the chunks still match
    if (maxblk && a.chunk > maxblk * esz) a.chunk = maxblk * esz;
    // partial sums need block-sized homes when the caller has no full buffer
    char *part = NULL, *tmp = malloc(2 * a.chunk);
    if (!recv_full) part = malloc(2 * maxblk * esz + 1);
    if (!tmp || (!recv_full && !part)) {
        free(tmp);
        free(part);
        return hpcdl_fail(HPCDL_ERR_NOMEM, "ring reduce-scatter: out of memory");
    }
    a.tmp[0] = tmp;
    a.tmp[1] = tmp + a.chunk;
    const char *prev = NULL; // where the block sent at this step was reduced
    int rc = HPCDL_OK;
    for (int s = 0; s < n - 1 && rc == HPCDL_OK; s++) {
        int sb = hpcdl_mod(r - s - 1, n), rb = hpcdl_mod(r - s - 2, n);
        const char *src = s == 0 ? send + off[sb] * esz : prev;
        char *dst = s == n - 2 ? out
                    : recv_full ? recv_full + off[rb] * esz
                                : part + (size_t)(s % 2) * maxblk * esz;
        rc = hpcdl_ring_step(&a, src, (off[sb + 1] - off[sb]) * esz, dst,
                             (off[rb + 1] - off[rb]) * esz, send + off[rb] * esz);
        prev = dst;
    }
    free(tmp);
    free(part);
    return rc;
}

// All-gather: rank r's block r is already in place in buf.
static int allgather_phase(hpcdl_team *t, MPI_Comm comm, char *buf, const size_t *off,
                           hpcdl_dtype dtype) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    size_t esz = hpcdl_dtype_size(dtype);
    // no reduction to overlap: bigger pieces mean fewer messages
    hpcdl_step a = {t, comm, (r + 1) % n, hpcdl_mod(r - 1, n), TAG_AG, dtype, HPCDL_SUM,
                    chunk_for(t, dtype) * 16, {NULL, NULL}, NULL, NULL};
    if (a.chunk > (size_t)INT_MAX / 2) a.chunk = chunk_for(t, dtype);
    for (int s = 0; s < n - 1; s++) {
        int sb = hpcdl_mod(r - s, n), rb = hpcdl_mod(r - s - 1, n);
        HPCDL_TRY(hpcdl_ring_step(&a, buf + off[sb] * esz, (off[sb + 1] - off[sb]) * esz,
                                  buf + off[rb] * esz, (off[rb + 1] - off[rb]) * esz, NULL));
    }
    return HPCDL_OK;
}

static size_t *balanced_offsets(size_t count, int n) {
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (off)
        for (int i = 0; i <= n; i++) off[i] = hpcdl_block_start(count, n, i);
    return off;
}

static size_t *prefix_offsets(const size_t *counts, int n) {
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (off) {
        off[0] = 0;
        for (int i = 0; i < n; i++) off[i + 1] = off[i] + counts[i];
    }
    return off;
}

// ----------------------------------------------------------------------------
// collectives

// Preconditions across ranks: same count, dtype, op. send may equal recv.
int hpcdl_ring_allreduce(hpcdl_team *t, MPI_Comm comm, const void *send, void *recv,
                         size_t count, hpcdl_dtype dtype, hpcdl_op op) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    size_t esz = hpcdl_dtype_size(dtype);
    if (n == 1 || count == 0) {
        if (send != recv && count) memcpy(recv, send, count * esz);
        return HPCDL_OK;
    }
    size_t *off = balanced_offsets(count, n);
    if (!off) return hpcdl_fail(HPCDL_ERR_NOMEM, "ring all-reduce: out of memory");
    char *out = (char *)recv + off[r] * esz;
    int rc = reduce_scatter_phase(t, comm, send, recv, out, off, dtype, op);
    if (rc == HPCDL_OK && op == HPCDL_AVERAGE)
        hpcdl_divide_local(out, off[r + 1] - off[r], dtype, n); // 1/N of the work
    if (rc == HPCDL_OK) rc = allgather_phase(t, comm, recv, off, dtype);
    free(off);
    return rc;
}

// Preconditions across ranks: same counts[], dtype, op. recv holds counts[r].
int hpcdl_ring_reduce_scatter(hpcdl_team *t, MPI_Comm comm, const void *send,
                              void *recv, const size_t *counts, hpcdl_dtype dtype,
                              hpcdl_op op) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    size_t *off = prefix_offsets(counts, n);
    if (!off) return hpcdl_fail(HPCDL_ERR_NOMEM, "ring reduce-scatter: out of memory");
    size_t esz = hpcdl_dtype_size(dtype);
    int rc;
    if (n == 1) {
        memmove(recv, send, counts[0] * esz);
        rc = HPCDL_OK;
    } else {
        rc = reduce_scatter_phase(t, comm, send, NULL, recv, off, dtype, op);
    }
    if (rc == HPCDL_OK && op == HPCDL_AVERAGE) hpcdl_divide_local(recv, counts[r], dtype, n);
    free(off);
    return rc;
}

// Preconditions across ranks: same counts[], dtype. recv holds sum(counts).
int hpcdl_ring_allgatherv(hpcdl_team *t, MPI_Comm comm, const void *send, void *recv,
                          const size_t *counts, hpcdl_dtype dtype) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    size_t *off = prefix_offsets(counts, n);
    if (!off) return hpcdl_fail(HPCDL_ERR_NOMEM, "ring all-gather: out of memory");
    size_t esz = hpcdl_dtype_size(dtype);
    char *mine = (char *)recv + off[r] * esz;
    if (mine != send && counts[r]) memmove(mine, send, counts[r] * esz);
    int rc = n > 1 ? allgather_phase(t, comm, recv, off, dtype) : HPCDL_OK;
    free(off);
    return rc;
}

// Pipelined chain from root: rel = (r - root) mod N receives chunk k from rel-1
// and forwards it to rel+1 while chunk k+1 arrives. Time ~ M*beta + (N-2)*chunk*beta.
// Preconditions across ranks: same count, dtype, root.
int hpcdl_ring_broadcast(hpcdl_team *t, MPI_Comm comm, void *buf, size_t count,
                         hpcdl_dtype dtype, int root) {
    int n, r;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    if (n == 1 || count == 0) return HPCDL_OK;
    int rel = hpcdl_mod(r - root, n);
    int next = rel < n - 1 ? (r + 1) % n : -1, prev = rel > 0 ? hpcdl_mod(r - 1, n) : -1;
    size_t chunk = chunk_for(t, dtype) * 4, bytes = count * hpcdl_dtype_size(dtype);
    if (chunk > (size_t)INT_MAX / 2) chunk = chunk_for(t, dtype);
    size_t nk = (bytes + chunk - 1) / chunk;
    MPI_Request sreq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    for (size_t k = 0; k < nk; k++) {
        char *p = (char *)buf + k * chunk;
        int len = (int)(bytes - k * chunk < chunk ? bytes - k * chunk : chunk);
        if (prev >= 0) {
            MPI_Request rq;
            MPI_CHECK(MPI_Irecv(p, len, MPI_BYTE, prev, TAG_BC, comm, &rq));
            MPI_CHECK(hpcdl_team_wait(t, &rq));
        }
        if (next >= 0) {
            MPI_CHECK(hpcdl_team_wait(t, &sreq[k % 2])); // keep <= 2 in flight
            MPI_CHECK(MPI_Isend(p, len, MPI_BYTE, next, TAG_BC, comm, &sreq[k % 2]));
        }
    }
    MPI_CHECK(hpcdl_team_wait(t, &sreq[0]));
    MPI_CHECK(hpcdl_team_wait(t, &sreq[1]));
    return HPCDL_OK;
}
