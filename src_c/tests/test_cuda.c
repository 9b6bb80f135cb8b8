/*
 * test_cuda.c - the CUDA path of the core, on a GPU machine:
 *   1. the device kernels against reduce.c, bit for bit (every dtype x op,
 *      aligned and unaligned, in place and not, and the average's division);
 *   2. hpcdl_is_device_ptr on host, pinned, device and managed memory;
 *   3. hpcdl_allreduce on device buffers with rank- and position-dependent
 *      data, every dtype x op x algorithm, sizes {0, 1, N-1, 1031, 1 Mi + 3},
 *      in place and out of place, through the pinned-host staging path
 *      (forced with HPCDL_MPI_CUDA_AWARE=0) and, when the MPI is CUDA-aware,
 *      the GPU-direct path; plus the asynchronous engine on device buffers.
 * Without a GPU it prints "SKIP: no CUDA device" and exits 0.
 *
 *   make -C src_c check-cuda        (or: mpirun -n 2 src_c/build/test_cuda)
 */
#include <mpi.h>
#include <cuda_runtime_api.h>
#include "common.h"    // hpcdl_is_device_ptr
#include "cuda_core.h" // hpcdl_cuda_reduce, hpcdl_cuda_divide
#include "testutil.h"
#include "cudautil.h"

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes + 16)); // never 0 bytes: a real device pointer
    return p;
}

// ----------------------------------------------------------------------------
// 1. kernels against reduce.c. Values with fractions of 1/64, so that 16-bit
// sums, products and divisions really round.

static double frac_value(size_t i, int which) {
    return (double)((long)((i * 2654435761u + (size_t)which * 977) % 2001) - 1000) / 64.0;
}

static void test_kernels(size_t count, hpcdl_dtype d, hpcdl_op op) {
    size_t esz = hpcdl_dtype_size(d), bytes = count * esz;
    char *ha = malloc(bytes + 1), *hb = malloc(bytes + 1), *want = malloc(bytes + 1);
    char *got = malloc(bytes + 1);
    for (size_t i = 0; i < count; i++) {
        store(ha, i, d, frac_value(i, 1));
        store(hb, i, d, frac_value(i, 2));
    }
    char *da = dev_alloc(bytes), *db = dev_alloc(bytes), *dout = dev_alloc(bytes + esz);
    CUDA_OK(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice));
    hpcdl_reduce_local(want, ha, hb, count, d, op);
    // out of place into an address one element off alignment: the scalar path
    OK(hpcdl_cuda_reduce(dout + esz, da, db, count, d, op, (cudaStream_t)0));
    CUDA_OK(cudaMemcpy(got, dout + esz, bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(got, want, bytes), "rank %d kernel %s %s count=%zu unaligned: differs "
          "from reduce.c", rank, hpcdl_dtype_name(d), hpcdl_op_name(op), count);
    // in place on aligned buffers: the 16-byte packs
    OK(hpcdl_cuda_reduce(da, da, db, count, d, op, (cudaStream_t)0));
    CUDA_OK(cudaMemcpy(got, da, bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(got, want, bytes), "rank %d kernel %s %s count=%zu in place: differs "
          "from reduce.c", rank, hpcdl_dtype_name(d), hpcdl_op_name(op), count);
    // the average's division, aligned and not
    hpcdl_divide_local(want, count, d, 3);
    OK(hpcdl_cuda_divide(da, count, d, 3, (cudaStream_t)0));
    OK(hpcdl_cuda_divide(dout + esz, count, d, 3, (cudaStream_t)0));
    CUDA_OK(cudaMemcpy(got, da, bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(got, want, bytes), "rank %d divide %s count=%zu: differs from reduce.c",
          rank, hpcdl_dtype_name(d), count);
    CUDA_OK(cudaMemcpy(got, dout + esz, bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(got, want, bytes), "rank %d divide %s count=%zu unaligned: differs from "
          "reduce.c", rank, hpcdl_dtype_name(d), count);
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dout));
    free(ha);
    free(hb);
    free(want);
    free(got);
}

// ----------------------------------------------------------------------------
// 2. pointer kinds

static void test_pointer_kinds(void) {
    float stack[4];
    void *dev = dev_alloc(64), *pinned = NULL, *managed = NULL;
    CUDA_OK(cudaMallocHost(&pinned, 64));
    CUDA_OK(cudaMallocManaged(&managed, 64, cudaMemAttachGlobal));
    CHECK(hpcdl_is_device_ptr(NULL) == 0, "rank %d: NULL taken for device memory", rank);
    CHECK(hpcdl_is_device_ptr(stack) == 0, "rank %d: stack taken for device memory", rank);
    CHECK(hpcdl_is_device_ptr(pinned) == 0, "rank %d: pinned host memory taken for device "
          "memory", rank);
    CHECK(hpcdl_is_device_ptr(dev) == 1, "rank %d: cudaMalloc memory not seen", rank);
    CHECK(hpcdl_is_device_ptr(managed) == 1, "rank %d: managed memory not seen", rank);
    CUDA_OK(cudaFree(dev));
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaFree(managed));
}

// ----------------------------------------------------------------------------
// 3. all-reduce of device buffers

// Compares count elements of host (copied back from the GPU) with the
// reduction of test_value over all ranks; returns the number wrong.
static size_t count_wrong(const char *host, size_t count, hpcdl_dtype d, hpcdl_op op,
                          size_t *first) {
    size_t bad = 0;
    double tol = tolerance(d, op);
    for (size_t i = 0; i < count; i++) {
        double want = expected(nranks, i, d, op), got = load(host, i, d);
        if (fabs(got - want) > tol * (1 + fabs(want)) && bad++ == 0) *first = i;
    }
    return bad;
}

static void test_allreduce(hpcdl_ctx *ctx, size_t count, hpcdl_dtype d, hpcdl_op op,
                           hpcdl_algo algo, int in_place, const char *path) {
    size_t esz = hpcdl_dtype_size(d), bytes = count * esz, first = 0;
    char *host = malloc(bytes + 1), *dsend = dev_alloc(bytes), *dbase = NULL;
    // out of place: recv one element off 16-byte alignment, so the unaligned
    // kernels run too
    char *drecv = in_place ? dsend : (dbase = dev_alloc(bytes + esz)) + esz;
    for (size_t i = 0; i < count; i++) store(host, i, d, test_value(rank, i, op));
    CUDA_OK(cudaMemcpy(dsend, host, bytes, cudaMemcpyHostToDevice));
    OK(hpcdl_allreduce(ctx, dsend, drecv, count, d, op, algo));
    memset(host, 0, bytes);
    CUDA_OK(cudaMemcpy(host, drecv, bytes, cudaMemcpyDeviceToHost));
    size_t bad = count_wrong(host, count, d, op, &first);
    CHECK(bad == 0, "rank %d %s allreduce %s %s %s count=%zu %s: %zu wrong, first at %zu "
          "(got %g want %g)", rank, path, hpcdl_algo_name(algo), hpcdl_dtype_name(d),
          hpcdl_op_name(op), count, in_place ? "in-place" : "out-of-place", bad, first,
          bad ? load(host, first, d) : 0, bad ? expected(nranks, first, d, op) : 0);
    if (!in_place) { // the send buffer must come back untouched
        CUDA_OK(cudaMemcpy(host, dsend, bytes, cudaMemcpyDeviceToHost));
        bad = 0;
        for (size_t i = 0; i < count; i++) bad += load(host, i, d) != test_value(rank, i, op);
        CHECK(bad == 0, "rank %d %s allreduce %s %s count=%zu: send buffer changed", rank,
              path, hpcdl_dtype_name(d), hpcdl_op_name(op), count);
        CUDA_OK(cudaFree(dbase));
    }
    CUDA_OK(cudaFree(dsend));
    free(host);
}

// The engine thread on device buffers: two operations in flight at once.
static void test_async(hpcdl_ctx *ctx, const char *path) {
    size_t counts[2] = {1031, ((size_t)1 << 20) + 3}, first = 0;
    char *dbuf[2], *host[2];
    hpcdl_handle h[2];
    for (int k = 0; k < 2; k++) {
        host[k] = malloc(counts[k] * 4);
        dbuf[k] = dev_alloc(counts[k] * 4);
        for (size_t i = 0; i < counts[k]; i++)
            store(host[k], i, HPCDL_FLOAT32, test_value(rank, i, HPCDL_SUM));
        CUDA_OK(cudaMemcpy(dbuf[k], host[k], counts[k] * 4, cudaMemcpyHostToDevice));
        OK(hpcdl_allreduce_async(ctx, dbuf[k], dbuf[k], counts[k], HPCDL_FLOAT32, HPCDL_SUM,
                                 HPCDL_ALGO_AUTO, "cuda", &h[k]));
    }
    for (int k = 0; k < 2; k++) {
        char err[256];
        int rc = hpcdl_wait(ctx, h[k], err, sizeof err);
        CHECK(rc == HPCDL_OK, "rank %d %s async: %s", rank, path, err);
        CUDA_OK(cudaMemcpy(host[k], dbuf[k], counts[k] * 4, cudaMemcpyDeviceToHost));
        size_t bad = count_wrong(host[k], counts[k], HPCDL_FLOAT32, HPCDL_SUM, &first);
        CHECK(bad == 0, "rank %d %s async count=%zu: %zu wrong, first at %zu", rank, path,
              counts[k], bad, first);
        CUDA_OK(cudaFree(dbuf[k]));
        free(host[k]);
    }
}

static void run_path(hpcdl_ctx *ctx, const char *path) {
    size_t sizes[] = {0, 1, (size_t)nranks - 1, 1031, ((size_t)1 << 20) + 3};
    for (int d = 0; d < HPCDL_NUM_DTYPES; d++)
        for (int si = 0; si < 5; si++)
            for (int a = 0; a < HPCDL_NUM_ALGOS; a++)
                for (int op = 0; op < HPCDL_NUM_OPS; op++)
                    test_allreduce(ctx, sizes[si], d, op, a, (si + op) % 2, path);
    test_async(ctx, path);
}

int main(int argc, char **argv) {
    cuda_test_start(&argc, &argv);
    setenv("HPCDL_CUDA_STAGE_BYTES", "262144", 0);  // staging: many pieces
    // what the user's environment or the MPI says, before the test forces it
    int aware = hpcdl_mpi_cuda_aware(), all_aware = 0;
    MPI_Allreduce(&aware, &all_aware, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    size_t ksizes[] = {0, 1, 7, 1031, ((size_t)1 << 20) + 3};
    for (int d = 0; d < HPCDL_NUM_DTYPES; d++)
        for (int si = 0; si < 5; si++)
            for (int op = 0; op < HPCDL_NUM_OPS; op++) test_kernels(ksizes[si], d, op);
    test_pointer_kinds();
    const char *ls = getenv("HPCDL_LOCAL_SIZE");
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, ls ? atoi(ls) : 0, &ctx));
    setenv("HPCDL_MPI_CUDA_AWARE", "0", 1);
    run_path(ctx, "staged");
    if (all_aware) {
        setenv("HPCDL_MPI_CUDA_AWARE", "1", 1);
        run_path(ctx, "gpu-direct");
    } else if (rank == 0) {
        printf("gpu-direct path: not run (MPI is not CUDA-aware; HPCDL_MPI_CUDA_AWARE=1 "
               "says it is)\n");
    }
    OK(hpcdl_ctx_destroy(ctx));
    int total_fail = 0;
    MPI_Allreduce(&g_failures, &total_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_cuda (%d ranks, local_size=%s, paths: staged%s): %d checks per rank, "
               "%d failed\n", nranks, ls ? ls : "node", all_aware ? ", gpu-direct" : "",
               g_checks, total_fail);
    MPI_Finalize();
    return total_fail != 0;
}
