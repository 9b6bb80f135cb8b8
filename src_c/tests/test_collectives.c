/*
 * test_collectives.c - every blocking collective against single-process math,
 * with data that depends on rank and position, over dtype x op x algorithm x
 * sizes {0, 1, N-1, 1031, 1 Mi + 3, 64 MiB}, in place and out of place, with
 * small chunks and slots so pipelining and piecing really run. Also checks
 * that a count mismatch fails on every rank. Run under mpirun with 2-4 ranks
 * (HPCDL_LOCAL_SIZE=2 with 4 ranks runs the inter-node path). argv[1], if
 * given, restricts the run to one dtype (0..5, see hpcdl_dtype).
 */
#include <mpi.h>
#include "testutil.h"

static int rank, nranks;

static size_t max_bytes(void) {
    const char *e = getenv("HPCDL_TEST_MAX_BYTES");
    return e ? (size_t)strtoull(e, NULL, 10) : (size_t)64 << 20;
}

static void test_allreduce(hpcdl_ctx *ctx, size_t count, hpcdl_dtype d, hpcdl_op op,
                           hpcdl_algo algo, int in_place) {
    size_t esz = hpcdl_dtype_size(d);
    char *send = malloc(count * esz + 1), *recv = in_place ? send : malloc(count * esz + 1);
    for (size_t i = 0; i < count; i++) store(send, i, d, test_value(rank, i, op));
    OK(hpcdl_allreduce(ctx, send, recv, count, d, op, algo));
    size_t bad = 0, first = 0;
    double tol = tolerance(d, op);
    for (size_t i = 0; i < count; i++) {
        double want = expected(nranks, i, d, op), got = load(recv, i, d);
        if (fabs(got - want) > tol * (1 + fabs(want))) {
            if (!bad) first = i;
            bad++;
        }
    }
    CHECK(bad == 0, "rank %d allreduce %s %s %s count=%zu %s: %zu wrong, first at %zu "
          "(got %g want %g)", rank, hpcdl_algo_name(algo), hpcdl_dtype_name(d),
          hpcdl_op_name(op), count, in_place ? "in-place" : "out-of-place", bad, first,
          bad ? load(recv, first, d) : 0, bad ? expected(nranks, first, d, op) : 0);
    if (!in_place) free(recv);
    free(send);
}

static void test_reduce_scatter_allgather(hpcdl_ctx *ctx, size_t count, hpcdl_dtype d,
                                          hpcdl_algo algo) {
    size_t esz = hpcdl_dtype_size(d), *counts = malloc(sizeof(size_t) * (size_t)nranks);
    size_t total = 0;
    for (int r = 0; r < nranks; r++) { // uneven blocks: rank r gets count + r
        counts[r] = count + (size_t)r;
        total += counts[r];
    }
    size_t off = 0;
    for (int r = 0; r < rank; r++) off += counts[r];
    char *send = malloc(total * esz + 1), *part = malloc(counts[rank] * esz + 1);
    char *all = malloc(total * esz + 1);
    for (size_t i = 0; i < total; i++) store(send, i, d, test_value(rank, i, HPCDL_SUM));
    OK(hpcdl_reduce_scatter(ctx, send, part, counts, d, HPCDL_SUM, algo));
    size_t bad = 0;
    for (size_t i = 0; i < counts[rank]; i++)
        if (load(part, i, d) != expected(nranks, off + i, d, HPCDL_SUM)) bad++;
    CHECK(bad == 0, "rank %d reduce_scatter %s %s count=%zu: %zu wrong", rank,
          hpcdl_algo_name(algo), hpcdl_dtype_name(d), count, bad);
    // all-gather the reduced blocks back: must rebuild the full all-reduce
    OK(hpcdl_allgatherv(ctx, part, all, counts, d, algo));
    bad = 0;
    for (size_t i = 0; i < total; i++)
        if (load(all, i, d) != expected(nranks, i, d, HPCDL_SUM)) bad++;
    CHECK(bad == 0, "rank %d allgatherv %s %s count=%zu: %zu wrong", rank,
          hpcdl_algo_name(algo), hpcdl_dtype_name(d), count, bad);
    free(send);
    free(part);
    free(all);
    free(counts);
}

static void test_broadcast(hpcdl_ctx *ctx, size_t count, hpcdl_dtype d, hpcdl_algo algo) {
    size_t esz = hpcdl_dtype_size(d);
    int root = nranks - 1;
    char *buf = malloc(count * esz + 1);
    for (size_t i = 0; i < count; i++) store(buf, i, d, test_value(rank, i, HPCDL_SUM));
    OK(hpcdl_broadcast(ctx, buf, count, d, root, algo));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++)
        if (load(buf, i, d) != test_value(root, i, HPCDL_SUM)) bad++;
    CHECK(bad == 0, "rank %d broadcast %s %s count=%zu: %zu wrong", rank,
          hpcdl_algo_name(algo), hpcdl_dtype_name(d), count, bad);
    free(buf);
}

static void test_mismatch(hpcdl_ctx *ctx) {
    float buf[64] = {0};
    size_t count = rank == 1 ? 63 : 64; // rank 1 disagrees
    int rc = hpcdl_allreduce(ctx, buf, buf, count, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_RING);
    CHECK(rc == HPCDL_ERR_MISMATCH, "rank %d: count mismatch gave %d, not ERR_MISMATCH", rank, rc);
    CHECK(strstr(hpcdl_last_error(), "rank 1=63") != NULL,
          "rank %d: mismatch message does not name rank 1's count: %s", rank, hpcdl_last_error());
    rc = hpcdl_allreduce(ctx, buf, buf, 64, rank == 0 ? HPCDL_FLOAT64 : HPCDL_FLOAT32,
                         HPCDL_SUM, HPCDL_ALGO_AUTO);
    CHECK(rc == HPCDL_ERR_MISMATCH && strstr(hpcdl_last_error(), "dtype"),
          "rank %d: dtype mismatch not reported: %s", rank, hpcdl_last_error());
    // rank 0 says its host buffer is on GPU 0 (a CUDA tensor as hpcdl.comm
    // passes it): an error on every rank, in any build. Without CUDA the core
    // cannot take it; with CUDA it cannot confirm it (no GPU, or host memory).
    hpcdl_mem mem = {rank == 0 ? 0 : -1, NULL};
    rc = hpcdl_allreduce_mem(ctx, buf, buf, 64, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO, &mem);
    const char *want = rank != 0 ? "valid" : hpcdl_built_with_cuda() ? "GPU 0" : "without CUDA";
    CHECK(rc != HPCDL_OK && strstr(hpcdl_last_error(), want), "rank %d: a device buffer on "
          "rank 0 only gave %d: %s (wanted '%s')", rank, rc, hpcdl_last_error(), want);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    setenv("HPCDL_SHM_SLOT_BYTES", "65536", 0); // many pieces, both parities
    const char *ls = getenv("HPCDL_LOCAL_SIZE");
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, ls ? atoi(ls) : 0, &ctx));
    hpcdl_set_chunk_bytes(ctx, 4096); // many pipelined chunks per ring step
    size_t sizes[] = {0, 1, (size_t)nranks - 1, 1031, (1 << 20) + 3, 0};
    int nsizes = 6;
    // argv[1] = one dtype index: make check runs one launch per dtype so
    // each stays well inside its timeout
    int d_lo = argc > 1 ? atoi(argv[1]) : 0, d_hi = argc > 1 ? d_lo + 1 : HPCDL_NUM_DTYPES;
    for (int d = d_lo; d < d_hi; d++) {
        sizes[5] = max_bytes() / hpcdl_dtype_size(d); // 64 MiB of this dtype
        for (int si = 0; si < nsizes; si++) {
            for (int a = 0; a < HPCDL_NUM_ALGOS; a++) {
                for (int op = 0; op < HPCDL_NUM_OPS; op++)
                    test_allreduce(ctx, sizes[si], d, op, a, si % 2);
                if (sizes[si] <= ((size_t)1 << 20) + 3) {
                    test_reduce_scatter_allgather(ctx, sizes[si], d, a);
                    test_broadcast(ctx, sizes[si], d, a);
                }
            }
            if (si == 5) hpcdl_set_chunk_bytes(ctx, (size_t)256 << 10);
        }
        hpcdl_set_chunk_bytes(ctx, 4096);
    }
    if (d_lo == 0) test_mismatch(ctx);
    OK(hpcdl_ctx_destroy(ctx));
    int total_fail = 0;
    MPI_Allreduce(&g_failures, &total_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_collectives (%d ranks, local_size=%s): %d checks per rank, %d failed\n",
               nranks, ls ? ls : "node", g_checks, total_fail);
    MPI_Finalize();
    return total_fail != 0;
}
