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
 */
#include <stdlib.h>

#include "shim.h"

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
    if (status == UCS_OK)
        status = ucxs_py->tag_send(ep->worker->py, ep->py, data, req->dt.length, tag, sync,
                                   req, &req->info);
    else
        ucxs_error(entry, "cannot take the send buffer's datatype");
    if (ep->loopback) {
        req->flags |= UCXS_REQ_LOOPBACK;
        /* as UCX's self transport: the receive this send matches completes
         * within the send (Open MPI's Testsome looks once, right after): the
         * core delivers the message, then its completions are dispatched,
         * all but the send's own (its callback never runs inside the call) */
        ucxs_py->progress(ep->worker->py);
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
