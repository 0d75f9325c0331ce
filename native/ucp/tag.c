/*
 * tag.c — tagged messages: 64-bit tags, masks, matched probes.
 *
 * Entry points: ucp_tag_send_nbx, ucp_tag_send_sync_nbx, ucp_tag_recv_nbx,
 * ucp_tag_msg_recv_nbx, ucp_tag_probe_nb, and the callback forms
 * ucp_tag_send_nb, ucp_tag_send_sync_nb, ucp_tag_recv_nb, ucp_tag_msg_recv_nb.
 *
 * Theory of operation.  Matching, ordering and protocols (eager, rendezvous)
 * are the core's: a send is Endpoint.tag_send_nb (sync: tag_send_sync_nb,
 * which completes once the receiver matched), a receive Worker.tag_recv_nb
 * with the full 64-bit tag and mask.  This file turns the caller's datatype
 * into bytes (datatype.c), makes the request (request.c) and lets
 * ucxs_req_posted decide what the caller sees.  A probe looks at what has
 * arrived without progressing, as UCP's does.
 *
 * An eager send on a connection into a same-host peer's inbox goes by the
 * data plane too (dp_send): its lane (lane.c), which the bridge gives once
 * the core connected, takes the frame when nothing of Python's is queued
 * before it.  A larger send, or a synchronous one, is offered by the data
 * plane's rendezvous (dp_rndv, native/dp/rndv.c): the receiver reads it and
 * answers, and the answer completes the request from ucp_worker_progress
 * (request.c), all without Python where the receiver is libucp too (the
 * sizes of a protocol plug-in with a C half go to that half there instead:
 * native/dp/proto.c).
 * Otherwise, and for anything else, the core sends.
 *
 * A receive (not of a probed message) goes to the worker's data plane
 * directly when it has one (dp_recv): the request carries the data plane's
 * receive, posted in the one matcher all the process's callers share, and
 * an eager message the data plane matches to it completes it from
 * ucp_worker_progress without Python (worker.c).  A message Python's path
 * runs (a rendezvous offer, any frame of a connection the data plane does
 * not read) still finds it there: Python adopts the receive (bridge.c) and
 * completes it as any other.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* Times the bridge may find no lane for an endpoint before libucp stops
 * asking (another transport's endpoint never has one). */
#define LANE_ASKS 64

/* The end of a frame `entry` wrote on a tcp connection in C
 * (native/dp/stream.c; the lock held, released here): 1 sent, 0 not.  What the socket did not
 * take (`rest` bytes of `head`, then `data`) is queued by the transport
 * before anything else (one bridge call, when the socket's buffer is full). */
int ucxs_dp_streamed(const char *entry, ucp_ep_h ep, ucxdp_status_t st, uint64_t rest,
                     const uint8_t *head, size_t head_length, const void *data, size_t length)
{
    if (st == UCXDP_INPROGRESS) {
        uint64_t sent = head_length + length - rest;
        uint8_t *tail = malloc(rest);
        if (tail == NULL)
            ucxs_fatal(entry, "out of memory for %llu bytes of a tcp frame",
                       (unsigned long long)rest);
        if (sent < head_length) {                  /* (the head, then the payload) */
            memcpy(tail, head + sent, head_length - sent);
            memcpy(tail + head_length - sent, data, length);
        } else {
            memcpy(tail, (const uint8_t *)data + (sent - head_length), rest);
        }
        ucxs_py->unlock();
        ucxs_py->stream_tail(ep->py, tail, rest);
        free(tail);
        return 1;
    }
    ucxs_py->unlock();
    return st == UCXDP_OK;
}

/* A tcp connection's eager send in C: 1 sent, 0 not. */
static int dp_stream_send(ucp_ep_h ep, const void *data, size_t length, ucp_tag_t tag)
{
    uint8_t head[UCXDP_TCP_EAGER_HEAD];
    uint64_t rest;
    ucxdp_status_t st;

    st = ucxs_py->dp->stream_send(ep->worker->dp, ep->stream, tag, data, length, &rest, head);
    return ucxs_dp_streamed("ucp_tag_send_nbx", ep, st, rest, head, sizeof head, data, length);
}

/* Send in the data plane: 1 sent, 0 not (the core's way). */
static int dp_send(ucp_ep_h ep, const void *data, size_t length, ucp_tag_t tag)
{
    int wake;
    ucxdp_status_t st;

    if (length > ep->eager_max || !ucxs_py->try_lock())
        return 0;
    if (ep->stream != NULL)
        return dp_stream_send(ep, data, length, tag);
    st = ucxs_py->dp->lane_eager(ep->worker->dp, ep->lane, tag, data, length, &wake);
    return ucxs_dp_pushed(ep, st, wake);
}

int ucxs_dp_pushed(ucp_ep_h ep, ucxdp_status_t st, int wake)
{
    ucxs_py->unlock();
    if (st != UCXDP_OK)
        return 0;
    if (wake)
        ucxs_py->wake_peer(ep->py);
    return 1;
}

/* Offer in the data plane's rendezvous (rndv.c): 1 offered (the request
 * completes when the receiver answers, from ucp_worker_progress), 0 not
 * (the core's way). */
static int dp_rndv(ucp_ep_h ep, ucxs_req_t *req, const void *data, size_t length, ucp_tag_t tag)
{
    ucxdp_rndv_send_t *s = &req->dts;
    ucxdp_status_t st;
    int wake;

    if (length > ep->rndv_max || !ucxs_py->try_lock())
        return 0;
    s->buffer = data;
    s->length = length;
    s->peer = ep->peer;
    req->flags |= UCXS_REQ_DP_SEND;        /* (before it can be answered) */
    st = ucxs_py->dp->rndv_send(ep->worker->dp, ep->lane, s, tag, &wake);
    ucxs_py->unlock();
    if (st != UCXDP_OK) {
        req->flags &= ~(uint32_t)UCXS_REQ_DP_SEND;
        return 0;
    }
    if (wake)
        ucxs_py->wake_peer(ep->py);
    return 1;
}

void ucxs_find_lane(ucp_ep_h ep)
{
    void *ref;
    ucxdp_lane_t *lane = NULL;
    ucxdp_stream_t *stream = NULL;
    uint64_t max, rndv_max;
    int64_t peer;

    if ((ep->lane != NULL && !ep->lane->dead) || (ep->stream != NULL && !ep->stream->dead))
        return;
    if (ep->lane_asks >= LANE_ASKS)
        return;
    if (ucxs_py->ep_lane(ep->py, &ref, &lane, &stream, &max, &rndv_max, &peer) != UCS_OK) {
        ep->lane_asks++;
        return;
    }
    if (ep->lane_ref != NULL)
        ucxs_py->release(ep->lane_ref);
    ep->lane_ref = ref;
    ep->lane = lane;
    ep->stream = stream;
    ep->eager_max = max;
    ep->rndv_max = rndv_max;
    ep->peer = peer;
    ep->lane_asks = 0;
}

static ucs_status_ptr_t tag_send(const char *entry, ucp_ep_h ep, const void *buffer, size_t count,
                             ucp_tag_t tag, int sync, ucxs_req_t *req,
                             const ucp_request_param_t *param)
{
    const void *data;
    ucs_status_t status;

    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    ep->worker->ops.tag_send++;
    status = ucxs_dt_send(ucxs_param_datatype(param), buffer, count, &req->dt, &data);
    if (status != UCS_OK) {
        ucxs_error(entry, "cannot take the send buffer's datatype");
    } else if (!sync && (ep->lane != NULL || ep->stream != NULL)
               && dp_send(ep, data, req->dt.length, tag)) {
        status = UCS_OK;                   /* (in the peer's inbox: done) */
    } else if (ep->lane != NULL && (sync || req->dt.length > ep->eager_max)
               && dp_rndv(ep, req, data, req->dt.length, tag)) {
        status = UCS_INPROGRESS;           /* (offered: the answer completes it) */
    } else {
        status = ucxs_py->tag_send(ep->worker->py, ep->py, data, req->dt.length, tag, sync,
                                   req, &req->info);
        if (ep->worker->dp_tag && !ep->loopback)
            ucxs_find_lane(ep);
    }
    if (ep->loopback) {
        req->flags |= UCXS_REQ_LOOPBACK;
        /* as UCX's self transport: the receive this send matches completes
         * within the send (Open MPI's Testsome looks once, right after): the
         * core delivers the message, then its completions are dispatched,
         * all but the send's own (its callback never runs inside the call) */
        uint64_t wait;
        ucxs_py->progress(ep->worker->py, 0, &wait);
        ucxs_dispatch_except(ep->worker, &req->ev);
    }
    return ucxs_req_posted(req, status, param);
}

ucs_status_ptr_t ucp_tag_send_nbx(ucp_ep_h ep, const void *buffer, size_t count,
                                  ucp_tag_t tag, const ucp_request_param_t *param)
{
    return tag_send("ucp_tag_send_nbx", ep, buffer, count, tag, 0,
                ucxs_req_new(ep->worker, param, UCXS_CB_SEND, "ucp_tag_send_nbx"), param);
}

ucs_status_ptr_t ucp_tag_send_sync_nbx(ucp_ep_h ep, const void *buffer, size_t count,
                                       ucp_tag_t tag, const ucp_request_param_t *param)
{
    return tag_send("ucp_tag_send_sync_nbx", ep, buffer, count, tag, 1,
                ucxs_req_new(ep->worker, param, UCXS_CB_SEND, "ucp_tag_send_sync_nbx"), param);
}

/* The callback forms take the old send callback and a datatype argument. */
static ucs_status_ptr_t send_old(const char *entry, ucp_ep_h ep, const void *buffer,
                                 size_t count, ucp_datatype_t datatype, ucp_tag_t tag, int sync,
                                 ucp_send_callback_t cb)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                                 .datatype = datatype};
    return tag_send(entry, ep, buffer, count, tag, sync, ucxs_req_new_old(ep->worker, cb, entry),
                &param);
}

ucs_status_ptr_t ucp_tag_send_nb(ucp_ep_h ep, const void *buffer, size_t count,
                                 ucp_datatype_t datatype, ucp_tag_t tag, ucp_send_callback_t cb)
{
    return send_old("ucp_tag_send_nb", ep, buffer, count, datatype, tag, 0, cb);
}

ucs_status_ptr_t ucp_tag_send_sync_nb(ucp_ep_h ep, const void *buffer, size_t count,
                                      ucp_datatype_t datatype, ucp_tag_t tag,
                                      ucp_send_callback_t cb)
{
    return send_old("ucp_tag_send_sync_nb", ep, buffer, count, datatype, tag, 1, cb);
}

/* Post `req`'s receive in the data plane: UCS_INPROGRESS (posted), the
 * outcome of an unexpected message it took, or UCS_ERR_NO_RESOURCE when the
 * lock is busy (the bridge's way then). */
static ucs_status_t dp_recv(ucp_worker_h worker, ucxs_req_t *req, void *data, size_t length,
                            ucp_tag_t tag, ucp_tag_t tag_mask)
{
    static char empty;
    const ucxdp_api_t *dp = ucxs_py->dp;
    ucxdp_tag_recv_t *r = &req->dtr;
    ucxdp_tag_unexp_t *u;
    ucxdp_status_t st;
    ucs_status_t status;

    memset(r, 0, sizeof(*r));
    r->m.source = UCXDP_ANY_SOURCE;
    r->m.tag = tag & tag_mask;
    r->m.mask = tag_mask;
    r->buffer = data != NULL ? data : &empty;
    r->capacity = length;
    r->owner = UCXDP_OWNER_EXT;
    if (!ucxs_py->try_lock())
        return UCS_ERR_NO_RESOURCE;
    req->flags |= UCXS_REQ_DP;             /* (before it can match: ext_recv clears it) */
    st = dp->tag_post(worker->dp, r, &u);
    ucxs_py->unlock();
    if (st != UCXDP_OK) {
        req->flags &= ~(uint32_t)UCXS_REQ_DP;
        return (ucs_status_t)st;
    }
    if (u == NULL)
        return UCS_INPROGRESS;
    req->flags &= ~(uint32_t)UCXS_REQ_DP;
    if (u->user != NULL)                   /* Python's protocol: it delivers */
        return ucxs_py->tag_recv_taken(worker->py, worker->dp, r, u, req, &req->info);
    req->info.sender_tag = u->m.tag;
    req->info.length = (size_t)u->length;
    if (u->length <= length) {
        memcpy(r->buffer, u->data, (size_t)u->length);
        status = UCS_OK;
    } else {
        status = UCS_ERR_MESSAGE_TRUNCATED;
    }
    dp->tag_unexp_free(worker->dp, u);
    return status;
}

/* A receive into `buffer` (`message`: a probed message, else a posted receive). */
static ucs_status_ptr_t tag_recv(const char *entry, ucp_worker_h worker, void *buffer, size_t count,
                             ucp_tag_t tag, ucp_tag_t tag_mask, ucp_tag_message_h message,
                             ucxs_req_t *req, const ucp_request_param_t *param)
{
    void *data;
    ucs_status_t status;

    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    req->flags |= UCXS_REQ_RECV;
    worker->ops.tag_recv++;
    status = ucxs_dt_recv(ucxs_param_datatype(param), buffer, count, &req->dt, &data);
    if (status != UCS_OK)
        ucxs_error(entry, "cannot take the receive buffer's datatype");
    else if (message != NULL)
        status = ucxs_py->msg_recv(worker->py, data, req->dt.length, message->py, req,
                                   &req->info);
    else if (worker->dp_tag && (status = dp_recv(worker, req, data, req->dt.length, tag,
                                                 tag_mask)) != UCS_ERR_NO_RESOURCE)
        ;                                  /* (the data plane's) */
    else
        status = ucxs_py->tag_recv(worker->py, data, req->dt.length, tag, tag_mask, req,
                                   &req->info);
    if (message != NULL) {
        ucxs_py->release(message->py);
        free(message);
    }
    return ucxs_req_posted(req, status, param);
}

ucs_status_ptr_t ucp_tag_recv_nbx(ucp_worker_h worker, void *buffer, size_t count,
                                  ucp_tag_t tag, ucp_tag_t tag_mask,
                                  const ucp_request_param_t *param)
{
    return tag_recv("ucp_tag_recv_nbx", worker, buffer, count, tag, tag_mask, NULL,
                ucxs_req_new(worker, param, UCXS_CB_TAG_RECV, "ucp_tag_recv_nbx"), param);
}

ucs_status_ptr_t ucp_tag_msg_recv_nbx(ucp_worker_h worker, void *buffer, size_t count,
                                      ucp_tag_message_h message,
                                      const ucp_request_param_t *param)
{
    return tag_recv("ucp_tag_msg_recv_nbx", worker, buffer, count, 0, 0, message,
                ucxs_req_new(worker, param, UCXS_CB_TAG_RECV, "ucp_tag_msg_recv_nbx"), param);
}

static ucs_status_ptr_t recv_old(const char *entry, ucp_worker_h worker, void *buffer,
                                 size_t count, ucp_datatype_t datatype, ucp_tag_t tag,
                                 ucp_tag_t tag_mask, ucp_tag_message_h message,
                                 ucp_tag_recv_callback_t cb)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .datatype = datatype,
    };
    ucxs_req_t *req = ucxs_req_new(worker, &param, UCXS_CB_TAG_RECV, entry);
    if (req != NULL) {
        /* the old callback lacks user_data: same arguments before it */
        req->cb = (void *)cb;
        req->kind = cb != NULL ? UCXS_CB_TAG_RECV : UCXS_CB_NONE;
    }
    return tag_recv(entry, worker, buffer, count, tag, tag_mask, message, req, &param);
}

ucs_status_ptr_t ucp_tag_recv_nb(ucp_worker_h worker, void *buffer, size_t count,
                                 ucp_datatype_t datatype, ucp_tag_t tag, ucp_tag_t tag_mask,
                                 ucp_tag_recv_callback_t cb)
{
    return recv_old("ucp_tag_recv_nb", worker, buffer, count, datatype, tag, tag_mask, NULL, cb);
}

ucs_status_ptr_t ucp_tag_msg_recv_nb(ucp_worker_h worker, void *buffer, size_t count,
                                     ucp_datatype_t datatype, ucp_tag_message_h message,
                                     ucp_tag_recv_callback_t cb)
{
    return recv_old("ucp_tag_msg_recv_nb", worker, buffer, count, datatype, 0, 0, message, cb);
}

ucp_tag_message_h ucp_tag_probe_nb(ucp_worker_h worker, ucp_tag_t tag, ucp_tag_t tag_mask,
                                   int remove, ucp_tag_recv_info_t *info)
{
    static struct ucp_recv_desc found;     /* a non-NULL answer when not removing */
    void *message = NULL;
    ucp_tag_message_h h;

    if (ucxs_py->tag_probe(worker->py, tag, tag_mask, remove, info, &message) != UCS_OK)
        return NULL;
    if (!remove)
        return &found;
    h = malloc(sizeof(*h));
    if (h == NULL) {
        ucxs_fatal("ucp_tag_probe_nb", "out of memory for a matched message");
    }
    h->py = message;
    return h;
}
