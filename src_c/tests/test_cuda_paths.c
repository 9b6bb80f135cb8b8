/*
 * test_cuda_paths.c - the CUDA all-reduce paths against MPI on CPU data, built
 * twice: against the fake runtime (tests/fake_cuda/, FAKE_CUDA defined; run by
 * `make check` on any machine) and against the real one (`make check-cuda`).
 *
 * Every input is written by an asynchronous copy on the caller's own stream
 * (behind a slow "kernel" in the fake), and the all-reduce is called at once
 * with that stream: a missing wait reads the poison the buffer held before.
 * Results are read back on the same stream right after the call returns, so
 * a call that returns before its own copies land is caught too.
 *   1. staging, GPU-direct and IPC inside a node, every dtype x op x
 *      algorithm, sizes {0, 1, N-1, 1031, 20483} (IPC also 65539 to 262147
 *      elements, 16 to 64 pieces), in place and out of
 *      place, blocking and through the engine: bit for bit against
 *      MPI_Allreduce on the host copies (hpcdl's host all-reduce for float16
 *      / bfloat16, which MPI lacks). Values are rank- and position-dependent
 *      and exact in the dtype, so every path must give the same bits. (fake)
 *      The IPC path copies nothing between host and device. On several
 *      (virtual) nodes IPC is hierarchical, staged or GPU-direct across.
 *   2. bad input, an error on every rank and no hang: device memory on one
 *      rank and host memory on the others, a GPU that cannot be confirmed, a
 *      pointer query that fails, the CUDA-awareness differing between ranks,
 *      HPCDL_MPI_CUDA_AWARE=1 on an MPI that says it is not CUDA-aware.
 *   3. (fake) no CUDA context on a GPU this rank did not choose.
 *   4. (fake) a CUDA call failing midway on every rank: errors, no hang, and
 *      the next all-reduce right; a GPU architecture the build lacks; IPC
 *      set-up failing on one rank: an error on every rank.
 *
 *   mpirun -n 2 src_c/build/fake/test_cuda_paths
 *   HPCDL_TEST_PATHS=ipc: the IPC path only (make check-fake's extra layouts)
 */
#include <mpi.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "common.h" // hpcdl_mpi_cuda_conflict
#include "testutil.h"
#include "cudautil.h"
#ifdef FAKE_CUDA
#include "fake_cuda.h"
#endif

static int my_dev;
static cudaStream_t prod; // the "user's" stream that produces every input
static int no_host_copies; // 1: the path under test must copy nothing host <-> device

// ----------------------------------------------------------------------------
// data: exact in each dtype, so sums in any order give the same bits

static double value(int r, size_t i, hpcdl_dtype d, hpcdl_op op) {
    if (op == HPCDL_PROD || d == HPCDL_FLOAT16 || d == HPCDL_BFLOAT16)
        return test_value(r, i, op); // small integers (testutil.h)
    long v = (long)((i * 2654435761u + (size_t)r * 977) % 2001) - 1000;
    if (d == HPCDL_INT32 || d == HPCDL_INT64) return (double)(v * 1009 + r);
    return (double)v / 64.0; // fractions, exact in float32
}

#ifdef FAKE_CUDA
static void slow(void *arg) { usleep(*(const int *)arg); }
#endif

// Writes host into dev on the producer stream, behind 2 ms of other work in
// the fake (on a GPU the copy itself is the work), and returns at once.
static void produce(void *dev, const void *host, size_t bytes) {
#ifdef FAKE_CUDA
    int us = 2000;
    CUDA_OK(fake_cuda_launch(prod, slow, &us, sizeof us));
#endif
    CUDA_OK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, prod));
}

static void read_back(void *host, const void *dev, size_t bytes) {
    CUDA_OK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, prod));
    CUDA_OK(cudaStreamSynchronize(prod));
}

// The reference: MPI_Allreduce on host data (hpcdl's host path for 16-bit floats).
static void reference(hpcdl_ctx *ctx, void *buf, size_t count, hpcdl_dtype d, hpcdl_op op) {
    if (d == HPCDL_FLOAT16 || d == HPCDL_BFLOAT16) {
        OK(hpcdl_allreduce(ctx, buf, buf, count, d, op, HPCDL_ALGO_RING));
        return;
    }
    MPI_Datatype t = d == HPCDL_FLOAT32 ? MPI_FLOAT : d == HPCDL_FLOAT64 ? MPI_DOUBLE
                     : d == HPCDL_INT32 ? MPI_INT32_T : MPI_INT64_T;
    MPI_Op o = op == HPCDL_MIN ? MPI_MIN : op == HPCDL_MAX ? MPI_MAX
               : op == HPCDL_PROD ? MPI_PROD : MPI_SUM;
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, t, o, MPI_COMM_WORLD);
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(buf, count, d, nranks);
}

// ----------------------------------------------------------------------------
// 1. the paths

static void one(hpcdl_ctx *ctx, const char *path, size_t count, hpcdl_dtype d, hpcdl_op op,
                hpcdl_algo algo, int in_place, int async) {
    size_t esz = hpcdl_dtype_size(d), bytes = count * esz;
    char *want = malloc(bytes + 1), *in = malloc(bytes + 1), *got = malloc(bytes + 1);
    char *dsend = NULL, *drecv = NULL;
    CUDA_OK(cudaMalloc((void **)&dsend, bytes + 16));
    CUDA_OK(in_place ? cudaSuccess : cudaMalloc((void **)&drecv, bytes + 16));
    if (in_place) drecv = dsend;
    for (size_t i = 0; i < count; i++) store(in, i, d, value(rank, i, d, op));
    memcpy(want, in, bytes);
    reference(ctx, want, count, d, op);
    memset(got, 0xff, bytes); // poison (NaN, -1): what a missing wait would read
    CUDA_OK(cudaMemcpy(dsend, got, bytes, cudaMemcpyHostToDevice));
    if (!in_place) CUDA_OK(cudaMemcpy(drecv, got, bytes, cudaMemcpyHostToDevice));
    // cudaMemcpy from pageable memory may return before its DMA lands, and the
    // producer's non-blocking stream does not wait for the legacy one: without
    // this the poison could land after the input (seen on an H100, in place)
    CUDA_OK(cudaDeviceSynchronize());
    produce(dsend, in, bytes);
    hpcdl_mem mem = {my_dev, prod};
    unsigned long copies = test_host_copies();
    if (async) {
        hpcdl_handle h;
        char err[512];
        OK(hpcdl_allreduce_mem_async(ctx, dsend, drecv, count, d, op, algo, &mem, "t", &h));
        int rc = hpcdl_wait(ctx, h, err, sizeof err);
        CHECK(rc == HPCDL_OK, "rank %d %s async: %s", rank, path, err);
    } else {
        OK(hpcdl_allreduce_mem(ctx, dsend, drecv, count, d, op, algo, &mem));
    }
    copies = test_host_copies() - copies;
    CHECK(!no_host_copies || copies == 0, "rank %d %s %s %s count=%zu: %lu copies between "
          "host and device", rank, path, hpcdl_dtype_name(d), hpcdl_op_name(op), count, copies);
    read_back(got, drecv, bytes);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++)
        if (memcmp(got + i * esz, want + i * esz, esz) && bad++ == 0) first = i;
    CHECK(bad == 0, "rank %d %s%s %s %s %s count=%zu %s: %zu wrong, first at %zu (got %g "
          "want %g)", rank, path, async ? " async" : "", hpcdl_algo_name(algo),
          hpcdl_dtype_name(d), hpcdl_op_name(op), count, in_place ? "in place" : "out of place",
          bad, first, bad ? load(got, first, d) : 0, bad ? load(want, first, d) : 0);
    if (!in_place) { // send comes back untouched
        read_back(got, dsend, bytes);
        CHECK(!memcmp(got, in, bytes), "rank %d %s %s %s count=%zu: send buffer changed",
              rank, path, hpcdl_dtype_name(d), hpcdl_op_name(op), count);
        CUDA_OK(cudaFree(drecv));
    }
    CUDA_OK(cudaFree(dsend));
    free(want);
    free(in);
    free(got);
}

static void run_path(hpcdl_ctx *ctx, const char *path) {
    size_t sizes[] = {0, 1, (size_t)nranks - 1, 1031, 20483};
    for (int d = 0; d < HPCDL_NUM_DTYPES; d++)
        for (int op = 0; op < HPCDL_NUM_OPS; op++)
            for (int a = 0; a < HPCDL_NUM_ALGOS; a++)
                for (int si = 0; si < 5; si++) // every size, each algorithm on some
                    if ((si + a + op) % 2 == 0 || si == 4)
                        one(ctx, path, sizes[si], d, op, a, (si + op + d) % 2,
                            (si + a + d) % 3 == 0);
}

// ----------------------------------------------------------------------------
// 2. bad input: the call fails on every rank (none hangs), with `want` in the
// message of the rank that caused it

static void expect_fail(hpcdl_ctx *ctx, const char *what, const void *send, void *recv,
                        int dev, int culprit, const char *want) {
    hpcdl_mem mem = {dev, prod};
    int rc = hpcdl_allreduce_mem(ctx, send, recv, 1031, HPCDL_FLOAT32, HPCDL_SUM,
                                 HPCDL_ALGO_AUTO, &mem);
    const char *msg = hpcdl_last_error();
    CHECK(rc != HPCDL_OK, "rank %d %s: no error", rank, what);
    CHECK(!culprit || strstr(msg, want), "rank %d %s: message lacks '%s': %s", rank, what,
          want, msg);
    if (rank == 0 && culprit && getenv("HPCDL_TEST_VERBOSE")) printf("%s: %s\n", what, msg);
    float ok = 1;
    CHECK(hpcdl_allreduce(ctx, &ok, &ok, 1, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO) ==
          HPCDL_OK && ok == nranks, "rank %d: context unusable after %s", rank, what);
}

static void test_bad_input(hpcdl_ctx *ctx) {
    size_t bytes = 1031 * 4;
    char *dev = NULL, *host = calloc(1, bytes);
    CUDA_OK(cudaMalloc((void **)&dev, bytes));
    setenv("HPCDL_MPI_CUDA_AWARE", "0", 1);
    // device memory on rank 0, host memory elsewhere
    expect_fail(ctx, "device/host mix", rank == 0 ? dev : host, rank == 0 ? dev : host,
                rank == 0 ? my_dev : -1, 0, "");
    // rank 0 says "GPU" for host memory: it cannot be confirmed
    expect_fail(ctx, "host memory said to be device", host, host, rank == 0 ? my_dev : -1,
                rank == 0, "CUDA says send is on -1");
    // send on the GPU, recv on the host
    expect_fail(ctx, "send device, recv host", dev, rank == 0 ? host : dev, my_dev, rank == 0,
                "CUDA says");
#ifdef FAKE_CUDA
    // the pointer query fails (a driver older than the runtime)
    if (rank == nranks - 1) fake_cuda_fail("cudaPointerGetAttributes", 1, cudaErrorInvalidValue);
    expect_fail(ctx, "failed pointer query", dev, dev, my_dev, rank == nranks - 1,
                "cannot confirm");
    fake_cuda_fail("", 0, cudaSuccess);
#endif
    // CUDA-awareness differs: the ranks would run different message patterns
    setenv("HPCDL_MPI_CUDA_AWARE", rank == 0 ? "force" : "0", 1);
    expect_fail(ctx, "CUDA-awareness differs", dev, dev, my_dev, 0, "");
    setenv("HPCDL_MPI_CUDA_AWARE", "0", 1);
    // IPC on one rank only
    setenv("HPCDL_CUDA_IPC", rank == 0 ? "1" : "0", 1);
    expect_fail(ctx, "HPCDL_CUDA_IPC differs", dev, dev, my_dev, 1, "memory path");
    setenv("HPCDL_CUDA_IPC", "0", 1);
    // the override contradicts an MPI that says it is not CUDA-aware
    setenv("HPCDL_MPI_CUDA_AWARE", "1", 1);
    if (hpcdl_mpi_cuda_conflict())
        expect_fail(ctx, "HPCDL_MPI_CUDA_AWARE=1 on a MPI without CUDA", dev, dev, my_dev, 1,
                    "not CUDA-aware");
    setenv("HPCDL_MPI_CUDA_AWARE", "0", 1);
    CUDA_OK(cudaFree(dev));
    free(host);
}

#ifdef FAKE_CUDA
// ----------------------------------------------------------------------------
// 4. (fake) a CUDA call failing midway on every rank at the same point: an
// error everywhere, no hang, and nothing left behind (no posted receive, no
// queued copy into the buffer): the next all-reduce is right.

static void fail_midway(hpcdl_ctx *ctx, const char *path, const char *call, int nth) {
    size_t count = 20483, bytes = count * 4;
    float *in = malloc(bytes);
    char *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, bytes));
    for (size_t i = 0; i < count; i++) in[i] = (float)value(rank, i, HPCDL_FLOAT32, HPCDL_SUM);
    produce(d, in, bytes);
    fake_cuda_fail(call, nth, cudaErrorInvalidValue); // counted from here, this call only
    hpcdl_mem mem = {my_dev, prod};
    int rc = hpcdl_allreduce_mem(ctx, d, d, count, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_RING,
                                 &mem);
    fake_cuda_fail("", 0, cudaSuccess);
    CHECK(rc == HPCDL_ERR_CUDA && strstr(hpcdl_last_error(), "Hint"), "rank %d %s: %s failing "
          "midway gave %d: %s", rank, path, call, rc, hpcdl_last_error());
    CUDA_OK(cudaFree(d));
    free(in);
    one(ctx, path, count, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_RING, 1, 0);
    one(ctx, path, count, HPCDL_FLOAT64, HPCDL_MAX, HPCDL_ALGO_AUTO, 0, 1);
}

// IPC with rank 0's GPU far slower than the others': the fast ranks run
// pieces ahead while rank 0's streams still read their workspaces (the
// halves' reuse must wait for it), many pieces per call.
static void ipc_skewed(hpcdl_ctx *ctx) {
    fake_cuda_set_delay_us(rank == 0 ? 3000 : 0);
    for (int k = 0; k < 3; k++)
        one(ctx, "ipc skewed", 20483, k == 1 ? HPCDL_FLOAT64 : HPCDL_FLOAT32,
            k == 2 ? HPCDL_AVERAGE : HPCDL_SUM, HPCDL_ALGO_AUTO, k != 1, k == 2);
    fake_cuda_set_delay_us(200);
}

// IPC set-up failing on one rank only (opening a peer's memory): an error
// on every rank, not a hang, and the next all-reduce sets up again and is
// right. A new context: the link is made at its first IPC all-reduce.
static void ipc_setup_fails(void) {
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, 0, &ctx));
    char *dev = NULL;
    CUDA_OK(cudaMalloc((void **)&dev, 1031 * 4));
    if (rank == nranks - 1) fake_cuda_fail("cudaIpcOpenMemHandle", 1, cudaErrorInvalidValue);
    expect_fail(ctx, "IPC set-up failing on one rank", dev, dev, my_dev, 1,
                rank == nranks - 1 ? "cudaIpcOpenMemHandle" : "another rank of this node");
    fake_cuda_fail("", 0, cudaSuccess);
    CUDA_OK(cudaFree(dev));
    one(ctx, "ipc", 1031, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO, 0, 0);
    one(ctx, "ipc", 20483, HPCDL_INT32, HPCDL_MAX, HPCDL_ALGO_RING, 1, 1);
    OK(hpcdl_ctx_destroy(ctx));
}

// Rank 0 moves to its other GPU for some calls and back: every rank sets the
// IPC link up again together (its workspace must be on the GPU of the
// call), through the engine too. Run last: it makes a context on that GPU.
static void ipc_moves_gpu(int local_size, int one_node) {
    int ndev = 0;
    CUDA_OK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) return; // FAKE_CUDA_DEVICES=1: nowhere to move
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, local_size, &ctx));
    setenv("HPCDL_CUDA_IPC", "1", 1);
    no_host_copies = one_node;
    one(ctx, "ipc", 1031, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO, 0, 0);
    int home = my_dev;
    cudaStream_t home_prod = prod;
    if (rank == 0) {
        my_dev = home == 0 ? 1 : 0;
        CUDA_OK(cudaSetDevice(my_dev));
        CUDA_OK(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking));
    }
    one(ctx, "ipc, rank 0 on its other GPU", 1031, HPCDL_FLOAT32, HPCDL_SUM,
        HPCDL_ALGO_AUTO, 1, 0);
    one(ctx, "ipc, rank 0 on its other GPU", 20483, HPCDL_INT32, HPCDL_MIN, HPCDL_ALGO_RING,
        0, 1);
    if (rank == 0) {
        my_dev = home;
        prod = home_prod;
        CUDA_OK(cudaSetDevice(home));
    }
    one(ctx, "ipc, rank 0 back", 20483, HPCDL_FLOAT64, HPCDL_AVERAGE, HPCDL_ALGO_AUTO, 1, 1);
    no_host_copies = 0;
    setenv("HPCDL_CUDA_IPC", "0", 1);
    OK(hpcdl_ctx_destroy(ctx));
}

// Run alone (FAKE_CUDA_CC=70 set by make check-fake): a GPU the build has no
// kernels for fails on every rank before any data moves.
static int arch_only(void) {
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, 0, &ctx));
    char *dev = NULL;
    CUDA_OK(cudaMalloc((void **)&dev, 1031 * 4));
    expect_fail(ctx, "unsupported GPU architecture", dev, dev, my_dev, 1, "no kernels for it");
    CUDA_OK(cudaFree(dev));
    OK(hpcdl_ctx_destroy(ctx));
    int total_fail = 0;
    MPI_Allreduce(&g_failures, &total_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_cuda_paths (fake runtime, sm_%s GPU, %d ranks): %d checks per rank, %d "
               "failed\n", getenv("FAKE_CUDA_CC"), nranks, g_checks, total_fail);
    MPI_Finalize();
    return total_fail != 0;
}
#endif

// ----------------------------------------------------------------------------
// main. With two (fake) GPUs and two ranks, each rank has a GPU it did not choose.

int main(int argc, char **argv) {
    my_dev = cuda_test_start(&argc, &argv);
    CUDA_OK(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking));
#ifdef FAKE_CUDA
    if (getenv("FAKE_CUDA_CC")) return arch_only();
#endif
    setenv("HPCDL_CUDA_STAGE_BYTES", "16384", 0);  // staging and IPC: many pieces
    int aware = hpcdl_mpi_cuda_aware(), all_aware = 0;
    MPI_Allreduce(&aware, &all_aware, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const char *ls = getenv("HPCDL_LOCAL_SIZE"), *only = getenv("HPCDL_TEST_PATHS");
    int ipc_only = only && !strcmp(only, "ipc");
    // IPC runs inside each node; on one node nothing touches the host
    MPI_Comm node;
    int on_node = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    int one_node = on_node == nranks && (!ls || atoi(ls) == nranks) && nranks > 1;
    hpcdl_ctx *ctx;
    OK(hpcdl_ctx_create(MPI_COMM_WORLD, ls ? atoi(ls) : 0, &ctx));
    setenv("HPCDL_MPI_CUDA_AWARE", "0", 1);
    setenv("HPCDL_CUDA_IPC", "1", 1);
    no_host_copies = one_node;
    run_path(ctx, one_node ? "ipc" : "ipc, staged across nodes");
    // large: 16 pieces and more (HPCDL_CUDA_STAGE_BYTES=16384 here), not a
    // multiple of the ranks
    one(ctx, "ipc large", 262147, HPCDL_FLOAT32, HPCDL_SUM, HPCDL_ALGO_AUTO, 0, 0);
    one(ctx, "ipc large", 131075, HPCDL_BFLOAT16, HPCDL_AVERAGE, HPCDL_ALGO_RING, 1, 1);
    one(ctx, "ipc large", 65539, HPCDL_INT64, HPCDL_MAX, HPCDL_ALGO_MPI, 1, 0);
    no_host_copies = 0;
#ifdef FAKE_CUDA
    ipc_skewed(ctx);
    ipc_setup_fails();
#endif
    setenv("HPCDL_CUDA_IPC", "0", 1);
    if (ipc_only) {
        OK(hpcdl_ctx_destroy(ctx));
#ifdef FAKE_CUDA
        ipc_moves_gpu(ls ? atoi(ls) : 0, one_node);
#endif
        goto done;
    }
    run_path(ctx, "staged");
#ifdef FAKE_CUDA
    fail_midway(ctx, "staged", "cudaMemcpyAsync", 3); // piece 0's copy back up
    // the fake's device memory readable by MPI, as a CUDA-aware MPI reads it
    fake_cuda_set_host_visible(1);
    all_aware = 1;
    setenv("HPCDL_MPI_CUDA_AWARE", "force", 1);
#else
    setenv("HPCDL_MPI_CUDA_AWARE", "1", 1);
#endif
    if (all_aware) run_path(ctx, "gpu-direct");
    if (all_aware && !one_node) { // hierarchical: IPC, the GPU-direct ring across, IPC
        hpcdl_ctx *fresh; // a new link: its workspace made after the memory turned visible
        OK(hpcdl_ctx_create(MPI_COMM_WORLD, ls ? atoi(ls) : 0, &fresh));
        setenv("HPCDL_CUDA_IPC", "1", 1);
        no_host_copies = 1;
        run_path(fresh, "ipc, gpu-direct across nodes");
        no_host_copies = 0;
        setenv("HPCDL_CUDA_IPC", "0", 1);
        OK(hpcdl_ctx_destroy(fresh));
    }
#ifdef FAKE_CUDA
    fail_midway(ctx, "gpu-direct", "fake_cuda_launch", 1); // the ring's first reduction
#endif
    test_bad_input(ctx);
    OK(hpcdl_ctx_destroy(ctx));
#ifdef FAKE_CUDA
    int other = my_dev == 0 ? 1 : 0; // the caller's and the engine's threads alike
    CHECK(!fake_cuda_context_made(other), "rank %d: a CUDA context was made on GPU %d, "
          "which this rank never chose (it uses GPU %d)", rank, other, my_dev);
    ipc_moves_gpu(ls ? atoi(ls) : 0, one_node);
#endif
done:;
    int total_fail = 0;
    MPI_Allreduce(&g_failures, &total_fail, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_cuda_paths (%s runtime, %d ranks, local_size=%s, paths: %s%s%s): %d "
               "checks per rank, %d failed\n",
               CUDA_RUNTIME_NAME,
               nranks, ls ? ls : "node", one_node ? "ipc" : "ipc + staged across nodes",
               ipc_only ? "" : ", staged", !ipc_only && all_aware ?
               (one_node ? ", gpu-direct" : ", gpu-direct, ipc + gpu-direct across nodes") : "",
               g_checks, total_fail);
    MPI_Finalize();
    return total_fail != 0;
}
