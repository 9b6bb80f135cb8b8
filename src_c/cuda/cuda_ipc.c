/*
 * cuda_ipc.c - the CUDA IPC transport: all-reduce of device buffers between
 * the ranks of one node, each rank reading its peers' device memory directly,
 * never through the host. Reached from hpcdl_cuda_allreduce when the team's
 * nodes are of equal size, more than one rank each (HPCDL_CUDA_IPC=0 turns
 * it off). With more than one node it is hierarchical: IPC reduce-scatter
 * inside the node, then each rank's block all-reduced between the nodes
 * over t->cross (the ranks of the same local rank: GPU-direct ring when MPI
 * is CUDA-aware, else staged through pinned memory with the host ring), then
 * the IPC all-gather inside the node again.
 *
 * Set up once per communicator (and again when a rank moves to another GPU
 * or needs a bigger workspace): each rank allocates a workspace of two
 * halves and two interprocess events, exports their IPC handles, and opens
 * every peer's (MPI_Allgather on the node's communicator). The link is cached
 * on that communicator (an MPI attribute, freed with it). Events, not
 * device-side flags, order the ranks' streams: the host syncs say when a
 * peer's event has been recorded, then cudaStreamWaitEvent orders the GPU.
 *
 * Per piece of at most HPCDL_CUDA_STAGE_BYTES (the halves alternate):
 *
 *   rank r, stream s                     host (all ranks)
 *   send piece -> ws[h]; record IN  ---> sync A: every IN is recorded (for a
 *                                        call's first piece also: does every
 *                                        rank's link fit? else set up again)
 *   wait peers' IN
 *   block r: ws[h][r] op= peer ws[h][r]      (kernel on the peer's memory, or
 *            for each peer, in rank order     a copy into scratch first where
 *   [more nodes: block r across them]         the GPUs have no peer access)
 *   (average: divide block r); record RED --> sync B: every RED is recorded
 *   wait peers' RED
 *   recv[b] <- ws_b[h][b] for every b (device-to-device copies)
 *
 * The host never waits for the GPU between pieces (the syncs only say that
 * an event was recorded), so the pieces flow through the streams back to
 * back; the call returns once its stream is idle. Each rank sends nothing
 * and reads (N-1)/N of the piece from its peers in the reduce-scatter and
 * (N-1)/N in the all-gather, plus a piece-sized copy in: 2(N-1)/N + 1 of
 * the buffer per rank, all device to device. Between nodes each rank moves
 * its block, 1/N of the buffer, through the ring: 2(M-1)/M of it for M nodes.
 *
 * Why two halves: rank r's copy into ws[h] for piece m must not overwrite
 * what a peer q still reads of piece m-2. It does not: on r's stream that
 * copy follows r's wait for q's RED of piece m-1, and on q's stream RED of
 * piece m-1 follows all of q's reads of piece m-2 (its reduction and its
 * all-gather). With one buffer r's copy for piece m would race q's
 * all-gather of piece m-1. Each element is reduced by one rank
 * only, so every rank gets the same bits; the arithmetic is reduce_elem.h's,
 * as everywhere else.
 */
// setup.py compiles every src_c/cuda/*.c, with or without CUDA
#ifdef HPCDL_WITH_CUDA
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "cuda_core.h"

enum { EV_IN, EV_RED, NEV }; // copied in; own block reduced

// What a rank exports to its peers.
typedef struct {
    cudaIpcMemHandle_t mem;     // its workspace
    cudaIpcEventHandle_t ev[NEV];
    int dev;                    // its GPU (its own ordinal: for messages only)
    int ok;                     // 0: its own set-up failed (the others fail too)
    uint64_t half;              // bytes of one half of the workspace
} ipc_card;

// One rank's view of the node, cached on the node's communicator.
typedef struct {
    int made;                   // 1 once everything below is open
    int dev;                    // this rank's GPU
    int n, me;                  // ranks on the node, this rank among them
    size_t half;                // bytes of one half of every workspace
    char *ws;                   // this rank's workspace (2 halves)
    char *scratch;              // one half, only when some peer is not direct: its block
                                // lands here first
    cudaEvent_t ev[NEV];        // this rank's events
    char **peer_ws;             // [n]: peers' workspaces opened here (own: ws)
    cudaEvent_t *peer_ev;       // [n * NEV]: peers' events opened here
    int *direct;                // [n]: kernels here may read that peer's memory
    unsigned long piece;        // pieces so far: the half the next one uses
} ipc_link;

// ----------------------------------------------------------------------------
// settings

// HPCDL_CUDA_IPC: unset or 1 uses IPC inside a node, 0 never.
int hpcdl_cuda_ipc_enabled(void) {
    const char *e = getenv("HPCDL_CUDA_IPC");
    return !e || !*e || atoi(e) != 0;
}

// HPCDL_CUDA_IPC_READ: how a rank reads a peer's block for its reduction.
// kernel: the reduction kernel loads it (same GPU, or peer access); copy: the
// copy engine brings it into scratch first; auto (default): kernel where it
// can. Which is faster by size is for a GPU to measure.
static int force_copy(void) {
    const char *e = getenv("HPCDL_CUDA_IPC_READ");
    return e && !strcmp(e, "copy");
}

// ----------------------------------------------------------------------------
// the link: made, exported, opened, freed

static int keyval = MPI_KEYVAL_INVALID;
static pthread_once_t keyval_once = PTHREAD_ONCE_INIT;

// Local: everything this rank holds of the link (best effort; also at
// MPI_Comm_free, where there is no one to report to). The link stays, empty.
static void unlink_all(ipc_link *l) {
    if (l->peer_ws)
        for (int p = 0; p < l->n; p++)
            if (p != l->me && l->peer_ws[p]) (void)cudaIpcCloseMemHandle(l->peer_ws[p]);
    if (l->peer_ev)
        for (int i = 0; i < l->n * NEV; i++)
            if (l->peer_ev[i] && i / NEV != l->me) (void)cudaEventDestroy(l->peer_ev[i]);
    for (int i = 0; i < NEV; i++)
        if (l->ev[i]) (void)cudaEventDestroy(l->ev[i]);
    if (l->ws) (void)cudaFree(l->ws);
    if (l->scratch) (void)cudaFree(l->scratch);
    (void)cudaGetLastError();
    free(l->peer_ws);
    free(l->peer_ev);
    free(l->direct);
    unsigned long piece = l->piece;
    memset(l, 0, sizeof *l);
    l->piece = piece;
}

static int delete_link(MPI_Comm comm, int kv, void *attr, void *extra) {
    ipc_link *l = attr;
    int cur = -1, moved = 0; // on the link's GPU, and back: never a user's thread moved
    if (l->made && cudaGetDevice(&cur) == cudaSuccess && cur != l->dev)
        moved = cudaSetDevice(l->dev) == cudaSuccess;
    unlink_all(l);
    if (moved) (void)cudaSetDevice(cur);
    free(l);
    return MPI_SUCCESS;
}

static void make_keyval(void) {
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_link, &keyval, NULL);
}

// This thread's link on comm, made empty on first use.
static int get_link(MPI_Comm comm, ipc_link **out) {
    pthread_once(&keyval_once, make_keyval);
    if (keyval == MPI_KEYVAL_INVALID)
        return hpcdl_fail(HPCDL_ERR_MPI, "cuda ipc: MPI_Comm_create_keyval failed");
    int found = 0;
    ipc_link *l = NULL;
    MPI_CHECK(MPI_Comm_get_attr(comm, keyval, &l, &found));
    if (!found) {
        l = calloc(1, sizeof *l);
        if (!l) return hpcdl_fail(HPCDL_ERR_NOMEM, "cuda ipc: out of memory");
        MPI_CHECK(MPI_Comm_set_attr(comm, keyval, l));
    }
    *out = l;
    return HPCDL_OK;
}

// Local: this rank's workspace, scratch and events on GPU dev, and its card.
static int make_own(ipc_link *l, int dev, size_t half, ipc_card *card) {
    l->dev = dev;
    l->half = half;
    CUDA_CHECK(cudaMalloc((void **)&l->ws, 2 * half));
    for (int i = 0; i < NEV; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&l->ev[i],
                                            cudaEventDisableTiming | cudaEventInterprocess));
        CUDA_CHECK(cudaIpcGetEventHandle(&card->ev[i], l->ev[i]));
    }
    CUDA_CHECK(cudaIpcGetMemHandle(&card->mem, l->ws));
    card->dev = dev;
    card->half = half;
    return HPCDL_OK;
}

// Local: every peer's workspace and events opened, and how to read each.
static int open_peers(ipc_link *l, const ipc_card *cards) {
    l->peer_ws = calloc((size_t)l->n, sizeof *l->peer_ws);
    l->peer_ev = calloc((size_t)l->n * NEV, sizeof *l->peer_ev);
    l->direct = calloc((size_t)l->n, sizeof *l->direct);
    if (!l->peer_ws || !l->peer_ev || !l->direct)
        return hpcdl_fail(HPCDL_ERR_NOMEM, "cuda ipc: out of memory");
    for (int p = 0; p < l->n; p++) {
        if (p == l->me) {
            l->peer_ws[p] = l->ws;
            for (int i = 0; i < NEV; i++) l->peer_ev[p * NEV + i] = l->ev[i];
            l->direct[p] = 1;
            continue;
        }
        // peer access is enabled here where the GPUs allow it
        CUDA_CHECK(cudaIpcOpenMemHandle((void **)&l->peer_ws[p], cards[p].mem,
                                        cudaIpcMemLazyEnablePeerAccess));
        for (int i = 0; i < NEV; i++)
            CUDA_CHECK(cudaIpcOpenEventHandle(&l->peer_ev[p * NEV + i], cards[p].ev[i]));
        // which GPU that is here: ordinals differ between processes (e.g. with
        // CUDA_VISIBLE_DEVICES per rank), so ask about the opened memory itself
        struct cudaPointerAttributes at;
        CUDA_CHECK(cudaPointerGetAttributes(&at, l->peer_ws[p]));
        int can = at.device == l->dev;
        if (!can) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, l->dev, at.device));
        l->direct[p] = can && !force_copy();
        if (!l->direct[p] && !l->scratch) CUDA_CHECK(cudaMalloc((void **)&l->scratch, l->half));
    }
    return HPCDL_OK;
}

// Collective over comm: 1 on every rank when every rank's ok is 1.
static int all_ok(const hpcdl_team *t, MPI_Comm comm, int ok, int *all) {
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(&ok, all, 1, MPI_INT, MPI_MIN, comm, &req));
    MPI_CHECK(hpcdl_team_wait(t, &req));
    return HPCDL_OK;
}

static int peer_failed(const char *what) {
    return hpcdl_fail(HPCDL_ERR_CUDA, "cuda ipc: another rank of this node failed to %s its "
                      "device memory (its message says why). Hint: HPCDL_CUDA_IPC=0 "
                      "stages through the host instead.", what);
}

// Collective over comm: the link made again, on GPU dev with halves of at
// least half bytes. Every rank's stream is idle and every peer's reads done
// before anything is freed.
static int relink(hpcdl_team *t, MPI_Comm comm, ipc_link *l, int dev, size_t half,
                  cudaStream_t s) {
    MPI_Request req;
    if (l->made) CUDA_CHECK(cudaStreamSynchronize(s));
    MPI_CHECK(MPI_Ibarrier(comm, &req));
    MPI_CHECK(hpcdl_team_wait(t, &req));
    unlink_all(l);
    MPI_CHECK(MPI_Comm_size(comm, &l->n));
    MPI_CHECK(MPI_Comm_rank(comm, &l->me));
    ipc_card mine, *cards = calloc((size_t)l->n, sizeof *cards);
    if (!cards) return hpcdl_fail(HPCDL_ERR_NOMEM, "cuda ipc: out of memory");
    memset(&mine, 0, sizeof mine);
    int rc = make_own(l, dev, half, &mine), all = 0;
    mine.ok = rc == HPCDL_OK;
    int mrc = MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, cards, sizeof mine, MPI_BYTE, comm,
                             &req);
    if (mrc == MPI_SUCCESS) mrc = hpcdl_team_wait(t, &req);
    if (mrc != MPI_SUCCESS) rc = hpcdl_mpi_fail(mrc, "MPI_Iallgather(ipc cards)", __FILE__,
                                                __LINE__);
    for (int p = 0; rc == HPCDL_OK && p < l->n; p++)
        if (!cards[p].ok) rc = peer_failed("export");
    if (rc == HPCDL_OK) rc = open_peers(l, cards);
    free(cards);
    if (mrc == MPI_SUCCESS) HPCDL_TRY(all_ok(t, comm, rc == HPCDL_OK, &all));
    if (rc == HPCDL_OK && !all) rc = peer_failed("open");
    if (rc != HPCDL_OK) {
        unlink_all(l);
        return rc;
    }
    l->made = 1;
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// one piece: copy in, reduce-scatter from the peers, all-gather from them

// Collective over comm (the host syncs). count elements of send -> recv.
// fits: -1, or for a call's first piece whether this rank's link fits the
// call: then sync A also asks whether every rank's does, and *redo says that
// one did not (nothing was reduced; every rank sets up again and starts the
// piece over). A rank without a fitting link copies nothing in.
static int ipc_piece(hpcdl_team *t, MPI_Comm comm, ipc_link *l, cudaStream_t s,
                     const char *send, char *recv, size_t count, hpcdl_dtype dtype,
                     hpcdl_op op, int fits, int *redo) {
    size_t esz = hpcdl_dtype_size(dtype), h = (l->piece % 2) * l->half;
    MPI_Request req;
    *redo = 0;
    if (fits != 0) {
        // ws[h] is free: every peer's reads of it two pieces ago came before
        // its RED of the last piece, which this stream waited for
        CUDA_CHECK(cudaMemcpyAsync(l->ws + h, send, count * esz, cudaMemcpyDeviceToDevice, s));
        CUDA_CHECK(cudaEventRecord(l->ev[EV_IN], s));
    }
    if (fits < 0) {
        MPI_CHECK(MPI_Ibarrier(comm, &req)); // sync A
        MPI_CHECK(hpcdl_team_wait(t, &req));
    } else { // sync A, and the link check of the call in the same message
        int all = 0;
        HPCDL_TRY(all_ok(t, comm, fits, &all));
        if (!all) {
            *redo = 1;
            return HPCDL_OK;
        }
    }
    l->piece++;
    int n = l->n, me = l->me;
    size_t lo = hpcdl_block_start(count, n, me) * esz;
    size_t mine = hpcdl_block_start(count, n, me + 1) * esz - lo;
    // reduce-scatter: block me, from every peer in rank order after me
    char *own = l->ws + h + lo;
    for (int k = 1; k < n; k++) {
        int p = (me + k) % n;
        CUDA_CHECK(cudaStreamWaitEvent(s, l->peer_ev[p * NEV + EV_IN], 0));
        const char *theirs = l->peer_ws[p] + h + lo;
        if (!l->direct[p] && mine) {
            CUDA_CHECK(cudaMemcpyAsync(l->scratch, theirs, mine, cudaMemcpyDeviceToDevice, s));
            theirs = l->scratch;
        }
        HPCDL_TRY(hpcdl_cuda_reduce(own, own, theirs, mine / esz, dtype, op, s));
    }
    if (t->cross_size > 1) // block me across the nodes (every node has the same blocks)
        HPCDL_TRY(hpcdl_cuda_allreduce_across(t, t->cross, l->dev, own, mine / esz, dtype,
                                              op == HPCDL_AVERAGE ? HPCDL_SUM : op));
    if (op == HPCDL_AVERAGE) HPCDL_TRY(hpcdl_cuda_divide(own, mine / esz, dtype, t->size, s));
    CUDA_CHECK(cudaEventRecord(l->ev[EV_RED], s));
    MPI_CHECK(MPI_Ibarrier(comm, &req)); // sync B
    MPI_CHECK(hpcdl_team_wait(t, &req));
    // all-gather: every block from its owner's workspace
    for (int k = 0; k < n; k++) {
        int p = (me + k) % n;
        size_t plo = hpcdl_block_start(count, n, p) * esz;
        size_t pn = hpcdl_block_start(count, n, p + 1) * esz - plo;
        if (p != me) CUDA_CHECK(cudaStreamWaitEvent(s, l->peer_ev[p * NEV + EV_RED], 0));
        if (pn)
            CUDA_CHECK(cudaMemcpyAsync(recv + plo, l->peer_ws[p] + h + plo, pn,
                                       cudaMemcpyDeviceToDevice, s));
    }
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// entry point

// Collective over t, whose nodes are of equal size (same count, dtype, op,
// path and HPCDL_CUDA_STAGE_BYTES: the agreement check compared them). send
// and recv are memory of GPU dev, the calling thread's current device; s is
// this thread's stream on it, and ready (or NULL) the producer's event.
// Returns with the work queued on s: recv is final once s is idle.
int hpcdl_ipc_allreduce(hpcdl_team *t, int dev, cudaStream_t s, cudaEvent_t ready,
                        const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                        hpcdl_op op) {
    MPI_Comm comm = t->local;
    size_t esz = hpcdl_dtype_size(dtype);
    size_t piece = hpcdl_cuda_stage_bytes() / esz, bytes = count * esz;
    size_t half = bytes < piece * esz ? bytes : piece * esz;
    half = (half + 255) / 256 * 256; // 256-byte aligned halves, as cudaMalloc's
    ipc_link *l = NULL;
    HPCDL_TRY(get_link(comm, &l));
    // Every rank learns at the first piece's sync A whether any rank must set
    // up again (a first call, a bigger piece, another GPU), so all of them do
    // it together, and the usual call pays no extra message for the check.
    int fits = l->made && l->dev == dev && l->half >= half, redo = 0;
    if (ready) CUDA_CHECK(cudaStreamWaitEvent(s, ready, 0)); // after the producer
    for (size_t lo = 0; lo < count; lo += piece) {
        size_t n = count - lo < piece ? count - lo : piece;
        const char *in = (const char *)send + lo * esz;
        char *out = (char *)recv + lo * esz;
        HPCDL_TRY(ipc_piece(t, comm, l, s, in, out, n, dtype, op, lo ? -1 : fits, &redo));
        if (!redo) continue;
        size_t grow = l->made && l->half > half ? l->half : half;
        HPCDL_TRY(relink(t, comm, l, dev, grow, s));
        HPCDL_TRY(ipc_piece(t, comm, l, s, in, out, n, dtype, op, -1, &redo));
    }
    return HPCDL_OK;
}

#endif // HPCDL_WITH_CUDA
