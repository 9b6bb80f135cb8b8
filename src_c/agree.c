/*
 * agree.c - the agreement check that runs before every collective: each rank
 * brings a small signature (valid, count, dtype, op, algorithm, ...) and a
 * mismatch becomes HPCDL_ERR_MISMATCH on every rank, with the value of each
 * rank in the message, instead of a hang or mixed data.
 *
 * On one node the signatures meet in shared memory; across nodes, in teams of
 * up to 8 ranks, in one exchange of records (small.c, which also carries the
 * data of small all-reduces). Larger teams: one small all-reduce of (sig,
 * -sig) with MAX gives the max and min of every field; only when they differ
 * are the values gathered to name the ranks. Every rank builds the same
 * message, so all of them fail.
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "shm.h"

#define MAX_SIG 8

// ----------------------------------------------------------------------------
// the message

static void describe(char *buf, size_t len, const char *field, int64_t v) {
    if (!strcmp(field, "dtype")) snprintf(buf, len, "%s", hpcdl_dtype_name((hpcdl_dtype)v));
    else if (!strcmp(field, "op")) snprintf(buf, len, "%s", hpcdl_op_name((hpcdl_op)v));
    else if (!strcmp(field, "algorithm")) snprintf(buf, len, "%s", hpcdl_algo_name((hpcdl_algo)v));
    else if (!strcmp(field, "valid")) snprintf(buf, len, "%s", v ? "ok" : "bad buffer");
    else if (!strcmp(field, "collective")) snprintf(buf, len, "%s", hpcdl_coll_name(v));
    else snprintf(buf, len, "%lld", (long long)v);
}

// all[r * nsig + i]: field i of rank r; bad: the first field that differs.
// Local call (small.c's exchange uses it too); returns HPCDL_ERR_MISMATCH.
int hpcdl_agree_mismatch(const hpcdl_team *t, const char *what, const int64_t *all, int nsig,
                    int bad, const char *const *names) {
    char msg[900], val[48];
    int pos = snprintf(msg, sizeof msg, "%s: ranks disagree on %s:", what, names[bad]);
    for (int r = 0; r < t->size && pos < (int)sizeof msg - 64; r++) {
        if (r >= 16 && r < t->size - 1) { // long jobs: first 16 and the last
            if (r == 16) pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " ...");
            continue;
        }
        describe(val, sizeof val, names[bad], all[(size_t)r * (size_t)nsig + (size_t)bad]);
        pos += snprintf(msg + pos, sizeof msg - (size_t)pos, " rank %d=%s%s", r, val,
                        r < t->size - 1 ? "," : "");
    }
    return hpcdl_fail(HPCDL_ERR_MISMATCH,
                      "%s. Hint: every rank must call the same collectives in the same "
                      "order with the same count, dtype and op.", msg);
}

// ----------------------------------------------------------------------------
// the check

// All ranks on one node: the signatures meet in shared memory at one spin
// barrier (~0.3 us) instead of an MPI all-reduce. Slots alternate with the
// barrier's parity, so a fast rank writing its next signature never
// overwrites one a slower rank is still reading (it cannot pass the next
// barrier before that rank does).
static int check_agree_shm(const hpcdl_team *t, const char *what, const int64_t *sig,
                           int nsig, const char *const *names) {
    hpcdl_shm *s = t->shm;
    int parity = (int)((s->epoch + 1) & 1);
    memcpy(hpcdl_shm_sig(s, t->local_rank, parity), sig, sizeof(int64_t) * (size_t)nsig);
    HPCDL_TRY(hpcdl_shm_barrier((hpcdl_team *)t));
    int bad = -1;
    for (int i = 0; i < nsig && bad < 0; i++)
        for (int j = 0; j < t->local_size; j++)
            if (hpcdl_shm_sig(s, j, parity)[i] != hpcdl_shm_sig(s, 0, parity)[i]) bad = i;
    if (bad < 0) return HPCDL_OK;
    int64_t all[MAX_SIG * 64];
    for (int j = 0; j < t->local_size; j++)
        memcpy(all + (size_t)j * (size_t)nsig, hpcdl_shm_sig(s, j, parity),
               sizeof(int64_t) * (size_t)nsig);
    return hpcdl_agree_mismatch(t, what, all, nsig, bad, names);
}

static int gather_sigs(const hpcdl_team *t, const int64_t *sig, int nsig, int64_t *all) {
    MPI_CHECK(MPI_Allgather(sig, nsig, MPI_INT64_T, all, nsig, MPI_INT64_T, t->world));
    return HPCDL_OK;
}

// Collective over t. Preconditions across ranks: every rank calls it at the
// same point with the same nsig (<= 8) and names; the check is that sig is
// the same everywhere.
int hpcdl_check_agree(const hpcdl_team *t, const char *what, const int64_t *sig, int nsig,
                      const char *const *names) {
    if (t->shm && t->cross_size == 1 && t->local_size <= 64)
        return check_agree_shm(t, what, sig, nsig, names);
    if (hpcdl_exchange_applies(t)) // across nodes: one exchange of records (small.c)
        return hpcdl_exchange_agree((hpcdl_team *)t, what, sig, nsig, names, NULL, 0);
    int64_t mm[2 * MAX_SIG];
    for (int i = 0; i < nsig; i++) {
        mm[i] = sig[i];
        mm[nsig + i] = -sig[i];
    }
    if (t->polite || t->crowded) { // the engine (peers may arrive much later), or crowded
        MPI_Request rq;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, mm, 2 * nsig, MPI_INT64_T, MPI_MAX, t->world,
                                 &rq));
        MPI_CHECK(hpcdl_team_wait(t, &rq));
    } else {
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * nsig, MPI_INT64_T, MPI_MAX, t->world));
    }
    int bad = -1;
    for (int i = 0; i < nsig && bad < 0; i++)
        if (mm[i] != -mm[nsig + i]) bad = i;
    if (bad < 0) return HPCDL_OK;
    int64_t *all = malloc(sizeof(int64_t) * (size_t)nsig * (size_t)t->size);
    if (!all) return hpcdl_fail(HPCDL_ERR_NOMEM, "agreement check: out of memory");
    int rc = gather_sigs(t, sig, nsig, all);
    if (rc == HPCDL_OK) rc = hpcdl_agree_mismatch(t, what, all, nsig, bad, names);
    free(all);
    return rc;
}

// A rank whose buffer failed validation joins the agreement check with
// valid = 0, so every other rank fails too instead of waiting for it.
// Collective over t, in place of the check the other ranks make (same nsig).
int hpcdl_check_invalid(const hpcdl_team *t, const char *what, int nsig) {
    static const char *const names[MAX_SIG] = {"valid", "x", "x", "x", "x", "x", "x", "x"};
    int64_t sig[MAX_SIG] = {0};
    if (nsig < 1 || nsig > MAX_SIG) nsig = 5;
    // the all-reduce's length is the core's to know (it grew with the memory
    // path): callers built against an older one must still match it
    if (what && !strcmp(what, "allreduce")) nsig = HPCDL_ALLREDUCE_SIG;
    return hpcdl_check_agree(t, what, sig, nsig, names);
}
