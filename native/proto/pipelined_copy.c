/*
 * pipelined_copy.c — the C half of the shipped protocol plug-in
 * "pipelined-copy" (its Python half and reference: ucxpy/protocols.py,
 * PipelinedCopy), built as the cffi module ucxpy._proto_pipelined.
 *
 * Theory of operation.  The protocol is a rendezvous through the inbox:
 *
 *     sender                             receiver
 *     OFFER (tag, send id, size) ──────>  matched (by the data plane)
 *            <────── CTS (send id, receive id; 0: takes nothing)
 *     FRAG (receive id, offset) + bytes ─> copied into the receive; the last
 *     ... as many as the ring takes;        one ends it
 *     the send ends once the last is pushed
 *
 * This half runs the messages of C callers (proto.h says how the work is
 * shared with the Python half, by ids): a send of a C caller (its id has
 * UCXDP_RNDV_EXT_ID), an offer whose receive is a C caller's, and the CTS
 * and fragments addressed to those ids.  Fragments the ring has no room for
 * are owed and pushed by `progress`; fragments of a send go to the peer by
 * our lane back to the connection its CTS came on.  The frames, their
 * layout and their sizes' choice are the Python half's, byte for byte, so
 * either half may start a message and the other end it.
 */
#include <stdlib.h>
#include <string.h>

#include "proto.h"

enum { OFFER = 1, CTS = 2, FRAG = 3 };

/* what this half owes: a CTS the ring had no room for, or a send's fragments */
typedef struct {
    ucxdp_link_t link;
    ucxdp_rndv_send_t *send;               /* NULL: a CTS */
    uint64_t conn;                         /* the connection whose peer the frames go to */
    int64_t peer;
    uint64_t send_id, recv_id;
    uint64_t offset;                       /* a send's: the next byte to push */
} owed_t;

/* a C caller's receive this half fills */
typedef struct {
    ucxdp_link_t link;
    ucxdp_tag_recv_t *r;
    uint64_t id;
    int64_t source;
    uint64_t tag, size, got;
} recv_t;

typedef struct {
    const ucxdp_proto_api_t *api;
    uint64_t frag;                         /* UCXPY_PIPELINED_FRAG */
    uint64_t ids;
    ucxdp_link_t owed, recvs;
} pc_t;

static void *pc_create(const ucxdp_proto_api_t *api, uint64_t param)
{
    pc_t *pc = calloc(1, sizeof(*pc));

    if (pc == NULL)
        return NULL;
    pc->api = api;
    pc->frag = param != 0 ? param : 16384;
    ucxdp_list_init(&pc->owed);
    ucxdp_list_init(&pc->recvs);
    return pc;
}

static void free_all(ucxdp_link_t *head, size_t offset)
{
    while (!ucxdp_list_empty(head)) {
        ucxdp_link_t *l = head->next;
        ucxdp_list_remove(l);
        free((char *)l - offset);
    }
}

static void pc_destroy(void *self)
{
    pc_t *pc = self;

    free_all(&pc->owed, offsetof(owed_t, link));
    free_all(&pc->recvs, offsetof(recv_t, link));
    free(pc);
}

static ucxdp_status_t push_cts(pc_t *pc, ucxdp_proto_ctx_t *ctx, uint64_t conn,
                               uint64_t send_id, uint64_t recv_id)
{
    uint64_t hdr[2] = {send_id, recv_id};
    return pc->api->push(ctx, NULL, conn, CTS, hdr, sizeof hdr, NULL, 0);
}

/* Push a send's fragments while the ring takes them: 1 when all are pushed
 * (the send is ended), 0 when some are still owed. */
static int push_frags(pc_t *pc, ucxdp_proto_ctx_t *ctx, owed_t *o)
{
    ucxdp_rndv_send_t *s = o->send;
    uint64_t frag = pc->api->max_payload(ctx, NULL, o->conn), hdr[2];

    if (frag > pc->frag)
        frag = pc->frag;
    while (frag != 0 && o->offset < s->length) {
        uint64_t n = s->length - o->offset < frag ? s->length - o->offset : frag;
        hdr[0] = o->recv_id;
        hdr[1] = o->offset;
        if (pc->api->push(ctx, NULL, o->conn, FRAG, hdr, sizeof hdr,
                          (const char *)s->buffer + o->offset, n) != UCXDP_OK)
            break;
        o->offset += n;
    }
    if (o->offset < s->length)
        return 0;
    pc->api->send_done(ctx, s, UCXDP_OK);
    return 1;
}

static ucxdp_status_t pc_send(void *self, ucxdp_proto_ctx_t *ctx, const ucxdp_lane_t *lane,
                              ucxdp_rndv_send_t *s, uint64_t tag)
{
    pc_t *pc = self;
    uint64_t hdr[3] = {tag, s->id, s->length};

    return pc->api->push(ctx, lane, 0, OFFER, hdr, sizeof hdr, NULL, 0);
}

static owed_t *owe(pc_t *pc, ucxdp_rndv_send_t *s, uint64_t conn, int64_t peer,
                   uint64_t send_id, uint64_t recv_id)
{
    owed_t *o = calloc(1, sizeof(*o));

    if (o == NULL)
        return NULL;
    o->send = s;
    o->conn = conn;
    o->peer = peer;
    o->send_id = send_id;
    o->recv_id = recv_id;
    ucxdp_list_append(&pc->owed, &o->link);
    return o;
}

static int on_offer(pc_t *pc, ucxdp_proto_ctx_t *ctx, const ucxdp_conn_t *c, const uint64_t *h)
{
    uint64_t tag = h[0], send_id = h[1], size = h[2], id;
    ucxdp_tag_recv_t *r;
    recv_t *rv;

    if (c->conn == 0 || pc->api->max_payload(ctx, NULL, c->conn) == 0)
        return 0;                          /* (no lane back: the Python half answers) */
    rv = calloc(1, sizeof(*rv));
    if (rv == NULL)
        return 0;
    r = pc->api->match(ctx, c->source, tag, size);
    if (r == NULL) {
        free(rv);
        return 0;                          /* (a receive of Python's, unexpected, truncated) */
    }
    id = size == 0 ? 0 : UCXDP_RNDV_EXT_ID | ++pc->ids;
    if (size == 0) {
        free(rv);
        rv = NULL;
        pc->api->recv_done(ctx, r, UCXDP_OK, c->source, tag, 0);
    } else {
        rv->r = r;
        rv->id = id;
        rv->source = c->source;
        rv->tag = tag;
        rv->size = size;
        ucxdp_list_append(&pc->recvs, &rv->link);
    }
    if (push_cts(pc, ctx, c->conn, send_id, id) != UCXDP_OK
            && owe(pc, NULL, c->conn, c->source, send_id, id) == NULL && rv != NULL) {
        /* (no memory to remember the answer: the receive cannot complete) */
        ucxdp_list_remove(&rv->link);
        pc->api->recv_done(ctx, r, UCXDP_ERR_NO_MEMORY, c->source, tag, size);
        free(rv);
    }
    return 1;
}

static int on_cts(pc_t *pc, ucxdp_proto_ctx_t *ctx, const ucxdp_conn_t *c, const uint64_t *h)
{
    ucxdp_rndv_send_t *s;
    owed_t *o;

    if (!(h[0] & UCXDP_RNDV_EXT_ID))
        return 0;                          /* (the Python half's send) */
    s = pc->api->find_send(ctx, h[0]);
    if (s == NULL)
        return 1;                          /* (failed meanwhile: nothing waits) */
    if (h[1] == 0 || s->length == 0) {
        pc->api->send_done(ctx, s, UCXDP_OK);
        return 1;
    }
    if (c->conn == 0) {                    /* (no way back to the receiver: never here on shm) */
        pc->api->send_done(ctx, s, UCXDP_ERR_CONNECTION_RESET);
        return 1;
    }
    o = owe(pc, s, c->conn, s->peer, h[0], h[1]);
    if (o == NULL) {
        pc->api->send_done(ctx, s, UCXDP_ERR_NO_MEMORY);
        return 1;
    }
    if (push_frags(pc, ctx, o)) {
        ucxdp_list_remove(&o->link);
        free(o);
    }
    return 1;
}

static int on_frag(pc_t *pc, ucxdp_proto_ctx_t *ctx, const uint64_t *h, const uint8_t *payload,
                   size_t length)
{
    recv_t *rv = NULL;

    if (!(h[0] & UCXDP_RNDV_EXT_ID))
        return 0;                          /* (the Python half's receive) */
    for (ucxdp_link_t *l = pc->recvs.next; l != &pc->recvs; l = l->next)
        if (UCXDP_CONTAINER(l, recv_t, link)->id == h[0]) {
            rv = UCXDP_CONTAINER(l, recv_t, link);
            break;
        }
    if (rv == NULL)
        return 1;                          /* (failed meanwhile) */
    if (h[1] > rv->size || length > rv->size - h[1]) {
        /* (a fragment outside the message: the sender broke the protocol) */
        ucxdp_list_remove(&rv->link);
        pc->api->recv_done(ctx, rv->r, UCXDP_ERR_CONNECTION_RESET, rv->source, rv->tag,
                           rv->size);
        free(rv);
        return 1;
    }
    memcpy((char *)rv->r->buffer + h[1], payload, length);
    rv->got += length;
    if (rv->got >= rv->size) {
        ucxdp_list_remove(&rv->link);
        pc->api->recv_done(ctx, rv->r, UCXDP_OK, rv->source, rv->tag, rv->size);
        free(rv);
    }
    return 1;
}

static int pc_frame(void *self, ucxdp_proto_ctx_t *ctx, const ucxdp_conn_t *c, uint8_t kind,
                    const uint8_t *header, size_t header_length, const uint8_t *payload,
                    size_t length)
{
    uint64_t h[3];

    if (kind == OFFER && header_length == 24) {
        memcpy(h, header, 24);
        return on_offer(self, ctx, c, h);
    }
    if (kind == CTS && header_length == 16) {
        memcpy(h, header, 16);
        return on_cts(self, ctx, c, h);
    }
    if (kind == FRAG && header_length == 16) {
        memcpy(h, header, 16);
        return on_frag(self, ctx, h, payload, length);
    }
    return 0;                              /* (the Python half reports a bad frame) */
}

static int pc_progress(void *self, ucxdp_proto_ctx_t *ctx)
{
    pc_t *pc = self;
    ucxdp_link_t *l, *next;

    for (l = pc->owed.next; l != &pc->owed; l = next) {
        owed_t *o = UCXDP_CONTAINER(l, owed_t, link);
        int done;
        next = l->next;
        if (o->send != NULL)
            done = push_frags(pc, ctx, o);
        else
            done = push_cts(pc, ctx, o->conn, o->send_id, o->recv_id) == UCXDP_OK;
        if (done) {
            ucxdp_list_remove(l);
            free(o);
        }
    }
    return !ucxdp_list_empty(&pc->owed);
}

static void pc_fail_peer(void *self, ucxdp_proto_ctx_t *ctx, int64_t peer)
{
    pc_t *pc = self;
    ucxdp_link_t *l, *next;

    for (l = pc->owed.next; l != &pc->owed; l = next) {
        owed_t *o = UCXDP_CONTAINER(l, owed_t, link);
        next = l->next;
        if (o->peer == peer) {             /* (its send, if any, the data plane fails) */
            ucxdp_list_remove(l);
            free(o);
        }
    }
    for (l = pc->recvs.next; l != &pc->recvs; l = next) {
        recv_t *rv = UCXDP_CONTAINER(l, recv_t, link);
        next = l->next;
        if (rv->source == peer) {
            ucxdp_list_remove(l);
            pc->api->recv_done(ctx, rv->r, UCXDP_ERR_CONNECTION_RESET, rv->source, rv->tag,
                               rv->size);
            free(rv);
        }
    }
}

static const ucxdp_proto_ops_t ops = {
    .abi = UCXDP_PROTO_ABI,
    .name = "pipelined-copy",
    .create = pc_create,
    .destroy = pc_destroy,
    .send = pc_send,
    .frame = pc_frame,
    .progress = pc_progress,
    .fail_peer = pc_fail_peer,
};

/* the table's address, for the Python half (cffi: ucxpy._proto_pipelined) */
uintptr_t ucxpy_pipelined_copy_ops(void)
{
    return (uintptr_t)&ops;
}
