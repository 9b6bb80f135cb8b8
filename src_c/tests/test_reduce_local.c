/*
 * test_reduce_local.c - the local reduction kernels against double math,
 * for every dtype and op, including in-place use and 16-bit rounding.
 */
#include <mpi.h>
#include "testutil.h"

int main(void) {
    const size_t n = 4099; // not a multiple of any block size
    for (int d = 0; d < HPCDL_NUM_DTYPES; d++) {
        for (int op = 0; op < HPCDL_NUM_OPS; op++) {
            size_t esz = hpcdl_dtype_size(d);
            char *a = malloc(n * esz), *b = malloc(n * esz), *o = malloc(n * esz);
            for (size_t i = 0; i < n; i++) {
                store(a, i, d, test_value(0, i, op));
                store(b, i, d, test_value(1, i, op));
            }
            hpcdl_reduce_local(o, a, b, n, d, op);
            hpcdl_reduce_local(a, a, b, n, d, op); // in place
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                double want = expected(2, i, d, op == HPCDL_AVERAGE ? HPCDL_SUM : op);
                if (load(o, i, d) != want || load(a, i, d) != want) bad++;
            }
            CHECK(bad == 0, "reduce_local %s %s: %d wrong", hpcdl_dtype_name(d),
                  hpcdl_op_name(op), bad);
            free(a);
            free(b);
            free(o);
        }
    }
    // 16-bit rounding: 1 + 2^-11 lies halfway between two float16 values and
    // must round to even (1.0); 1 + 3*2^-11 rounds up to 1 + 2^-9. The
    // compiler's own float -> _Float16 conversion is the reference.
    float addend[2] = {0x1p-11f, 3 * 0x1p-11f};
    for (int i = 0; i < 2; i++) {
        _Float16 one = (_Float16)1.0f, add = (_Float16)addend[i], sum;
        _Float16 want = (_Float16)(1.0f + addend[i]);
        hpcdl_reduce_local(&sum, &one, &add, 1, HPCDL_FLOAT16, HPCDL_SUM);
        CHECK(sum == want, "float16 rounding of 1 + %g: got %g want %g", addend[i],
              (double)sum, (double)want);
    }
    // integer average truncates toward zero
    int32_t iv[3] = {-7, 7, 9};
    hpcdl_divide_local(iv, 3, HPCDL_INT32, 2);
    CHECK(iv[0] == -3 && iv[1] == 3 && iv[2] == 4, "int divide: %d %d %d", iv[0], iv[1], iv[2]);
    // min / max: a NaN wins from either side (not only when it is the first
    // operand), so the result does not depend on the ranks' order
    for (int op = HPCDL_MIN; op <= HPCDL_MAX; op++) {
        float fa[2] = {NAN, 1.0f}, fb[2] = {1.0f, NAN}, fo[2];
        double da[2] = {NAN, 1.0}, db[2] = {1.0, NAN}, dout[2];
        hpcdl_reduce_local(fo, fa, fb, 2, HPCDL_FLOAT32, op);
        hpcdl_reduce_local(dout, da, db, 2, HPCDL_FLOAT64, op);
        CHECK(isnan(fo[0]) && isnan(fo[1]) && isnan(dout[0]) && isnan(dout[1]),
              "%s with one NaN operand: float32 %g %g, float64 %g %g", hpcdl_op_name(op),
              (double)fo[0], (double)fo[1], dout[0], dout[1]);
    }
    printf("test_reduce_local: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures != 0;
}
