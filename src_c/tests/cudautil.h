/*
 * cudautil.h - what the CUDA tests (test_cuda, test_cuda_paths) share: the
 * check of the test's own CUDA calls, and the start (MPI, one GPU per rank
 * of a node, the skip when a rank has none).
 */
#ifndef HPCDL_CUDAUTIL_H
#define HPCDL_CUDAUTIL_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>

static int rank, nranks;

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

#endif // HPCDL_CUDAUTIL_H
