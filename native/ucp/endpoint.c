/*
 * endpoint.c — endpoints from worker addresses; flush and close.
 *
 * Entry points: ucp_ep_create, ucp_ep_destroy, ucp_disconnect_nb,
 * ucp_ep_close_nb, ucp_ep_close_nbx, ucp_ep_flush, ucp_ep_flush_nb,
 * ucp_ep_flush_nbx, ucp_ep_evaluate_perf.
 *
 * Theory of operation.  An endpoint is the core's Endpoint to the worker whose
 * packed address (ucp_worker_get_address on the peer) the caller gives;
 * wire-up is the core's.  Close and the blocking flushes run to completion
 * inside the call (the core progresses while it waits, so peers waiting on
 * us are served) and report done-now, which UCP allows: the *_nbx forms
 * still hand back a request when the caller denied immediate completion.
 * ucp_ep_flush_nbx does not wait inside the call when RMA is in flight: its
 * request completes from later progress (ucxs_flush_nbx, worker.c), since
 * the peer may be another worker of this process that another thread
 * progresses (NIXL's agents).
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p)
{
    ucs_status_t status;
    ucp_ep_h ep;

    if (!(params->field_mask & UCP_EP_PARAM_FIELD_REMOTE_ADDRESS)) {
        ucxs_error("ucp_ep_create", "only endpoints to a worker address are implemented "
                   "(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS)");
        return UCS_ERR_UNSUPPORTED;
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return UCS_ERR_NO_MEMORY;
    ep->worker = worker;
    size_t n = ucxs_address_size(params->address);
    ep->loopback = worker->address != NULL && n == ucxs_address_size(worker->address) &&
                   !memcmp(ucxs_address_bytes(params->address),
                           ucxs_address_bytes(worker->address), n);
    status = ucxs_py->ep_create(worker->py, ucxs_address_bytes(params->address), n, &ep->py);
    if (status != UCS_OK) {
        free(ep);
        return status;
    }
    *ep_p = ep;
    return UCS_OK;
}

static ucs_status_t ep_close(ucp_ep_h ep)
{
    ucs_status_t status = ucxs_py->ep_close(ep->worker->py, ep->py);
    if (ep->lane_ref != NULL)
        ucxs_py->release(ep->lane_ref);
    ucxs_py->release(ep->py);
    free(ep);
    return status;
}

void ucp_ep_destroy(ucp_ep_h ep)
{
    ep_close(ep);
}

ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h ep)
{
    ucs_status_t status = ep_close(ep);
    return status == UCS_OK ? NULL : UCS_STATUS_PTR(status);
}

ucs_status_ptr_t ucp_ep_close_nb(ucp_ep_h ep, unsigned mode)
{
    (void)mode;
    return ucp_disconnect_nb(ep);
}

ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
    ucp_worker_h worker = ep->worker;
    ucxs_req_t *req = ucxs_req_new(worker, param, UCXS_CB_SEND, "ucp_ep_close_nbx");
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    return ucxs_req_posted(req, ep_close(ep), param);
}

ucs_status_t ucp_ep_flush(ucp_ep_h ep)
{
    return ucxs_flush(ep->worker, ep);
}

ucs_status_ptr_t ucp_ep_flush_nb(ucp_ep_h ep, unsigned flags, ucp_send_callback_t cb)
{
    (void)flags;
    (void)cb;
    ucs_status_t status = ucp_ep_flush(ep);
    return status == UCS_OK ? NULL : UCS_STATUS_PTR(status);
}

ucs_status_ptr_t ucp_ep_flush_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
    return ucxs_flush_nbx(ep->worker, ep, param, "ucp_ep_flush_nbx");
}

/* The core's own estimate for the endpoint's lane (capi.ep_perf: the
 * transport's overhead + latency + size / bandwidth, a round trip more from
 * the rendezvous threshold on), in seconds; the lane is chosen now if the
 * endpoint has not sent yet.  Without a message size: that of 0 bytes. */
ucs_status_t ucp_ep_evaluate_perf(ucp_ep_h ep, const ucp_ep_evaluate_perf_param_t *param,
                                  ucp_ep_evaluate_perf_attr_t *attr)
{
    size_t size = 0;
    double seconds = 0;
    ucs_status_t status;

    if (ep == NULL || attr == NULL)
        return UCS_ERR_INVALID_PARAM;
    if (param != NULL && (param->field_mask & UCP_EP_PERF_PARAM_FIELD_MESSAGE_SIZE))
        size = param->message_size;
    if (!(attr->field_mask & UCP_EP_PERF_ATTR_FIELD_ESTIMATED_TIME))
        return UCS_OK;
    status = ucxs_py->ep_perf(ep->py, size, &seconds);
    if (status == UCS_OK)
        attr->estimated_time = seconds;
    return status;
}
