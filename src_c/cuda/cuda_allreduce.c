/*
 * cuda_allreduce.c - all-reduce of device buffers, reached from
 * hpcdl_dispatch_allreduce for buffers cuda_where.c found on a GPU, after
 * the producer's ready event. Three ways:
 *
 *   IPC (every rank on one node, HPCDL_CUDA_IPC not 0): cuda_ipc.c, each
 *   rank reading its peers' device memory directly; never the host.
 *
 *   GPU-direct (hpcdl_mpi_cuda_aware()): device pointers go straight to MPI,
 *   which moves them with GPUDirect RDMA on InfiniBand. algo=mpi hands the
 *   buffer to MPI_Allreduce; otherwise ring.c's ring runs on the device
 *   buffer, its reductions done on the GPU by reduce_kernels.cu.
 *
 *   staging (MPI not CUDA-aware): the buffer travels in pieces through two
 *   pinned host buffers; while the host all-reduces piece k with the host
 *   code (ring / hier / MPI), the stream copies piece k-1 back up and piece
 *   k+1 down:
 *
 *       stream:  D2H 0 | D2H 1         | H2D 0  D2H 2 | H2D 1  D2H 3 | ...
 *       host:          | all-reduce 0  | all-reduce 1 | all-reduce 2 | ...
 *
 *   Time ~ one piece's copy + max(copy, all-reduce) per piece.
 *
 * Each thread (the caller's, the engine's) keeps its own stream, events,
 * pinned pieces and device scratch per GPU it used; they are freed when the
 * thread exits. Nothing here runs until device memory is passed, so a CUDA
 * build imports and works on machines without GPU or driver. Waits poll
 * (gpu_wait), and a failed call drains its stream before returning.
 */
// setup.py compiles every src_c/cuda/*.c, with or without CUDA: without it
// this file is empty
#ifdef HPCDL_WITH_CUDA
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common.h"
#include "cuda_core.h"

enum { TAG_DEV_RS = 7311 };

// ----------------------------------------------------------------------------
// errors

static const char *cuda_hint(cudaError_t err) {
    switch (err) {
    case cudaErrorMemoryAllocation:
        return "the GPU or pinned host memory is full: free memory, or lower "
               "HPCDL_CUDA_STAGE_BYTES / the chunk size";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU or driver: check nvidia-smi, the driver version and "
               "CUDA_VISIBLE_DEVICES";
    case cudaErrorInvalidValue:
    case cudaErrorIllegalAddress:
        return "a buffer is not valid memory of count elements on this GPU (freed, "
               "too small, or another process's)";
    default:
        return "check the buffers and the GPU (nvidia-smi); CUDA_LAUNCH_BLOCKING=1 "
               "pins an asynchronous error on the call that caused it";
    }
}

int hpcdl_cuda_fail(cudaError_t err, const char *call, const char *file, int line) {
    int rank = -1, initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return hpcdl_fail(HPCDL_ERR_CUDA, "%s failed on rank %d: %s (%s) (%s:%d). Hint: %s.",
                      call, rank, cudaGetErrorName(err), cudaGetErrorString(err), file,
                      line, cuda_hint(err));
}

// ----------------------------------------------------------------------------
// per-thread resources, kept between calls, one set per GPU the thread used

enum { MAX_GPUS = 64 };

typedef struct {
    int made;              // 1 once the handles below exist
    cudaStream_t stream;   // every copy and kernel of this thread's calls
    cudaEvent_t staged[2]; // staging: piece k has reached pinned piece k % 2
    char *pinned;          // staging: two pinned host pieces
    size_t pinned_bytes;
    char *scratch;         // GPU-direct ring: two device receive chunks
    size_t scratch_bytes;
} gpu_state;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

// At thread exit, best effort: there is no caller left to hand an error to.
// Only GPUs this thread used have state, so no context is made elsewhere.
static void release_at_exit(void *p) {
    gpu_state *gs = p;
    for (int d = 0; d < MAX_GPUS; d++) {
        gpu_state *g = &gs[d];
        if (!g->made || cudaSetDevice(d) != cudaSuccess) continue;
        if (g->pinned) (void)cudaFreeHost(g->pinned);
        if (g->scratch) (void)cudaFree(g->scratch);
        for (int i = 0; i < 2; i++) (void)cudaEventDestroy(g->staged[i]);
        (void)cudaStreamDestroy(g->stream);
    }
    (void)cudaGetLastError();
    free(gs);
}

static void make_key(void) { pthread_key_create(&state_key, release_at_exit); }

// This thread's state for GPU dev (its current device), made on first use.
static int get_state(int dev, gpu_state **out) {
    if (dev < 0 || dev >= MAX_GPUS)
        return hpcdl_fail(HPCDL_ERR_CUDA, "cuda all-reduce: GPU %d is beyond the %d this "
                          "build handles", dev, MAX_GPUS);
    pthread_once(&state_once, make_key);
    gpu_state *gs = pthread_getspecific(state_key);
    if (!gs) {
        gs = calloc(MAX_GPUS, sizeof *gs);
        if (!gs) return hpcdl_fail(HPCDL_ERR_NOMEM, "cuda all-reduce: out of memory");
        pthread_setspecific(state_key, gs);
    }
    gpu_state *g = &gs[dev];
    if (!g->made) {
        // non-blocking: ordered after the producer by the ready event, not by
        // the legacy stream (which would also serialise with unrelated work)
        CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
        for (int i = 0; i < 2; i++)
            CUDA_CHECK(cudaEventCreateWithFlags(&g->staged[i], cudaEventDisableTiming));
        g->made = 1;
    }
    *out = g;
    return HPCDL_OK;
}

static int ensure_pinned(gpu_state *g, size_t bytes) {
    if (g->pinned_bytes >= bytes) return HPCDL_OK;
    if (g->pinned) CUDA_CHECK(cudaFreeHost(g->pinned));
    g->pinned = NULL;
    g->pinned_bytes = 0;
    CUDA_CHECK(cudaMallocHost((void **)&g->pinned, bytes));
    g->pinned_bytes = bytes;
    return HPCDL_OK;
}

static int ensure_scratch(gpu_state *g, size_t bytes) {
    if (g->scratch_bytes >= bytes) return HPCDL_OK;
    if (g->scratch) CUDA_CHECK(cudaFree(g->scratch));
    g->scratch = NULL;
    g->scratch_bytes = 0;
    CUDA_CHECK(cudaMalloc((void **)&g->scratch, bytes));
    g->scratch_bytes = bytes;
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// waits. Until ev has happened (ev NULL: until the stream is idle), without
// holding a core the rank's compute needs: the engine (polite team) sleeps
// between queries as hpcdl_team_wait does, a blocking caller yields. CUDA's
// own synchronize calls spin unless the context was made with blocking sync,
// which is the user's choice, not ours.

int hpcdl_cuda_wait(const hpcdl_team *t, cudaStream_t s, cudaEvent_t ev) {
    long sleep_ns = 2000;
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
        if (e == cudaSuccess) return HPCDL_OK;
        if (e != cudaErrorNotReady)
            return hpcdl_cuda_fail(e, ev ? "cudaEventQuery" : "cudaStreamQuery", __FILE__,
                                   __LINE__);
        if (spins < 64) continue; // a short kernel or copy: keep asking
        if (!t->polite || hpcdl_team_urgent(t)) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 50000) sleep_ns *= 2;
    }
}

// After a failure: let what this call queued finish, so that no copy lands
// in the caller's buffers after it returned. Errors here add nothing.
static void settle(gpu_state *g) {
    (void)cudaStreamSynchronize(g->stream);
    (void)cudaGetLastError();
}

// The average's division of n elements of device memory, finished on return.
static int divide_on_device(const hpcdl_team *t, gpu_state *g, void *buf, size_t n,
                            hpcdl_dtype dtype, int by) {
    HPCDL_TRY(hpcdl_cuda_divide(buf, n, dtype, by, g->stream));
    return hpcdl_cuda_wait(t, g->stream, NULL);
}

// ----------------------------------------------------------------------------
// staging through pinned host memory

// One piece on the host, with the algorithm dispatch resolved (mpi, hier or
// ring; over comm: the ring only, for the step between nodes).
static int host_allreduce(hpcdl_team *t, MPI_Comm comm, void *buf, size_t n,
                          hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo) {
    if (comm != t->world || algo == HPCDL_ALGO_RING)
        return hpcdl_ring_allreduce(t, comm, buf, buf, n, dtype, op);
    if (algo == HPCDL_ALGO_HIER) return hpcdl_hier_allreduce(t, buf, buf, n, dtype, op);
    return hpcdl_mpi_allreduce(t, buf, buf, n, dtype, op);
}

// Queues the copy of piece k of src (pieces of `piece` elements) into pinned
// piece k % 2 and marks its arrival with staged[k % 2].
static int stage_down(gpu_state *g, const char *src, size_t k, size_t piece, size_t count,
                      size_t esz) {
    size_t lo = k * piece, n = count - lo < piece ? count - lo : piece;
    char *dst = g->pinned + (k % 2) * piece * esz;
    CUDA_CHECK(cudaMemcpyAsync(dst, src + lo * esz, n * esz, cudaMemcpyDefault, g->stream));
    CUDA_CHECK(cudaEventRecord(g->staged[k % 2], g->stream));
    return HPCDL_OK;
}

// Preconditions across ranks: same count, dtype, op, algo and stage size.
// All copies share one stream, so the copy into pinned piece k % 2 for piece
// k+2 runs only after piece k's copy back out of it.
static int staged_allreduce(hpcdl_team *t, MPI_Comm comm, gpu_state *g, const void *send,
                            void *recv, size_t count, hpcdl_dtype dtype, hpcdl_op op,
                            hpcdl_algo algo) {
    size_t esz = hpcdl_dtype_size(dtype), piece = hpcdl_cuda_stage_bytes() / esz;
    size_t npieces = (count + piece - 1) / piece;
    HPCDL_TRY(ensure_pinned(g, 2 * piece * esz));
    HPCDL_TRY(stage_down(g, send, 0, piece, count, esz));
    for (size_t k = 0; k < npieces; k++) {
        if (k + 1 < npieces) HPCDL_TRY(stage_down(g, send, k + 1, piece, count, esz));
        HPCDL_TRY(hpcdl_cuda_wait(t, NULL, g->staged[k % 2]));
        size_t lo = k * piece, n = count - lo < piece ? count - lo : piece;
        char *host = g->pinned + (k % 2) * piece * esz;
        HPCDL_TRY(host_allreduce(t, comm, host, n, dtype, op, algo));
        CUDA_CHECK(cudaMemcpyAsync((char *)recv + lo * esz, host, n * esz,
                                   cudaMemcpyDefault, g->stream));
    }
    return hpcdl_cuda_wait(t, g->stream, NULL);
}

// ----------------------------------------------------------------------------
// GPU-direct ring: ring.c's algorithm on a device buffer, in place.
//
//   reduce-scatter, steps s = 0 .. N-2: send block (r - s - 1), receive block
//   (r - s - 2) into scratch and reduce it on the GPU into this rank's copy;
//   after N-1 steps rank r holds the fully reduced block r.
//   all-gather: ring.c's own (pure MPI, so device pointers pass as they are).
//
// Cost as ring.c: each rank sends 2(N-1)/N of the buffer. Each step is
// ring.c's hpcdl_ring_step with a GPU reduction: the kernel reducing chunk k
// runs while chunk k+1 is on the wire.

// A kernel launch and a stream sync cost ~10 us per chunk, which a
// host-sized chunk (256 KiB by default) would not hide: GPU chunks are at
// least 1 MiB.
static size_t gpu_chunk(const hpcdl_team *t, hpcdl_dtype dtype) {
    size_t esz = hpcdl_dtype_size(dtype), c = t->chunk_bytes;
    if (c < ((size_t)1 << 20)) c = (size_t)1 << 20;
    if (c > (size_t)INT_MAX / 2) c = (size_t)INT_MAX / 2; // MPI counts are int
    return c - c % esz;
}

// The step's reduce hook: dst = recvd op own on the GPU, finished on return
// (the step reuses recvd's scratch two chunks later).
static int reduce_on_device(const hpcdl_step *s, void *dst, const void *recvd,
                            const void *own, size_t count) {
    gpu_state *g = s->user;
    HPCDL_TRY(hpcdl_cuda_reduce(dst, recvd, own, count, s->dtype, s->op, g->stream));
    return hpcdl_cuda_wait(s->team, g->stream, NULL);
}

static int dev_reduce_scatter(hpcdl_team *t, MPI_Comm comm, int n, int r, gpu_state *g,
                              char *buf, const size_t *off, hpcdl_dtype dtype, hpcdl_op op) {
    size_t esz = hpcdl_dtype_size(dtype);
    hpcdl_step a = {t, comm, (r + 1) % n, hpcdl_mod(r - 1, n), TAG_DEV_RS, dtype, op,
                    gpu_chunk(t, dtype), {NULL, NULL}, reduce_on_device, g};
    HPCDL_TRY(ensure_scratch(g, 2 * a.chunk));
    a.tmp[0] = g->scratch;
    a.tmp[1] = g->scratch + a.chunk;
    for (int s = 0; s < n - 1; s++) {
        int sb = hpcdl_mod(r - s - 1, n), rb = hpcdl_mod(r - s - 2, n);
        char *dst = buf + off[rb] * esz; // reduced in place: own is dst
        HPCDL_TRY(hpcdl_ring_step(&a, buf + off[sb] * esz, (off[sb + 1] - off[sb]) * esz,
                                  dst, (off[rb + 1] - off[rb]) * esz, dst));
    }
    return HPCDL_OK;
}

// Collective over comm (t->world, or t->cross for cuda_ipc.c's step across
// nodes). Preconditions across ranks: same count, dtype, op. In place on buf.
static int dev_ring_allreduce(hpcdl_team *t, MPI_Comm comm, gpu_state *g, void *buf,
                              size_t count, hpcdl_dtype dtype, hpcdl_op op) {
    int n = 1, r = 0;
    MPI_CHECK(MPI_Comm_size(comm, &n));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    if (n == 1) return HPCDL_OK; // nothing to reduce; the average divides by 1
    size_t esz = hpcdl_dtype_size(dtype);
    size_t *off = malloc(sizeof(size_t) * (2 * (size_t)n + 1)); // then counts[n]
    if (!off) return hpcdl_fail(HPCDL_ERR_NOMEM, "cuda ring all-reduce: out of memory");
    size_t *counts = off + n + 1;
    for (int i = 0; i <= n; i++) off[i] = hpcdl_block_start(count, n, i);
    for (int i = 0; i < n; i++) counts[i] = off[i + 1] - off[i];
    char *mine = (char *)buf + off[r] * esz;
    int rc = dev_reduce_scatter(t, comm, n, r, g, buf, off, dtype, op);
    if (rc == HPCDL_OK && op == HPCDL_AVERAGE) // 1/N of the work, before the gather
        rc = divide_on_device(t, g, mine, counts[r], dtype, n);
    if (rc == HPCDL_OK) rc = hpcdl_ring_allgatherv(t, comm, mine, buf, counts, dtype);
    free(off);
    return rc;
}

// MPI has no 16-bit float reduction that runs on the GPU (hpcdl's own
// MPI_Op reads host memory), so those dtypes take the ring even for algo=mpi;
// hier needs host shared memory, so it takes the ring too.
static int direct_allreduce(hpcdl_team *t, gpu_state *g, const void *send, void *recv,
                            size_t count, hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo) {
    int half = dtype == HPCDL_FLOAT16 || dtype == HPCDL_BFLOAT16;
    if (algo == HPCDL_ALGO_MPI && !half) {
        // always the blocking call: Open MPI 4.x takes device pointers in
        // point-to-point and blocking collectives, not in MPI_Iallreduce
        HPCDL_TRY(hpcdl_mpi_allreduce_pieces(t, send, recv, count, dtype, op, 1));
        return op == HPCDL_AVERAGE ? divide_on_device(t, g, recv, count, dtype, t->size)
                                   : HPCDL_OK;
    }
    if (send != recv) {
        CUDA_CHECK(cudaMemcpyAsync(recv, send, count * hpcdl_dtype_size(dtype),
                                   cudaMemcpyDefault, g->stream));
        HPCDL_TRY(hpcdl_cuda_wait(t, g->stream, NULL));
    }
    return dev_ring_allreduce(t, t->world, g, recv, count, dtype, op);
}

// ----------------------------------------------------------------------------
// entry points

// Collective over comm (cuda_ipc.c's step between nodes: t->cross): buf,
// count elements of memory of GPU dev, the thread's current device,
// all-reduced in place, on this thread's stream for dev, after what is
// queued there already; finished on return. GPU-direct ring when MPI is
// CUDA-aware, else staged through pinned memory a piece at a time with the
// host ring. Preconditions across ranks: same count, dtype, op, path.
int hpcdl_cuda_allreduce_across(hpcdl_team *t, MPI_Comm comm, int dev, void *buf,
                                size_t count, hpcdl_dtype dtype, hpcdl_op op) {
    gpu_state *g = NULL;
    HPCDL_TRY(get_state(dev, &g));
    if (count == 0) return HPCDL_OK;
    if (hpcdl_mpi_cuda_aware()) {
        HPCDL_TRY(hpcdl_cuda_wait(t, g->stream, NULL)); // MPI reads buf itself
        return dev_ring_allreduce(t, comm, g, buf, count, dtype, op);
    }
    return staged_allreduce(t, comm, g, buf, buf, count, dtype, op, HPCDL_ALGO_RING);
}


// Local: the IPC path applies (the same answer on every rank: the team's
// topology and HPCDL_CUDA_IPC, which the agreement check compares).
int hpcdl_cuda_uses_ipc(const hpcdl_team *t) {
    return hpcdl_cuda_ipc_enabled() && t->local_size > 1 && t->uniform;
}

// Collective over t, called by hpcdl_dispatch_allreduce after the agreement
// check (count, dtype, op, algo and the path: device, CUDA-awareness, stage
// size) with algo resolved (mpi, hier or ring). Both buffers are memory of
// GPU where->device (hpcdl_where_resolve). Blocking: the result is in recv on
// return; on an error nothing this call queued is still running.
int hpcdl_cuda_allreduce(hpcdl_ctx *ctx, hpcdl_team *t, const hpcdl_where *where,
                         const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                         hpcdl_op op, hpcdl_algo algo) {
    if (count == 0) return HPCDL_OK; // no path sends anything for 0 elements
    int dev = where->device, cur = -1;
    // the caller's thread is on dev already (checked at resolve): hpcdl never
    // switches a user's thread. The engine thread is hpcdl's own; it moves to
    // the GPU the user's buffers are on and stays, so no context is ever made
    // on a GPU the user did not choose.
    CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != dev) {
        if (t != &ctx->eng)
            return hpcdl_fail(HPCDL_ERR_ARG, "allreduce: the current device changed to %d "
                              "since the call was checked on GPU %d", cur, dev);
        CUDA_CHECK(cudaSetDevice(dev));
    }
    gpu_state *g = NULL;
    HPCDL_TRY(get_state(dev, &g));
    int rc;
    if (hpcdl_cuda_uses_ipc(t)) { // one node: the peers' memory directly (cuda_ipc.c)
        rc = hpcdl_ipc_allreduce(t, dev, g->stream, (cudaEvent_t)where->ready, send,
                                 recv, count, dtype, op);
        if (rc == HPCDL_OK) rc = hpcdl_cuda_wait(t, g->stream, NULL);
    } else {
        // MPI and this thread's stream read send directly: first the producer's
        // work queued before the call (its stream, recorded at the call)
        if (where->ready) HPCDL_TRY(hpcdl_cuda_wait(t, NULL, (cudaEvent_t)where->ready));
        rc = hpcdl_mpi_cuda_aware() ? direct_allreduce(t, g, send, recv, count, dtype, op, algo)
                                    : staged_allreduce(t, t->world, g, send, recv, count, dtype,
                                                       op, algo);
    }
    if (rc != HPCDL_OK) settle(g);
    return rc;
}

#endif // HPCDL_WITH_CUDA
