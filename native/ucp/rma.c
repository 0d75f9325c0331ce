/*
 * rma.c — one-sided put and get.
 *
 * Entry points: ucp_put_nbx, ucp_get_nbx, ucp_put_nbi, ucp_get_nbi, ucp_put_nb,
 * ucp_get_nb, ucp_put, ucp_get.
 *
 * Theory of operation.  The core's Endpoint.put_nb / get_nb pick the access
 * mode per remote key (mapped memory of a same-host peer, a one-sided
 * transport, or active messages served by the target's progress: see
 * ucxpy/rma.py).  The implicit forms (*_nbi) hand the core no request: it
 * keeps them outstanding until a flush (ucp_ep_flush, ucp_worker_flush_nb).
 * The blocking forms are the implicit form and a flush of the endpoint.
 */
#include "shim.h"

/* A key of an empty region reaches nothing: UCS_OK for nothing, else an error. */
static ucs_status_t empty_key(const char *entry, size_t length)
{
    if (length == 0)
        return UCS_OK;
    ucxs_error(entry, "%zu bytes through the remote key of an empty region", length);
    return UCS_ERR_INVALID_PARAM;
}

static ucs_status_ptr_t rma(ucp_ep_h ep, int put, void *buffer, size_t length,
                            uint64_t remote_addr, ucp_rkey_h rkey, ucxs_req_t *req,
                            const ucp_request_param_t *param)
{
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    if (rkey->py == NULL)
        return ucxs_req_posted(req, empty_key(put ? "ucp_put" : "ucp_get", length), param);
    req->flags |= UCXS_REQ_AM;            /* a length, if anything, in recv_info */
    if (put)
        ep->worker->ops.put++;
    else
        ep->worker->ops.get++;
    return ucxs_req_posted(req, ucxs_rma_posted(ep->worker, ucxs_py->rma(
                               ep->worker->py, ep->py, put, buffer, length, remote_addr,
                               rkey->py, req, &req->info)),
                           param);
}

static ucs_status_t rma_implicit(ucp_ep_h ep, int put, void *buffer, size_t length,
                                 uint64_t remote_addr, ucp_rkey_h rkey)
{
    if (rkey->py == NULL)
        return empty_key(put ? "ucp_put" : "ucp_get", length);
    if (put)
        ep->worker->ops.put++;
    else
        ep->worker->ops.get++;
    return ucxs_rma_posted(ep->worker, ucxs_py->rma(ep->worker->py, ep->py, put, buffer, length,
                                                    remote_addr, rkey->py, NULL, NULL));
}

ucs_status_ptr_t ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count, uint64_t remote_addr,
                             ucp_rkey_h rkey, const ucp_request_param_t *param)
{
    if (ucxs_param_datatype(param) != ucp_dt_make_contig(1)) {
        ucxs_error("ucp_put_nbx", "only contiguous bytes are implemented");
        return UCS_STATUS_PTR(UCS_ERR_UNSUPPORTED);
    }
    return rma(ep, 1, (void *)buffer, count, remote_addr, rkey,
               ucxs_req_new(ep->worker, param, UCXS_CB_SEND, "ucp_put_nbx"), param);
}

ucs_status_ptr_t ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count, uint64_t remote_addr,
                             ucp_rkey_h rkey, const ucp_request_param_t *param)
{
    if (ucxs_param_datatype(param) != ucp_dt_make_contig(1)) {
        ucxs_error("ucp_get_nbx", "only contiguous bytes are implemented");
        return UCS_STATUS_PTR(UCS_ERR_UNSUPPORTED);
    }
    return rma(ep, 0, buffer, count, remote_addr, rkey,
               ucxs_req_new(ep->worker, param, UCXS_CB_SEND, "ucp_get_nbx"), param);
}

ucs_status_t ucp_put_nbi(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
                         ucp_rkey_h rkey)
{
    return rma_implicit(ep, 1, (void *)buffer, length, remote_addr, rkey);
}

ucs_status_t ucp_get_nbi(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
                         ucp_rkey_h rkey)
{
    return rma_implicit(ep, 0, buffer, length, remote_addr, rkey);
}

ucs_status_ptr_t ucp_put_nb(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
                            ucp_rkey_h rkey, ucp_send_callback_t cb)
{
    return rma(ep, 1, (void *)buffer, length, remote_addr, rkey,
               ucxs_req_new_old(ep->worker, cb, "ucp_put_nb"), NULL);
}

ucs_status_ptr_t ucp_get_nb(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
                            ucp_rkey_h rkey, ucp_send_callback_t cb)
{
    return rma(ep, 0, buffer, length, remote_addr, rkey,
               ucxs_req_new_old(ep->worker, cb, "ucp_get_nb"), NULL);
}

ucs_status_t ucp_put(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
                     ucp_rkey_h rkey)
{
    ucs_status_t status = rma_implicit(ep, 1, (void *)buffer, length, remote_addr, rkey);
    return status == UCS_INPROGRESS ? ucp_ep_flush(ep) : status;
}

ucs_status_t ucp_get(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
                     ucp_rkey_h rkey)
{
    ucs_status_t status = rma_implicit(ep, 0, buffer, length, remote_addr, rkey);
    return status == UCS_INPROGRESS ? ucp_ep_flush(ep) : status;
}
