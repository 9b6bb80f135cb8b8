/*
 * reduce.c - element-wise local reductions out[i] = a[i] op b[i] for every
 * dtype and op, written as plain loops over restrict pointers so the compiler
 * vectorises them. float16 and bfloat16 are widened to float in small blocks
 * (kept in L1), reduced, and rounded back to nearest-even (F16C hardware
 * conversions where the CPU has them).
 */
#include <math.h>
#include <string.h>
#include "common.h"

// ----------------------------------------------------------------------------
// 16-bit float conversions (bit-exact, round to nearest even)

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);                 // inf / nan
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13);        // normal
    } else if (mant == 0) {
        u = sign;                                               // zero
    } else {                                                    // subnormal
        float f = (float)mant * 5.9604644775390625e-8f;         // mant * 2^-24
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return sign | 0x7e00u;              // nan
    if (absu >= 0x477ff000u) return sign | 0x7c00u;            // overflow -> inf
    if (absu < 0x38800000u) {                                   // subnormal or zero
        float a;
        memcpy(&a, &absu, 4);
        // scale so one unit = 2^-24, then round to nearest even
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);           // round to nearest even
    return sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0xffffu);
}

// ----------------------------------------------------------------------------
// typed kernels

// min / max propagate NaN whichever operand holds it (b != b only for a
// NaN; integers fold it away), so the result does not depend on which rank
// sits where in the ring: reduce_elem.h does the same on the GPU.
#define DEFINE_KERNELS(T, NAME)                                                 \
    static void NAME##_reduce(T *restrict out, const T *restrict a,            \
                              const T *restrict b, size_t n, hpcdl_op op) {    \
        switch (op) {                                                          \
        case HPCDL_SUM:                                                        \
        case HPCDL_AVERAGE:                                                    \
            for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];               \
            break;                                                             \
        case HPCDL_MIN:                                                        \
            for (size_t i = 0; i < n; i++)                                     \
                out[i] = b[i] < a[i] || b[i] != b[i] ? b[i] : a[i];            \
            break;                                                             \
        case HPCDL_MAX:                                                        \
            for (size_t i = 0; i < n; i++)                                     \
                out[i] = b[i] > a[i] || b[i] != b[i] ? b[i] : a[i];            \
            break;                                                             \
        case HPCDL_PROD:                                                       \
            for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];               \
            break;                                                             \
        default:                                                               \
            break;                                                             \
        }                                                                      \
    }

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(int32_t, i32)
DEFINE_KERNELS(int64_t, i64)

// ----------------------------------------------------------------------------
// 16-bit blocks: widen to float, reduce, round back. The float16 conversions
// above are branchy scalar code (~6x slower per byte than the float32 sum,
// which made fp16 compression slower than none); x86 CPUs since 2012 convert
// 8 at a time in hardware (F16C), chosen at run time so the build stays
// portable. Hardware and software agree bit for bit on every non-NaN value
// (round to nearest even, subnormals, inf); a block holding a NaN is
// narrowed by the software path, so NaN bits do not depend on the CPU either.

static void widen_f16_sw(float *dst, const uint16_t *src, size_t m) {
    for (size_t i = 0; i < m; i++) dst[i] = f16_to_f32(src[i]);
}

static void narrow_f16_sw(uint16_t *dst, const float *src, size_t m) {
    for (size_t i = 0; i < m; i++) dst[i] = f32_to_f16(src[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

__attribute__((target("avx,f16c"))) static void widen_f16_hw(float *dst, const uint16_t *src,
                                                             size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    widen_f16_sw(dst + i, src + i, m - i);
}

__attribute__((target("avx,f16c"))) static void narrow_f16_hw(uint16_t *dst, const float *src,
                                                              size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) // a NaN: software bits
            narrow_f16_sw(dst + i, src + i, 8);
        else
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    narrow_f16_sw(dst + i, src + i, m - i);
}

static int have_f16c(void) {
    static int v = -1; // racy first calls all compute the same answer
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return v;
}
#else
static int have_f16c(void) { return 0; }
#define widen_f16_hw widen_f16_sw
#define narrow_f16_hw narrow_f16_sw
#endif

static void widen_bf16(float *dst, const uint16_t *src, size_t m) {
    for (size_t i = 0; i < m; i++) dst[i] = bf16_to_f32(src[i]);
}

static void narrow_bf16(uint16_t *dst, const float *src, size_t m) {
    for (size_t i = 0; i < m; i++) dst[i] = f32_to_bf16(src[i]);
}

typedef void (*widen_fn)(float *, const uint16_t *, size_t);
typedef void (*narrow_fn)(uint16_t *, const float *, size_t);

// The conversions of one 16-bit dtype, chosen once per call.
static void converters(int is_bf16, widen_fn *widen, narrow_fn *narrow) {
    int hw = !is_bf16 && have_f16c();
    *widen = is_bf16 ? widen_bf16 : hw ? widen_f16_hw : widen_f16_sw;
    *narrow = is_bf16 ? narrow_bf16 : hw ? narrow_f16_hw : narrow_f16_sw;
}

// out may alias a or b exactly (in-place reduction), so the 16-bit path goes
// through widened blocks (kept in L1) instead of restrict-qualified pointers.
#define HALF_BLOCK 512
static void half_reduce(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                        hpcdl_op op, int is_bf16) {
    float fa[HALF_BLOCK], fb[HALF_BLOCK], fo[HALF_BLOCK];
    widen_fn widen;
    narrow_fn narrow;
    converters(is_bf16, &widen, &narrow);
    for (size_t base = 0; base < n; base += HALF_BLOCK) {
        size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;
        widen(fa, a + base, m);
        widen(fb, b + base, m);
        f32_reduce(fo, fa, fb, m, op);
        narrow(out + base, fo, m);
    }
}

static void half_divide(uint16_t *p, size_t n, int by, int is_bf16) {
    float f[HALF_BLOCK];
    widen_fn widen;
    narrow_fn narrow;
    converters(is_bf16, &widen, &narrow);
    for (size_t base = 0; base < n; base += HALF_BLOCK) {
        size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;
        widen(f, p + base, m);
        for (size_t i = 0; i < m; i++) f[i] /= (float)by;
        narrow(p + base, f, m);
    }
}

// ----------------------------------------------------------------------------
// public entry points

void hpcdl_reduce_local(void *out, const void *a, const void *b, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op) {
    // restrict kernels require out to alias a or b exactly or not at all,
    // which is how every caller in the core uses them.
    switch (dtype) {
    case HPCDL_FLOAT32: f32_reduce(out, a, b, count, op); break;
    case HPCDL_FLOAT64: f64_reduce(out, a, b, count, op); break;
    case HPCDL_INT32: i32_reduce(out, a, b, count, op); break;
    case HPCDL_INT64: i64_reduce(out, a, b, count, op); break;
    case HPCDL_FLOAT16: half_reduce(out, a, b, count, op, 0); break;
    case HPCDL_BFLOAT16: half_reduce(out, a, b, count, op, 1); break;
    default: break;
    }
}

void hpcdl_divide_local(void *buf, size_t count, hpcdl_dtype dtype, int n) {
    switch (dtype) {
    case HPCDL_FLOAT32: {
        float *p = buf, s = 1.0f / (float)n;
        for (size_t i = 0; i < count; i++) p[i] *= s;
        break;
    }
    case HPCDL_FLOAT64: {
        double *p = buf, s = 1.0 / (double)n;
        for (size_t i = 0; i < count; i++) p[i] *= s;
        break;
    }
    case HPCDL_INT32: {
        int32_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= n;
        break;
    }
    case HPCDL_INT64: {
        int64_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= n;
        break;
    }
    case HPCDL_FLOAT16:
    case HPCDL_BFLOAT16: half_divide(buf, count, n, dtype == HPCDL_BFLOAT16); break;
    default: break;
    }
}

size_t hpcdl_dtype_size(hpcdl_dtype dtype) {
    static const size_t sizes[HPCDL_NUM_DTYPES] = {4, 8, 2, 2, 4, 8};
    return (unsigned)dtype < HPCDL_NUM_DTYPES ? sizes[dtype] : 0;
}

const char *hpcdl_dtype_name(hpcdl_dtype dtype) {
    static const char *names[HPCDL_NUM_DTYPES] = {"float32", "float64", "float16",
                                                  "bfloat16", "int32", "int64"};
    return (unsigned)dtype < HPCDL_NUM_DTYPES ? names[dtype] : "unknown";
}

const char *hpcdl_op_name(hpcdl_op op) {
    static const char *names[HPCDL_NUM_OPS] = {"sum", "average", "min", "max", "prod"};
    return (unsigned)op < HPCDL_NUM_OPS ? names[op] : "unknown";
}

const char *hpcdl_algo_name(hpcdl_algo algo) {
    static const char *names[HPCDL_NUM_ALGOS] = {"auto", "ring", "hier", "mpi"};
    if (algo == HPCDL_USED_SHARED) return "hier-shared"; // reported, never requested
    if (algo == HPCDL_USED_INLINE) return "inline";       // reported, never requested
    return (unsigned)algo < HPCDL_NUM_ALGOS ? names[algo] : "unknown";
}
