/*
 * cuda_where.c - where an all-reduce's buffers live, decided on the caller's
 * thread before the agreement check (so that a rank that cannot tell, or that
 * differs from its peers, fails on every rank instead of taking a path its
 * peers do not), and the event that orders the all-reduce after the work
 * that produces its input.
 *
 *   mem given (hpcdl_allreduce_mem, what Python uses): device -1 is host
 *     memory and no CUDA call is made, so a CPU job never makes a context;
 *     device >= 0 must be confirmed by cudaPointerGetAttributes for both
 *     buffers, on that GPU, which must be the thread's current device.
 *   mem NULL (hpcdl_allreduce): CUDA is asked. No runtime or no GPU means
 *     host memory (then there is no device memory this runtime could see); a
 *     failed pointer query with a working runtime is an error, never "host".
 */
#ifdef HPCDL_WITH_CUDA
#include <stdlib.h>
#include "common.h"
#include "cuda_core.h"

// ----------------------------------------------------------------------------
// pointer queries

static int n_devices = -1; // -1: not asked yet
static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;

// Local call. GPUs this process's runtime sees; 0 when it has none or no driver.
static int device_count(void) {
    pthread_mutex_lock(&devices_mu);
    if (n_devices < 0 && cudaGetDeviceCount(&n_devices) != cudaSuccess) n_devices = 0;
    (void)cudaGetLastError(); // a failed count is an answer, not a pending error
    int n = n_devices;
    pthread_mutex_unlock(&devices_mu);
    return n;
}

// *dev = the GPU owning p (device or managed memory), -1 for host memory.
static int query(const void *p, int *dev) {
    struct cudaPointerAttributes at;
    CUDA_CHECK(cudaPointerGetAttributes(&at, p));
    *dev = at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged ? at.device : -1;
    return HPCDL_OK;
}

int hpcdl_is_device_ptr(const void *p) {
    int dev = -1;
    if (!p || device_count() == 0 || query(p, &dev) != HPCDL_OK) return 0;
    return dev >= 0;
}

// ----------------------------------------------------------------------------
// the GPU's architecture against the kernels built (Makefile / setup.py)

#ifndef HPCDL_CUDA_ARCHS
#define HPCDL_CUDA_ARCHS "75,80,90"
#endif

// The kernels run on GPU dev: a cubin of its major version not newer than it
// (sm_80's runs on sm_86), or PTX of the newest built (JIT for any later
// GPU). Otherwise every launch would fail with "no kernel image": say so
// before any rank moves data. Asked once per GPU.
static int check_arch(int dev) {
    static int ok[64];
    if (dev < 64 && __atomic_load_n(&ok[dev], __ATOMIC_RELAXED)) return HPCDL_OK;
    int maj = 0, min = 0, newest = 0, runs = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&min, cudaDevAttrComputeCapabilityMinor, dev));
    int cc = maj * 10 + min;
    for (const char *p = HPCDL_CUDA_ARCHS; *p;) {
        int a = (int)strtol(p, (char **)&p, 10);
        if (a / 10 == maj && a <= cc) runs = 1;
        if (a > newest) newest = a;
        while (*p == ',' || *p == ' ') p++;
    }
    if (!runs && cc < newest)
        return hpcdl_fail(HPCDL_ERR_CUDA, "GPU %d is sm_%d, and this core has no kernels for it "
                          "(built for sm_%s, PTX of the newest). Hint: rebuild with "
                          "HPCDL_CUDA_ARCHS=\"%d;%s\" (make -C src_c CUDA_ARCHS=...); nvcc 13 "
                          "cannot build sm_70 (V100): use CUDA 12 for that.", dev, cc,
                          HPCDL_CUDA_ARCHS, cc, "80;90");
    if (dev < 64) __atomic_store_n(&ok[dev], 1, __ATOMIC_RELAXED);
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// resolving

// Both buffers on GPU dev, as the caller said.
static int confirm(const void *send, const void *recv, int dev) {
    int ds = -1, dr = -1;
    int rc = query(recv, &dr);
    if (rc == HPCDL_OK && send != recv) rc = query(send, &ds);
    else ds = dr;
    if (rc != HPCDL_OK)
        return hpcdl_fail(HPCDL_ERR_CUDA, "allreduce: cannot confirm that the buffers are "
                          "memory of GPU %d: %s", dev, hpcdl_last_error());
    if (ds != dev || dr != dev)
        return hpcdl_fail(HPCDL_ERR_ARG, "allreduce: the buffers were passed as memory of GPU "
                          "%d but CUDA says send is on %d, recv on %d (-1: host). Hint: pass "
                          "the device the tensors are on.", dev, ds, dr);
    return HPCDL_OK;
}

// The calling thread is on GPU dev: hpcdl never switches a user's thread
// (nor, below MPI_THREAD_SERIALIZED, where the engine's work runs on it).
static int on_device(int dev) {
    int cur = -1;
    CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != dev)
        return hpcdl_fail(HPCDL_ERR_ARG, "allreduce: the buffers are on GPU %d but this "
                          "thread's current device is %d. Hint: call it under "
                          "torch.cuda.device(%d) (or cudaSetDevice(%d)); hpcdl never switches "
                          "the caller's device.", dev, cur, dev, dev);
    return HPCDL_OK;
}

// mem == NULL: ask CUDA (host when the runtime has no GPU).
static int detect(const void *send, const void *recv, int *dev) {
    int ds = -1, dr = -1;
    *dev = -1;
    if (device_count() == 0) return HPCDL_OK;
    HPCDL_TRY(query(recv, &dr));
    ds = dr;
    if (send != recv) HPCDL_TRY(query(send, &ds));
    if (ds != dr)
        return hpcdl_fail(HPCDL_ERR_ARG, "allreduce: send is on device %d and recv on %d "
                          "(-1: host memory). Hint: both on the same GPU, or both on the host.",
                          ds, dr);
    *dev = dr;
    return HPCDL_OK;
}

int hpcdl_where_resolve(const void *send, const void *recv, size_t bytes,
                        const hpcdl_mem *mem, hpcdl_where *w) {
    w->device = -1;
    w->ready = NULL;
    if (bytes == 0) return HPCDL_OK; // nothing is read: no path to agree on
    if (mem) HPCDL_TRY(mem->device < 0 ? HPCDL_OK : confirm(send, recv, mem->device));
    else HPCDL_TRY(detect(send, recv, &w->device));
    int dev = mem ? mem->device : w->device;
    if (dev < 0) return HPCDL_OK;
    HPCDL_TRY(check_arch(dev));
    HPCDL_TRY(on_device(dev));
    const char *conflict = hpcdl_mpi_cuda_conflict();
    if (conflict) return hpcdl_fail(HPCDL_ERR_ARG, "allreduce of device memory: %s", conflict);
    cudaStream_t producer = mem && mem->stream ? (cudaStream_t)mem->stream : cudaStreamLegacy;
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, producer);
    if (e != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        return hpcdl_cuda_fail(e, "cudaEventRecord(ready, producer stream)", __FILE__, __LINE__);
    }
    w->device = dev;
    w->ready = ev;
    return HPCDL_OK;
}

void hpcdl_where_release(hpcdl_where *w) {
    if (w->ready) (void)cudaEventDestroy((cudaEvent_t)w->ready);
    w->ready = NULL;
}

// 0 host, 1 staged, 2 GPU-direct; 3 and 4 the same with IPC inside a node
// (HPCDL_CUDA_IPC), taken when the team is one node.
int64_t hpcdl_where_path(const hpcdl_where *w) {
    if (w->device < 0) return 0;
    return (hpcdl_mpi_cuda_aware() ? 2 : 1) + (hpcdl_cuda_ipc_enabled() ? 2 : 0);
}

// Piece size in bytes: HPCDL_CUDA_STAGE_BYTES, default 8 MiB, read once.
size_t hpcdl_cuda_stage_bytes(void) {
    static size_t v = 0;
    if (!v) {
        const char *e = getenv("HPCDL_CUDA_STAGE_BYTES");
        size_t b = e && *e ? (size_t)strtoull(e, NULL, 10) : (size_t)8 << 20;
        v = b < 4096 ? 4096 : b > ((size_t)1 << 30) ? (size_t)1 << 30 : b;
    }
    return v;
}

// The piece size, where pieces are used: staging, and IPC (its workspace halves).
int64_t hpcdl_where_stage(const hpcdl_where *w) {
    int64_t path = hpcdl_where_path(w);
    return path == 1 || path >= 3 ? (int64_t)hpcdl_cuda_stage_bytes() : 0;
}

#endif // HPCDL_WITH_CUDA
