/*
 * test_engine.c - the asynchronous engine: many all-reduces in flight at once
 * (different sizes, dtypes and algorithms), waited in reverse order, must all
 * be right; polls must turn true; the timeline must hold one record per
 * operation in submission order; blocking calls on the caller's thread may
 * run while the engine works.
 */
#include <mpi.h>
#include "testutil.h"

#define NOPS 48

int main(int argc, char **argv) {
    int provided, rank, n;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, 0, &ctx));
    void *bufs[NOPS];
    size_t counts[NOPS];
    hpcdl_dtype dts[NOPS];
    hpcdl_handle h[NOPS];
    for (int k = 0; k < NOPS; k++) {
        counts[k] = (size_t)(k * 997) % 70001 + (size_t)k;  // 0 .. ~70000, irregular
        dts[k] = (hpcdl_dtype)(k % HPCDL_NUM_DTYPES);
        bufs[k] = malloc(counts[k] * hpcdl_dtype_size(dts[k]) + 1);
        for (size_t i = 0; i < counts[k]; i++)
            store(bufs[k], i, dts[k], test_value(rank, i + (size_t)k, HPCDL_SUM));
        char name[32];
        snprintf(name, sizeof name, "grad.%d", k);
        OK(hpcdl_allreduce_async(ctx, bufs[k], bufs[k], counts[k], dts[k], HPCDL_SUM,
                                 (hpcdl_algo)(k % HPCDL_NUM_ALGOS), name, &h[k]));
    }
    // a blocking collective on the caller's thread while the engine works
    float x[5] = {1, 2, 3, 4, (float)rank};
    OK(hpcdl_allreduce(ctx, x, x, 5, HPCDL_FLOAT32, HPCDL_MAX, HPCDL_ALGO_RING));
    CHECK(x[4] == (float)(n - 1), "blocking call during async work: got %g", x[4]);
    for (int k = NOPS - 1; k >= 0; k--) { // wait in reverse order
        OK(hpcdl_wait(ctx, h[k], NULL, 0));
        size_t bad = 0;
        for (size_t i = 0; i < counts[k]; i++)
            if (load(bufs[k], i, dts[k]) != expected(n, i + (size_t)k, dts[k], HPCDL_SUM)) bad++;
        CHECK(bad == 0, "rank %d async op %d (%s, %zu elements): %zu wrong", rank, k,
              hpcdl_dtype_name(dts[k]), counts[k], bad);
        free(bufs[k]);
    }
    CHECK(hpcdl_wait(ctx, h[0], NULL, 0) == HPCDL_ERR_STATE, "double wait not refused");
    hpcdl_timeline_rec recs[NOPS + 4];
    size_t nrec = hpcdl_timeline_drain(ctx, recs, NOPS + 4);
    CHECK(nrec == NOPS, "timeline has %zu records, want %d", nrec, NOPS);
    for (size_t k = 0; k < nrec; k++) {
        char name[32];
        snprintf(name, sizeof name, "grad.%zu", k);
        CHECK(strcmp(recs[k].name, name) == 0, "record %zu is %s (out of order)", k, recs[k].name);
        CHECK(recs[k].t_start >= recs[k].t_submit && recs[k].t_end >= recs[k].t_start,
              "record %zu times out of order", k);
        CHECK(k == 0 || recs[k].t_start >= recs[k - 1].t_end, "record %zu overlaps its predecessor", k);
        CHECK(recs[k].bytes == counts[k] * hpcdl_dtype_size(dts[k]), "record %zu bytes", k);
    }
    // the other collectives through the engine, interleaved with an all-reduce
    size_t *cnt = malloc(sizeof(size_t) * (size_t)n), tot = 0;
    for (int r = 0; r < n; r++) tot += (cnt[r] = (size_t)(100 + 7 * r));
    size_t off = 0;
    for (int r = 0; r < rank; r++) off += cnt[r];
    double *src = malloc(tot * sizeof(double)), *part = malloc(cnt[rank] * sizeof(double));
    double *gath = malloc(tot * sizeof(double)), *bc = malloc(500 * sizeof(double));
    for (size_t i = 0; i < tot; i++) src[i] = test_value(rank, i, HPCDL_SUM);
    for (int i = 0; i < 500; i++) bc[i] = test_value(rank, (size_t)i, HPCDL_SUM);
    hpcdl_handle hrs, hag, hbc;
    OK(hpcdl_reduce_scatter_async(ctx, src, part, cnt, HPCDL_FLOAT64, HPCDL_SUM,
                                  HPCDL_ALGO_RING, "rs", &hrs));
    OK(hpcdl_broadcast_async(ctx, bc, 500, HPCDL_FLOAT64, n - 1, HPCDL_ALGO_AUTO, "bc", &hbc));
    OK(hpcdl_wait(ctx, hrs, NULL, 0));
    OK(hpcdl_allgatherv_async(ctx, part, gath, cnt, HPCDL_FLOAT64, HPCDL_ALGO_AUTO, "ag", &hag));
    OK(hpcdl_wait(ctx, hag, NULL, 0));
    OK(hpcdl_wait(ctx, hbc, NULL, 0));
    size_t bad = 0;
    for (size_t i = 0; i < cnt[rank]; i++)
        if (part[i] != expected(n, off + i, HPCDL_FLOAT64, HPCDL_SUM)) bad++;
    for (size_t i = 0; i < tot; i++)
        if (gath[i] != expected(n, i, HPCDL_FLOAT64, HPCDL_SUM)) bad++;
    for (int i = 0; i < 500; i++)
        if (bc[i] != test_value(n - 1, (size_t)i, HPCDL_SUM)) bad++;
    CHECK(bad == 0, "rank %d async reduce_scatter / allgather / broadcast: %zu wrong", rank, bad);
    free(cnt);
    free(src);
    free(part);
    free(gath);
    free(bc);
    hpcdl_timeline_drain(ctx, recs, NOPS + 4);

    // poll eventually reports completion
    float y[1000];
    for (int i = 0; i < 1000; i++) y[i] = (float)(rank + i);
    hpcdl_handle hy;
    OK(hpcdl_allreduce_async(ctx, y, y, 1000, HPCDL_FLOAT32, HPCDL_AVERAGE, HPCDL_ALGO_AUTO, "y", &hy));
    while (hpcdl_poll(ctx, hy) == 0) {
    }
    OK(hpcdl_wait(ctx, hy, NULL, 0));
    CHECK(fabs(y[10] - (10 + (n - 1) / 2.0)) < 1e-5, "average via poll: %g", y[10]);
    OK(hpcdl_ctx_destroy(ctx));
    int total = 0;
    MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("test_engine (%d ranks): %d checks per rank, %d failed\n", n, g_checks, total);
    MPI_Finalize();
    return total != 0;
}
