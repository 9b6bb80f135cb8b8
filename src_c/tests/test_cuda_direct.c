/*
 * test_cuda_direct.c - does this MPI move device memory? A probe run as its
 * own job, so that an MPI that reads device pointers as host memory can only
 * crash the probe, never a training job: each rank fills a device buffer
 * with rank- and position-dependent values, then MPI_Sendrecv passes device
 * pointers around the ring and MPI_Allreduce sums device buffers in place;
 * both results are copied back and checked. It prints one line per rank 0:
 *
 *   gpu-direct probe (...): Sendrecv of device memory right|WRONG,
 *   Allreduce right|WRONG
 *
 * and exits 0 only when both are right. A crash or a wrong answer says: not
 * with this MPI (and its UCX). scripts/gpu-first-run.sh runs it on the
 * registry's Open MPI as it is and on the CUDA-enabled UCX (issue #39); on
 * the fake runtime it passes with FAKE_CUDA_HOST_VISIBLE=1 (make check-fake).
 *
 *   mpirun -n 2 src_c/build/test_cuda_direct
 */
#include <mpi.h>
#include <cuda_runtime_api.h>
#include <string.h>
#include "cudautil.h"

static float value(int r, size_t i) { return (float)((int)((i * 13 + (size_t)r * 5) % 31) - 15); }

// Bytes of the run: small (eager protocol), and large (rendezvous, where
// UCX's CUDA transports take over when they are there).
static const size_t counts[] = {1024, (1 << 22) + 3};

// 1 when count floats of dev equal want(i).
static int matches(const float *dev, size_t count, int from, int sum) {
    float *got = malloc(count * sizeof *got);
    CUDA_OK(cudaMemcpy(got, dev, count * sizeof *got, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        if (sum)
            for (int r = 0; r < nranks; r++) want += value(r, i);
        else
            want = value(from, i);
        bad += got[i] != want;
    }
    free(got);
    return bad == 0;
}

int main(int argc, char **argv) {
    cuda_test_start(&argc, &argv);
    int right_sr = 1, right_ar = 1;
    for (int k = 0; k < 2; k++) {
        size_t count = counts[k], bytes = count * sizeof(float);
        float *host = malloc(bytes), *dsend = NULL, *drecv = NULL;
        for (size_t i = 0; i < count; i++) host[i] = value(rank, i);
        CUDA_OK(cudaMalloc((void **)&dsend, bytes));
        CUDA_OK(cudaMalloc((void **)&drecv, bytes));
        CUDA_OK(cudaMemcpy(dsend, host, bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemsetAsync(drecv, 0xff, bytes, NULL)); // poison: NaN
        CUDA_OK(cudaDeviceSynchronize());
        int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
        MPI_Sendrecv(dsend, (int)count, MPI_FLOAT, right, 1, drecv, (int)count, MPI_FLOAT, left,
                     1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        right_sr &= matches(drecv, count, left, 0);
        MPI_Allreduce(MPI_IN_PLACE, dsend, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        right_ar &= matches(dsend, count, 0, 1);
        CUDA_OK(cudaFree(dsend));
        CUDA_OK(cudaFree(drecv));
        free(host);
    }
    int all_sr = 0, all_ar = 0;
    MPI_Allreduce(&right_sr, &all_sr, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&right_ar, &all_ar, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
        printf("gpu-direct probe (%s runtime, %d ranks, 4 KiB and 16 MiB): Sendrecv of device "
               "memory %s, Allreduce %s\n",
               CUDA_RUNTIME_NAME,
               nranks, all_sr ? "right" : "WRONG", all_ar ? "right" : "WRONG");
    MPI_Finalize();
    return !(all_sr && all_ar);
}
