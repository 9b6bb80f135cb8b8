/*
 * cudautil.h - what the CUDA tests (test_cuda, test_cuda_paths, test_cuda_ipc)
 * share: the check of the test's own CUDA calls, the start (MPI, one GPU per
 * rank of a node, the skip when a rank has none), and the count of copies
 * between host and device (test_host_copies).
 */
#ifndef HPCDL_CUDAUTIL_H
#define HPCDL_CUDAUTIL_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>

static int rank, nranks;

// the runtime the test was built against, for its last line
#ifdef FAKE_CUDA
#define CUDA_RUNTIME_NAME "fake"
#else
#define CUDA_RUNTIME_NAME "real"
#endif

// a failed CUDA call of the test itself ends it: it says nothing about hpcdl
#define CUDA_OK(call)                                                           \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "rank %d: %s failed: %s (%s:%d)\n", rank, #call,    \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                \
            MPI_Abort(MPI_COMM_WORLD, 2);                                       \
        }                                                                       \
    } while (0)

// MPI up, rank and nranks set, this rank on GPU local_rank % count (ranks
// beyond the GPU count share). Returns that GPU; when any rank sees none,
// every rank prints the skip and exits 0 here, together.
static int cuda_test_start(int *argc, char ***argv) {
    int provided, n = 0, min_n = 0, local = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    MPI_Allreduce(&n, &min_n, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (min_n == 0) {
        if (rank == 0) printf("SKIP: no CUDA device\n");
        MPI_Finalize();
        exit(0);
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    CUDA_OK(cudaSetDevice(local % n));
    setenv("HPCDL_SHM_SLOT_BYTES", "65536", 0); // hier: many pieces
    return local % n;
}

// ----------------------------------------------------------------------------
// copies between host (pinned or pageable) and device memory this process
// queued so far, to show a path makes none. The fake runtime counts them
// itself. Against the real runtime the Makefile links test_cuda_paths and
// test_cuda_ipc with -Wl,--wrap=cudaMemcpyAsync,--wrap=cudaMemcpy (and
// -DHPCDL_COUNT_COPIES): every such call, the core's included (libhpcdl.a
// and libcudart_static are linked statically), passes through the wrappers
// below first. Other copy calls (2D, peer, to symbols) are not counted; the
// core makes none.

#if defined(FAKE_CUDA)
#include "fake_cuda.h"
static inline unsigned long test_host_copies(void) { return fake_cuda_host_copies(NULL); }
#elif defined(HPCDL_COUNT_COPIES)
static unsigned long counted_copies;

static int test_on_gpu(const void *p) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError(); // old drivers: unregistered host memory is an error
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

static void count_copy(void *dst, const void *src) {
    if (test_on_gpu(dst) != test_on_gpu(src))
        __atomic_add_fetch(&counted_copies, 1, __ATOMIC_RELAXED);
}

cudaError_t __real_cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                   enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t __real_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);

cudaError_t __wrap_cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                   enum cudaMemcpyKind kind, cudaStream_t s) {
    count_copy(dst, src);
    return __real_cudaMemcpyAsync(dst, src, n, kind, s);
}

cudaError_t __wrap_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    count_copy(dst, src);
    return __real_cudaMemcpy(dst, src, n, kind);
}

static inline unsigned long test_host_copies(void) {
    return __atomic_load_n(&counted_copies, __ATOMIC_RELAXED);
}
#else
static inline unsigned long test_host_copies(void) { return 0; } // not counted
#endif

#endif // HPCDL_CUDAUTIL_H
