/*
 * hpcdl.h - the public C API of hpcdl's collectives core.
 *
 * Usable from C without Python, like a small MPI library. Every call below is
 * collective over the context's communicator unless it says otherwise, and
 * every rank must make the same calls in the same order with the same count,
 * dtype and op (the agreement check, on by default, turns a mismatch into
 * HPCDL_ERR_MISMATCH on every rank instead of a hang or wrong data).
 *
 *   hpcdl_ctx_create(comm, local_size, &ctx)   topology + shared memory + engine
 *   hpcdl_allreduce(ctx, send, recv, count, dtype, op, algo)
 *        recv[i] = op over ranks of send[i]; send == recv is in place.
 *   hpcdl_reduce_scatter(ctx, send, recv, recvcounts, dtype, op, algo)
 *        send holds sum(recvcounts) elements on every rank; rank r receives the
 *        reduced block r (recvcounts[r] elements, blocks laid out in rank order).
 *   hpcdl_allgatherv(ctx, send, recv, counts, dtype, algo)
 *        rank r contributes counts[r] elements; recv gets all blocks in rank order.
 *   hpcdl_broadcast(ctx, buf, count, dtype, root, algo)
 *   hpcdl_allreduce_async(...) -> handle; hpcdl_poll / hpcdl_wait
 *        (also reduce_scatter, allgatherv and broadcast _async)
 *        queued to one background thread; operations complete in submission
 *        order on every rank.
 *
 * Errors: every function returns HPCDL_OK (0) or a negative hpcdl_err; the
 * message (call, rank, hint) is in hpcdl_last_error() of the calling thread, or
 * in hpcdl_wait's errbuf for asynchronous work. The library never exits.
 */
#ifndef HPCDL_H
#define HPCDL_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HPCDL_VERSION_MAJOR 0
#define HPCDL_VERSION_MINOR 1

// ----------------------------------------------------------------------------
// enums shared with Python (hpcdl/comm/_types.py must keep the same numbers)

typedef enum {
    HPCDL_FLOAT32 = 0,
    HPCDL_FLOAT64 = 1,
    HPCDL_FLOAT16 = 2,
    HPCDL_BFLOAT16 = 3,
    HPCDL_INT32 = 4,
    HPCDL_INT64 = 5,
    HPCDL_NUM_DTYPES = 6
} hpcdl_dtype;

typedef enum {
    HPCDL_SUM = 0,
    HPCDL_AVERAGE = 1,   // sum, then divide by the number of ranks
    HPCDL_MIN = 2,
    HPCDL_MAX = 3,
    HPCDL_PROD = 4,
    HPCDL_NUM_OPS = 5
} hpcdl_op;

typedef enum {
    HPCDL_ALGO_AUTO = 0, // chosen per call from message size and topology
    HPCDL_ALGO_RING = 1, // pipelined ring over MPI point-to-point
    HPCDL_ALGO_HIER = 2, // shared memory inside a node, ring across nodes
    HPCDL_ALGO_MPI = 3,  // the MPI library's own collective (for comparison)
    HPCDL_NUM_ALGOS = 4
} hpcdl_algo;
// Reported in timeline records when hier ran on a shared buffer (zero-copy).
#define HPCDL_USED_SHARED ((hpcdl_algo)HPCDL_NUM_ALGOS)
// Reported when an auto all-reduce of a few KiB across nodes rode inside the
// agreement check's exchange and was reduced locally ("inline").
#define HPCDL_USED_INLINE ((hpcdl_algo)(HPCDL_NUM_ALGOS + 1))

typedef enum {
    HPCDL_OK = 0,
    HPCDL_ERR_ARG = -1,      // bad argument on this rank (null pointer, bad enum)
    HPCDL_ERR_MPI = -2,      // an MPI call failed
    HPCDL_ERR_MISMATCH = -3, // ranks disagree on count, dtype, op or algorithm
    HPCDL_ERR_NOMEM = -4,    // allocation failed
    HPCDL_ERR_CUDA = -5,     // a CUDA call failed, or CUDA was not built in
    HPCDL_ERR_STATE = -6,    // context shut down, or handle unknown
    HPCDL_ERR_PROC_FAILED = -7 // a peer rank failed (ULFM): the context is revoked;
                               // rebuild on a shrunken communicator (hpcdl_ctx_abandon)
} hpcdl_err;

typedef struct hpcdl_ctx hpcdl_ctx;
typedef int64_t hpcdl_handle;

// ----------------------------------------------------------------------------
// context

// Collective over comm. local_size > 0 overrides the node split: ranks
// [k*local_size, (k+1)*local_size) form virtual node k (must divide the size),
// so one machine can exercise the inter-node path. 0 = split by shared memory.
int hpcdl_ctx_create(MPI_Comm comm, int local_size, hpcdl_ctx **out);
// Collective. Drains the engine, frees shared memory and communicators.
int hpcdl_ctx_destroy(hpcdl_ctx *ctx);

// ----------------------------------------------------------------------------
// fault tolerance (ULFM: Open MPI 5 run with mpiexec --with-ft ulfm;
// docs/fault-tolerance.md). A peer that dies during an operation makes that
// operation, and every one after it (queued asynchronous ones included),
// return HPCDL_ERR_PROC_FAILED on every surviving rank; the context's
// communicators are revoked. The caller then shrinks its own communicator
// (MPIX_Comm_shrink) and creates a new context on it.

// 1 if the core was compiled against an MPI with ULFM.
int hpcdl_built_with_ulfm(void);
// Local call: 1 once the context is lost (a peer failed, or hpcdl_ctx_revoke);
// hpcdl_ctx_destroy then abandons it instead of freeing it collectively.
int hpcdl_ctx_is_lost(const hpcdl_ctx *ctx);
// Local call: the lost ranks this rank knows of (ranks of the context's
// communicator), at most max of them; returns how many (0 when none).
int hpcdl_lost_ranks(const hpcdl_ctx *ctx, int *ranks, int max);
// Local call: marks the context lost and revokes its communicators (a
// recovery started by the caller, not by a failure seen here).
void hpcdl_ctx_revoke(hpcdl_ctx *ctx, const char *why);
// Local call for a lost context: stops its threads and frees its memory
// without any communication (its MPI objects are left to MPI_Finalize).
void hpcdl_ctx_abandon(hpcdl_ctx *ctx);
// Local call, at exit after a lost rank: a thread that ends the process
// (status 0) if it is still alive `seconds` later (MPI_Finalize stuck in
// Open MPI's fence, waiting for the dead process).
void hpcdl_exit_watchdog(double seconds);

int hpcdl_rank(const hpcdl_ctx *ctx);
int hpcdl_size(const hpcdl_ctx *ctx);
int hpcdl_local_rank(const hpcdl_ctx *ctx);
int hpcdl_local_size(const hpcdl_ctx *ctx);
int hpcdl_cross_rank(const hpcdl_ctx *ctx);
int hpcdl_cross_size(const hpcdl_ctx *ctx);

// Local call. 1 (default) = check that all ranks agree before every collective.
void hpcdl_set_check(hpcdl_ctx *ctx, int enabled);
// Local call. Ring pipelining chunk in bytes (default 256 KiB).
void hpcdl_set_chunk_bytes(hpcdl_ctx *ctx, size_t bytes);
// Local calls. A collective made outside the core (an MPI call of the caller's
// own on the same ranks, e.g. mpi4py's pickled-object allgather) counts for
// the stall inspector from begin to end, named `name`, like the core's own
// blocking collectives: a rank that never arrives is named, and the job ends
// after HPCDL_STALL_SHUTDOWN_TIME_SECONDS. One at a time per context.
void hpcdl_blocking_begin(hpcdl_ctx *ctx, const char *name);
void hpcdl_blocking_end(hpcdl_ctx *ctx);

// ----------------------------------------------------------------------------
// blocking collectives (host memory; device pointers when built with CUDA)

int hpcdl_allreduce(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                    hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo);
int hpcdl_reduce_scatter(hpcdl_ctx *ctx, const void *send, void *recv,
                         const size_t *recvcounts, hpcdl_dtype dtype, hpcdl_op op,
                         hpcdl_algo algo);
int hpcdl_allgatherv(hpcdl_ctx *ctx, const void *send, void *recv,
                     const size_t *counts, hpcdl_dtype dtype, hpcdl_algo algo);
int hpcdl_broadcast(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype dtype,
                    int root, hpcdl_algo algo);

// Collective: a rank whose buffer failed its own validation calls this in
// place of the collective (nsig: 8 for allreduce, 5 for reduce_scatter, broadcast;
// 4 for allgather), so every rank fails with HPCDL_ERR_MISMATCH instead of
// waiting for it. Needs the agreement check on.
int hpcdl_report_invalid(hpcdl_ctx *ctx, const char *what, int nsig);

// The algorithm 'auto' would pick for an all-reduce of this many bytes.
hpcdl_algo hpcdl_choose_algo(const hpcdl_ctx *ctx, size_t bytes);

// ----------------------------------------------------------------------------
// device memory (cores built with CUDA; docs/cuda.md)

// Where an all-reduce's buffers live, as the caller knows it. The plain calls
// (hpcdl_allreduce, _async) ask CUDA per call instead; the _mem calls never
// guess: device -1 makes no CUDA call at all, device >= 0 is confirmed with
// cudaPointerGetAttributes and any doubt is an error on every rank (as is a
// rank whose location differs from its peers').
typedef struct {
    int device;   // -1: host memory; >= 0: send and recv are memory of this GPU,
                  // which must be the calling thread's current device
    void *stream; // the cudaStream_t that produces send (NULL: the legacy default
                  // stream); the all-reduce reads send only after the work queued
                  // on it before the call, and recv is final when the call (or
                  // hpcdl_wait) returns
} hpcdl_mem;

int hpcdl_allreduce_mem(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                        const hpcdl_mem *mem);
int hpcdl_allreduce_mem_async(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                              hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                              const hpcdl_mem *mem, const char *name, hpcdl_handle *out);

// ----------------------------------------------------------------------------
// asynchronous all-reduce through the background engine

// Local call: queues the work and returns at once. The buffers must stay
// alive and untouched until hpcdl_wait (or a successful poll) says done.
int hpcdl_allreduce_async(hpcdl_ctx *ctx, const void *send, void *recv, size_t count,
                          hpcdl_dtype dtype, hpcdl_op op, hpcdl_algo algo,
                          const char *name, hpcdl_handle *out);
// The same for the other collectives (arguments as in the blocking calls).
int hpcdl_reduce_scatter_async(hpcdl_ctx *ctx, const void *send, void *recv,
                               const size_t *recvcounts, hpcdl_dtype dtype, hpcdl_op op,
                               hpcdl_algo algo, const char *name, hpcdl_handle *out);
int hpcdl_allgatherv_async(hpcdl_ctx *ctx, const void *send, void *recv, const size_t *counts,
                           hpcdl_dtype dtype, hpcdl_algo algo, const char *name,
                           hpcdl_handle *out);
int hpcdl_broadcast_async(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype dtype,
                          int root, hpcdl_algo algo, const char *name, hpcdl_handle *out);
// For a rank whose buffer failed validation: the queued work only joins the
// agreement check of `what` ("allreduce", "reduce_scatter", "allgather",
// "broadcast"), so every rank's operation fails instead of waiting.
int hpcdl_async_invalid(hpcdl_ctx *ctx, const char *what, const char *name,
                        hpcdl_handle *out);
// 1 if done, 0 if not yet, <0 on unknown handle.
int hpcdl_poll(hpcdl_ctx *ctx, hpcdl_handle h);
// Blocks until done; returns the operation's status and copies its message
// into errbuf (may be NULL). The handle is released.
int hpcdl_wait(hpcdl_ctx *ctx, hpcdl_handle h, char *errbuf, size_t errlen);

// A buffer of `bytes` in the node's shared memory (collective over the ranks
// of each node; needs >= 2 ranks per node, the same number on every node).
// An in-place all-reduce of exactly this buffer, with algorithm auto or
// hier, reads and writes the other local ranks' buffers directly instead of
// staging copies. Freed at MPI_Finalize, never before.
int hpcdl_shared_alloc(hpcdl_ctx *ctx, size_t bytes, void **ptr);

// One record per finished asynchronous operation, oldest first.
typedef struct {
    hpcdl_handle handle;
    char name[64];
    size_t bytes;
    int algo;            // hpcdl_algo actually used
    double t_submit;     // MPI_Wtime() seconds
    double t_start;
    double t_agreed;     // every rank had arrived (agreement check done); = t_start without it
    double t_end;
    int status;
} hpcdl_timeline_rec;
// Copies up to max records out and removes them; returns how many.
size_t hpcdl_timeline_drain(hpcdl_ctx *ctx, hpcdl_timeline_rec *out, size_t max);

// ----------------------------------------------------------------------------
// helpers

size_t hpcdl_dtype_size(hpcdl_dtype dtype);
const char *hpcdl_dtype_name(hpcdl_dtype dtype);
const char *hpcdl_op_name(hpcdl_op op);
const char *hpcdl_algo_name(hpcdl_algo algo);
// Message of the last failed call on this thread.
const char *hpcdl_last_error(void);
// 1 if the core was compiled with CUDA support.
int hpcdl_built_with_cuda(void);
// 1 if the MPI library reports CUDA-aware support at run time.
int hpcdl_mpi_cuda_aware(void);

// Element-wise local reduction, exposed for tests and the CUDA staging path:
// out[i] = a[i] op b[i] (AVERAGE reduces like SUM; scaling is separate).
void hpcdl_reduce_local(void *out, const void *a, const void *b, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op);
// buf[i] /= n, in the dtype's arithmetic (integers truncate toward zero).
void hpcdl_divide_local(void *buf, size_t count, hpcdl_dtype dtype, int n);

#ifdef __cplusplus
}
#endif
#endif // HPCDL_H
