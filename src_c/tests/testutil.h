/*
 * testutil.h - shared helpers of the C tests: rank- and position-dependent
 * data that is exact in every dtype, conversion to double for checking, and
 * a CHECK macro that counts failures (tests exit non-zero on any).
 */
#ifndef HPCDL_TESTUTIL_H
#define HPCDL_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hpcdl.h"

static int g_failures = 0, g_checks = 0;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        g_checks++;                                                             \
        if (!(cond)) {                                                          \
            g_failures++;                                                       \
            if (g_failures <= 20) {                                             \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
                fprintf(stderr, __VA_ARGS__);                                   \
                fprintf(stderr, "\n");                                          \
            }                                                                   \
        }                                                                       \
    } while (0)

#define OK(call)                                                                \
    do {                                                                        \
        int rc_ = (call);                                                       \
        if (rc_ != HPCDL_OK) {                                                  \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, hpcdl_last_error()); \
            MPI_Abort(MPI_COMM_WORLD, 2);                                       \
        }                                                                       \
    } while (0)

// Small integers: exact in float16 and bfloat16, sums over <= 8 ranks too.
// For prod the values are +-1, +-2 so products stay exact.
static inline double test_value(int rank, size_t i, hpcdl_op op) {
    if (op == HPCDL_PROD)
        return (double)(1 + (int)((i + 3 * (size_t)rank) % 2)) * (((i + (size_t)rank) % 3 == 0) ? -1 : 1);
    return (double)((int)((i * 7 + (size_t)rank * 13 + 5) % 17) - 8);
}

static inline void store(void *buf, size_t i, hpcdl_dtype d, double v) {
    switch (d) {
    case HPCDL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HPCDL_FLOAT64: ((double *)buf)[i] = v; break;
    case HPCDL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HPCDL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HPCDL_FLOAT16: ((_Float16 *)buf)[i] = (_Float16)v; break;
    case HPCDL_BFLOAT16: {
        float f = (float)v; // small integers: truncating the low bits is exact
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    }
    default: break;
    }
}

static inline double load(const void *buf, size_t i, hpcdl_dtype d) {
    switch (d) {
    case HPCDL_FLOAT32: return ((const float *)buf)[i];
    case HPCDL_FLOAT64: return ((const double *)buf)[i];
    case HPCDL_INT32: return ((const int32_t *)buf)[i];
    case HPCDL_INT64: return (double)((const int64_t *)buf)[i];
    case HPCDL_FLOAT16: return (double)((const _Float16 *)buf)[i];
    case HPCDL_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return NAN;
    }
}

// What element i must be after reducing test_value over n ranks.
static inline double expected(int n, size_t i, hpcdl_dtype d, hpcdl_op op) {
    double acc = test_value(0, i, op);
    for (int r = 1; r < n; r++) {
        double v = test_value(r, i, op);
        if (op == HPCDL_SUM || op == HPCDL_AVERAGE) acc += v;
        else if (op == HPCDL_MIN) acc = v < acc ? v : acc;
        else if (op == HPCDL_MAX) acc = v > acc ? v : acc;
        else acc *= v;
    }
    if (op == HPCDL_AVERAGE) {
        if (d == HPCDL_INT32 || d == HPCDL_INT64) acc = trunc(acc / n);
        else acc /= n;
    }
    return acc;
}

static inline double tolerance(hpcdl_dtype d, hpcdl_op op) {
    if (op != HPCDL_AVERAGE) return 0; // every other result is an exact small integer
    if (d == HPCDL_FLOAT16) return 1e-2;
    if (d == HPCDL_BFLOAT16) return 5e-2;
    if (d == HPCDL_FLOAT32) return 1e-6;
    return 1e-12;
}

#endif // HPCDL_TESTUTIL_H
