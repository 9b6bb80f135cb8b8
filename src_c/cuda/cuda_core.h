/*
 * cuda_core.h - what the two halves of the CUDA path share: the kernels
 * (reduce_kernels.cu, compiled by nvcc as C++) and the all-reduce paths
 * (cuda_allreduce.c, compiled by mpicc). Holds the one check macro every
 * CUDA call goes through and the device reduction API. Only built with
 * HPCDL_WITH_CUDA; what the rest of the core calls is in common.h.
 */
#ifndef HPCDL_CUDA_CORE_H
#define HPCDL_CUDA_CORE_H

#ifdef __cplusplus
#define OMPI_SKIP_MPICXX 1 // hpcdl.h pulls in mpi.h: the C API only, nothing to link
#define MPICH_SKIP_MPICXX 1
#endif
#include <cuda_runtime_api.h>
#include "hpcdl.h"

#ifdef __cplusplus
extern "C" {
// common.h is C only; the kernels need just this from it
int hpcdl_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif

// ----------------------------------------------------------------------------
// errors: every CUDA call is checked here; the message names the call, the
// rank, the place, CUDA's own text and a hint, and the caller gets
// HPCDL_ERR_CUDA back. Kernel launches are checked with
// CUDA_CHECK(cudaGetLastError()) right after the launch.

int hpcdl_cuda_fail(cudaError_t err, const char *call, const char *file, int line);

#define CUDA_CHECK(call)                                                       \
    do {                                                                       \
        cudaError_t cu_rc_ = (call);                                           \
        if (cu_rc_ != cudaSuccess)                                             \
            return hpcdl_cuda_fail(cu_rc_, #call, __FILE__, __LINE__);         \
    } while (0)

// ----------------------------------------------------------------------------
// device reductions (reduce_kernels.cu). Local calls: they queue work on
// `stream` and return; the caller synchronises. Same arithmetic as reduce.c,
// so host and device results are bit-identical.

// out[i] = a[i] op b[i], i < count, all three in device memory. out may be
// a or b exactly (in place) but must not overlap them otherwise. AVERAGE
// reduces like SUM; hpcdl_cuda_divide does the scaling.
int hpcdl_cuda_reduce(void *out, const void *a, const void *b, size_t count,
                      hpcdl_dtype dtype, hpcdl_op op, cudaStream_t stream);
// buf[i] /= n in the dtype's arithmetic (integers truncate toward zero).
int hpcdl_cuda_divide(void *buf, size_t count, hpcdl_dtype dtype, int n,
                      cudaStream_t stream);

// ----------------------------------------------------------------------------
// the IPC transport inside a node (cuda_ipc.c); the core's C files only
// (common.h first: it needs the team)

#if defined(HPCDL_COMMON_H) && !defined(__cplusplus)
// Local: HPCDL_CUDA_IPC is not 0.
int hpcdl_cuda_ipc_enabled(void);
// Local: device all-reduces on team t take the IPC path (enabled, nodes of
// equal size, more than one rank each); the same answer on every rank.
int hpcdl_cuda_uses_ipc(const hpcdl_team *t);
// Collective over t: the all-reduce of device memory through IPC inside each
// node (and, with more than one node, the ring between nodes on each rank's
// block), queued on s, this thread's stream for dev (hpcdl_cuda_stream),
// after ready (NULL: none); recv is final once s is idle. Preconditions
// across ranks: same count, dtype, op, path and HPCDL_CUDA_STAGE_BYTES.
// send, recv: memory of GPU dev, the thread's current device.
int hpcdl_ipc_allreduce(hpcdl_team *t, int dev, cudaStream_t s, cudaEvent_t ready,
                        const void *send, void *recv, size_t count, hpcdl_dtype dtype,
                        hpcdl_op op);

// cuda_allreduce.c, for cuda_ipc.c. Until ev has happened (NULL: until s is
// idle), polling politely.
int hpcdl_cuda_wait(const hpcdl_team *t, cudaStream_t s, cudaEvent_t ev);
// Collective over comm: buf all-reduced in place across comm on this
// thread's stream for dev, finished on return (GPU-direct ring or staged).
int hpcdl_cuda_allreduce_across(hpcdl_team *t, MPI_Comm comm, int dev, void *buf,
                                size_t count, hpcdl_dtype dtype, hpcdl_op op);
#endif

#ifdef __cplusplus
}
#endif
#endif // HPCDL_CUDA_CORE_H
