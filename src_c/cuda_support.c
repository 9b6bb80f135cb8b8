/*
 * cuda_support.c - what the core knows about CUDA at run time: whether it
 * was compiled with the CUDA path, and whether the MPI library is CUDA-aware
 * (device pointers may go straight to MPI, GPU-direct RDMA on InfiniBand).
 */
#include <stdlib.h>
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

// HPCDL_MPI_CUDA_AWARE=0|1 overrides the query (some MPIs are CUDA-aware
// without exporting MPIX_Query_cuda_support).
int hpcdl_mpi_cuda_aware(void) {
    const char *env = getenv("HPCDL_MPI_CUDA_AWARE");
    if (env && *env) return atoi(env) != 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support();
#else
    return 0;
#endif
}
