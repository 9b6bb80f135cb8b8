/*
 * fake_kernels.c - the device reductions (cuda_core.h's hpcdl_cuda_reduce /
 * hpcdl_cuda_divide) for the fake-runtime build: the same per-element
 * functions as reduce_kernels.cu (reduce_elem.h), run as a "kernel" on the
 * stream's worker thread, after the fake's delay and in order with its copies.
 * A pointer that is not device memory fails the launch, as a kernel reading
 * host memory would fault on a GPU; so does another GPU's memory without peer
 * access.
 */
#include <string.h>
#include "cuda_core.h"
#include "reduce_elem.h"
#include "fake_cuda.h"

typedef struct {
    void *out;
    const void *a, *b; // b == NULL: divide out by n
    size_t count;
    hpcdl_dtype dtype;
    hpcdl_op op;
    int n;
} kernel_arg;

#define LOOP(T, S)                                                             \
    do {                                                                       \
        T *o = out;                                                            \
        const T *x = a, *y = b;                                                \
        if (y) for (size_t i = 0; i < k->count; i++) o[i] = hpcdl_el_##S(x[i], y[i], k->op); \
        else for (size_t i = 0; i < k->count; i++) o[i] = hpcdl_el_div_##S(o[i], k->n); \
    } while (0)

static void kernel(void *arg) {
    const kernel_arg *k = arg;
    void *out = fake_cuda_backing(k->out);
    const void *a = k->a ? fake_cuda_backing(k->a) : NULL;
    const void *b = k->b ? fake_cuda_backing(k->b) : NULL;
    switch (k->dtype) {
    case HPCDL_FLOAT32: LOOP(float, f32); break;
    case HPCDL_FLOAT64: LOOP(double, f64); break;
    case HPCDL_FLOAT16: LOOP(uint16_t, f16); break;
    case HPCDL_BFLOAT16: LOOP(uint16_t, bf16); break;
    case HPCDL_INT32: LOOP(int32_t, i32); break;
    default: LOOP(int64_t, i64); break;
    }
}

// 1 when [p, p + bytes) is device or managed memory that a kernel on the
// current GPU may touch: its own, or a peer's with peer access enabled (a
// peer's memory opened through IPC included).
static int on_device(const void *p, size_t bytes) {
    struct cudaPointerAttributes at;
    int cur = 0;
    if (!p || cudaPointerGetAttributes(&at, p) != cudaSuccess) return 0;
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged) return 0;
    if (at.type == cudaMemoryTypeDevice &&
        (cudaGetDevice(&cur) != cudaSuccess || !fake_cuda_peer_enabled(cur, at.device)))
        return 0;
    return cudaPointerGetAttributes(&at, (const char *)p + bytes - 1) == cudaSuccess &&
           (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged);
}

static int launch(kernel_arg k, cudaStream_t stream) {
    size_t bytes = k.count * hpcdl_dtype_size(k.dtype);
    if (!on_device(k.out, bytes) || (k.a && !on_device(k.a, bytes)) ||
        (k.b && !on_device(k.b, bytes)))
        CUDA_CHECK(cudaErrorIllegalAddress);
    CUDA_CHECK(fake_cuda_launch(stream, kernel, &k, sizeof k));
    return HPCDL_OK;
}

int hpcdl_cuda_reduce(void *out, const void *a, const void *b, size_t count,
                      hpcdl_dtype dtype, hpcdl_op op, cudaStream_t stream) {
    if (count == 0) return HPCDL_OK;
    return launch((kernel_arg){out, a, b, count, dtype, op, 0}, stream);
}

int hpcdl_cuda_divide(void *buf, size_t count, hpcdl_dtype dtype, int n, cudaStream_t stream) {
    if (count == 0) return HPCDL_OK;
    return launch((kernel_arg){buf, NULL, NULL, count, dtype, HPCDL_SUM, n}, stream);
}
