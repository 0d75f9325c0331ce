/*
 * proto.c — a protocol plug-in's C half, run by the data plane.
 *
 * Theory of operation (the plug-in's side: proto.h).  Python's worker loads
 * the plug-in UCXPY_PROTO_PLUGIN names; when that plug-in has a C half
 * (Protocol.native), it hands its table to the worker here with the sizes
 * it runs (ucxdp_proto_set).  From then on:
 *
 *  - a C caller's send of those sizes (libucp's ucp_tag_send_nbx above its
 *    eager limit, which offers through ucxdp_rndv_send) goes to the C half's
 *    `send` in place of the stock offer, and waits in the worker's sends as
 *    a stock offer does: the C half ends it (send_done), a failed peer
 *    fails it (ucxdp_rndv_fail_peer);
 *  - every plug-in frame (wire.PLUGIN) the inbox meets goes to the C half's
 *    `frame` first (ucxdp_proto_take_frame), and so does one that Python's
 *    path read (ucxdp_proto_frame: a connection the inbox does not read yet);
 *    what it leaves stays Python's, in order;
 *  - what it could not push for want of room it pushes from `progress`,
 *    which the inbox's dispatch runs first on every pass while owed.
 *
 * All of it under the worker's lock, which the C half never takes.
 */
#include <string.h>

#include "dp.h"
#include "proto.h"
#include "ucxpy_native.h"


#define PROTO_HEADER_MAX 255               /* the kind byte, then up to this */

struct ucxdp_proto_ctx {
    ucxdp_worker_t *w;
    ucxdp_inbox_t *in;                     /* the inbox (wake-ups, lanes back), or NULL */
    int wake;                              /* a push on a given lane found its peer asleep */
};

static const ucxdp_lane_t *lane_for(ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane,
                                    uint64_t conn)
{
    const ucxdp_conn_t *c;

    if (lane != NULL || ctx->in == NULL)
        return lane;
    c = ucxdp_inbox_conn(ctx->in, conn);
    return c != NULL ? c->lane : NULL;
}

static ucxdp_status_t api_push(ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane, uint64_t conn,
                               uint8_t kind, const void *header, size_t header_length,
                               const void *payload, size_t length)
{
    uint8_t hdr[1 + PROTO_HEADER_MAX];
    int rc;

    lane = lane_for(ctx, lane, conn);
    if (lane == NULL || !lane->open || lane->dead || header_length > PROTO_HEADER_MAX
            || length > lane->max_frame)
        return UCXDP_ERR_NO_RESOURCE;
    hdr[0] = kind;
    if (header_length != 0)
        memcpy(hdr + 1, header, header_length);
    rc = ucxpy_ring_push(lane->ring, ctx->w->proto_am_id, hdr, 1 + header_length, payload,
                         length);
    if (rc < 0)
        return UCXDP_ERR_NO_RESOURCE;
    if (rc == UCXPY_RING_NOTIFY) {
        if (conn != 0 && ctx->in != NULL)
            ucxdp_inbox_peer_wake(ctx->in, conn);
        else
            ctx->wake = 1;
    }
    return UCXDP_OK;
}

static uint64_t api_max_payload(ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane, uint64_t conn)
{
    lane = lane_for(ctx, lane, conn);
    return lane != NULL && !lane->dead ? lane->max_frame : 0;
}

static ucxdp_rndv_send_t *api_find_send(ucxdp_proto_ctx_t *ctx, uint64_t id)
{
    return ucxdp_rndv_find_locked(ctx->w, id);
}

static void api_send_done(ucxdp_proto_ctx_t *ctx, ucxdp_rndv_send_t *s, ucxdp_status_t status)
{
    ucxdp_list_remove(&s->link);
    s->status = status;
    ucxdp_list_append(&ctx->w->sends_done, &s->link);
}

static ucxdp_tag_recv_t *api_match(ucxdp_proto_ctx_t *ctx, int64_t source, uint64_t tag,
                                   uint64_t length)
{
    ucxdp_tag_recv_t *r = ucxdp_tag_peek_ext(ctx->w, source, tag, length);

    if (r != NULL)                         /* (else the Python half's: unexpected, ...) */
        ucxdp_match_arrived(&ctx->w->matcher, source, tag);    /* (r, out of the matcher) */
    return r;
}

static void api_recv_done(ucxdp_proto_ctx_t *ctx, ucxdp_tag_recv_t *r, ucxdp_status_t status,
                          int64_t source, uint64_t tag, uint64_t length)
{
    r->info_source = source;
    r->info_tag = tag;
    r->info_length = length;
    r->handoff = NULL;
    r->status = status;
    ucxdp_tag_done_locked(ctx->w, r);
    UCXDP_COUNT(ctx->w, proto_recv, 1);
}

static const ucxdp_proto_api_t api = {
    .abi = UCXDP_PROTO_ABI,
    .push = api_push,
    .max_payload = api_max_payload,
    .find_send = api_find_send,
    .send_done = api_send_done,
    .match = api_match,
    .recv_done = api_recv_done,
};

ucxdp_status_t ucxdp_proto_set(ucxdp_worker_t *w, const ucxdp_proto_ops_t *ops, uint64_t param,
                               unsigned am_id, const uint64_t (*ranges)[2], int n)
{
    void *self = NULL, *old;
    const ucxdp_proto_ops_t *old_ops;

    if (ops != NULL) {
        if (ops->abi != UCXDP_PROTO_ABI || n < 1
                || n > (int)(sizeof w->proto_sizes / sizeof w->proto_sizes[0]) || am_id == 0)
            return UCXDP_ERR_INVALID_PARAM;
        self = ops->create(&api, param);
        if (self == NULL)
            return UCXDP_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&w->lock);
    old_ops = w->proto_ops;
    old = w->proto;
    w->proto_ops = ops;
    w->proto = self;
    w->proto_am_id = am_id;
    for (int i = 0; i < n && ops != NULL; i++) {
        w->proto_sizes[i][0] = ranges[i][0];
        w->proto_sizes[i][1] = ranges[i][1];
    }
    w->nproto_sizes = ops != NULL ? n : 0;
    __atomic_store_n(&w->proto_owed, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->lock);
    if (old != NULL)
        old_ops->destroy(old);
    return UCXDP_OK;
}

int ucxdp_proto_covers(const ucxdp_worker_t *w, uint64_t length)
{
    for (int i = 0; i < w->nproto_sizes; i++)
        if (length >= w->proto_sizes[i][0] && length <= w->proto_sizes[i][1])
            return 1;
    return 0;
}

ucxdp_status_t ucxdp_proto_send_locked(ucxdp_worker_t *w, const ucxdp_lane_t *lane,
                                       ucxdp_rndv_send_t *s, uint64_t tag, int *wake)
{
    ucxdp_proto_ctx_t ctx = {.w = w, .in = w->inbox, .wake = 0};
    ucxdp_status_t st;

    *wake = 0;
    if (!lane->open || lane->dead)
        return UCXDP_ERR_NO_RESOURCE;
    s->status = UCXDP_INPROGRESS;
    ucxdp_list_append(&w->sends, &s->link);        /* (before its first frame can be answered) */
    st = w->proto_ops->send(w->proto, &ctx, lane, s, tag);
    if (st != UCXDP_OK) {
        ucxdp_list_remove(&s->link);
        return UCXDP_ERR_NO_RESOURCE;      /* (whatever it said: the caller's path sends) */
    }
    *wake = ctx.wake;
    __atomic_store_n(&w->proto_owed, 1, __ATOMIC_RELAXED);
    UCXDP_COUNT(w, proto_send, 1);
    return UCXDP_OK;
}

/* the C half's `frame` on one frame; the lock held */
static int offer_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                       const uint8_t *hdr, size_t hlen, const uint8_t *payload, size_t plen)
{
    ucxdp_proto_ctx_t ctx = {.w = w, .in = in, .wake = 0};

    if (hlen < 1 || !w->proto_ops->frame(w->proto, &ctx, c, hdr[0], hdr + 1, hlen - 1, payload,
                                         plen))
        return 0;
    __atomic_store_n(&w->proto_owed, 1, __ATOMIC_RELAXED);
    UCXDP_COUNT(w, proto_frame, 1);
    return 1;
}

int ucxdp_proto_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                           const uint64_t *out, int *wake)
{
    *wake = 0;
    if (w->proto == NULL || out[0] != w->proto_am_id || c == NULL)
        return 0;
    if (!offer_frame(w, in, c, in->ring->data + out[1], out[2], in->ring->data + out[3], out[4]))
        return 0;
    *wake = ucxpy_ring_release(in->ring) == UCXPY_RING_NOTIFY;
    return 1;
}

int ucxdp_proto_frame(ucxdp_worker_t *w, uint64_t conn, const uint8_t *header,
                      size_t header_length, const uint8_t *payload, size_t length)
{
    ucxdp_conn_t unknown = {.conn = conn, .source = -1, .lane = NULL};
    const ucxdp_conn_t *c = NULL;
    int taken = 0;

    pthread_mutex_lock(&w->lock);
    if (w->proto != NULL) {
        if (w->inbox != NULL)
            c = ucxdp_inbox_conn(w->inbox, conn);
        taken = offer_frame(w, w->inbox, c != NULL ? c : &unknown, header, header_length,
                            payload, length);
    }
    pthread_mutex_unlock(&w->lock);
    return taken;
}

void ucxdp_proto_progress(ucxdp_worker_t *w, ucxdp_inbox_t *in)
{
    ucxdp_proto_ctx_t ctx = {.w = w, .in = in, .wake = 0};

    pthread_mutex_lock(&w->lock);
    if (w->proto != NULL)
        __atomic_store_n(&w->proto_owed, (uint32_t)w->proto_ops->progress(w->proto, &ctx),
                         __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->lock);
}

void ucxdp_proto_fail_peer_locked(ucxdp_worker_t *w, int64_t peer)
{
    ucxdp_proto_ctx_t ctx = {.w = w, .in = w->inbox, .wake = 0};

    w->proto_ops->fail_peer(w->proto, &ctx, peer);
}
