/*
 * small.c - the agreement check across nodes as one exchange of records, and
 * small all-reduces carried inside it (#15, #16).
 *
 * Across hosts a round trip costs tens of microseconds, as much as a whole
 * small all-reduce, so a check that is its own all-reduce doubles the cost of
 * small messages. Here every rank's record reaches every other rank
 * (in two steps, see "the exchange"):
 *
 *   record = [ collective | signature (8 x int64) | inline bytes | payload ]
 *
 * and lands in a slot sized for the largest payload any rank can inline
 * (SMALL_MAX, whatever HPCDL_SMALL_BYTES says), so a rank that disagrees on
 * the size can never overrun a buffer. Every rank then holds every record:
 * the headers are compared the same way everywhere (one verdict, one message
 * on every rank), and an auto all-reduce of at most HPCDL_SMALL_BYTES reduces
 * the payloads locally in rank order (x0 op x1 op ... : bit-identical on
 * every rank). Cost: one network latency; a rank receives every rank's
 * payload, so it is used for teams of at most SMALL_MAX_RANKS ranks. Every
 * collective's check takes this path when it applies, so a rank in an
 * all-reduce and a rank in a broadcast meet in the same exchange and fail on
 * "collective".
 */
#include <stdlib.h>
#include <string.h>
#include "common.h"

#define MAX_SIG 8
#define X_COLL 0                  // header field: which collective
#define X_INLINE (1 + MAX_SIG)    // header field: payload bytes carried
#define XHDR (2 + MAX_SIG)        // header fields
#define HDR_BYTES (XHDR * sizeof(int64_t))
#define SMALL_MAX ((size_t)64 << 10) // slots hold this much payload, whatever the env
#define SMALL_MAX_RANKS 8         // more ranks: the MPI_Allreduce check (log N rounds)
#define X_TAG 0x5a11              // no other message of the core uses it

static const char *const colls[] = {"?", "allreduce", "reduce_scatter", "allgather",
                                    "broadcast"};

static int64_t coll_code(const char *what) {
    for (int i = 1; i < (int)(sizeof colls / sizeof *colls); i++)
        if (what && !strcmp(what, colls[i])) return i;
    return 0;
}

const char *hpcdl_coll_name(int64_t code) {
    return code > 0 && code < (int64_t)(sizeof colls / sizeof *colls) ? colls[code] : "?";
}

// ----------------------------------------------------------------------------
// when it applies (every answer is the same on every rank of a team)

// Local call: the inline limit, HPCDL_SMALL_BYTES (0 turns inlining off);
// ranks that disagree on it fail on the header's "inline bytes".
size_t hpcdl_small_bytes(void) {
    static size_t v = (size_t)-1;
    if (v == (size_t)-1) {
        const char *e = getenv("HPCDL_SMALL_BYTES");
        size_t x = e && *e ? (size_t)strtoull(e, NULL, 10) : (size_t)8 << 10;
        v = x < SMALL_MAX ? x : SMALL_MAX;
    }
    return v;
}

// Local call: 1 when t's agreement check is the exchange. One node checks
// in shared memory instead (agree.c); large teams use MPI's log N rounds.
int hpcdl_exchange_applies(const hpcdl_team *t) {
    int shm_check = t->shm && t->cross_size == 1 && t->local_size <= 64;
    return !shm_check && t->size > 1 && t->size <= SMALL_MAX_RANKS;
}

// ----------------------------------------------------------------------------
// the exchange, in two steps like MPI's own small all-reduce on two levels:
//
//   step 1 (node, shared-memory transport): every rank sends its entry to
//          the node's other ranks, so each holds the node's L entries
//   step 2 (network): every rank sends the node's bundle of L entries to the
//          ranks with its local rank on the other nodes (one message each)
//
// entry = [world rank | record bytes | record]. One network latency and
// cross_size - 1 network messages per rank (a flat exchange sends N - 1).
// Nodes of unequal size: step 2 alone, over all ranks, one entry a bundle.

#define ENTRY (2 * sizeof(int64_t) + HDR_BYTES + SMALL_MAX) // an entry's room

// t->xbuf: N record slots by world rank, then the node's entries by local
// rank, then the bundle this rank sends, then one received bundle per node.
static char *slot(const hpcdl_team *t, int r) {
    return (char *)t->xbuf + (HDR_BYTES + SMALL_MAX) * (size_t)r;
}

// HPCDL_SMALL_FLAT=1: one step over all ranks even on equal nodes (to compare).
static int two_level(const hpcdl_team *t) {
    static int flat = -1;
    if (flat < 0) {
        const char *e = getenv("HPCDL_SMALL_FLAT");
        flat = e && !strcmp(e, "1");
    }
    return t->uniform && t->local_size > 1 && !flat;
}

static int xbuf_alloc(hpcdl_team *t) {
    if (t->xbuf) return HPCDL_OK;
    size_t L = two_level(t) ? (size_t)t->local_size : 1, N = (size_t)t->size;
    t->xbuf = malloc((HDR_BYTES + SMALL_MAX) * N + ENTRY * (L + L + N));
    if (!t->xbuf) return hpcdl_fail(HPCDL_ERR_NOMEM, "agreement check: out of memory");
    return HPCDL_OK;
}

static char *area(const hpcdl_team *t, size_t entry) { // entry-sized room number `entry`
    return slot(t, t->size) + ENTRY * entry;
}

// Waits for all n requests by the team's policy (hpcdl_team_wait: tests,
// yields, then sleeps, so a rank waiting here for a stalled peer across
// nodes leaves its core; MPI_Waitall spun it at ~50% of a core, issue 38);
// st[i] gets each status.
static int wait_all(const hpcdl_team *t, MPI_Request *rq, MPI_Status *st, int n) {
    for (int i = 0; i < n; i++) MPI_CHECK(hpcdl_team_wait_status(t, &rq[i], &st[i]));
    return HPCDL_OK;
}

// Collective over comm (size n, this rank me): sends `len` bytes of out to
// every other rank, receives rank j's (at most cap bytes) at in + j * cap;
// got[j] = bytes received (got[me] = len).
static int swap(const hpcdl_team *t, MPI_Comm comm, int n, int me, const char *out, int len,
                char *in, int cap, int *got) {
    MPI_Request rq[2 * SMALL_MAX_RANKS];
    MPI_Status st[2 * SMALL_MAX_RANKS];
    int k = 0;
    for (int j = 0; j < n; j++)
        if (j != me)
            MPI_CHECK(MPI_Irecv(in + (size_t)j * (size_t)cap, cap, MPI_BYTE, j, X_TAG, comm,
                                &rq[k++]));
    for (int j = 0; j < n; j++)
        if (j != me) MPI_CHECK(MPI_Isend(out, len, MPI_BYTE, j, X_TAG, comm, &rq[k++]));
    HPCDL_TRY(wait_all(t, rq, st, k));
    for (int j = 0, i = 0; j < n; j++) {
        got[j] = len;
        if (j != me) MPI_CHECK(MPI_Get_count(&st[i++], MPI_BYTE, &got[j]));
    }
    return HPCDL_OK;
}

// Local call: the entries of one bundle (nbytes) into the record slots.
static int unpack(const hpcdl_team *t, const char *b, size_t nbytes, int *lens) {
    for (size_t off = 0; off + 2 * sizeof(int64_t) <= nbytes;) {
        int64_t hd[2];
        memcpy(hd, b + off, sizeof hd);
        off += sizeof hd;
        if (hd[0] < 0 || hd[0] >= t->size || hd[1] < 0 || hd[1] > (int64_t)(HDR_BYTES + SMALL_MAX) ||
            off + (size_t)hd[1] > nbytes)
            return hpcdl_fail(HPCDL_ERR_MPI, "agreement check: a malformed record arrived. "
                              "Hint: every rank must run the same hpcdl build.");
        memcpy(slot(t, (int)hd[0]), b + off, (size_t)hd[1]);
        lens[hd[0]] = (int)hd[1];
        off += (size_t)hd[1];
    }
    return HPCDL_OK;
}

// Collective over t: this rank's record (len bytes, in its own slot) to every
// rank; afterwards every slot holds its rank's record, lens[r] its bytes.
static int exchange(hpcdl_team *t, size_t len, int *lens) {
    int two = two_level(t), L = two ? t->local_size : 1, got[SMALL_MAX_RANKS];
    char *mine = area(t, 0), *send = area(t, (size_t)L), *in = area(t, 2 * (size_t)L);
    int64_t hd[2] = {t->rank, (int64_t)len};
    memcpy(mine + (size_t)t->local_rank * ENTRY * two, hd, sizeof hd);
    memcpy(mine + (size_t)t->local_rank * ENTRY * two + sizeof hd, slot(t, t->rank), len);
    size_t elen = sizeof hd + len, blen = 0;
    if (two) // step 1: the node's entries
        HPCDL_TRY(swap(t, t->local, L, t->local_rank, mine + (size_t)t->local_rank * ENTRY,
                       (int)elen, mine, (int)ENTRY, got));
    else
        got[0] = (int)elen;
    for (int j = 0; j < L; j++) { // the bundle: the node's entries back to back
        memcpy(send + blen, mine + (size_t)j * ENTRY, (size_t)got[j]);
        blen += (size_t)got[j];
    }
    MPI_Comm comm = two ? t->cross : t->world;
    int n = two ? t->cross_size : t->size, me = two ? t->cross_rank : t->rank;
    for (int r = 0; r < t->size; r++) lens[r] = -1;
    HPCDL_TRY(swap(t, comm, n, me, send, (int)blen, in, (int)ENTRY * L, got)); // step 2
    for (int j = 0; j < n; j++)
        HPCDL_TRY(unpack(t, j == me ? send : in + (size_t)j * ENTRY * (size_t)L, (size_t)got[j],
                         lens));
    for (int r = 0; r < t->size; r++)
        if (lens[r] < 0)
            return hpcdl_fail(HPCDL_ERR_MPI, "agreement check: no record from rank %d. "
                              "Hint: every rank must run the same hpcdl build.", r);
    return HPCDL_OK;
}

// Local call on the exchanged slots: HPCDL_OK when every header is the same,
// else the mismatch message (the same on every rank, from the same records).
static int verdict(const hpcdl_team *t, const char *what, const int *lens,
                   const char *const *names, int nsig) {
    int64_t all[XHDR * SMALL_MAX_RANKS];
    for (int r = 0; r < t->size; r++) {
        int64_t *h = all + (size_t)r * XHDR;
        memset(h, 0, HDR_BYTES);
        if (lens[r] >= (int)HDR_BYTES) memcpy(h, slot(t, r), HDR_BYTES);
        // a record whose length is not its header's: count it as its own value
        if ((size_t)lens[r] != HDR_BYTES + (size_t)h[X_INLINE]) h[X_INLINE] = -1 - lens[r];
    }
    int bad = -1;
    for (int i = 0; i < XHDR && bad < 0; i++)
        for (int r = 1; r < t->size; r++)
            if (all[(size_t)r * XHDR + (size_t)i] != all[i]) bad = i;
    if (bad < 0) return HPCDL_OK;
    const char *fields[XHDR];
    fields[X_COLL] = "collective";
    for (int i = 0; i < MAX_SIG; i++) fields[1 + i] = i < nsig ? names[i] : "x";
    fields[X_INLINE] = "inline bytes (HPCDL_SMALL_BYTES)";
    return hpcdl_agree_mismatch(t, what, all, XHDR, bad, fields);
}

// Collective over t (when hpcdl_exchange_applies): the agreement check, with
// pbytes (<= hpcdl_small_bytes()) of payload carried along. Preconditions
// across ranks: none beyond calling it at the same point; that the headers
// agree is what it checks. On HPCDL_OK, hpcdl_exchange_payload(t, r) is rank
// r's payload until the team's next exchange.
int hpcdl_exchange_agree(hpcdl_team *t, const char *what, const int64_t *sig, int nsig,
                         const char *const *names, const void *payload, size_t pbytes) {
    int lens[SMALL_MAX_RANKS];
    HPCDL_TRY(xbuf_alloc(t));
    int64_t *h = (int64_t *)slot(t, t->rank);
    memset(h, 0, HDR_BYTES);
    h[X_COLL] = coll_code(what);
    memcpy(h + 1, sig, sizeof(int64_t) * (size_t)(nsig < MAX_SIG ? nsig : MAX_SIG));
    h[X_INLINE] = (int64_t)pbytes;
    if (pbytes) memcpy((char *)h + HDR_BYTES, payload, pbytes); // send may be recv
    HPCDL_TRY(exchange(t, HDR_BYTES + pbytes, lens));
    return verdict(t, what, lens, names, nsig);
}

// ----------------------------------------------------------------------------
// the inline all-reduce

// Local call after hpcdl_exchange_agree carried count elements from every
// rank: recv = x0 op x1 op ... op x(N-1), in rank order on every rank.
int hpcdl_small_allreduce(hpcdl_team *t, void *recv, size_t count, hpcdl_dtype dtype,
                          hpcdl_op op) {
    size_t bytes = count * hpcdl_dtype_size(dtype);
    if (!bytes) return HPCDL_OK;
    memcpy(recv, slot(t, 0) + HDR_BYTES, bytes);
    for (int r = 1; r < t->size; r++)
        hpcdl_reduce_local(recv, recv, slot(t, r) + HDR_BYTES, count, dtype, op);
    if (op == HPCDL_AVERAGE) hpcdl_divide_local(recv, count, dtype, t->size);
    return HPCDL_OK;
}
