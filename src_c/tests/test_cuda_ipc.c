/*
 * test_cuda_ipc.c - the CUDA IPC calls the core's IPC path relies on, between
 * the ranks of one node: a rank's device memory and interprocess events
 * opened by its peers, the peers' reads ordered after the owner's stream
 * (cudaStreamWaitEvent on the opened event), a reduction kernel reading a
 * peer's memory directly, and no host copy on the way (counted by the fake
 * runtime, or through the linker's --wrap on the real one: cudautil.h).
 * Built against the fake runtime (make check-fake) and the real one
 * (check-cuda).
 *
 * Each rank writes rank- and position-dependent values into its buffer on a
 * stream from pinned memory, behind 20 ms of other work in the fake, records
 * an interprocess event and exports both; every peer waits for that event on
 * an idle stream and copies the buffer out device to device: a missing wait
 * reads the poison the buffer held before.
 *
 *   mpirun -n 3 src_c/build/fake/test_cuda_ipc   (all ranks on one node)
 *   FAKE_CUDA_PEER=0: GPUs without peer access (the kernel on a peer's memory
 *   of another GPU must then fail; copies still work)
 */
#include <mpi.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "common.h"
#include "cuda_core.h"
#include "testutil.h"
#include "cudautil.h"
#ifdef FAKE_CUDA
#include "fake_cuda.h"
#endif

enum { COUNT = 4099 };

typedef struct {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t ev;
    int dev;
} exported;

#ifdef FAKE_CUDA
static void slow(void *arg) { usleep(*(const int *)arg); }
#endif

static float value(int r, size_t i) { return (float)((int)((i * 31 + (size_t)r * 7) % 101) - 50) / 4; }


int main(int argc, char **argv) {
    int dev = cuda_test_start(&argc, &argv);
    MPI_Comm node;
    int nlocal = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &nlocal);
    if (nlocal != nranks) {
        if (rank == 0) printf("SKIP: test_cuda_ipc needs every rank on one node\n");
        MPI_Finalize();
        return 0;
    }
    size_t bytes = COUNT * sizeof(float);
    cudaStream_t s, rd; // s writes this rank's buffer; rd reads the peers' (idle until then)
    cudaEvent_t done;
    float *mine = NULL, *scratch = NULL, *host = NULL, *got = malloc(bytes);
    CUDA_OK(cudaMallocHost((void **)&host, bytes)); // pinned: the copy below stays queued
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&rd, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventInterprocess));
    CUDA_OK(cudaMalloc((void **)&mine, bytes));
    CUDA_OK(cudaMalloc((void **)&scratch, bytes));

    // an event without cudaEventInterprocess has no handle; nor has a pointer
    // inside an allocation
    cudaEvent_t plain;
    cudaIpcEventHandle_t eh;
    CUDA_OK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    CHECK(cudaIpcGetEventHandle(&eh, plain) != cudaSuccess, "rank %d: a plain event exported",
          rank);
    (void)cudaGetLastError();
#ifdef FAKE_CUDA
    cudaIpcMemHandle_t mh;
    CHECK(cudaIpcGetMemHandle(&mh, mine + 1) != cudaSuccess, "rank %d: an inner pointer "
          "exported", rank);
    (void)cudaGetLastError();
#endif

    // poison, then the values behind slow work, then the event
    memset(host, 0xff, bytes);
    CUDA_OK(cudaMemcpy(mine, host, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    for (size_t i = 0; i < COUNT; i++) host[i] = value(rank, i);
#ifdef FAKE_CUDA
    int us = 20000;
    CUDA_OK(fake_cuda_launch(s, slow, &us, sizeof us));
#endif
    CUDA_OK(cudaMemcpyAsync(mine, host, bytes, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaEventRecord(done, s));

    exported me, *all = malloc(sizeof *all * (size_t)nranks);
    memset(&me, 0, sizeof me);
    CUDA_OK(cudaIpcGetMemHandle(&me.mem, mine));
    CUDA_OK(cudaIpcGetEventHandle(&me.ev, done));
    me.dev = dev;
    MPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    // opening one's own handle is an error in CUDA
    void *self = NULL;
    if (nranks > 1)
        CHECK(cudaIpcOpenMemHandle(&self, me.mem, cudaIpcMemLazyEnablePeerAccess) !=
              cudaSuccess, "rank %d: opened its own handle", rank);
    (void)cudaGetLastError();

    for (int k = 1; k < nranks; k++) {
        int p = (rank + k) % nranks;
        float *peer = NULL;
        cudaEvent_t pev;
        CUDA_OK(cudaIpcOpenMemHandle((void **)&peer, all[p].mem, cudaIpcMemLazyEnablePeerAccess));
        CUDA_OK(cudaIpcOpenEventHandle(&pev, all[p].ev));
        struct cudaPointerAttributes at;
        CUDA_OK(cudaPointerGetAttributes(&at, peer));
        CHECK(at.type == cudaMemoryTypeDevice && at.device == all[p].dev, "rank %d: peer %d's "
              "memory is type %d on GPU %d, want device memory of GPU %d", rank, p,
              (int)at.type, at.device, all[p].dev);
        // ordered after the peer's stream: the copy waits for its event
        unsigned long before = test_host_copies();
        CUDA_OK(cudaStreamWaitEvent(rd, pev, 0));
        CUDA_OK(cudaMemcpyAsync(scratch, peer, bytes, cudaMemcpyDeviceToDevice, rd));
        CHECK(test_host_copies() == before, "rank %d: a device-to-device copy from peer %d was "
              "counted as a host copy", rank, p);
        CUDA_OK(cudaMemcpyAsync(got, scratch, bytes, cudaMemcpyDeviceToHost, rd));
        CUDA_OK(cudaStreamSynchronize(rd));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < COUNT; i++)
            if (got[i] != value(p, i) && bad++ == 0) first = i;
        CHECK(bad == 0, "rank %d: peer %d's memory through IPC: %zu wrong, first at %zu "
              "(got %g want %g)", rank, p, bad, first, bad ? got[first] : 0,
              bad ? value(p, first) : 0);
        CHECK(test_host_copies() == before + 1, "rank %d: %lu host copies counted, want 1",
              rank, test_host_copies() - before);
        // a kernel reading the peer's memory: same GPU or peer access
        int can = all[p].dev == dev;
        if (!can) CUDA_OK(cudaDeviceCanAccessPeer(&can, dev, all[p].dev));
        CUDA_OK(cudaStreamWaitEvent(rd, done, 0)); // the kernel reads mine too
        int rc = hpcdl_cuda_reduce(scratch, mine, peer, COUNT, HPCDL_FLOAT32, HPCDL_SUM, rd);
        if (can) {
            CHECK(rc == HPCDL_OK, "rank %d: kernel on peer %d's memory: %s", rank, p,
                  hpcdl_last_error());
            CUDA_OK(cudaMemcpyAsync(got, scratch, bytes, cudaMemcpyDeviceToHost, rd));
            CUDA_OK(cudaStreamSynchronize(rd));
            bad = 0;
            for (size_t i = 0; i < COUNT; i++) bad += got[i] != value(rank, i) + value(p, i);
            CHECK(bad == 0, "rank %d: sum with peer %d's memory: %zu wrong", rank, p, bad);
        } else {
#ifdef FAKE_CUDA
            CHECK(rc != HPCDL_OK, "rank %d: a kernel read GPU %d's memory from GPU %d "
                  "without peer access", rank, all[p].dev, dev);
#endif
            (void)cudaGetLastError();
        }
        CUDA_OK(cudaIpcCloseMemHandle(peer));
        CUDA_OK(cudaEventDestroy(pev));
    }
    MPI_Barrier(MPI_COMM_WORLD); // no peer reads our memory any more
    CUDA_OK(cudaFree(mine));
    CUDA_OK(cudaFree(scratch));
    int total_fail = 0;
    MPI_Allreduce(&g_failures, &total_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_cuda_ipc (%s runtime, %d ranks): %d checks per rank, %d failed\n",
               CUDA_RUNTIME_NAME,
               nranks, g_checks, total_fail);
    MPI_Comm_free(&node);
    free(all);
    CUDA_OK(cudaFreeHost(host));
    free(got);
    MPI_Finalize();
    return total_fail != 0;
}
