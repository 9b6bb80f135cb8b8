/*
 * common.h - internal declarations shared by the core's C files: the context
 * struct, the team of communicators each thread uses, and the one error-check
 * macro that every MPI call goes through.
 */
#ifndef HPCDL_COMMON_H
#define HPCDL_COMMON_H

#include <pthread.h>
#include <stdio.h>
#include "hpcdl.h"

// ULFM, MPI's fault tolerance (Open MPI 5's ftmpi extension): a failed peer
// becomes an error class (MPIX_ERR_PROC_FAILED, _PENDING, MPIX_ERR_REVOKED)
// instead of the end of the job, and communicators can be revoked and shrunk
// (fault.c). Other MPIs, and Open MPI 4, build without it.
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI && defined(MPIX_ERR_PROC_FAILED)
#define HPCDL_ULFM 1
#endif

// ----------------------------------------------------------------------------
// errors: every MPI call is checked here; the message names the call, the
// rank, the place and a hint, and the caller gets HPCDL_ERR_MPI back.

int hpcdl_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// A failed MPI call's message; HPCDL_ERR_PROC_FAILED when its error class is
// ULFM's (a peer failed, or the communicator was revoked), else HPCDL_ERR_MPI.
int hpcdl_mpi_fail(int mpi_rc, const char *call, const char *file, int line);

#define MPI_CHECK(call)                                                        \
    do {                                                                       \
        int mpi_rc_ = (call);                                                  \
        if (mpi_rc_ != MPI_SUCCESS)                                            \
            return hpcdl_mpi_fail(mpi_rc_, #call, __FILE__, __LINE__);         \
    } while (0)

// Propagates an hpcdl error code (message already set by the callee).
#define HPCDL_TRY(call)                                                        \
    do {                                                                       \
        int hp_rc_ = (call);                                                   \
        if (hp_rc_ != HPCDL_OK) return hp_rc_;                                 \
    } while (0)

// ----------------------------------------------------------------------------
// a team: the communicators one thread uses. The caller's thread and the
// engine thread each own one, duplicated from the user's communicator, so
// their messages can never match each other's or the user's.

typedef struct hpcdl_shm hpcdl_shm;

typedef struct {
    MPI_Comm world;     // all ranks
    MPI_Comm local;     // ranks of this (possibly virtual) node
    MPI_Comm cross;     // ranks with the same local rank, one per node
    int rank, size;
    int local_rank, local_size;
    int cross_rank, cross_size;
    int uniform;        // 1 if every node has the same local_size
    hpcdl_shm *shm;     // node shared-memory segment; NULL when local_size == 1
    size_t chunk_bytes; // ring pipelining chunk
    int polite;         // 1: waits test-and-sleep instead of spinning (engine thread)
    int crowded;        // 1: more ranks on this host than cores (waits yield the core)
    int full;           // 1: this host's ranks fill its cores (ranks >= cores)
    int spin;           // 1: HPCDL_WAIT=spin: waits are MPI_Wait (never yield)
    const int *urgent;  // polite teams: > 0 while a caller thread blocks in hpcdl_wait
    double t_agreed;    // MPI_Wtime when the last collective's agreement check ended
    void *scratch;      // shared.c's piece buffer, allocated on first use
    void *xbuf;         // small.c's record slots (one per rank), allocated on first use
    int ft;             // 1: ULFM in force (fault.c): shared-memory waits look for lost peers
    double ft_next;     // MPI_Wtime of the next such look
} hpcdl_team;

// MPI_Test with short sleeps for a polite team: the engine thread waiting for
// a slower rank must not take the core from this rank's own compute
// (backward) running beside it. While the caller's thread is blocked on the
// engine (hpcdl_team_urgent), its core is free and sleeping would only add
// latency, so the wait spins (yielding now and then). The caller's team tests
// a few times, then tests and yields: a spinning MPI_Wait (MPICH's never
// yields; Open MPI's only with mpi_yield_when_idle) holds the core the peer
// may need to send, whenever the host has fewer free cores than ranks
// (crowded, or another process running). HPCDL_WAIT=spin: plain MPI_Wait.
// Returns an MPI error code.
int hpcdl_team_wait(const hpcdl_team *t, MPI_Request *req);
// The same, filling *status (a receive's source and count).
int hpcdl_team_wait_status(const hpcdl_team *t, MPI_Request *req, MPI_Status *status);

static inline int hpcdl_team_urgent(const hpcdl_team *t) {
    return t->urgent && __atomic_load_n(t->urgent, __ATOMIC_RELAXED) > 0;
}

// ----------------------------------------------------------------------------
// where an all-reduce's buffers live (cuda/cuda_where.c; cuda_support.c
// without CUDA), resolved on the caller's thread before the agreement check,
// which compares the path on every rank

typedef struct {
    int device;  // -1: host memory; >= 0: the GPU of both buffers (confirmed)
    void *ready; // cudaEvent_t recorded on the producer's stream at the call
} hpcdl_where;

// Local call: *w from mem (NULL: ask CUDA). An error when the location cannot
// be confirmed, or is a GPU in a core without CUDA.
int hpcdl_where_resolve(const void *send, const void *recv, size_t bytes,
                        const hpcdl_mem *mem, hpcdl_where *w);
void hpcdl_where_release(hpcdl_where *w); // local: frees w->ready
// The agreement check's path fields: 0 host, 1 staged, 2 GPU-direct; the stage
// piece bytes (0 unless staged).
int64_t hpcdl_where_path(const hpcdl_where *w);
int64_t hpcdl_where_stage(const hpcdl_where *w);
// Local call (cuda_support.c): why HPCDL_MPI_CUDA_AWARE=1 contradicts the
// MPI's own answer, or NULL.
const char *hpcdl_mpi_cuda_conflict(void);

typedef struct hpcdl_engine hpcdl_engine;
typedef struct hpcdl_stall hpcdl_stall;
typedef struct hpcdl_shared_buf hpcdl_shared_buf;

struct hpcdl_ctx {
    hpcdl_team main;          // used by blocking calls on the caller's thread
    hpcdl_team eng;           // used only by the engine thread
    int check;                // 1: agreement check before every collective
    int thread_multiple;      // MPI granted MPI_THREAD_MULTIPLE
    pthread_mutex_t mpi_lock; // serialises MPI between threads when it did not
    hpcdl_engine *engine;
    int waiters;              // caller threads blocked in hpcdl_wait (eng.urgent)
    hpcdl_shared_buf **shared; // buffers from hpcdl_shared_alloc (shared.c)
    int nshared, cap_shared;
    hpcdl_stall *stall;       // the stall inspector's heartbeat; NULL when off
    int lost;                 // fault.c: 0; 1 while a thread writes lost_msg; 2: a peer
                              // was lost (or revoke() was called): every call fails
    char lost_msg[768];       // the first failure's message, for every later call
    int lost_ranks[16];       // ranks of main.world named lost (nlost of them, at most 16)
    int nlost;
    char (*hosts)[32];        // ULFM in force: every rank's host name, to name lost ranks
};

// ----------------------------------------------------------------------------
// fault.c: a lost peer under ULFM. Each is a local call.

// 1 when the core is built with ULFM and the job runs with it (mpiexec
// --with-ft ulfm sets OMPI_MCA_mpi_ft_enable).
int hpcdl_ft_in_force(void);
// At context creation (collective over the context): teams' ft flags, hosts.
int hpcdl_ft_setup(hpcdl_ctx *ctx);
// The result of one operation (what: "allreduce", ...; name: the async
// operation's name or NULL): rc unchanged, unless it is HPCDL_ERR_PROC_FAILED
// or the context is lost, when every communicator of the context is revoked
// (so every survivor leaves whatever call it waits in), the lost ranks are
// named, and HPCDL_ERR_PROC_FAILED comes back with one message.
int hpcdl_ft_result(hpcdl_ctx *ctx, int rc, const char *what, const char *name);
// Before an operation: HPCDL_ERR_PROC_FAILED (message set) on a lost context.
int hpcdl_ft_refuse(hpcdl_ctx *ctx, const char *what, const char *name);
// Shared-memory waits call this now and then: HPCDL_ERR_PROC_FAILED when a
// peer of the team has failed or its communicators were revoked. Cheap: looks
// at most every 10 ms, and only when ULFM is in force.
int hpcdl_team_check_peers(hpcdl_team *t);
// stall.c: the heartbeat's communicator (MPI_COMM_NULL when off), to revoke.
MPI_Comm hpcdl_stall_comm(const hpcdl_ctx *ctx);

int hpcdl_stall_start(hpcdl_ctx *ctx, MPI_Comm comm);

// shared.c: node shared-memory buffers all-reduced in place without copies
int hpcdl_shared_alloc_locked(hpcdl_ctx *ctx, size_t bytes, void **out);
hpcdl_shared_buf *hpcdl_shared_find(const hpcdl_ctx *ctx, const hpcdl_team *t,
                                    const void *ptr, size_t bytes);
int64_t hpcdl_shared_id(const hpcdl_shared_buf *b); // -1 for NULL
uint32_t hpcdl_shared_publish(hpcdl_shared_buf *b, int local_rank, size_t count,
                              hpcdl_dtype dtype, hpcdl_op op);
int hpcdl_shared_steal_allreduce(hpcdl_team *t, const hpcdl_shared_buf *b, uint32_t gen,
                                 size_t count, hpcdl_dtype dtype, hpcdl_op op);
int hpcdl_shared_allreduce(hpcdl_team *t, const hpcdl_shared_buf *b, size_t count,
                           hpcdl_dtype dtype, hpcdl_op op);
// The buffer an in-place all-reduce (algo auto or hier) of [ptr, ptr+bytes)
// uses, or NULL. Caller's thread.
static inline hpcdl_shared_buf *hpcdl_shared_for(const hpcdl_ctx *ctx, const hpcdl_team *t,
                                                 const void *send, const void *recv,
                                                 size_t bytes, hpcdl_algo algo) {
    if (send != recv || (algo != HPCDL_ALGO_AUTO && algo != HPCDL_ALGO_HIER) ||
        t->local_size < 2 || !t->uniform)
        return NULL;
    return hpcdl_shared_find(ctx, t, recv, bytes);
}
void hpcdl_stall_stop(hpcdl_ctx *ctx);

// ----------------------------------------------------------------------------
// building blocks (each is collective over the team's communicators):
// teams (team.c) and the agreement check (agree.c)

int hpcdl_team_create(hpcdl_team *t, MPI_Comm comm, int local_size);
int hpcdl_team_free(hpcdl_team *t);

int hpcdl_check_agree(const hpcdl_team *t, const char *what, const int64_t *sig,
                      int nsig, const char *const *names);
// The agreement check from a rank whose own arguments failed validation.
int hpcdl_check_invalid(const hpcdl_team *t, const char *what, int nsig);
// The mismatch message from every rank's fields (all[r * nsig + i]), bad the
// first that differs; returns HPCDL_ERR_MISMATCH. Local call.
int hpcdl_agree_mismatch(const hpcdl_team *t, const char *what, const int64_t *all, int nsig,
                         int bad, const char *const *names);
// small.c: the check across nodes as one exchange of records, which carries
// the data of auto all-reduces of at most hpcdl_small_bytes() bytes.
size_t hpcdl_small_bytes(void);
int hpcdl_exchange_applies(const hpcdl_team *t);
int hpcdl_exchange_agree(hpcdl_team *t, const char *what, const int64_t *sig, int nsig,
                         const char *const *names, const void *payload, size_t pbytes);
int hpcdl_small_allreduce(hpcdl_team *t, void *recv, size_t count, hpcdl_dtype dtype,
                          hpcdl_op op);
const char *hpcdl_coll_name(int64_t code);
// Fields of the all-reduce's signature (dispatch.c): hpcdl_report_invalid's nsig.
#define HPCDL_ALLREDUCE_SIG 8

// ----------------------------------------------------------------------------
// the ring's pipelined step (ring.c), used by the host ring and the
// GPU-direct ring (cuda/): send sn bytes of src to `to` while receiving rn
// bytes from `from`, chunk by chunk, combining chunk k-1 while chunk k is on
// the wire.

typedef struct hpcdl_step hpcdl_step;

// Combines one received chunk: dst = recvd op own (count elements of the
// step's dtype, with its op). Must be finished with recvd when it returns
// (the step reuses that buffer two chunks later). Returns an hpcdl code.
typedef int (*hpcdl_step_reduce_fn)(const hpcdl_step *s, void *dst, const void *recvd,
                                    const void *own, size_t count);

struct hpcdl_step {
    const hpcdl_team *team;      // for its wait policy
    MPI_Comm comm;
    int to, from, tag;
    hpcdl_dtype dtype;
    hpcdl_op op;
    size_t chunk;                // bytes per chunk, a multiple of the element size
    char *tmp[2];                // two chunk-sized receive buffers (only when combining)
    hpcdl_step_reduce_fn reduce; // NULL: hpcdl_reduce_local on host memory
    void *user;                  // the reduce hook's own state (the CUDA path's stream)
};

// own == NULL: received bytes land in dst. own != NULL: they land in tmp[]
// and are combined into dst with own. dst may equal own (in place).
int hpcdl_ring_step(const hpcdl_step *s, const char *src, size_t sn, char *dst, size_t rn,
                    const char *own);

// ----------------------------------------------------------------------------
// the algorithms (each is collective over the team's communicators): ring.c,
// shm.c + hierarchical.c

int hpcdl_ring_allreduce(hpcdl_team *t, MPI_Comm comm, const void *send, void *recv,
                         size_t count, hpcdl_dtype dtype, hpcdl_op op);
int hpcdl_ring_reduce_scatter(hpcdl_team *t, MPI_Comm comm, const void *send,
                              void *recv, const size_t *counts, hpcdl_dtype dtype,
                              hpcdl_op op);
int hpcdl_ring_allgatherv(hpcdl_team *t, MPI_Comm comm, const void *send, void *recv,
                          const size_t *counts, hpcdl_dtype dtype);
int hpcdl_ring_broadcast(hpcdl_team *t, MPI_Comm comm, void *buf, size_t count,
                         hpcdl_dtype dtype, int root);

int hpcdl_shm_create(hpcdl_team *t);
void hpcdl_shm_free(hpcdl_team *t);
int hpcdl_hier_allreduce(hpcdl_team *t, const void *send, void *recv, size_t count,
                         hpcdl_dtype dtype, hpcdl_op op);

// ----------------------------------------------------------------------------
// dispatch.c: one collective on team t (the caller's or the engine's), the
// agreement check first. shared: the caller's hpcdl_shared_for (resolved on
// its thread), or NULL.

int hpcdl_dispatch_allreduce(hpcdl_ctx *ctx, hpcdl_team *t, const hpcdl_shared_buf *shared,
                             const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                             hpcdl_op op, hpcdl_algo algo, const hpcdl_where *where,
                             hpcdl_algo *used);
int hpcdl_dispatch_reduce_scatter(hpcdl_ctx *ctx, hpcdl_team *t, const void *send,
                                   void *recv, const size_t *counts, hpcdl_dtype dtype,
                                   hpcdl_op op, hpcdl_algo algo);
int hpcdl_dispatch_allgatherv(hpcdl_ctx *ctx, hpcdl_team *t, const void *send, void *recv,
                              const size_t *counts, hpcdl_dtype dtype, hpcdl_algo algo);
int hpcdl_dispatch_broadcast(hpcdl_ctx *ctx, hpcdl_team *t, void *buf, size_t count,
                             hpcdl_dtype dtype, int root, hpcdl_algo algo);
// context.c. Collective (with the check on): this rank failed with err before
// the collective; its peers fail in the agreement check, it keeps its message.
int hpcdl_fail_together(hpcdl_ctx *ctx, hpcdl_team *t, const char *what, int nsig, int err);
// context.c. Local call: the enums in range.
int hpcdl_check_enums(const char *what, hpcdl_dtype d, hpcdl_op op, hpcdl_algo a);

#ifdef HPCDL_WITH_CUDA
// cuda/cuda_where.c. Local call: 1 if p is device (or managed) memory;
// 0 for host memory, when there is no GPU or CUDA driver, or the query fails.
int hpcdl_is_device_ptr(const void *p);
size_t hpcdl_cuda_stage_bytes(void);
// cuda/cuda_allreduce.c. Collective over t: the all-reduce of device buffers
// (GPU-direct when MPI is CUDA-aware, else staged through pinned host
// memory), after where->ready. Called by the dispatch after the agreement
// check (which compared the path), with algo resolved.
int hpcdl_cuda_allreduce(hpcdl_ctx *ctx, hpcdl_team *t, const hpcdl_where *where,
                         const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                         hpcdl_op op, hpcdl_algo algo);
#endif

// ----------------------------------------------------------------------------
// mpi_coll.c: MPI's own collectives on t->world. _pieces leaves the
// average's division to the caller (device memory); the others divide on
// the host.
int hpcdl_mpi_allreduce_pieces(hpcdl_team *t, const void *send, void *recv, size_t count,
                               hpcdl_dtype dtype, hpcdl_op op, int blocking_only);
int hpcdl_mpi_allreduce(hpcdl_team *t, const void *send, void *recv, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op);
int hpcdl_mpi_reduce_scatter(hpcdl_team *t, const void *send, void *recv,
                             const size_t *counts, hpcdl_dtype dtype, hpcdl_op op);
int hpcdl_mpi_allgatherv(hpcdl_team *t, const void *send, void *recv, const size_t *counts,
                         hpcdl_dtype dtype);
int hpcdl_mpi_broadcast(hpcdl_team *t, void *buf, size_t count, hpcdl_dtype dtype, int root);
MPI_Datatype hpcdl_mpi_dtype(hpcdl_dtype dtype);
int hpcdl_mpi_op(hpcdl_dtype dtype, hpcdl_op op, MPI_Op *out);

// ----------------------------------------------------------------------------
// block arithmetic

// Balanced split of count elements into n blocks: block i starts at
// hpcdl_block_start(count, n, i) and ends at hpcdl_block_start(count, n, i + 1).
static inline size_t hpcdl_block_start(size_t count, int n, int i) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    return (size_t)i * q + ((size_t)i < r ? (size_t)i : r);
}

static inline int hpcdl_mod(int a, int n) { return ((a % n) + n) % n; }

#endif // HPCDL_COMMON_H
