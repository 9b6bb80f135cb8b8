/*
 * test_ring_step.c - ring.c's pipelined step (hpcdl_ring_step) with a reduce
 * hook, the way the GPU-direct ring (cuda/cuda_allreduce.c) drives it, on the
 * CPU: every rank sends to rank + 1 and receives from rank - 1 in small
 * chunks; the hook must see each received chunk once, in order, with the
 * matching part of `own`, and dst must come out as received op own, in place
 * (own == dst, as on the GPU) and not, and as a plain copy without own.
 *
 *   mpirun -n 3 src_c/build/test_ring_step
 */
#include <mpi.h>
#include <string.h>
#include "common.h"
#include "testutil.h"

enum { TAG = 7399 };

typedef struct {
    size_t calls, next;       // hook calls so far; the byte offset the next chunk must have
    const char *dst0, *own0;  // start of the step's dst and own
    size_t chunk;
    int bad;                  // chunks out of order, too long, or with another part of own
} hook_log;

// A host stand-in for the GPU hook: checks the chunk's place, then reduces.
static int logging_reduce(const hpcdl_step *s, void *dst, const void *recvd,
                          const void *own, size_t count) {
    hook_log *log = s->user;
    size_t at = (size_t)((const char *)dst - log->dst0);
    if (at != log->next || (const char *)own != log->own0 + at || count == 0 ||
        count * hpcdl_dtype_size(s->dtype) > log->chunk)
        log->bad++;
    log->calls++;
    log->next = at + count * hpcdl_dtype_size(s->dtype);
    hpcdl_reduce_local(dst, recvd, own, count, s->dtype, s->op);
    return HPCDL_OK;
}

// mode 0: own separate; 1: in place (own == dst); 2: no own (a copy).
static void run_step(hpcdl_team *t, size_t count, int mode) {
    int n = t->size, r = t->rank, from = hpcdl_mod(r - 1, n);
    hpcdl_dtype d = HPCDL_FLOAT32;
    size_t esz = hpcdl_dtype_size(d), bytes = count * esz, chunk = 64;
    char *src = malloc(bytes + 1), *own = malloc(bytes + 1), *dst = malloc(bytes + 1);
    char *tmp = malloc(2 * chunk);
    for (size_t i = 0; i < count; i++) {
        store(src, i, d, test_value(r, i, HPCDL_SUM));      // what rank r sends
        store(own, i, d, test_value(r + 100, i, HPCDL_SUM)); // what it adds
    }
    if (mode == 1) memcpy(dst, own, bytes);
    const char *own_arg = mode == 0 ? own : mode == 1 ? dst : NULL;
    hook_log log = {0, 0, dst, own_arg, chunk, 0};
    hpcdl_step s = {t, t->world, (r + 1) % n, from, TAG, d, HPCDL_SUM, chunk,
                    {tmp, tmp + chunk}, logging_reduce, &log};
    OK(hpcdl_ring_step(&s, src, bytes, dst, bytes, own_arg));
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double want = test_value(from, i, HPCDL_SUM) +
                      (mode == 2 ? 0 : test_value(r + 100, i, HPCDL_SUM));
        if (load(dst, i, d) != want) wrong++;
    }
    size_t chunks = mode == 2 ? 0 : (bytes + chunk - 1) / chunk;
    CHECK(wrong == 0, "rank %d count %zu mode %d: %zu elements wrong", r, count, mode, wrong);
    CHECK(log.calls == chunks && log.bad == 0 && (mode == 2 || log.next == bytes),
          "rank %d count %zu mode %d: hook called %zu times (want %zu), %d out of place",
          r, count, mode, log.calls, chunks, log.bad);
    free(src);
    free(own);
    free(dst);
    free(tmp);
}

// Every rank sends one element fewer than its peer expects, in the same
// number of chunks: MPI reports no error for a short message, the step must.
static void short_message(hpcdl_team *t) {
    int r = t->rank;
    size_t bytes = 15 * 4, chunk = 64;
    char src[64] = {0}, dst[64], tmp[128];
    hpcdl_step s = {t, t->world, (r + 1) % t->size, hpcdl_mod(r - 1, t->size), TAG + 1,
                    HPCDL_FLOAT32, HPCDL_SUM, chunk, {tmp, tmp + chunk}, NULL, NULL};
    int rc = hpcdl_ring_step(&s, src, bytes - 4, dst, bytes, NULL);
    CHECK(rc == HPCDL_ERR_MISMATCH && strstr(hpcdl_last_error(), "received 56 bytes"),
          "rank %d: a short message gave %d (%s)", r, rc, hpcdl_last_error());
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    hpcdl_team t;
    OK(hpcdl_team_create(&t, MPI_COMM_WORLD, 0));
    const size_t counts[] = {0, 1, 15, 16, 17, 1031};
    for (int mode = 0; mode < 3; mode++)
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            run_step(&t, counts[i], mode);
    short_message(&t);
    OK(hpcdl_team_free(&t));
    int failures = 0;
    MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (t.rank == 0)
        printf("test_ring_step (%d ranks): %d checks per rank, %d failed\n", t.size, g_checks,
               failures);
    MPI_Finalize();
    return failures != 0;
}
