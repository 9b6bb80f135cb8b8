/*
 * cuda_support.c - what the core knows about CUDA at run time: whether it
 * was compiled with the CUDA path, and whether the MPI library is CUDA-aware
 * (device pointers may go straight to MPI, GPU-direct RDMA on InfiniBand).
 * Without CUDA, also the stand-ins of cuda/cuda_where.c: host memory only.
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> // declares MPIX_Query_cuda_support when Open MPI has it
#endif

int hpcdl_built_with_cuda(void) {
#ifdef HPCDL_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}

// 1 or 0 when the MPI says whether it is CUDA-aware, -1 when it cannot say.
static int mpi_says(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support();
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
    return 0; // Open MPI built without CUDA
#else
    return -1;
#endif
}

// HPCDL_MPI_CUDA_AWARE=0|1|force overrides the query: 1 for MPIs that are
// CUDA-aware without exporting MPIX_Query_cuda_support (refused by
// hpcdl_mpi_cuda_conflict when the MPI says it is not), force for an MPI
// that says no but can read the memory anyway (the fake-runtime tests).
int hpcdl_mpi_cuda_aware(void) {
    const char *env = getenv("HPCDL_MPI_CUDA_AWARE");
    if (env && !strcmp(env, "force")) return 1;
    if (env && *env) return atoi(env) != 0;
    return mpi_says() == 1;
}

const char *hpcdl_mpi_cuda_conflict(void) {
    const char *env = getenv("HPCDL_MPI_CUDA_AWARE");
    if (!env || strcmp(env, "1") || mpi_says() != 0) return NULL;
    return "HPCDL_MPI_CUDA_AWARE=1 but this MPI says it is not CUDA-aware "
           "(MPIX_Query_cuda_support() is 0): it would read device pointers as host "
           "memory. Hint: unset it (hpcdl stages through host memory), or use a "
           "CUDA-aware MPI build";
}

#ifndef HPCDL_WITH_CUDA
int hpcdl_where_resolve(const void *send, const void *recv, size_t bytes,
                        const hpcdl_mem *mem, hpcdl_where *w) {
    w->device = -1;
    w->ready = NULL;
    if (mem && mem->device >= 0 && bytes > 0)
        return hpcdl_fail(HPCDL_ERR_CUDA, "allreduce: the buffers are on GPU %d but this "
                          "core was built without CUDA. Hint: rebuild with nvcc on PATH "
                          "(HPCDL_WITH_CUDA=1 makes a missing nvcc an error), or move the "
                          "tensors to the CPU.", mem->device);
    return HPCDL_OK;
}
void hpcdl_where_release(hpcdl_where *w) { w->ready = NULL; }
int64_t hpcdl_where_path(const hpcdl_where *w) { return 0; }
int64_t hpcdl_where_stage(const hpcdl_where *w) { return 0; }
#endif
