/*
 * reduce.c - element-wise local reductions out[i] = a[i] op b[i] for every
 * dtype and op, written as plain loops over restrict pointers so the compiler
 * vectorises them. float16 and bfloat16 are widened to float in small blocks
 * (kept in L1), reduced, and rounded back to nearest-even.
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

// out may alias a or b exactly (in-place reduction), so the 16-bit path goes
// through widened blocks instead of restrict-qualified pointers.
#define HALF_BLOCK 512
static void half_reduce(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                        hpcdl_op op, int is_bf16) {
    float fa[HALF_BLOCK], fb[HALF_BLOCK], fo[HALF_BLOCK];
    for (size_t base = 0; base < n; base += HALF_BLOCK) {
        size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;
        for (size_t i = 0; i < m; i++) {
            fa[i] = is_bf16 ? bf16_to_f32(a[base + i]) : f16_to_f32(a[base + i]);
            fb[i] = is_bf16 ? bf16_to_f32(b[base + i]) : f16_to_f32(b[base + i]);
        }
        f32_reduce(fo, fa, fb, m, op);
        for (size_t i = 0; i < m; i++)
            out[base + i] = is_bf16 ? f32_to_bf16(fo[i]) : f32_to_f16(fo[i]);
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
    case HPCDL_BFLOAT16: {
        uint16_t *p = buf;
        int bf = dtype == HPCDL_BFLOAT16;
        for (size_t i = 0; i < count; i++) {
            float f = (bf ? bf16_to_f32(p[i]) : f16_to_f32(p[i])) / (float)n;
            p[i] = bf ? f32_to_bf16(f) : f32_to_f16(f);
        }
        break;
    }
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
    return (unsigned)algo < HPCDL_NUM_ALGOS ? names[algo] : "unknown";
}
