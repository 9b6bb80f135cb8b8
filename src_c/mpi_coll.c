/*
 * mpi_coll.c - MPI's own collectives, for algo = mpi (and the pieces the CUDA
 * path hands to a CUDA-aware MPI): hpcdl's dtypes and ops as MPI's, user
 * ops for the 16-bit floats MPI lacks, int-sized pieces of large buffers,
 * and the average's division that MPI does not do.
 */
#include <stdlib.h>
#include "common.h"

// ----------------------------------------------------------------------------
// dtypes and ops

static void half_op(void *in, void *inout, int *len, MPI_Datatype *dt, hpcdl_dtype d,
                    hpcdl_op op) {
    (void)dt;
    hpcdl_reduce_local(inout, inout, in, (size_t)*len, d, op);
}
#define HALF_OP_FN(D, O, NAME)                                                 \
    static void NAME(void *in, void *inout, int *len, MPI_Datatype *dt) {      \
        half_op(in, inout, len, dt, D, O);                                     \
    }
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_SUM, f16_sum)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_MIN, f16_min)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_MAX, f16_max)
HALF_OP_FN(HPCDL_FLOAT16, HPCDL_PROD, f16_prod)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_SUM, bf16_sum)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_MIN, bf16_min)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_MAX, bf16_max)
HALF_OP_FN(HPCDL_BFLOAT16, HPCDL_PROD, bf16_prod)

MPI_Datatype hpcdl_mpi_dtype(hpcdl_dtype d) {
    switch (d) {
    case HPCDL_FLOAT32: return MPI_FLOAT;
    case HPCDL_FLOAT64: return MPI_DOUBLE;
    case HPCDL_INT32: return MPI_INT32_T;
    case HPCDL_INT64: return MPI_INT64_T;
    default: return MPI_UINT16_T; // 16-bit floats travel as raw bits
    }
}

// MPI has no 16-bit float ops: user-defined ones are created once and kept.
// Local call; thread-safe.
int hpcdl_mpi_op(hpcdl_dtype d, hpcdl_op op, MPI_Op *out) {
    static MPI_Op half_ops[2][HPCDL_NUM_OPS];
    static int created[2][HPCDL_NUM_OPS];
    static MPI_User_function *fns[2][HPCDL_NUM_OPS] = {
        {f16_sum, f16_sum, f16_min, f16_max, f16_prod},
        {bf16_sum, bf16_sum, bf16_min, bf16_max, bf16_prod}};
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (d == HPCDL_FLOAT16 || d == HPCDL_BFLOAT16) {
        int h = d == HPCDL_BFLOAT16;
        pthread_mutex_lock(&lock);
        int rc = MPI_SUCCESS;
        if (!created[h][op]) rc = MPI_Op_create(fns[h][op], 1, &half_ops[h][op]);
        if (rc == MPI_SUCCESS) created[h][op] = 1;
        pthread_mutex_unlock(&lock);
        MPI_CHECK(rc);
        *out = half_ops[h][op];
        return HPCDL_OK;
    }
    switch (op) {
    case HPCDL_SUM:
    case HPCDL_AVERAGE: *out = MPI_SUM; break;
    case HPCDL_MIN: *out = MPI_MIN; break;
    case HPCDL_MAX: *out = MPI_MAX; break;
    default: *out = MPI_PROD; break;
    }
    return HPCDL_OK;
}

// ----------------------------------------------------------------------------
// collectives. Each is collective over t->world; preconditions across ranks
// are those of the MPI call: the same count (counts), dtype, op (root).
// Counts above 2^30 go in pieces (MPI counts are int) where the call allows.

// MPI_Allreduce in pieces of at most 2^30 elements, on host or (CUDA-aware
// MPI) device buffers. AVERAGE reduces like SUM here: the division is the
// caller's, who knows where the data lives. blocking_only: never the polite
// MPI_Iallreduce (Open MPI 4.x takes device pointers in blocking collectives
// only).
int hpcdl_mpi_allreduce_pieces(hpcdl_team *t, const void *send, void *recv, size_t count,
                               hpcdl_dtype dtype, hpcdl_op op, int blocking_only) {
    MPI_Op mop;
    HPCDL_TRY(hpcdl_mpi_op(dtype, op, &mop));
    size_t esz = hpcdl_dtype_size(dtype), piece = (size_t)1 << 30;
    for (size_t base = 0; base < count; base += piece) {
        int n = (int)(count - base < piece ? count - base : piece);
        char *r = (char *)recv + base * esz;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + base * esz;
        if ((t->polite || t->crowded) && !blocking_only) { // see hpcdl_team_wait
            MPI_Request rq;
            MPI_CHECK(MPI_Iallreduce(s, r, n, hpcdl_mpi_dtype(dtype), mop, t->world, &rq));
            MPI_CHECK(hpcdl_team_wait(t, &rq));
        } else {
            MPI_CHECK(MPI_Allreduce(s, r, n, hpcdl_mpi_dtype(dtype), mop, t->world));
        }
    }
    return HPCDL_OK;
}

// Host buffers: the average divided here.
int hpcdl_mpi_allreduce(hpcdl_team *t, const void *send, void *recv, size_t count,
                        hpcdl_dtype dtype, hpcdl_op op) {
    HPCDL_TRY(hpcdl_mpi_allreduce_pieces(t, send, recv, count, dtype, op, 0));
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(recv, count, dtype, t->size);
    return HPCDL_OK;
}

static int reduce_scatter_int(hpcdl_team *t, const void *send, void *recv, const int *counts,
                              hpcdl_dtype dtype, hpcdl_op op) {
    MPI_Op mop;
    HPCDL_TRY(hpcdl_mpi_op(dtype, op, &mop));
    MPI_CHECK(MPI_Reduce_scatter(send, recv, counts, hpcdl_mpi_dtype(dtype), mop, t->world));
    return HPCDL_OK;
}

// Host buffers; one call, so every count must fit an int.
int hpcdl_mpi_reduce_scatter(hpcdl_team *t, const void *send, void *recv,
                             const size_t *counts, hpcdl_dtype dtype, hpcdl_op op) {
    int *ic = malloc(sizeof(int) * (size_t)t->size);
    if (!ic) return hpcdl_fail(HPCDL_ERR_NOMEM, "reduce_scatter: out of memory");
    for (int i = 0; i < t->size; i++) ic[i] = (int)counts[i];
    int rc = reduce_scatter_int(t, send, recv, ic, dtype, op);
    free(ic);
    if (rc == HPCDL_OK && op == HPCDL_AVERAGE)
        hpcdl_divide_local(recv, counts[t->rank], dtype, t->size);
    return rc;
}

static int allgatherv_int(hpcdl_team *t, const void *send, void *recv, const int *counts,
                          const int *displs, hpcdl_dtype dtype) {
    MPI_Datatype dt = hpcdl_mpi_dtype(dtype);
    MPI_CHECK(MPI_Allgatherv(send, counts[t->rank], dt, recv, counts, displs, dt, t->world));
    return HPCDL_OK;
}

// Host buffers; one call, so the total count must fit an int.
int hpcdl_mpi_allgatherv(hpcdl_team *t, const void *send, void *recv, const size_t *counts,
                         hpcdl_dtype dtype) {
    int *ic = malloc(sizeof(int) * 2 * (size_t)t->size);
    if (!ic) return hpcdl_fail(HPCDL_ERR_NOMEM, "allgather: out of memory");
    int *displs = ic + t->size, off = 0;
    for (int i = 0; i < t->size; i++) {
        ic[i] = (int)counts[i];
        displs[i] = off;
        off += ic[i];
    }
    int rc = allgatherv_int(t, send, recv, ic, displs, dtype);
    free(ic);
    return rc;
}

// MPI_Ibcast in pieces, waited for by the team's policy.
int hpcdl_mpi_broadcast(hpcdl_team *t, void *buf, size_t count, hpcdl_dtype dtype, int root) {
    size_t esz = hpcdl_dtype_size(dtype), piece = (size_t)1 << 30;
    for (size_t base = 0; base < count; base += piece) {
        int n = (int)(count - base < piece ? count - base : piece);
        MPI_Request rq;
        MPI_CHECK(MPI_Ibcast((char *)buf + base * esz, n, hpcdl_mpi_dtype(dtype), root,
                             t->world, &rq));
        MPI_CHECK(hpcdl_team_wait(t, &rq));
    }
    return HPCDL_OK;
}
