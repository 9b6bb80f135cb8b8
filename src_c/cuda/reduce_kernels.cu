/*
 * reduce_kernels.cu - device element-wise reductions, the GPU twins of
 * reduce.c: out[i] = a[i] op b[i] for every dtype and op, and buf[i] /= n for
 * the average. Used by the GPU-direct ring in cuda_allreduce.c.
 *
 * The arithmetic is reduce.c's, so a device result is bit-identical to the
 * host one: 16-bit floats widen to float, reduce, and round to nearest even;
 * min/max take b only when it is strictly smaller/larger; float averages
 * multiply by 1/n, 16-bit ones divide by n in float, integers divide
 * (truncating toward zero).
 *
 * Kernels are grid-stride loops. When the three pointers are 16-byte aligned
 * the bulk moves as 16-byte packs (one load per operand per 4 floats or 8
 * halves), and the last few elements one by one.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "cuda_core.h"

// ----------------------------------------------------------------------------
// arithmetic: Acc<T> widens the stored type to the one reduce.c computes in

template <typename T> struct Acc {
    static __device__ T up(T x) { return x; }
    static __device__ T down(T x) { return x; }
};
template <> struct Acc<__half> {
    static __device__ float up(__half x) { return __half2float(x); }
    static __device__ __half down(float x) { return __float2half_rn(x); }
};
template <> struct Acc<__nv_bfloat16> {
    static __device__ float up(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __nv_bfloat16 down(float x) { return __float2bfloat16_rn(x); }
};

// operand order as in reduce.c (matters for NaN and signed zero)
struct OpSum {
    template <typename A> __device__ A operator()(A a, A b) const { return a + b; }
};
struct OpMin {
    template <typename A> __device__ A operator()(A a, A b) const { return b < a ? b : a; }
};
struct OpMax {
    template <typename A> __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};
struct OpProd {
    template <typename A> __device__ A operator()(A a, A b) const { return a * b; }
};

// the average's scaling, per stored type, as hpcdl_divide_local does it
struct DivBy {
    int n;
    __device__ float operator()(float x) const { return x * (1.0f / (float)n); }
    __device__ double operator()(double x) const { return x * (1.0 / (double)n); }
    __device__ int32_t operator()(int32_t x) const { return x / n; }
    __device__ int64_t operator()(int64_t x) const { return x / n; }
    __device__ __half operator()(__half x) const {
        return __float2half_rn(__half2float(x) / (float)n);
    }
    __device__ __nv_bfloat16 operator()(__nv_bfloat16 x) const {
        return __float2bfloat16_rn(__bfloat162float(x) / (float)n);
    }
};

// ----------------------------------------------------------------------------
// kernels. n = elements, npack = 16-byte packs of V = 16/sizeof(T) elements
// (0 when a pointer is not aligned); elements [npack*V, n) go one by one.

template <typename T> struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};

template <typename T, typename Op>
__global__ void reduce_kernel(T *out, const T *a, const T *b, size_t n, size_t npack,
                              Op op) {
    constexpr int V = 16 / sizeof(T);
    using A = Acc<T>;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    // each thread reads its elements before writing them: out may alias a or b
    for (size_t i = tid; i < npack; i += stride) {
        Pack<T> x = reinterpret_cast<const Pack<T> *>(a)[i];
        Pack<T> y = reinterpret_cast<const Pack<T> *>(b)[i], z;
#pragma unroll
        for (int j = 0; j < V; j++) z.v[j] = A::down(op(A::up(x.v[j]), A::up(y.v[j])));
        reinterpret_cast<Pack<T> *>(out)[i] = z;
    }
    for (size_t i = npack * V + tid; i < n; i += stride)
        out[i] = A::down(op(A::up(a[i]), A::up(b[i])));
}

template <typename T>
__global__ void divide_kernel(T *buf, size_t n, size_t npack, DivBy div) {
    constexpr int V = 16 / sizeof(T);
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < npack; i += stride) {
        Pack<T> x = reinterpret_cast<Pack<T> *>(buf)[i];
#pragma unroll
        for (int j = 0; j < V; j++) x.v[j] = div(x.v[j]);
        reinterpret_cast<Pack<T> *>(buf)[i] = x;
    }
    for (size_t i = npack * V + tid; i < n; i += stride) buf[i] = div(buf[i]);
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

template <typename T, typename Op>
static int launch_reduce(void *out, const void *a, const void *b, size_t n,
                         cudaStream_t stream) {
    const size_t V = 16 / sizeof(T);
    size_t npack = aligned16(out) && aligned16(a) && aligned16(b) ? n / V : 0;
    size_t items = npack + (n - npack * V); // packs plus single elements
    reduce_kernel<T, Op><<<grid_for(items), THREADS, 0, stream>>>(
        (T *)out, (const T *)a, (const T *)b, n, npack, Op());
    CUDA_CHECK(cudaGetLastError());
    return HPCDL_OK;
}

template <typename T>
static int launch_divide(void *buf, size_t n, int by, cudaStream_t stream) {
    const size_t V = 16 / sizeof(T);
    size_t npack = aligned16(buf) ? n / V : 0;
    size_t items = npack + (n - npack * V);
    divide_kernel<T><<<grid_for(items), THREADS, 0, stream>>>((T *)buf, n, npack, DivBy{by});
    CUDA_CHECK(cudaGetLastError());
    return HPCDL_OK;
}

template <typename T>
static int reduce_typed(void *out, const void *a, const void *b, size_t n, hpcdl_op op,
                        cudaStream_t stream) {
    switch (op) {
    case HPCDL_SUM:
    case HPCDL_AVERAGE: return launch_reduce<T, OpSum>(out, a, b, n, stream);
    case HPCDL_MIN: return launch_reduce<T, OpMin>(out, a, b, n, stream);
    case HPCDL_MAX: return launch_reduce<T, OpMax>(out, a, b, n, stream);
    case HPCDL_PROD: return launch_reduce<T, OpProd>(out, a, b, n, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda reduce: op %d out of range", (int)op);
    }
}

// ----------------------------------------------------------------------------
// host API (cuda_core.h)

extern "C" int hpcdl_cuda_reduce(void *out, const void *a, const void *b, size_t count,
                                 hpcdl_dtype dtype, hpcdl_op op, cudaStream_t stream) {
    if (count == 0) return HPCDL_OK; // an empty grid is a launch error
    switch (dtype) {
    case HPCDL_FLOAT32: return reduce_typed<float>(out, a, b, count, op, stream);
    case HPCDL_FLOAT64: return reduce_typed<double>(out, a, b, count, op, stream);
    case HPCDL_FLOAT16: return reduce_typed<__half>(out, a, b, count, op, stream);
    case HPCDL_BFLOAT16: return reduce_typed<__nv_bfloat16>(out, a, b, count, op, stream);
    case HPCDL_INT32: return reduce_typed<int32_t>(out, a, b, count, op, stream);
    case HPCDL_INT64: return reduce_typed<int64_t>(out, a, b, count, op, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda reduce: dtype %d out of range", (int)dtype);
    }
}

extern "C" int hpcdl_cuda_divide(void *buf, size_t count, hpcdl_dtype dtype, int n,
                                 cudaStream_t stream) {
    if (count == 0) return HPCDL_OK;
    switch (dtype) {
    case HPCDL_FLOAT32: return launch_divide<float>(buf, count, n, stream);
    case HPCDL_FLOAT64: return launch_divide<double>(buf, count, n, stream);
    case HPCDL_FLOAT16: return launch_divide<__half>(buf, count, n, stream);
    case HPCDL_BFLOAT16: return launch_divide<__nv_bfloat16>(buf, count, n, stream);
    case HPCDL_INT32: return launch_divide<int32_t>(buf, count, n, stream);
    case HPCDL_INT64: return launch_divide<int64_t>(buf, count, n, stream);
    default: return hpcdl_fail(HPCDL_ERR_ARG, "cuda divide: dtype %d out of range", (int)dtype);
    }
}
