/*
 * inbox.c — the shm inbox's eager messages, consumed and matched in C.
 *
 * Theory of operation.  A process's shm inbox is one ring (native/ring.c)
 * that all its same-host peers push frames into; each frame carries its
 * connection's id.  The transport owns the ring and knows bytes only; the
 * data plane consumes from it the frames whose protocol it runs: eager
 * messages (`eager_am_id`, an 8-byte little-endian tag as the header, the
 * payload as the message) of connections Python registered, which tag.c
 * matches and delivers (and rndv.c's rendezvous frames, am.c's active
 * messages for C handlers, proto.c's plug-in frames).  It stops, leaving
 * the frame in the ring, at the first frame that is anything else (another protocol, a connection not
 * registered, a close record, a message of a size the caller's protocol runs:
 * the protocol table's "Python" entries): the caller's Python path takes
 * that one, and then calls again.  So every connection's frames are handled
 * in order, by whichever side, and MPI's order holds.
 *
 * A blocking receive that nothing posted or queued could take from it
 * (Worker.tag_try_recv checks that) reads the next frame straight into its
 * buffer when it is that message (ucxdp_inbox_try_recv): no request, no
 * matcher.
 *
 * The connection table is open addressing on the 64-bit connection id (ids
 * are random and never 0), with backward-shift deletion; it doubles when
 * half full.
 */
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "ucxpy_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "an eager frame's tag is little-endian (ucxpy.wire.EAGER): it is read as is"
#endif

#define CONNS_MIN 16

static inline size_t conn_slot(uint64_t conn, size_t cap)
{
    uint64_t h = conn * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32) & (cap - 1);
}

ucxdp_status_t ucxdp_inbox_init(ucxdp_inbox_t *in, struct ucxpy_ring *ring, unsigned eager_am_id)
{
    in->conns = calloc(CONNS_MIN, sizeof(*in->conns));
    if (in->conns == NULL)
        return UCXDP_ERR_NO_MEMORY;
    in->ring = ring;
    in->eager_am_id = eager_am_id;
    in->cap = CONNS_MIN;
    in->nconns = 0;
    in->nhanded = 0;
    in->owed_wake = in->py_busy = 0;
    in->rts_am_id = in->ats_am_id = 0;
    in->rndv_max = 0;
    in->nowed = in->nwake = in->wake_all = in->stopped = 0;
    return UCXDP_OK;
}

void ucxdp_inbox_cleanup(ucxdp_inbox_t *in)
{
    free(in->conns);
    in->conns = NULL;
    in->cap = in->nconns = 0;
}

static ucxdp_conn_t *conn_find(const ucxdp_inbox_t *in, uint64_t conn)
{
    size_t i = conn_slot(conn, in->cap);

    while (in->conns[i].conn != 0) {
        if (in->conns[i].conn == conn)
            return &in->conns[i];
        i = (i + 1) & (in->cap - 1);
    }
    return NULL;
}

ucxdp_conn_t *ucxdp_inbox_conn(const ucxdp_inbox_t *in, uint64_t conn)
{
    return conn == 0 || in->cap == 0 ? NULL : conn_find(in, conn);
}

static void conn_put(ucxdp_conn_t *table, size_t cap, const ucxdp_conn_t *entry)
{
    size_t i = conn_slot(entry->conn, cap);

    while (table[i].conn != 0 && table[i].conn != entry->conn)
        i = (i + 1) & (cap - 1);
    table[i] = *entry;
}

ucxdp_status_t ucxdp_inbox_add_conn(ucxdp_inbox_t *in, uint64_t conn, int64_t source)
{
    ucxdp_conn_t *c, entry = {.conn = conn, .source = source, .lane = NULL};

    if (conn == 0)
        return UCXDP_ERR_INVALID_PARAM;
    c = conn_find(in, conn);
    if (c != NULL) {
        c->source = source;
        return UCXDP_OK;
    }
    if (2 * (in->nconns + 1) > in->cap) {
        size_t cap = in->cap * 2;
        ucxdp_conn_t *table = calloc(cap, sizeof(*table));
        if (table == NULL)
            return UCXDP_ERR_NO_MEMORY;
        for (size_t i = 0; i < in->cap; i++)
            if (in->conns[i].conn != 0)
                conn_put(table, cap, &in->conns[i]);
        free(in->conns);
        in->conns = table;
        in->cap = cap;
    }
    conn_put(in->conns, in->cap, &entry);
    in->nconns++;
    return UCXDP_OK;
}

void ucxdp_inbox_forget_conn(ucxdp_inbox_t *in, uint64_t conn)
{
    ucxdp_conn_t *c = conn == 0 ? NULL : conn_find(in, conn);
    size_t i, j, home;

    if (c == NULL)
        return;
    ucxdp_inbox_set_lane(in, conn, NULL);  /* (its owed answers go: the peer is gone) */
    /* backward-shift deletion: later entries of the same probe run move up */
    i = (size_t)(c - in->conns);
    for (j = (i + 1) & (in->cap - 1); in->conns[j].conn != 0; j = (j + 1) & (in->cap - 1)) {
        home = conn_slot(in->conns[j].conn, in->cap);
        /* j's entry may fill the hole at i when its home is not in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            in->conns[i] = in->conns[j];
            i = j;
        }
    }
    in->conns[i].conn = 0;
    in->nconns--;
}

ucxdp_status_t ucxdp_inbox_hand_sizes(ucxdp_inbox_t *in, const uint64_t (*ranges)[2], int n)
{
    if (n < 0 || n > UCXDP_INBOX_RANGES)
        return UCXDP_ERR_INVALID_PARAM;
    for (int i = 0; i < n; i++) {
        in->handed[i][0] = ranges[i][0];
        in->handed[i][1] = ranges[i][1];
    }
    in->nhanded = n;
    return UCXDP_OK;
}

void ucxdp_inbox_rndv(ucxdp_inbox_t *in, unsigned rts_am_id, unsigned ats_am_id,
                      uint64_t rndv_max)
{
    in->rts_am_id = rts_am_id;
    in->ats_am_id = ats_am_id;
    in->rndv_max = rndv_max;
}

void ucxdp_inbox_set_lane(ucxdp_inbox_t *in, uint64_t conn, struct ucxdp_lane *lane)
{
    ucxdp_conn_t *c = conn == 0 ? NULL : conn_find(in, conn);
    int k = 0;

    if (c != NULL)
        c->lane = lane;
    /* answers owed on the connection's old lane go by the new one, or not
     * at all when it has none */
    for (int i = 0; i < in->nowed; i++) {
        if (in->owed[i].conn == conn) {
            if (lane == NULL)
                continue;
            in->owed[i].lane = lane;
        }
        in->owed[k++] = in->owed[i];
    }
    in->nowed = k;
}

/* the frame ucxpy_ring_peek described in `out` is an eager message dispatch
 * takes (of a registered connection, not of a size the caller's protocol runs) */
static inline int eager_frame(const ucxdp_inbox_t *in, const uint64_t *out)
{
    return out[0] == in->eager_am_id && out[2] == sizeof(uint64_t)
        && !ucxdp_inbox_handed(in, out[4]);
}

long ucxdp_inbox_dispatch(ucxdp_worker_t *w, ucxdp_inbox_t *in, long limit, int spins,
                          int *wake, int *bad)
{
    ucxpy_ring_t *ring = in->ring;
    uint64_t out[UCXPY_RING_PEEK_OUT], tag;
    const ucxdp_conn_t *c;
    long count = 0;
    int rc, rwake;

    *wake = *bad = 0;
    in->stopped = 0;
    if (__atomic_load_n(&in->nowed, __ATOMIC_RELAXED) != 0) {
        pthread_mutex_lock(&w->lock);
        ucxdp_rndv_push_owed(w, in);
        pthread_mutex_unlock(&w->lock);
    }
    if (__atomic_load_n(&w->proto_owed, __ATOMIC_RELAXED))
        ucxdp_proto_progress(w, in);       /* (a plug-in's frames waiting for room) */
    rc = ucxpy_ring_peek(ring, out);
    while (rc == 0 && spins-- > 0) {
        ucxpy_cpu_relax();
        rc = ucxpy_ring_peek(ring, out);
    }
    if (rc != 1) {
        *bad = rc < 0;
        return 0;
    }
    pthread_mutex_lock(&w->lock);
    while (count < limit) {
        c = conn_find(in, out[5]);         /* (one lookup: eager or rendezvous frame) */
        if (c != NULL && eager_frame(in, out)) {
            memcpy(&tag, ring->data + out[1], sizeof tag);
            if (ucxdp_tag_eager_locked(w, c->source, tag, ring->data + out[3], out[4])
                    != UCXDP_OK) {
                in->stopped = 1;           /* (no memory: the caller's path tries and reports) */
                break;
            }
            if (ucxpy_ring_release(ring) == UCXPY_RING_NOTIFY)
                *wake = 1;
        } else if (ucxdp_rndv_take_frame(w, in, c, out, &rwake)
                   || ucxdp_am_take_frame(w, in, c, out, &rwake)
                   || ucxdp_proto_take_frame(w, in, c, out, &rwake)) {
            *wake |= rwake;
        } else {
            in->stopped = 1;
            break;
        }
        count++;
        rc = ucxpy_ring_peek(ring, out);
        if (rc != 1) {
            *bad = rc < 0;
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return count;
}

long ucxdp_inbox_progress(ucxdp_worker_t *w, ucxdp_inbox_t *in, long limit, unsigned *flags)
{
    int wake, bad;
    long n = ucxdp_inbox_dispatch(w, in, limit, 0, &wake, &bad);

    *flags = 0;
    if (wake)
        __atomic_store_n(&in->owed_wake, 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&in->owed_wake, __ATOMIC_RELAXED))
        *flags |= UCXDP_INBOX_WAKE;        /* (and peers an answer went to: peer_wake) */
    if (bad)
        *flags |= UCXDP_INBOX_BAD;
    else if ((n < limit && in->stopped) || __atomic_load_n(&w->py_done, __ATOMIC_RELAXED))
        *flags |= UCXDP_INBOX_LEFT;        /* (or a receive of Python's matched: its pass
                                              delivers it, tag.c) */
    if (__atomic_load_n(&in->py_busy, __ATOMIC_RELAXED))
        *flags |= UCXDP_INBOX_BUSY;
    return n;
}

int64_t ucxdp_inbox_try_recv(ucxdp_worker_t *w, ucxdp_inbox_t *in, uint64_t conn, uint64_t tag,
                             uint64_t mask, void *buffer, uint64_t capacity, int spins,
                             uint64_t *got, int *wake)
{
    ucxpy_ring_t *ring = in->ring;
    uint64_t out[UCXPY_RING_PEEK_OUT], t;
    int rc;

    *wake = 0;
    for (;;) {
        rc = ucxpy_ring_peek(ring, out);
        if (rc > 0)
            break;
        if (rc < 0 || spins-- <= 0)
            return -1;
        ucxpy_cpu_relax();
    }
    if (rc != 1 || out[5] != conn || out[0] != in->eager_am_id || out[2] != sizeof t
            || out[4] > capacity || conn_find(in, conn) == NULL
            || ucxdp_inbox_handed(in, out[4]))
        return -2;
    memcpy(&t, ring->data + out[1], sizeof t);
    if ((t ^ tag) & mask)
        return -2;
    *got = t;
    memcpy(buffer, ring->data + out[3], out[4]);
    *wake = ucxpy_ring_release(ring) == UCXPY_RING_NOTIFY;
    UCXDP_COUNT(w, tag_eager, 1);
    UCXDP_COUNT(w, tag_direct, 1);
    return (int64_t)out[4];
}
