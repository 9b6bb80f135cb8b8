/*
 * error.c - the thread-local error message behind hpcdl_last_error(), and
 * the formatting of failed MPI calls (call, rank, MPI's own text, a hint).
 */
#include <stdarg.h>
#include <string.h>
#include "common.h"

static _Thread_local char last_error[1024];

const char *hpcdl_last_error(void) { return last_error; }

int hpcdl_fail(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return err;
}

int hpcdl_mpi_fail(int mpi_rc, const char *call, const char *file, int line) {
    char mpi_msg[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0, rank = -1, initialized = 0, finalized = 0, cls = MPI_ERR_OTHER;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Error_string(mpi_rc, mpi_msg, &len);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Error_class(mpi_rc, &cls);
    }
#ifdef HPCDL_ULFM
    // a peer failed, or a survivor revoked the communicator: the caller's
    // hpcdl_ft_result names the lost ranks (fault.c)
    if (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING ||
        cls == MPIX_ERR_REVOKED)
        return hpcdl_fail(HPCDL_ERR_PROC_FAILED, "%s failed on rank %d: %s (%s:%d)", call, rank,
                          mpi_msg, file, line);
#else
    (void)cls;
#endif
    return hpcdl_fail(HPCDL_ERR_MPI,
                      "%s failed on rank %d: %s (%s:%d). Hint: check that every rank "
                      "made the same calls and that the MPI job is healthy "
                      "(a rank may have died).",
                      call, rank, mpi_msg, file, line);
}
