/*
 * rma.c — one-sided put and get.
 *
 * Entry points: ucp_put_nbx, ucp_get_nbx, ucp_put_nbi, ucp_get_nbi, ucp_put_nb,
 * ucp_get_nb, ucp_put, ucp_get.
 *
 * Theory of operation.  A key whose region is mapped here (a same-host peer)
 * has a data-plane key: the data plane does the copy within the call, without
 * Python (ucxs_dp_rma).  Every other access, and one the data plane declines
 * (out of range, a stale key), goes to the core's Endpoint.put_nb / get_nb,
 * which pick the access mode per remote key (mapped memory, a one-sided
 * transport, or active messages served by the target's progress: see
 * ucxpy/rma.py) and say why an access is refused.  The implicit forms (*_nbi)
 * hand the core no request: it keeps them outstanding until a flush
 * (ucp_ep_flush, ucp_worker_flush_nb).
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

static void count(ucp_ep_h ep, int put)
{
    if (put)
        ep->worker->ops.put++;
    else
        ep->worker->ops.get++;
}

/* A put or get with a request made for it (param's, or the 1.x form's with
 * `cb`), unless the data plane does it at once and the caller needs none */
static ucs_status_ptr_t rma(ucp_ep_h ep, int put, void *buffer, size_t length,
                            uint64_t remote_addr, ucp_rkey_h rkey,
                            const ucp_request_param_t *param, ucp_send_callback_t cb,
                            const char *entry)
{
    ucxs_req_t *req;
    ucs_status_t status = UCS_OK;
    int done;

    if (rkey->py == NULL) {
        status = empty_key(put ? "ucp_put" : "ucp_get", length);
        done = 1;
    } else {
        count(ep, put);
        done = ucxs_dp_rma(ep, put, buffer, length, remote_addr, rkey) == UCS_OK;
    }
    if (done && !ucxs_needs_request(param))
        return UCS_STATUS_PTR(status);
    req = param != NULL || cb == NULL ? ucxs_req_new(ep->worker, param, UCXS_CB_SEND, entry)
                                      : ucxs_req_new_old(ep->worker, cb, entry);
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    req->flags |= UCXS_REQ_AM;            /* a length, if anything, in recv_info */
    if (!done)
        status = ucxs_rma_posted(ep->worker, ucxs_py->rma(ep->worker->py, ep->py, put, buffer,
                                                          length, remote_addr, rkey->py, req,
                                                          &req->info));
    return ucxs_req_posted(req, status, param);
}

static ucs_status_t rma_implicit(ucp_ep_h ep, int put, void *buffer, size_t length,
                                 uint64_t remote_addr, ucp_rkey_h rkey)
{
    if (rkey->py == NULL)
        return empty_key(put ? "ucp_put" : "ucp_get", length);
    count(ep, put);
    if (ucxs_dp_rma(ep, put, buffer, length, remote_addr, rkey) == UCS_OK)
        return UCS_OK;
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
    return rma(ep, 1, (void *)buffer, count, remote_addr, rkey, param, NULL, "ucp_put_nbx");
}

ucs_status_ptr_t ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count, uint64_t remote_addr,
                             ucp_rkey_h rkey, const ucp_request_param_t *param)
{
    if (ucxs_param_datatype(param) != ucp_dt_make_contig(1)) {
        ucxs_error("ucp_get_nbx", "only contiguous bytes are implemented");
        return UCS_STATUS_PTR(UCS_ERR_UNSUPPORTED);
    }
    return rma(ep, 0, buffer, count, remote_addr, rkey, param, NULL, "ucp_get_nbx");
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
    return rma(ep, 1, (void *)buffer, length, remote_addr, rkey, NULL, cb, "ucp_put_nb");
}

ucs_status_ptr_t ucp_get_nb(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
                            ucp_rkey_h rkey, ucp_send_callback_t cb)
{
    return rma(ep, 0, buffer, length, remote_addr, rkey, NULL, cb, "ucp_get_nb");
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
