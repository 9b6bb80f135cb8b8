/*
 * test_reduce_elem.c - the device reduction's per-element functions
 * (cuda/reduce_elem.h: the code the CUDA kernels run for each element), run
 * on the CPU bit for bit against reduce.c (hpcdl_reduce_local,
 * hpcdl_divide_local) for every dtype and op. No GPU needed: what is left
 * untested of the device reduction without one is the launch and the copies.
 *
 * Data depends on position and covers each type's edges:
 *   float16, bfloat16: every bit pattern as one operand, against zeros,
 *     subnormals, the largest values, inf, NaN (quiet, signalling, negative),
 *     0.5 and 1.5 (products on subnormal rounding ties), and against half and
 *     1.5 units in the last place of itself (sums exactly on rounding ties);
 *     then random pairs.
 *   float32, float64: all pairs of edge values (signed zeros, denormals,
 *     extremes, inf, NaN) and random bit patterns.
 *   int32, int64: extremes for min/max; values that cannot overflow for
 *     sum/prod (overflow is undefined in C, on both sides).
 * The 16-bit conversions are also checked on their own: float16 against the
 * compiler's _Float16, bfloat16 rounding against nearest-even in double.
 *
 *   make -C src_c check     (or: src_c/build/test_reduce_elem)
 */
#include <mpi.h>
#include "cuda/reduce_elem.h"
#include "testutil.h"

// ----------------------------------------------------------------------------
// the device functions over arrays, one element at a time as a kernel does

#define EACH(T, F)                                                             \
    for (size_t i = 0; i < n; i++) ((T *)out)[i] = F(((const T *)a)[i], ((const T *)b)[i], op)

static void elem_reduce(void *out, const void *a, const void *b, size_t n, hpcdl_dtype d,
                        hpcdl_op op) {
    switch (d) {
    case HPCDL_FLOAT32: EACH(float, hpcdl_el_f32); break;
    case HPCDL_FLOAT64: EACH(double, hpcdl_el_f64); break;
    case HPCDL_FLOAT16: EACH(uint16_t, hpcdl_el_f16); break;
    case HPCDL_BFLOAT16: EACH(uint16_t, hpcdl_el_bf16); break;
    case HPCDL_INT32: EACH(int32_t, hpcdl_el_i32); break;
    case HPCDL_INT64: EACH(int64_t, hpcdl_el_i64); break;
    default: break;
    }
}

#define EACH_DIV(T, F) for (size_t i = 0; i < n; i++) ((T *)buf)[i] = F(((T *)buf)[i], by)

static void elem_divide(void *buf, size_t n, hpcdl_dtype d, int by) {
    switch (d) {
    case HPCDL_FLOAT32: EACH_DIV(float, hpcdl_el_div_f32); break;
    case HPCDL_FLOAT64: EACH_DIV(double, hpcdl_el_div_f64); break;
    case HPCDL_FLOAT16: EACH_DIV(uint16_t, hpcdl_el_div_f16); break;
    case HPCDL_BFLOAT16: EACH_DIV(uint16_t, hpcdl_el_div_bf16); break;
    case HPCDL_INT32: EACH_DIV(int32_t, hpcdl_el_div_i32); break;
    case HPCDL_INT64: EACH_DIV(int64_t, hpcdl_el_div_i64); break;
    default: break;
    }
}

// ----------------------------------------------------------------------------
// test data: n pairs (a[i], b[i]) per dtype

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) { // xorshift64
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const uint16_t F16_EDGES[] = {
    0x0000, 0x8000, 0x0001, 0x8001, 0x0003, 0x03ff, 0x83ff, 0x0400, 0x3c00, 0xbc00,
    0x3800, 0x3e00, 0x3555, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7d00, 0xfe01};
static const uint16_t BF16_EDGES[] = {
    0x0000, 0x8000, 0x0001, 0x8001, 0x0003, 0x007f, 0x807f, 0x0080, 0x3f80, 0xbf80,
    0x3f00, 0x3fc0, 0x3eab, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1};
#define NEDGE16 (sizeof F16_EDGES / sizeof F16_EDGES[0])

// Bits of m * 2^k (m = 1 or 3) in the 16-bit type, 0 when not representable.
static uint16_t small_bits(int m, int k, int bf) {
    float f = ldexpf((float)m, k);
    if (bf) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return k >= -133 && k <= 126 ? (uint16_t)(u >> 16) : 0; // m * 2^k is exact here
    }
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return k >= -24 && k <= 14 ? u : 0;
}

// Half a unit in the last place of pattern p (times m), with p's sign
// flipped when neg: a + b lands exactly between two 16-bit values.
static uint16_t tie_partner(uint16_t p, int m, int neg, int bf) {
    int e = bf ? (p >> 7) & 0xff : (p >> 10) & 0x1f, emax = bf ? 0xff : 0x1f;
    if (e == 0 || e == emax) return 0; // subnormal ulp / 2 is not representable
    int k = bf ? e - 135 : e - 26;     // 2^k = ulp / 2
    return small_bits(m, k, bf) | (uint16_t)((p & 0x8000u) ^ (neg ? 0x8000u : 0));
}

static size_t make_half(uint16_t *a, uint16_t *b, int bf) {
    const uint16_t *edges = bf ? BF16_EDGES : F16_EDGES;
    size_t n = 0;
    for (size_t e = 0; e < NEDGE16; e++) // every pattern against each edge, both orders
        for (uint32_t p = 0; p < 65536; p++, n += 2) {
            a[n] = (uint16_t)p, b[n] = edges[e];
            a[n + 1] = edges[e], b[n + 1] = (uint16_t)p;
        }
    for (int m = 1; m <= 3; m += 2) // rounding ties from above and below
        for (int neg = 0; neg < 2; neg++)
            for (uint32_t p = 0; p < 65536; p++, n++)
                a[n] = (uint16_t)p, b[n] = tie_partner((uint16_t)p, m, neg, bf);
    for (int i = 0; i < 65536; i++, n++) {
        uint64_t r = next_random();
        a[n] = (uint16_t)r, b[n] = (uint16_t)(r >> 16);
    }
    return n;
}

static const double WIDE_EDGES[] = {0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -7.25, 1e-300, 1e300,
                                    1e-40, -1e-40, 3.4e38, -3.4e38, 1.17549435e-38,
                                    INFINITY, -INFINITY, NAN, -NAN};
#define NWIDE (sizeof WIDE_EDGES / sizeof WIDE_EDGES[0])

// float32 / float64: all edge pairs, then random bits (any NaN, denormal, ...).
static size_t make_wide(void *a, void *b, int f64, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < NWIDE; i++)
        for (size_t j = 0; j < NWIDE; j++, n++) {
            double x = WIDE_EDGES[i], y = WIDE_EDGES[j];
            if (f64) ((double *)a)[n] = x, ((double *)b)[n] = y;
            else ((float *)a)[n] = (float)x, ((float *)b)[n] = (float)y;
        }
    for (; n < cap; n++) {
        uint64_t x = next_random(), y = next_random();
        if (f64) memcpy((double *)a + n, &x, 8), memcpy((double *)b + n, &y, 8);
        else memcpy((float *)a + n, &x, 4), memcpy((float *)b + n, &y, 4);
    }
    return n;
}

// int32 / int64: position-dependent values; full range only for min and max.
static size_t make_int(void *a, void *b, int i64, hpcdl_op op, size_t cap) {
    int wide = op == HPCDL_MIN || op == HPCDL_MAX;
    const int64_t ext[4] = {i64 ? INT64_MIN : INT32_MIN, i64 ? INT64_MAX : INT32_MAX, -1, 0};
    for (size_t i = 0; i < cap; i++) {
        int64_t x = (int64_t)next_random(), y = (int64_t)next_random();
        if (i < 16) x = ext[i % 4], y = ext[i / 4]; // every pair of extremes
        if (!wide) x %= 46341, y %= 46341; // |x * y| < 2^31
        if (i64) ((int64_t *)a)[i] = x, ((int64_t *)b)[i] = y;
        else ((int32_t *)a)[i] = (int32_t)x, ((int32_t *)b)[i] = (int32_t)y;
    }
    return cap;
}

// ----------------------------------------------------------------------------
// comparisons against reduce.c

static int is_nan(const void *buf, size_t i, hpcdl_dtype d) {
    switch (d) {
    case HPCDL_FLOAT32: return isnan(((const float *)buf)[i]);
    case HPCDL_FLOAT64: return isnan(((const double *)buf)[i]);
    case HPCDL_FLOAT16: return (((const uint16_t *)buf)[i] & 0x7fff) > 0x7c00;
    case HPCDL_BFLOAT16: return (((const uint16_t *)buf)[i] & 0x7fff) > 0x7f80;
    default: return 0;
    }
}

// Bit for bit, but for one case: when both operands are NaN, IEEE leaves
// open which one's payload and sign the result keeps (x86 takes the first
// operand's, and the compiler may swap the operands of a + b or a * b; GPUs
// make a canonical NaN): then any NaN will do.
static void report(const char *what, hpcdl_dtype d, hpcdl_op op, const void *a,
                   const void *b, const void *got, const void *want, size_t n) {
    size_t esz = hpcdl_dtype_size(d), bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!memcmp((const char *)got + i * esz, (const char *)want + i * esz, esz)) continue;
        if (is_nan(a, i, d) && is_nan(b, i, d) && is_nan(got, i, d) && is_nan(want, i, d))
            continue;
        if (bad++ < 3) {
            uint64_t x = 0, y = 0, g = 0, w = 0;
            memcpy(&x, (const char *)a + i * esz, esz);
            memcpy(&y, (const char *)b + i * esz, esz);
            memcpy(&g, (const char *)got + i * esz, esz);
            memcpy(&w, (const char *)want + i * esz, esz);
            fprintf(stderr, "  %s %s %s [%zu]: a=%#llx b=%#llx device=%#llx reduce.c=%#llx\n",
                    what, hpcdl_dtype_name(d), hpcdl_op_name(op), i, (unsigned long long)x,
                    (unsigned long long)y, (unsigned long long)g, (unsigned long long)w);
        }
    }
    CHECK(bad == 0, "%s %s %s: %zu of %zu elements differ from reduce.c", what,
          hpcdl_dtype_name(d), hpcdl_op_name(op), bad, n);
}

// cap: room for make_half's pairs; the other dtypes use `other` pairs.
static void test_dtype(hpcdl_dtype d, size_t cap, size_t other) {
    size_t esz = hpcdl_dtype_size(d);
    if (d != HPCDL_FLOAT16 && d != HPCDL_BFLOAT16) cap = other;
    char *a = malloc(cap * esz), *b = malloc(cap * esz);
    char *got = malloc(cap * esz), *want = malloc(cap * esz);
    for (int op = 0; op < HPCDL_NUM_OPS; op++) {
        size_t n = d == HPCDL_FLOAT16 || d == HPCDL_BFLOAT16
                       ? make_half((uint16_t *)a, (uint16_t *)b, d == HPCDL_BFLOAT16)
                   : d == HPCDL_INT32 || d == HPCDL_INT64
                       ? make_int(a, b, d == HPCDL_INT64, op, other)
                       : make_wide(a, b, d == HPCDL_FLOAT64, other);
        hpcdl_reduce_local(want, a, b, n, d, op);
        elem_reduce(got, a, b, n, d, op);
        report("reduce", d, op, a, b, got, want, n);
        if (op != HPCDL_AVERAGE) continue;
        const int by[] = {1, 2, 3, 7, 64};
        for (int k = 0; k < 5; k++) {
            memcpy(want, a, n * esz);
            memcpy(got, a, n * esz);
            hpcdl_divide_local(want, n, d, by[k]);
            elem_divide(got, n, d, by[k]);
            report("divide", d, op, a, a, got, want, n);
        }
    }
    free(a);
    free(b);
    free(got);
    free(want);
}

// ----------------------------------------------------------------------------
// the 16-bit conversions on their own

// bfloat16 reference: the nearer of the two neighbours in double, ties to
// the even one (the pattern above the largest finite one is 2^128 = inf).
static uint16_t ref_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double x = fabs((double)f), vlo = fabs((double)hpcdl_el_bf16_to_f32(lo));
    double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1.0, 128)
                                          : fabs((double)hpcdl_el_bf16_to_f32(hi));
    if (x - vlo < vhi - x || (x - vlo == vhi - x && !(lo & 1))) return lo;
    return hi;
}

static void test_conversions(void) {
    int bad = 0;
    for (uint32_t p = 0; p < 65536; p++) { // every float16 widens exactly
        _Float16 h;
        uint16_t bits = (uint16_t)p;
        memcpy(&h, &bits, 2);
        float got = hpcdl_el_f16_to_f32(bits), want = (float)h;
        if (isnan(want) ? !isnan(got) : memcmp(&got, &want, 4) != 0) bad++;
    }
    CHECK(bad == 0, "float16 -> float32: %d of 65536 patterns differ from _Float16", bad);
    bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) { // floats narrow to nearest even
        uint32_t bits = (uint32_t)u;
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f)) continue; // NaN: reduce.c's quiet NaN, checked against reduce.c above
        _Float16 w = (_Float16)f;
        uint16_t want, got = hpcdl_el_f32_to_f16(f);
        memcpy(&want, &w, 2);
        if (got != want || hpcdl_el_f32_to_bf16(f) != ref_bf16(f)) bad++;
    }
    CHECK(bad == 0, "float32 -> float16 / bfloat16: %d sampled floats rounded wrongly", bad);
}

int main(void) {
    const size_t cap = (2 * NEDGE16 + 5) * 65536; // make_half's count, the largest
    for (int d = 0; d < HPCDL_NUM_DTYPES; d++) test_dtype(d, cap, (size_t)1 << 20);
    test_conversions();
    printf("test_reduce_elem: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures != 0;
}
