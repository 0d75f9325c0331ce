/*
 * am.c — active messages: handlers run from ucp_worker_progress.
 *
 * Entry points: ucp_worker_set_am_handler, ucp_worker_set_am_recv_handler,
 * ucp_am_send_nb, ucp_am_send_nbx, ucp_am_recv_data_nbx, ucp_am_data_release.
 *
 * Theory of operation.  Both handler forms share one id space per worker (a
 * slot table); the core's Worker.set_am_handler routes the id to the bridge,
 * which queues each arrival as an event with a copy of its header and data
 * (the core's views die with its handler).  ucp_worker_progress dispatches
 * them in order with the send completions, outside the GIL.
 *
 * A message larger than the core's rendezvous threshold arrives as an offer:
 * the nbx handler sees UCP_AM_RECV_ATTR_FLAG_RNDV and a data descriptor (the
 * core's AmMessage).  It either receives it now or keeps it by returning
 * UCS_INPROGRESS and later calls ucp_am_recv_data_nbx (or
 * ucp_am_data_release to decline); any other answer declines it.  The old
 * handler form gets whole messages only: an offer is received into a buffer
 * of ours before it runs, and so does a handler registered with
 * UCP_AM_FLAG_PERSISTENT_DATA, which always sees UCP_AM_RECV_ATTR_FLAG_DATA
 * and may keep the data (UCS_INPROGRESS) until ucp_am_data_release.
 *
 * With the data plane (w->dp_tag), an eager message to a same-host peer is
 * pushed into its inbox in C (dp_am_send), and the ids this worker's
 * handlers claim take their eager arrivals from the inbox in C too
 * (native/dp/am.c calls ucxs_dp_am_arrived, which queues them as above):
 * no Python per message.  Offers, other transports, and ids without a
 * handler yet (held, in order) stay Python's.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* A rendezvous message's data descriptor, as the handler sees it.  It is
 * used up by ucp_am_recv_data_nbx or ucp_am_data_release (py NULL then),
 * and freed by whichever of those or the dispatch comes last. */
typedef struct {
    void *py;                              /* the core's AmMessage */
    int dispatching;
} ucxs_am_desc_t;

typedef struct {
    ucxs_event_t ev;
    unsigned id;
    ucxs_am_desc_t *desc;                  /* rendezvous, or NULL: the data is here */
    size_t header_length;
    size_t length;
    char bytes[];                          /* header, then data (eager) */
} ucxs_am_event_t;

static ucs_status_t slot_set(ucp_worker_h w, unsigned id, int is_nbx, void *cb, void *arg,
                             uint32_t flags)
{
    ucs_status_t status;

    if (id >= UCXS_AM_IDS)
        return UCS_ERR_INVALID_PARAM;
    if (w->am == NULL) {
        w->am = calloc(UCXS_AM_IDS, sizeof(*w->am));
        if (w->am == NULL)
            return UCS_ERR_NO_MEMORY;
    }
    w->am[id] = (ucxs_am_slot_t){.is_nbx = is_nbx, .cb = cb, .arg = arg, .flags = flags};
    /* Python's path first (it delivers what it held for the id), then the
     * data plane's, which takes the id's eager messages from now on */
    status = ucxs_py->am_handler(w->py, id, cb != NULL);
    if (status == UCS_OK && w->dp_tag
            && ucxs_py->dp->am_claim(w->dp, id, cb != NULL) != UCXDP_OK && cb != NULL)
        ucxs_error("ucp_worker_set_am_recv_handler",
                   "active message %u: no memory for the data plane's claim (Python's path "
                   "carries it)", id);
    return status;
}

void ucxs_dp_am_arrived(void *arg, int64_t source, unsigned id, const void *header,
                        uint64_t header_length, const void *data, uint64_t length)
{
    (void)source;
    ucxs_core_am_arrived(arg, id, header, (size_t)header_length, data, (size_t)length, NULL);
}

ucs_status_t ucp_worker_set_am_handler(ucp_worker_h worker, uint16_t id, ucp_am_callback_t cb,
                                       void *arg, uint32_t flags)
{
    return slot_set(worker, id, 0, (void *)cb, arg, flags);
}

ucs_status_t ucp_worker_set_am_recv_handler(ucp_worker_h worker,
                                            const ucp_am_handler_param_t *param)
{
    uint64_t m = param->field_mask;
    if (!(m & UCP_AM_HANDLER_PARAM_FIELD_ID)) {
        ucxs_error("ucp_worker_set_am_recv_handler", "no handler id (field_mask)");
        return UCS_ERR_INVALID_PARAM;
    }
    return slot_set(worker, param->id, 1,
                    (m & UCP_AM_HANDLER_PARAM_FIELD_CB) ? (void *)param->cb : NULL,
                    (m & UCP_AM_HANDLER_PARAM_FIELD_ARG) ? param->arg : NULL,
                    (m & UCP_AM_HANDLER_PARAM_FIELD_FLAGS) ? param->flags : 0);
}

void ucxs_core_am_arrived(void *cworker, unsigned id, const void *header, size_t header_length,
                          const void *data, size_t length, void *desc)
{
    size_t data_bytes = desc == NULL ? length : 0;
    ucxs_am_event_t *ev = malloc(sizeof(*ev) + header_length + data_bytes);
    if (ev == NULL)
        ucxs_fatal("ucp_worker_progress", "out of memory for an active message of %zu bytes",
                   length);
    ev->ev.type = UCXS_EV_AM;
    ev->id = id;
    ev->desc = NULL;
    if (desc != NULL) {
        ev->desc = malloc(sizeof(*ev->desc));
        if (ev->desc == NULL)
            ucxs_fatal("ucp_worker_progress", "out of memory for an active message");
        *ev->desc = (ucxs_am_desc_t){.py = desc, .dispatching = 0};
    }
    ev->header_length = header_length;
    ev->length = length;
    memcpy(ev->bytes, header, header_length);
    if (data_bytes)
        memcpy(ev->bytes + header_length, data, data_bytes);
    ucxs_queue_push(cworker, &ev->ev);
}

/* An offer for an old-form handler: receive it whole, in a blocking wait. */
static void *receive_whole(ucp_worker_h w, ucxs_am_event_t *ev)
{
    void *buf = malloc(ev->length ? ev->length : 1);
    ucp_tag_recv_info_t info;
    if (buf == NULL)
        return NULL;
    ucxs_req_t *req = ucxs_req_new(w, NULL, UCXS_CB_NONE, "ucp_worker_progress");
    ucs_status_t status = ucxs_py->am_recv(w->py, ev->desc->py, buf, ev->length, req, &info);
    while (status == UCS_INPROGRESS) {
        ucp_worker_progress(w);
        status = ucp_request_check_status(ucxs_req_handle(req));
    }
    ucp_request_free(ucxs_req_handle(req));
    return buf;
}

/* Data a UCP_AM_FLAG_PERSISTENT_DATA handler kept (it returned
 * UCS_INPROGRESS): `block` (what to free) holds `data` (what the handler
 * got, and gives back to ucp_am_data_release). */
struct ucxs_am_kept {
    struct ucxs_am_kept *next;
    void *block, *data;
};

static int keep(ucp_worker_h w, void *block, void *data)
{
    struct ucxs_am_kept *k = malloc(sizeof(*k));
    if (k == NULL) {
        ucxs_error("ucp_worker_progress", "no memory to keep an active message's data for "
                   "its handler: it is released now");
        return 0;
    }
    k->block = block;
    k->data = data;
    pthread_mutex_lock(&w->lock);
    k->next = w->am_kept;
    w->am_kept = k;
    pthread_mutex_unlock(&w->lock);
    return 1;
}

/* The kept data `data` released (1), or 0: it is not kept data. */
static int unkeep(ucp_worker_h w, void *data)
{
    struct ucxs_am_kept **p, *k = NULL;
    pthread_mutex_lock(&w->lock);
    for (p = &w->am_kept; *p != NULL; p = &(*p)->next) {
        if ((*p)->data == data) {
            k = *p;
            *p = k->next;
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (k == NULL)
        return 0;
    free(k->block);
    free(k);
    return 1;
}

void ucxs_am_kept_free(ucp_worker_h w)
{
    while (w->am_kept != NULL && unkeep(w, w->am_kept->data))
        ;
}

/* The descriptor is used up: drop the core's message (a no-op once received). */
static void desc_use(ucxs_am_desc_t *d)
{
    ucxs_py->am_drop(d->py);
    d->py = NULL;
    if (!d->dispatching)
        free(d);
}

void ucxs_am_dispatch(ucp_worker_h w, ucxs_event_t *e)
{
    ucxs_am_event_t *ev = (ucxs_am_event_t *)e;
    ucxs_am_slot_t *slot = w != NULL && w->am != NULL ? &w->am[ev->id] : NULL;
    ucxs_am_desc_t *d = ev->desc;
    ucs_status_t status = UCS_OK;
    void *data = ev->bytes + ev->header_length;

    if (d != NULL)
        d->dispatching = 1;
    if (slot == NULL || slot->cb == NULL) {
        if (w != NULL)
            ucxs_error("ucp_worker_progress", "active message %u has no handler: dropped",
                       ev->id);
    } else if (slot->is_nbx && (slot->flags & UCP_AM_FLAG_PERSISTENT_DATA)) {
        /* the data, whole, is the handler's to keep (UCS_INPROGRESS) until
         * ucp_am_data_release: an eager message's event stays allocated, an
         * offer is received first into a buffer of ours */
        void *whole = d != NULL ? receive_whole(w, ev) : data;
        ucp_am_recv_param_t p = {.recv_attr = UCP_AM_RECV_ATTR_FLAG_DATA, .reply_ep = NULL};
        if (whole != NULL) {
            status = ((ucp_am_recv_callback_t)slot->cb)(slot->arg, ev->bytes, ev->header_length,
                                                        whole, ev->length, &p);
            if (status == UCS_INPROGRESS && keep(w, whole != data ? whole : (void *)ev, whole)) {
                if (whole == data)
                    return;                /* (the event is the kept block) */
                whole = NULL;              /* (kept) */
            }
            if (whole != data)
                free(whole);
        }
        status = UCS_OK;                   /* (an offer: received, used up) */
    } else if (slot->is_nbx) {
        ucp_am_recv_param_t p = {.recv_attr = d != NULL ? UCP_AM_RECV_ATTR_FLAG_RNDV : 0,
                                 .reply_ep = NULL};
        status = ((ucp_am_recv_callback_t)slot->cb)(slot->arg, ev->bytes, ev->header_length,
                                                    d != NULL ? (void *)d : data, ev->length,
                                                    &p);
    } else {
        void *whole = d != NULL ? receive_whole(w, ev) : data;
        if (whole != NULL)
            ((ucp_am_callback_t)slot->cb)(slot->arg, whole, ev->length, NULL, 0);
        if (whole != data)
            free(whole);
    }
    if (d != NULL) {
        d->dispatching = 0;
        if (d->py == NULL)
            free(d);                       /* used up by the handler */
        else if (status != UCS_INPROGRESS || slot == NULL || !slot->is_nbx)
            desc_use(d);                   /* declined */
        /* else kept: ucp_am_recv_data_nbx or ucp_am_data_release uses it up */
    }
    free(ev);
}

ucs_status_ptr_t ucp_am_recv_data_nbx(ucp_worker_h worker, void *data_desc, void *buffer,
                                      size_t count, const ucp_request_param_t *param)
{
    void *data;
    ucs_status_t status;
    ucxs_req_t *req = ucxs_req_new(worker, param, UCXS_CB_AM_RECV, "ucp_am_recv_data_nbx");
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    req->flags |= UCXS_REQ_RECV | UCXS_REQ_AM;
    worker->ops.am_recv++;
    status = ucxs_dt_recv(ucxs_param_datatype(param), buffer, count, &req->dt, &data);
    if (status == UCS_OK)
        status = ucxs_py->am_recv(worker->py, ((ucxs_am_desc_t *)data_desc)->py, data,
                                  req->dt.length, req, &req->info);
    desc_use(data_desc);                  /* used up either way */
    return ucxs_req_posted(req, status, param);
}

void ucp_am_data_release(ucp_worker_h worker, void *data)
{
    if (!unkeep(worker, data))             /* (else an offer's descriptor) */
        desc_use(data);
}

/* Send an eager active message in the data plane (am.c): 1 sent, 0 not
 * (the core's way: a rendezvous asked for or needed, no lane, a full ring). */
static int dp_am_send(ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
                      const void *data, size_t length, const ucp_request_param_t *param)
{
    int wake;
    ucxdp_status_t st;

    if ((param->op_attr_mask & UCP_OP_ATTR_FIELD_FLAGS) && (param->flags & UCP_AM_SEND_FLAG_RNDV))
        return 0;
    if (length > ep->eager_max || !ucxs_py->try_lock())
        return 0;
    if (ep->stream != NULL) {              /* (a tcp connection written in C) */
        uint8_t head[UCXDP_STREAM_AM_HEAD_MAX];
        uint64_t rest;
        size_t head_length;
        st = ucxs_py->dp->stream_am_send(ep->worker->dp, ep->stream, id, header, header_length,
                                         data, length, &rest, head, &head_length);
        return ucxs_dp_streamed("ucp_am_send_nbx", ep, st, rest, head, head_length, data,
                                length);
    }
    st = ucxs_py->dp->lane_am(ep->worker->dp, ep->lane, id, header, header_length, data, length,
                              &wake);
    return ucxs_dp_pushed(ep, st, wake);
}

static ucs_status_ptr_t am_send(const char *entry, ucp_ep_h ep, unsigned id, const void *header,
                                size_t header_length, const void *buffer, size_t count,
                                ucxs_req_t *req, const ucp_request_param_t *param)
{
    const void *data;
    ucs_status_t status;

    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    ep->worker->ops.am_send++;
    status = ucxs_dt_send(ucxs_param_datatype(param), buffer, count, &req->dt, &data);
    if (status != UCS_OK) {
        ucxs_error(entry, "cannot take the send buffer's datatype");
    } else if ((ep->lane != NULL || ep->stream != NULL)
               && dp_am_send(ep, id, header, header_length, data, req->dt.length, param)) {
        status = UCS_OK;                   /* (in the peer's inbox, or the socket's: done) */
    } else {
        status = ucxs_py->am_send(ep->worker->py, ep->py, id, header, header_length, data,
                                  req->dt.length, req, &req->info);
        if (ep->worker->dp_tag && !ep->loopback)
            ucxs_find_lane(ep);
    }
    return ucxs_req_posted(req, status, param);
}

ucs_status_ptr_t ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void *header,
                                 size_t header_length, const void *buffer, size_t count,
                                 const ucp_request_param_t *param)
{
    return am_send("ucp_am_send_nbx", ep, id, header, header_length, buffer, count,
                   ucxs_req_new(ep->worker, param, UCXS_CB_SEND, "ucp_am_send_nbx"), param);
}

ucs_status_ptr_t ucp_am_send_nb(ucp_ep_h ep, uint16_t id, const void *buffer, size_t count,
                                ucp_datatype_t datatype, ucp_send_callback_t cb, unsigned flags)
{
    (void)flags;
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                                 .datatype = datatype};
    return am_send("ucp_am_send_nb", ep, id, NULL, 0, buffer, count,
                   ucxs_req_new_old(ep->worker, cb, "ucp_am_send_nb"), &param);
}
