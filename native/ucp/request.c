/*
 * request.c — UCP's request contract, in one place.
 *
 * Entry points: ucp_request_free, ucp_request_release, ucp_request_cancel,
 * ucp_request_check_status, ucp_request_is_completed, ucp_request_test.
 *
 * Theory of operation.  A request is our header (ucxs_req_t) followed by the
 * caller's request_size bytes; the handle the caller sees is the address of
 * its bytes.  Requests come from a per-context pool and the caller's
 * request_init runs once per pool object, when it is first made; with
 * UCP_OP_ATTR_FIELD_REQUEST the caller gives the memory (request_size of
 * ucp_context_query counts our header, which sits before its handle); an
 * operation done within the call leaves that request completed, so testing
 * it gives the outcome whatever the call returned.
 *
 *   posted ──(bridge: done now)────────────────> caller gets NULL / error,
 *     │                                           or, NO_IMM_CMPL, queued
 *     └──(bridge: INPROGRESS)──> pending ──(core completes)──> queued
 *   queued ──(ucp_worker_progress)──> COMPLETED: datatype finished, callback
 *
 * Completion is visible only from ucp_worker_progress (check_status says
 * INPROGRESS until then; a cancel is the exception), and the callback runs there, without the GIL, so
 * it may call the library again.  ucp_request_free / _release before
 * completion marks the request RELEASED and it returns to the pool once
 * done: after ucp_request_release its callback still runs (MPICH relies on
 * it), after ucp_request_free it does not (as UCP: Open MPI frees an active
 * request whose callback would touch memory it reuses); after completion
 * both return it at once.  ucp_request_cancel of a pending
 * request completes it within the call (UCS_ERR_CANCELED, callback
 * included), as UCP does.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static ucxs_req_t *pool_get(ucp_context_h ctx)
{
    ucxs_req_t *req;
    pthread_mutex_lock(&ctx->pool_lock);
    req = ctx->pool;
    if (req != NULL)
        ctx->pool = req->next_free;
    pthread_mutex_unlock(&ctx->pool_lock);
    if (req != NULL)
        return req;
    req = calloc(1, UCXS_REQ_HEADER + ctx->user_size);
    if (req != NULL && ctx->init != NULL)
        ctx->init(ucxs_req_handle(req));
    return req;
}

void ucxs_req_put(ucxs_req_t *req)
{
    if (req->flags & UCXS_REQ_CALLER_MEMORY)
        return;
    ucp_context_h ctx = req->worker->context;
    pthread_mutex_lock(&ctx->pool_lock);
    req->next_free = ctx->pool;
    ctx->pool = req;
    pthread_mutex_unlock(&ctx->pool_lock);
}

void ucxs_pool_destroy(ucp_context_h ctx)
{
    ucxs_req_t *req = ctx->pool, *next;
    for (; req != NULL; req = next) {
        next = req->next_free;
        if (ctx->cleanup != NULL)
            ctx->cleanup(ucxs_req_handle(req));
        free(req);
    }
    ctx->pool = NULL;
}

static void req_reset(ucxs_req_t *req, ucp_worker_h worker, ucxs_cb_kind_t kind)
{
    req->ev.next = NULL;
    req->ev.type = UCXS_EV_REQUEST;
    req->worker = worker;
    req->flags &= UCXS_REQ_CALLER_MEMORY;
    req->kind = kind;
    req->status = UCS_INPROGRESS;
    req->info.sender_tag = 0;
    req->info.length = 0;
    req->cb = NULL;
    req->user_data = NULL;
    memset(&req->dt, 0, sizeof(req->dt));
    req->reply = NULL;
    req->reply_size = 0;
}

ucxs_req_t *ucxs_req_new(ucp_worker_h worker, const ucp_request_param_t *param,
                         ucxs_cb_kind_t kind, const char *entry)
{
    uint32_t mask = param != NULL ? param->op_attr_mask : 0;
    ucxs_req_t *req;

    if (mask & UCP_OP_ATTR_FIELD_REQUEST) {
        req = ucxs_req_of(param->request);
        req->flags = UCXS_REQ_CALLER_MEMORY;
    } else {
        req = pool_get(worker->context);
        if (req == NULL) {
            ucxs_error(entry, "out of memory for a request");
            return NULL;
        }
        req->flags = 0;
    }
    req_reset(req, worker, (mask & UCP_OP_ATTR_FIELD_CALLBACK) ? kind : UCXS_CB_NONE);
    if (mask & UCP_OP_ATTR_FIELD_CALLBACK)
        req->cb = (void *)param->cb.send;  /* one union: the kind says which */
    if (mask & UCP_OP_ATTR_FIELD_USER_DATA)
        req->user_data = param->user_data;
    return req;
}

ucxs_req_t *ucxs_req_new_old(ucp_worker_h worker, ucp_send_callback_t cb, const char *entry)
{
    ucxs_req_t *req = pool_get(worker->context);
    if (req == NULL) {
        ucxs_error(entry, "out of memory for a request");
        return NULL;
    }
    req->flags = 0;
    req_reset(req, worker, cb != NULL ? UCXS_CB_SEND_OLD : UCXS_CB_NONE);
    req->cb = (void *)cb;
    return req;
}

/* Data epilogue of a finished request, before the caller hears of it: the
 * datatype's (may turn its status into an error), or an atomic's old value
 * into the reply buffer (its low reply_size bytes: x86-64 is little-endian). */
static void req_finish_data(ucxs_req_t *req)
{
    if (req->flags & UCXS_REQ_FETCH) {
        if (req->status == UCS_OK)
            memcpy(req->reply, &req->info.sender_tag, req->reply_size);
        return;
    }
    req->status = ucxs_dt_finish(&req->dt, req->flags & UCXS_REQ_RECV, req->status,
                                 req->info.length);
}

ucs_status_ptr_t ucxs_req_posted(ucxs_req_t *req, ucs_status_t status,
                                 const ucp_request_param_t *param)
{
    uint32_t mask = param != NULL ? param->op_attr_mask : 0;

    if (status == UCS_INPROGRESS)
        return ucxs_req_handle(req);
    req->status = status;
    if (mask & UCP_OP_ATTR_FLAG_NO_IMM_CMPL) {
        /* the caller holds a request whatever happens: its completion
         * (callback included) comes from the next progress */
        ucxs_queue_push(req->worker, &req->ev);
        return ucxs_req_handle(req);
    }
    req_finish_data(req);
    status = req->status;
    if (status == UCS_OK && (mask & UCP_OP_ATTR_FIELD_RECV_INFO) &&
        (req->flags & UCXS_REQ_RECV)) {
        if (req->flags & UCXS_REQ_AM) {
            if (param->recv_info.length != NULL)
                *param->recv_info.length = req->info.length;
        } else if (param->recv_info.tag_info != NULL) {
            *param->recv_info.tag_info = req->info;
        }
    }
    if (req->flags & UCXS_REQ_CALLER_MEMORY)
        /* the caller's memory stays a request it may test (Open MPI's pml
         * tests its own request whatever the call returned) */
        req->flags |= UCXS_REQ_COMPLETED;
    ucxs_req_put(req);
    return status == UCS_OK ? NULL : UCS_STATUS_PTR(status);
}

void ucxs_core_complete(void *handle, ucs_status_t status, uint64_t tag, size_t length)
{
    ucxs_req_t *req = handle;
    req->status = status;
    req->info.sender_tag = tag;
    req->info.length = length;
    ucxs_queue_push(req->worker, &req->ev);
}

/* The request whose data-plane receive `r` is. */
static inline ucxs_req_t *req_of_dtr(ucxdp_tag_recv_t *r)
{
    return (ucxs_req_t *)((char *)r - offsetof(ucxs_req_t, dtr));
}

static inline ucxs_req_t *req_of_dts(ucxdp_rndv_send_t *s)
{
    return (ucxs_req_t *)((char *)s - offsetof(ucxs_req_t, dts));
}

void ucxs_core_ext_recv(ucxdp_tag_recv_t *r, void **handle, void **cworker)
{
    ucxs_req_t *req = req_of_dtr(r);

    req->flags &= ~(uint32_t)UCXS_REQ_DP;  /* Python's to complete now */
    *handle = req;
    *cworker = req->worker->py;
}

/* The outcome of a data-plane receive the data plane matched. */
static void dp_outcome(ucxs_req_t *req)
{
    ucxdp_tag_recv_t *r = &req->dtr;

    req->flags &= ~(uint32_t)UCXS_REQ_DP;
    req->info.sender_tag = r->info_tag;
    req->info.length = (size_t)r->info_length;
    if (r->status == UCXDP_OK) {
        req->status = UCS_OK;
    } else if (r->status == UCXDP_HANDOFF) {
        /* (libucp's receives always have a buffer: a handed-off eager
         * message did not fit in it) */
        free(r->handoff);
        r->handoff = NULL;
        req->status = UCS_ERR_MESSAGE_TRUNCATED;
    } else {
        req->status = (ucs_status_t)r->status;
    }
}

unsigned ucxs_dp_done(ucp_worker_h worker)
{
    ucxdp_link_t list, *l;
    unsigned n = 0;

    /* (under the lock: a cancel in another thread reads the flags there).
     * A C thread of a Python program never waits for it: its holder may be
     * waiting for the GIL, held by a Python thread that waits for this one
     * (joining it); the next progress call takes what is owed. */
    if (!ucxs_foreign()) {
        ucxs_py->lock();
    } else if (!ucxs_py->try_lock()) {
        __atomic_store_n(&worker->dp_owed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_store_n(&worker->dp_owed, 0, __ATOMIC_RELAXED);
    ucxs_py->dp->tag_take_done(worker->dp, UCXDP_OWNER_EXT, &list);
    while ((l = list.next) != &list) {
        ucxs_req_t *req = req_of_dtr(UCXDP_DONE_RECV(l));

        list.next = l->next;
        l->next->prev = &list;
        dp_outcome(req);
        ucxs_queue_push(worker, &req->ev);
        n++;
    }
    /* rendezvous sends the data plane offered, answered */
    ucxs_py->dp->rndv_take_done(worker->dp, &list);
    while ((l = list.next) != &list) {
        ucxs_req_t *req = req_of_dts(UCXDP_DONE_SEND(l));

        list.next = l->next;
        l->next->prev = &list;
        req->flags &= ~(uint32_t)UCXS_REQ_DP_SEND;
        req->status = req->dts.status == UCXDP_OK ? UCS_OK : (ucs_status_t)req->dts.status;
        ucxs_queue_push(worker, &req->ev);
        n++;
    }
    ucxs_py->unlock();
    return n;
}

void ucxs_req_dispatch(ucxs_req_t *req)
{
    void *h = ucxs_req_handle(req);
    int released;

    req_finish_data(req);
    req->flags |= UCXS_REQ_COMPLETED;
    released = req->flags & UCXS_REQ_RELEASED;
    if (req->flags & UCXS_REQ_LOOPBACK)
        req->worker->loopback_done++;
    switch (req->kind) {
    case UCXS_CB_SEND:
        ((ucp_send_nbx_callback_t)req->cb)(h, req->status, req->user_data);
        break;
    case UCXS_CB_SEND_OLD:
        ((ucp_send_callback_t)req->cb)(h, req->status);
        break;
    case UCXS_CB_TAG_RECV:
        ((ucp_tag_recv_nbx_callback_t)req->cb)(h, req->status, &req->info, req->user_data);
        break;
    case UCXS_CB_AM_RECV:
        ((ucp_am_recv_data_nbx_callback_t)req->cb)(h, req->status, req->info.length,
                                                   req->user_data);
        break;
    case UCXS_CB_NONE:
        break;
    }
    if (released)                          /* freed by the caller before: ours now */
        ucxs_req_put(req);
}

/* -- entry points ------------------------------------------------------------ */
/* Return `request` to us: now if completed, else when it completes; `quiet`:
 * its callback will not run (ucp_request_free), else it still does
 * (ucp_request_release, which MPICH relies on). */
static void release(void *request, int quiet)
{
    ucxs_req_t *req = ucxs_req_of(request);
    if (req->flags & UCXS_REQ_COMPLETED) {
        ucxs_req_put(req);
        return;
    }
    req->flags |= UCXS_REQ_RELEASED;
    if (quiet)
        req->kind = UCXS_CB_NONE;
}

void ucp_request_free(void *request)
{
    release(request, 1);
}

void ucp_request_release(void *request)
{
    release(request, 0);
}

void ucp_request_cancel(ucp_worker_h worker, void *request)
{
    ucxs_req_t *req = ucxs_req_of(request);
    if (!(req->flags & UCXS_REQ_COMPLETED) && req->status == UCS_INPROGRESS) {
        if (req->flags & UCXS_REQ_DP) {
            int removed;

            ucxs_py->lock();
            /* (still posted in the data plane: nobody else completes it) */
            removed = (req->flags & UCXS_REQ_DP) && ucxs_py->dp->tag_cancel(worker->dp, &req->dtr);
            ucxs_py->unlock();
            if (removed) {
                req->flags &= ~(uint32_t)UCXS_REQ_DP;
                req->status = UCS_ERR_CANCELED;
                ucxs_req_dispatch(req);
                return;
            }
            /* matched meanwhile: on the done list (completes in progress),
             * or Python's (adopted: its core request is cancelled below) */
        }
        ucxs_py->cancel(worker->py, req);
        /* as UCP does, a cancelled request completes inside the call: MPICH
         * cancels the netmod half of an ANY_SOURCE receive its self path
         * matched, and reads the outcome at once */
        if (ucxs_queue_take(worker, &req->ev))
            ucxs_req_dispatch(req);
    }
}

ucs_status_t ucp_request_check_status(void *request)
{
    ucxs_req_t *req = ucxs_req_of(request);
    return (req->flags & UCXS_REQ_COMPLETED) ? req->status : UCS_INPROGRESS;
}

int ucp_request_is_completed(void *request)
{
    return ucp_request_check_status(request) != UCS_INPROGRESS;
}

ucs_status_t ucp_request_test(void *request, ucp_tag_recv_info_t *info)
{
    ucxs_req_t *req = ucxs_req_of(request);
    if (!(req->flags & UCXS_REQ_COMPLETED))
        return UCS_INPROGRESS;
    if (info != NULL)
        *info = req->info;
    return req->status;
}

ucs_status_t ucp_tag_recv_request_test(void *request, ucp_tag_recv_info_t *info)
{
    return ucp_request_test(request, info);
}
