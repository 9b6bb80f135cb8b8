/*
 * fake_cuda.c - a fake CUDA runtime for tests (controls in fake_cuda.h): the
 * runtime functions the core's CUDA path calls, with CUDA's own names and
 * types, running on the CPU, so that the path's logic (ordering, streams,
 * events, error paths, pointer queries) is tested on machines without a GPU.
 *
 *   device memory  a memfd mapped twice: the address handed out is PROT_NONE
 *                  (a host access crashes, as with a real device pointer),
 *                  the stream workers use the second mapping.
 *   streams        one worker thread each, FIFO; every operation first sleeps
 *                  FAKE_CUDA_DELAY_US, so a missing wait reads stale data.
 *   events         a generation per record; queries, waits, stream waits.
 *   contexts       a flag per device, set by anything that needs one.
 * copies          CUDA's rules for pageable host memory (copy() below);
 *                  copies between host and device memory are counted.
 *   IPC            a device allocation's handle names its memfd
 *                  (/proc/<pid>/fd/<fd>), which a peer process maps as device
 *                  memory of the owner's GPU; interprocess events keep their
 *                  generations in a shared page, so a peer's query, sync and
 *                  stream wait see the owner's records (polled, not signalled).
 *   peer access    cudaDeviceCanAccessPeer answers FAKE_CUDA_PEER (default 1);
 *                  a kernel touching another GPU's memory without peer access
 *                  enabled fails (fake_kernels.c).
 * Not modelled: the legacy stream's implicit sync with blocking streams,
 * graphs, async error reporting.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "fake_cuda.h"

// ----------------------------------------------------------------------------
// settings and error injection

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; // registry, events, settings
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER; // an event completed
static long delay_us = -1;
static int ndev = 2, host_visible = 0, fail_nth = 0, fail_calls = 0, peer_ok = 1;
static int peer_on[64][64]; // peer_on[d][p]: GPU d's kernels may touch GPU p's memory
static unsigned long host_copies, host_copy_bytes; // host <-> device copies queued
static char fail_name[64];
static cudaError_t fail_err = cudaErrorInvalidValue;
static int ctx_made[64];
static __thread int cur_dev = 0;
static __thread cudaError_t last_err = cudaSuccess;

static void settings_locked(void) {
    if (delay_us >= 0) return;
    const char *e = getenv("FAKE_CUDA_DELAY_US");
    delay_us = e && *e ? atol(e) : 300;
    if ((e = getenv("FAKE_CUDA_DEVICES")) && *e) ndev = atoi(e);
    if ((e = getenv("FAKE_CUDA_HOST_VISIBLE")) && *e) host_visible = atoi(e);
    if ((e = getenv("FAKE_CUDA_PEER")) && *e) peer_ok = atoi(e);
    if ((e = getenv("FAKE_CUDA_FAIL")) && *e && strchr(e, ':')) {
        snprintf(fail_name, sizeof fail_name, "%.*s", (int)(strchr(e, ':') - e), e);
        fail_nth = atoi(strchr(e, ':') + 1);
    }
}

void fake_cuda_set_delay_us(long us) {
    pthread_mutex_lock(&mu);
    settings_locked();
    delay_us = us;
    pthread_mutex_unlock(&mu);
}

void fake_cuda_fail(const char *name, int nth, cudaError_t err) {
    pthread_mutex_lock(&mu);
    settings_locked();
    snprintf(fail_name, sizeof fail_name, "%s", name ? name : "");
    fail_nth = nth;
    fail_calls = 0;
    fail_err = err;
    pthread_mutex_unlock(&mu);
}

void fake_cuda_set_host_visible(int v) {
    pthread_mutex_lock(&mu);
    settings_locked();
    host_visible = v;
    pthread_mutex_unlock(&mu);
}

int fake_cuda_context_made(int dev) { return dev >= 0 && dev < 64 && ctx_made[dev]; }

// Every entry point starts here: the injected failure, or success.
static cudaError_t enter(const char *name) {
    pthread_mutex_lock(&mu);
    settings_locked();
    cudaError_t rc = cudaSuccess;
    if (fail_nth > 0 && !strcmp(name, fail_name) && ++fail_calls == fail_nth) {
        rc = fail_err;
        if (!strcmp(name, "cudaGetDeviceCount") || !strcmp(name, "cudaPointerGetAttributes"))
            rc = fail_err == cudaErrorInvalidValue ? cudaErrorInsufficientDriver : fail_err;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

#define ENTER()                                                                \
    do {                                                                       \
        cudaError_t e_ = enter(__func__);                                      \
        if (e_ != cudaSuccess) return last_err = e_;                           \
    } while (0)
#define FAIL(e) return last_err = (e)

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_err; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMapBufferObjectFailed: return "cudaErrorMapBufferObjectFailed";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorPeerAccessUnsupported: return "cudaErrorPeerAccessUnsupported";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

// ----------------------------------------------------------------------------
// memory registry

typedef struct alloc {
    char *addr, *backing; // handed out / used by the workers (equal when visible)
    size_t bytes, map_bytes;
    enum cudaMemoryType type;
    int dev;
    int fd;               // the memfd (device memory: kept for IPC handles), or -1
    int imported;         // 1: a peer's memory from cudaIpcOpenMemHandle
    struct alloc *next;
} alloc;
static alloc *allocs;
static size_t dev_bytes_live;

static alloc *find_locked(const void *p) {
    for (alloc *a = allocs; a; a = a->next)
        if ((const char *)p >= a->addr && (const char *)p < a->addr + a->bytes) return a;
    return NULL;
}

void *fake_cuda_backing(const void *p) {
    pthread_mutex_lock(&mu);
    alloc *a = find_locked(p);
    void *b = a ? a->backing + ((const char *)p - a->addr) : (void *)p;
    pthread_mutex_unlock(&mu);
    return b;
}

size_t fake_cuda_device_bytes(void) { return dev_bytes_live; }

// Unmaps an allocation taken off the registry.
static void unmap(alloc *a) {
    if (a->addr != a->backing) munmap(a->addr, a->map_bytes);
    munmap(a->backing, a->map_bytes);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

// Device memory (type Device) behind a PROT_NONE mapping unless host_visible.
// Maps fd's map bytes as memory of GPU dev and registers it. fd is kept for
// device memory (its IPC handle names it), closed otherwise.
static cudaError_t map_alloc(void **out, int fd, size_t bytes, size_t map,
                             enum cudaMemoryType type, int dev, int imported) {
    alloc *a = calloc(1, sizeof *a);
    if (!a) FAIL(cudaErrorMemoryAllocation);
    a->backing = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int hide = type == cudaMemoryTypeDevice && !host_visible;
    a->addr = hide ? mmap(NULL, map, PROT_NONE, MAP_SHARED, fd, 0) : a->backing;
    a->fd = type == cudaMemoryTypeDevice && !imported ? fd : -1;
    if (a->fd < 0) close(fd);
    if (a->backing == MAP_FAILED || a->addr == MAP_FAILED) FAIL(cudaErrorMemoryAllocation);
    a->bytes = bytes ? bytes : 1;
    a->map_bytes = map;
    a->type = type;
    a->dev = dev;
    a->imported = imported;
    pthread_mutex_lock(&mu);
    a->next = allocs;
    allocs = a;
    if (type == cudaMemoryTypeDevice && !imported) dev_bytes_live += bytes;
    ctx_made[cur_dev] = 1;
    pthread_mutex_unlock(&mu);
    *out = a->addr;
    return cudaSuccess;
}

// Device memory (type Device) behind a PROT_NONE mapping unless host_visible.
static cudaError_t new_alloc(void **out, size_t bytes, enum cudaMemoryType type) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), map = (bytes + page) / page * page;
    int fd = memfd_create("fake_cuda", 0);
    if (fd < 0) FAIL(cudaErrorMemoryAllocation);
    if (ftruncate(fd, (off_t)map) != 0) {
        close(fd);
        FAIL(cudaErrorMemoryAllocation);
    }
    return map_alloc(out, fd, bytes, map, type, cur_dev, 0);
}

// 1 when [p, p+n) lies in one allocation of this type, or is host memory
// (type Host / unregistered) that no allocation covers.
static int range_ok(const void *p, size_t n) {
    pthread_mutex_lock(&mu);
    alloc *a = find_locked(p);
    int ok = !a || (const char *)p + n <= a->addr + a->bytes;
    pthread_mutex_unlock(&mu);
    return ok;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
    ENTER();
    memset(at, 0, sizeof *at);
    pthread_mutex_lock(&mu);
    alloc *a = find_locked(p);
    at->type = a ? a->type : cudaMemoryTypeUnregistered;
    at->device = a ? a->dev : -2;
    at->devicePointer = a && a->type != cudaMemoryTypeHost ? (void *)p : NULL;
    at->hostPointer = !a || a->type != cudaMemoryTypeDevice ? (void *)p : NULL;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    ENTER();
    *n = ndev;
    return cudaSuccess;
}

// Compute capability FAKE_CUDA_CC (default 90: an H100); the rest is 0.
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev) {
    ENTER();
    if (dev < 0 || dev >= ndev) FAIL(cudaErrorInvalidDevice);
    const char *e = getenv("FAKE_CUDA_CC");
    int cc = e && *e ? atoi(e) : 90;
    *v = attr == cudaDevAttrComputeCapabilityMajor ? cc / 10
         : attr == cudaDevAttrComputeCapabilityMinor ? cc % 10 : 0;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    ENTER();
    *d = cur_dev; // no context: CUDA answers 0 without making one
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    ENTER();
    if (d < 0 || d >= ndev) FAIL(cudaErrorInvalidDevice);
    cur_dev = d;
    ctx_made[d] = 1; // CUDA 12+: cudaSetDevice initialises the primary context
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// streams: a FIFO of operations served by one worker thread

typedef enum { OP_COPY, OP_SET, OP_FN, OP_RECORD, OP_WAIT } op_kind;

// An event's generations: recorded counts cudaEventRecord calls, completed
// is the newest record a stream has reached. Interprocess events keep them in
// a shared page that peers map (cudaIpcOpenEventHandle).
typedef struct {
    unsigned long recorded, completed; // atomics
} ev_gens;

struct CUevent_st {
    ev_gens *g;   // &own, or the shared page
    ev_gens own;
    int dev;
    int fd;       // interprocess: the shared page's memfd (owner), else -1
    int shared;   // 1: g is shared with other processes (waits poll)
};

static unsigned long gen_load(const unsigned long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

// Until e's completed generation reaches gen: the condition variable within
// a process, polling for a shared event (a peer's worker does not signal us).
static void wait_gen(struct CUevent_st *e, unsigned long gen) {
    if (e->shared) {
        while (gen_load(&e->g->completed) < gen) usleep(20);
        return;
    }
    pthread_mutex_lock(&mu);
    while (gen_load(&e->g->completed) < gen) pthread_cond_wait(&ev_cv, &mu);
    pthread_mutex_unlock(&mu);
}

typedef struct op {
    op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    fake_cuda_fn fn;
    void *arg;
    struct CUevent_st *ev;
    unsigned long gen;
    struct op *next;
} op;

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t cv; // work queued, or an operation done
    op *head, *tail;
    unsigned long queued, done;
    int stop, dev;
    pthread_t thread;
};

static struct CUstream_st *streams[256], *legacy[64]; // legacy: one per device
static int nstreams;

static void run_op(op *o) {
    switch (o->kind) {
    case OP_COPY: memcpy(fake_cuda_backing(o->dst), fake_cuda_backing(o->src), o->n); break;
    case OP_SET: memset(fake_cuda_backing(o->dst), o->value, o->n); break;
    case OP_FN: o->fn(o->arg); break;
    case OP_RECORD: {
        pthread_mutex_lock(&mu);
        unsigned long c = gen_load(&o->ev->g->completed); // raised, never lowered
        while (c < o->gen && !__atomic_compare_exchange_n(&o->ev->g->completed, &c, o->gen, 0,
                                                          __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {}
        pthread_cond_broadcast(&ev_cv);
        pthread_mutex_unlock(&mu);
        break;
    }
    case OP_WAIT: wait_gen(o->ev, o->gen); break;
    }
}

static void *worker(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        pthread_mutex_unlock(&s->mu);
        if (delay_us > 0 && o->kind != OP_WAIT) usleep((useconds_t)delay_us);
        run_op(o);
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->done++;
        free(o->arg);
        free(o);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static struct CUstream_st *new_stream(int dev) {
    struct CUstream_st *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->dev = dev;
    pthread_create(&s->thread, NULL, worker, s);
    pthread_mutex_lock(&mu);
    if (nstreams < 256) streams[nstreams++] = s;
    ctx_made[dev] = 1;
    pthread_mutex_unlock(&mu);
    return s;
}

static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;

// NULL, cudaStreamLegacy and cudaStreamPerThread are the current device's
// one default stream (made on first use, with its context).
static struct CUstream_st *real_stream(cudaStream_t s) {
    if (s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
    int dev = cur_dev;
    pthread_mutex_lock(&legacy_mu);
    if (!legacy[dev]) legacy[dev] = new_stream(dev);
    pthread_mutex_unlock(&legacy_mu);
    return legacy[dev];
}

static cudaError_t enqueue(cudaStream_t stream, op o) {
    struct CUstream_st *s = real_stream(stream);
    op *p = malloc(sizeof *p);
    if (!p) FAIL(cudaErrorMemoryAllocation);
    *p = o;
    p->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
    s->queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

static void sync_stream(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->done < s->queued) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    ENTER();
    *out = new_stream(cur_dev);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    ENTER();
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) FAIL(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu); // queued work still runs, as in CUDA
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nstreams; i++)
        if (streams[i] == s) streams[i] = streams[--nstreams];
    pthread_mutex_unlock(&mu);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    ENTER();
    sync_stream(real_stream(s));
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    ENTER();
    struct CUstream_st *s = real_stream(stream);
    pthread_mutex_lock(&s->mu);
    int idle = s->done == s->queued;
    pthread_mutex_unlock(&s->mu);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    ENTER();
    pthread_mutex_lock(&mu);
    int n = nstreams;
    struct CUstream_st *all[256];
    memcpy(all, streams, sizeof(all[0]) * (size_t)n);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) sync_stream(all[i]);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// copies, kernels

// 1 when p is pageable host memory: no allocation (device, managed or
// cudaMallocHost) covers it.
static int pageable(const void *p) {
    pthread_mutex_lock(&mu);
    int yes = find_locked(p) == NULL;
    pthread_mutex_unlock(&mu);
    return yes;
}

// 1 when p is device or managed memory (this process's or a peer's).
static int on_gpu(const void *p) {
    pthread_mutex_lock(&mu);
    alloc *a = find_locked(p);
    int yes = a && (a->type == cudaMemoryTypeDevice || a->type == cudaMemoryTypeManaged);
    pthread_mutex_unlock(&mu);
    return yes;
}

unsigned long fake_cuda_host_copies(size_t *bytes) {
    if (bytes) *bytes = __atomic_load_n(&host_copy_bytes, __ATOMIC_RELAXED);
    return __atomic_load_n(&host_copies, __ATOMIC_RELAXED);
}

// CUDA's rules for pageable host memory ("API synchronization behavior"),
// for cudaMemcpy and cudaMemcpyAsync alike: host to device syncs the stream,
// copies the source to a staging buffer and returns while the transfer is
// still queued (so its bytes may land after work on other streams); device
// to host returns only once the copy is done. Pinned memory: queued, and
// cudaMemcpy waits for it. The first GPU run found a test relying on
// cudaMemcpy having landed; this is the semantics it met there.
static cudaError_t copy(void *dst, const void *src, size_t n, cudaStream_t s, int wait) {
    if (!range_ok(dst, n) || !range_ok(src, n)) FAIL(cudaErrorInvalidValue);
    int from_pageable = pageable(src), to_pageable = pageable(dst);
    if (on_gpu(dst) != on_gpu(src)) { // host <-> device: counted for the IPC tests
        __atomic_add_fetch(&host_copies, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&host_copy_bytes, n, __ATOMIC_RELAXED);
    }
    if (from_pageable && !to_pageable) {
        sync_stream(real_stream(s));
        void *staged = malloc(n ? n : 1);
        if (!staged) FAIL(cudaErrorMemoryAllocation);
        memcpy(staged, src, n);
        return enqueue(s, (op){.kind = OP_COPY, .dst = dst, .src = staged, .n = n,
                               .arg = staged}); // the worker frees arg
    }
    cudaError_t e = enqueue(s, (op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
    if (e == cudaSuccess && (wait || (to_pageable && !from_pageable)))
        sync_stream(real_stream(s));
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
    ENTER();
    return copy(dst, src, n, s, 0);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    ENTER();
    return copy(dst, src, n, NULL, 1);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s) {
    ENTER();
    if (!range_ok(dst, n)) FAIL(cudaErrorInvalidValue);
    return enqueue(s, (op){.kind = OP_SET, .dst = dst, .value = value, .n = n});
}

cudaError_t fake_cuda_launch(cudaStream_t stream, fake_cuda_fn fn, const void *arg,
                             size_t bytes) {
    ENTER();
    if (real_stream(stream)->dev != cur_dev && stream != NULL)
        FAIL(cudaErrorInvalidResourceHandle); // a kernel runs on the current device
    void *copy = malloc(bytes);
    if (!copy) FAIL(cudaErrorMemoryAllocation);
    memcpy(copy, arg, bytes);
    return enqueue(stream, (op){.kind = OP_FN, .fn = fn, .arg = copy});
}

// ----------------------------------------------------------------------------
// events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
    ENTER();
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) FAIL(cudaErrorMemoryAllocation);
    e->g = &e->own;
    e->fd = -1;
    if (flags & cudaEventInterprocess) {
        if (!(flags & cudaEventDisableTiming)) { // CUDA's rule
            free(e);
            FAIL(cudaErrorInvalidValue);
        }
        e->fd = memfd_create("fake_cuda_event", 0);
        void *page = MAP_FAILED;
        if (e->fd >= 0 && ftruncate(e->fd, (off_t)sizeof(ev_gens)) == 0)
            page = mmap(NULL, sizeof(ev_gens), PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
        if (page == MAP_FAILED) {
            if (e->fd >= 0) close(e->fd);
            free(e);
            FAIL(cudaErrorMemoryAllocation);
        }
        e->g = page;
        e->shared = 1;
    }
    e->dev = cur_dev;
    ctx_made[cur_dev] = 1;
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

// Never freed: a queued record may still point at it (tests are short).
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    ENTER();
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    ENTER();
    if (real_stream(stream)->dev != e->dev && stream != NULL)
        FAIL(cudaErrorInvalidResourceHandle); // event and stream of different GPUs
    unsigned long gen = __atomic_add_fetch(&e->g->recorded, 1, __ATOMIC_ACQ_REL);
    return enqueue(stream, (op){.kind = OP_RECORD, .ev = e, .gen = gen});
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    ENTER();
    int done = gen_load(&e->g->completed) >= gen_load(&e->g->recorded);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    ENTER();
    wait_gen(e, gen_load(&e->g->recorded));
    return cudaSuccess;
}

// Waits for the newest record at the time of the call, as CUDA does.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    ENTER();
    unsigned long gen = gen_load(&e->g->recorded);
    return gen ? enqueue(s, (op){.kind = OP_WAIT, .ev = e, .gen = gen}) : cudaSuccess;
}

// ----------------------------------------------------------------------------
// IPC: handles name a memfd of the owning process, opened by a peer through
// /proc/<pid>/fd/<fd> (the same user, as CUDA IPC needs the same machine).

enum { IPC_MEM_MAGIC = 0x46434d31, IPC_EV_MAGIC = 0x46434531 };

typedef struct {
    uint32_t magic;
    int32_t pid, fd, dev;
    uint64_t bytes, map_bytes;
} ipc_mem;

typedef struct {
    uint32_t magic;
    int32_t pid, fd, dev;
} ipc_event;

// The peer's memfd, or -1.
static int open_peer_fd(int pid, int fd) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    ENTER();
    pthread_mutex_lock(&mu);
    alloc *a = find_locked(p);
    ipc_mem m = {IPC_MEM_MAGIC, getpid(), a ? a->fd : -1, a ? a->dev : -1,
                 a ? a->bytes : 0, a ? a->map_bytes : 0};
    int ok = a && a->addr == p && a->type == cudaMemoryTypeDevice && !a->imported;
    pthread_mutex_unlock(&mu);
    if (!ok) FAIL(cudaErrorInvalidValue); // the base of this process's cudaMalloc only
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &m, sizeof m);
    return cudaSuccess;
}

// The peer's allocation as device memory of its GPU, at a new address. With
// cudaIpcMemLazyEnablePeerAccess, peer access to that GPU is enabled where
// it can be (as CUDA does).
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags) {
    ENTER();
    ipc_mem m;
    memcpy(&m, h.reserved, sizeof m);
    if (m.magic != IPC_MEM_MAGIC || m.dev < 0 || m.dev >= ndev) FAIL(cudaErrorInvalidValue);
    if (m.pid == getpid()) FAIL(cudaErrorDeviceUninitialized); // CUDA: not in the owner
    int fd = open_peer_fd(m.pid, m.fd);
    if (fd < 0) FAIL(cudaErrorMapBufferObjectFailed);
    if ((flags & cudaIpcMemLazyEnablePeerAccess) && m.dev != cur_dev && peer_ok)
        peer_on[cur_dev][m.dev] = 1;
    return last_err = map_alloc(p, fd, m.bytes, m.map_bytes, cudaMemoryTypeDevice, m.dev, 1);
}

cudaError_t cudaIpcCloseMemHandle(void *p) {
    ENTER();
    (void)cudaDeviceSynchronize(); // as cudaFree: nothing queued still reads it
    pthread_mutex_lock(&mu);
    alloc **link = &allocs, *a = NULL;
    for (; *link; link = &(*link)->next)
        if ((*link)->addr == p && (*link)->imported) {
            a = *link;
            *link = a->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    if (!a) FAIL(cudaErrorInvalidValue);
    unmap(a);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e) {
    ENTER();
    if (!e || !e->shared || e->fd < 0) FAIL(cudaErrorInvalidResourceHandle);
    ipc_event m = {IPC_EV_MAGIC, getpid(), e->fd, e->dev};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &m, sizeof m);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *out, cudaIpcEventHandle_t h) {
    ENTER();
    ipc_event m;
    memcpy(&m, h.reserved, sizeof m);
    if (m.magic != IPC_EV_MAGIC) FAIL(cudaErrorInvalidValue);
    if (m.pid == getpid()) FAIL(cudaErrorDeviceUninitialized);
    int fd = open_peer_fd(m.pid, m.fd);
    if (fd < 0) FAIL(cudaErrorMapBufferObjectFailed);
    void *page = mmap(NULL, sizeof(ev_gens), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (page == MAP_FAILED || !e) FAIL(cudaErrorMapBufferObjectFailed);
    e->g = page;
    e->fd = -1;
    e->shared = 1;
    e->dev = m.dev;
    *out = e;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// peer access: FAKE_CUDA_PEER=0 makes GPUs unable to reach each other

cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
    ENTER();
    if (dev < 0 || dev >= ndev || peer < 0 || peer >= ndev) FAIL(cudaErrorInvalidDevice);
    *can = dev != peer && peer_ok;
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
    ENTER();
    if (peer < 0 || peer >= ndev || peer == cur_dev) FAIL(cudaErrorInvalidDevice);
    if (!peer_ok) FAIL(cudaErrorPeerAccessUnsupported);
    if (peer_on[cur_dev][peer]) FAIL(cudaErrorPeerAccessAlreadyEnabled);
    peer_on[cur_dev][peer] = 1;
    return cudaSuccess;
}

int fake_cuda_peer_enabled(int dev, int peer) {
    return dev == peer || (dev >= 0 && dev < 64 && peer >= 0 && peer < 64 && peer_on[dev][peer]);
}

// ----------------------------------------------------------------------------
// allocation. Frees synchronise the device first, as cudaFree does.

cudaError_t cudaMalloc(void **p, size_t bytes) {
    ENTER();
    return last_err = new_alloc(p, bytes, cudaMemoryTypeDevice);
}

cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags) {
    ENTER();
    return last_err = new_alloc(p, bytes, cudaMemoryTypeManaged);
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    ENTER();
    return last_err = new_alloc(p, bytes, cudaMemoryTypeHost);
}

static cudaError_t free_alloc(void *p, int host) {
    if (!p) return cudaSuccess;
    (void)cudaDeviceSynchronize();
    pthread_mutex_lock(&mu);
    alloc **link = &allocs, *a = NULL;
    for (; *link; link = &(*link)->next)
        if ((*link)->addr == p) {
            a = *link;
            break;
        }
    if (!a || (a->type == cudaMemoryTypeHost) != host || a->imported) {
        pthread_mutex_unlock(&mu);
        FAIL(cudaErrorInvalidValue);
    }
    *link = a->next;
    if (a->type == cudaMemoryTypeDevice) dev_bytes_live -= a->bytes;
    pthread_mutex_unlock(&mu);
    unmap(a);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    ENTER();
    return free_alloc(p, 0);
}

cudaError_t cudaFreeHost(void *p) {
    ENTER();
    return free_alloc(p, 1);
}
