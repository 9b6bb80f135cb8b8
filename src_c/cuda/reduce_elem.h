/*
 * reduce_elem.h - the device reduction's per-element arithmetic, written once
 * for two compilers: nvcc builds it into the kernels of reduce_kernels.cu
 * (as __host__ __device__ functions), the plain C compiler into
 * tests/test_reduce_elem.c, which runs it on the CPU against reduce.c for
 * every dtype and op. What a machine without a GPU cannot test of the device
 * reduction is then only the kernel launch and the copies.
 *
 * The arithmetic is reduce.c's, so a device result is bit-identical to the
 * host one: 16-bit floats widen to float, reduce, and round to nearest even
 * (a NaN becomes reduce.c's quiet NaN); min/max take b only when it is
 * strictly smaller/larger; float averages multiply by 1/n, 16-bit ones
 * divide by n in float, integers divide (truncating toward zero). The 16-bit
 * conversions are integer bit work written independently of reduce.c's, so
 * that the test compares two implementations.
 *
 * Plain C needs only <stdint.h> and hpcdl.h's enums; CUDA code
 * includes cuda_core.h first (it keeps mpi.h's C++ bindings out).
 */
#ifndef HPCDL_REDUCE_ELEM_H
#define HPCDL_REDUCE_ELEM_H

#include <stdint.h>
#include "hpcdl.h"

#ifdef __CUDACC__
#define HPCDL_HD static inline __host__ __device__
#else
#define HPCDL_HD static inline
#endif

// ----------------------------------------------------------------------------
// a float's bits and back, through a union: defined in C, and supported by
// g++ and nvcc's device compiler alike

typedef union {
    float f;
    uint32_t u;
} hpcdl_el_word;

HPCDL_HD uint32_t hpcdl_el_bits(float f) { hpcdl_el_word w; w.f = f; return w.u; }
HPCDL_HD float hpcdl_el_float(uint32_t u) { hpcdl_el_word w; w.u = u; return w.f; }

// ----------------------------------------------------------------------------
// 16-bit floats <-> float. Widening is exact; narrowing rounds to nearest
// even, overflows to inf, keeps the sign of zeros and NaNs.

// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
HPCDL_HD float hpcdl_el_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, mant = h & 0x3ffu;
    int e = (h >> 10) & 0x1f;
    if (e == 0x1f) return hpcdl_el_float(sign | 0x7f800000u | (mant << 13)); // inf, NaN
    if (e == 0) {
        if (mant == 0) return hpcdl_el_float(sign); // +-0
        e = 1; // subnormal, mant * 2^-24: shift the leading 1 up to the implicit bit
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        mant &= 0x3ffu;
    }
    return hpcdl_el_float(sign | ((uint32_t)(e + 112) << 23) | (mant << 13));
}

HPCDL_HD uint16_t hpcdl_el_f32_to_f16(float f) {
    uint32_t u = hpcdl_el_bits(f), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN: the quiet NaN reduce.c makes
    if (a >= 0x477ff000u) return sign | 0x7c00u; // 65520 and up round to inf
    int e = (int)(a >> 23) - 127;                // unbiased exponent
    if (e < -25) return sign;                    // below 2^-25: rounds to zero
    uint32_t m = (a & 0x7fffffu) | 0x800000u;    // 24-bit significand
    // normals keep 11 of the 24 bits; below 2^-14 the unit is 2^-24
    int shift = e >= -14 ? 13 : -1 - e;
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    q += rest > half || (rest == half && (q & 1u)); // to nearest, ties to even
    if (e < -14) return sign | (uint16_t)q;         // subnormal (0x400: smallest normal)
    // q holds the implicit bit: adding it carries a rounded-up mantissa into the exponent
    return sign | (uint16_t)(((uint32_t)(e + 14) << 10) + q);
}

// bfloat16: the top half of a float.
HPCDL_HD float hpcdl_el_bf16_to_f32(uint16_t h) { return hpcdl_el_float((uint32_t)h << 16); }

HPCDL_HD uint16_t hpcdl_el_f32_to_bf16(float f) {
    uint32_t u = hpcdl_el_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); // quiet NaN
    uint32_t q = u >> 16, rest = u & 0xffffu;
    q += rest > 0x8000u || (rest == 0x8000u && (q & 1u)); // carries into the exponent
    return (uint16_t)q;
}

// ----------------------------------------------------------------------------
// out = a op b, operands in reduce.c's order (it matters for NaN and signed
// zero). AVERAGE reduces like SUM; the division is hpcdl_el_div_*.

#define HPCDL_EL_OP(T, S)                                                      \
    HPCDL_HD T hpcdl_el_##S(T a, T b, hpcdl_op op) {                           \
        switch (op) {                                                          \
        case HPCDL_MIN: return b < a || b != b ? b : a; /* NaN wins, either side */ \
        case HPCDL_MAX: return b > a || b != b ? b : a;                        \
        case HPCDL_PROD: return a * b;                                         \
        default: return a + b;                                                 \
        }                                                                      \
    }
HPCDL_EL_OP(float, f32)
HPCDL_EL_OP(double, f64)
HPCDL_EL_OP(int32_t, i32)
HPCDL_EL_OP(int64_t, i64)
#undef HPCDL_EL_OP

HPCDL_HD uint16_t hpcdl_el_f16(uint16_t a, uint16_t b, hpcdl_op op) {
    return hpcdl_el_f32_to_f16(
        hpcdl_el_f32(hpcdl_el_f16_to_f32(a), hpcdl_el_f16_to_f32(b), op));
}

HPCDL_HD uint16_t hpcdl_el_bf16(uint16_t a, uint16_t b, hpcdl_op op) {
    return hpcdl_el_f32_to_bf16(
        hpcdl_el_f32(hpcdl_el_bf16_to_f32(a), hpcdl_el_bf16_to_f32(b), op));
}

// ----------------------------------------------------------------------------
// the average's division, x / n, as hpcdl_divide_local does it

HPCDL_HD float hpcdl_el_div_f32(float x, int n) { return x * (1.0f / (float)n); }
HPCDL_HD double hpcdl_el_div_f64(double x, int n) { return x * (1.0 / (double)n); }
HPCDL_HD int32_t hpcdl_el_div_i32(int32_t x, int n) { return x / n; }
HPCDL_HD int64_t hpcdl_el_div_i64(int64_t x, int n) { return x / n; }

HPCDL_HD uint16_t hpcdl_el_div_f16(uint16_t x, int n) {
    return hpcdl_el_f32_to_f16(hpcdl_el_f16_to_f32(x) / (float)n);
}

HPCDL_HD uint16_t hpcdl_el_div_bf16(uint16_t x, int n) {
    return hpcdl_el_f32_to_bf16(hpcdl_el_bf16_to_f32(x) / (float)n);
}

#endif // HPCDL_REDUCE_ELEM_H
