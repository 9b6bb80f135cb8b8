/*
 * reduce_kernels.cu - device element-wise reductions, the GPU twins of
 * reduce.c: out[i] = a[i] op b[i] for every dtype and op, and buf[i] /= n for
 * the average. Used by the GPU-direct ring in cuda_allreduce.c.
 *
 * The per-element arithmetic is reduce_elem.h's, shared with the C test that
 * checks it on the CPU against reduce.c, so a device result is bit-identical
 * to the host one. This file only lays the elements out over threads.
 *
 * Kernels are grid-stride loops. When the three pointers are 16-byte aligned
 * the bulk moves as 16-byte packs (one load per operand per 4 floats or 8
 * halves), and the last few elements one by one.
 */
#include <stdint.h>
#include "cuda_core.h" // first: hpcdl.h without mpi.h's C++ bindings
#include "reduce_elem.h"

// ----------------------------------------------------------------------------
// the dtypes as template parameters: the stored type (16-bit floats as their
// bits) and reduce_elem.h's functions for it

#define ELEM(NAME, T, S)                                                       \
    struct NAME {                                                              \
        typedef T type;                                                        \
        static __device__ T reduce(T a, T b, hpcdl_op op) {                    \
            return hpcdl_el_##S(a, b, op);                                     \
        }                                                                      \
        static __device__ T divide(T x, int n) { return hpcdl_el_div_##S(x, n); } \
    };
ELEM(F32, float, f32)
ELEM(F64, double, f64)
ELEM(F16, uint16_t, f16)
ELEM(BF16, uint16_t, bf16)
ELEM(I32, int32_t, i32)
ELEM(I64, int64_t, i64)
#undef ELEM

// ----------------------------------------------------------------------------
// kernels. n = elements, npack = 16-byte packs of V = 16/sizeof(T) elements
// (0 when a pointer is not aligned); elements [npack*V, n) go one by one.

template <typename T> struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};

// OP is a template constant, so the switch in D::reduce folds away.
template <typename D, hpcdl_op OP, typename T = typename D::type>
__global__ void reduce_kernel(T *out, const T *a, const T *b, size_t n, size_t npack) {
    constexpr int V = 16 / sizeof(T);
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    // each thread reads its elements before writing them: out may alias a or b
    for (size_t i = tid; i < npack; i += stride) {
        Pack<T> x = reinterpret_cast<const Pack<T> *>(a)[i];
        Pack<T> y = reinterpret_cast<const Pack<T> *>(b)[i], z;
#pragma unroll
        for (int j = 0; j < V; j++) z.v[j] = D::reduce(x.v[j], y.v[j], OP);
        reinterpret_cast<Pack<T> *>(out)[i] = z;
    }
    for (size_t i = npack * V + tid; i < n; i += stride)
        out[i] = D::reduce(a[i], b[i], OP);
}

template <typename D, typename T = typename D::type>
__global__ void divide_kernel(T *buf, size_t n, size_t npack, int by) {
    constexpr int V = 16 / sizeof(T);
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < npack; i += stride) {
        Pack<T> x = reinterpret_cast<Pack<T> *>(buf)[i];
#pragma unroll
        for (int j = 0; j < V; j++) x.v[j] = D::divide(x.v[j], by);
        reinterpret_cast<Pack<T> *>(buf)[i] = x;
    }
    for (size_t i = npack * V + tid; i < n; i += stride) buf[i] = D::divide(buf[i], by);
}

// ----------------------------------------------------------------------------
// launches

static const int THREADS = 256;
// 4096 x 256 threads cover any current GPU several times; more blocks only
// add scheduling, the grid-stride loop does the rest
static const size_t MAX_BLOCKS = 4096;

static unsigned grid_for(size_t items) {
    size_t blocks = (items + THREADS - 1) / THREADS;
    return (unsigned)(blocks == 0 ? 1 : blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename D, hpcdl_op OP>
static int launch_reduce(void *out, const void *a, const void *b, size_t n,
                         cudaStream_t stream) {
    typedef typename D::type T;
    const size_t V = 16 / sizeof(T);
    size_t npack = aligned16(out) && aligned16(a) && aligned16(b) ? n / V : 0;
    size_t items = npack + (n - npack * V); // packs plus single elements
    reduce_kernel<D, OP><<<grid_for(items), THREADS, 0, stream>>>(
        (T *)out, (const T *)a, (const T *)b, n, npack);
    CUDA_CHECK(cudaGetLastError());
    return HPCDL_OK;
}

template <typename D>
static int launch_divide(void *buf, size_t n, int by, cudaStream_t stream) {
    typedef typename D::type T;
    const size_t V = 16 / sizeof(T);
    size_t npack = aligned16(buf) ? n / V : 0;
    size_t items = npack + (n - npack * V);
    divide_kernel<D><<<grid_for(items), THREADS, 0, stream>>>((T *)buf, n, npack, by);
    CUDA_CHECK(cudaGetLastError());
    return HPCDL_OK;
}

template <typename D>
static int reduce_typed(void *out, const void *a, const void *b, size_t n, hpcdl_op op,
                        cudaStream_t stream) {
    switch (op) {
    case HPCDL_SUM:
    case HPCDL_AVERAGE: return launch_reduce<D, HPCDL_SUM>(out, a, b, n, stream);
    case HPCDL_MIN: return launch_reduce<D, HPCDL_MIN>(out, a, b, n, stream);
    case HPCDL_MAX: return launch_reduce<D, HPCDL_MAX>(out, a, b, n, stream);
    case HPCDL_PROD: return launch_reduce<D, HPCDL_PROD>(out, a, b, n, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda reduce: op %d out of range", (int)op);
    }
}

// ----------------------------------------------------------------------------
// host API (cuda_core.h)

extern "C" int hpcdl_cuda_reduce(void *out, const void *a, const void *b, size_t count,
                                 hpcdl_dtype dtype, hpcdl_op op, cudaStream_t stream) {
    if (count == 0) return HPCDL_OK; // an empty grid is a launch error
    switch (dtype) {
    case HPCDL_FLOAT32: return reduce_typed<F32>(out, a, b, count, op, stream);
    case HPCDL_FLOAT64: return reduce_typed<F64>(out, a, b, count, op, stream);
    case HPCDL_FLOAT16: return reduce_typed<F16>(out, a, b, count, op, stream);
    case HPCDL_BFLOAT16: return reduce_typed<BF16>(out, a, b, count, op, stream);
    case HPCDL_INT32: return reduce_typed<I32>(out, a, b, count, op, stream);
    case HPCDL_INT64: return reduce_typed<I64>(out, a, b, count, op, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda reduce: dtype %d out of range", (int)dtype);
    }
}

extern "C" int hpcdl_cuda_divide(void *buf, size_t count, hpcdl_dtype dtype, int n,
                                 cudaStream_t stream) {
    if (count == 0) return HPCDL_OK;
    switch (dtype) {
    case HPCDL_FLOAT32: return launch_divide<F32>(buf, count, n, stream);
    case HPCDL_FLOAT64: return launch_divide<F64>(buf, count, n, stream);
    case HPCDL_FLOAT16: return launch_divide<F16>(buf, count, n, stream);
    case HPCDL_BFLOAT16: return launch_divide<BF16>(buf, count, n, stream);
    case HPCDL_INT32: return launch_divide<I32>(buf, count, n, stream);
    case HPCDL_INT64: return launch_divide<I64>(buf, count, n, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda divide: dtype %d out of range", (int)dtype);
    }
}
