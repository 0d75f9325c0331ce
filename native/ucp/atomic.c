/*
 * atomic.c — remote atomic operations.
 *
 * Entry points: ucp_atomic_op_nbx, ucp_atomic_post, ucp_atomic_fetch_nb, and
 * the blocking 1.x forms ucp_atomic_add32/64, ucp_atomic_fadd32/64,
 * ucp_atomic_swap32/64, ucp_atomic_cswap32/64.
 *
 * Theory of operation.  A key whose region is mapped here, with CPU atomics,
 * has each atomic done by the data plane within the call (dp.h), without
 * Python.  Every other form is one core call, Endpoint.atomic_post
 * (add/and/or/xor, nothing fetched) or Endpoint.atomic_fetch_nb (any op, the
 * old value fetched), on a word of 4 or 8 bytes.  The core applies it as
 * UCXPY_ATOMIC_MODE says (ucxpy/rma.py): CPU atomics on the mapped memory of
 * a same-host peer (done within the call), the target's progress applying it
 * (active messages), or a transport's device atomics.  A fetched old value
 * comes back as the request's 64-bit result (info.sender_tag) and is stored
 * into the caller's reply buffer when the request finishes, before the caller
 * can see it complete (request.c).  A post without a request (ucp_atomic_post)
 * is kept by the core until the next flush, like ucp_put_nbi.
 *
 * UCP's conditional swap: ucp_atomic_op_nbx compares the remote word with
 * *buffer and stores *reply_buffer; ucp_atomic_fetch_nb compares with `value`
 * and stores *result.  Both return the old word in the reply/result.
 */
#include <string.h>

#include "shim.h"

/* The operand of `size` bytes at `p`, zero-extended. */
static uint64_t load(const void *p, size_t size)
{
    uint64_t v = 0;
    memcpy(&v, p, size);
    return v;
}

static int size_ok(const char *entry, size_t size)
{
    if (size == 4 || size == 8)
        return 1;
    ucxs_error(entry, "atomics are on words of 4 or 8 bytes, not %zu", size);
    return 0;
}

/* UCP's operation as the data plane's (ucxpy.atomics.OPS' codes) */
static ucxdp_amo_op_t dp_op(ucp_atomic_op_t op)
{
    switch (op) {
    case UCP_ATOMIC_OP_ADD: return UCXDP_AMO_ADD;
    case UCP_ATOMIC_OP_SWAP: return UCXDP_AMO_SWAP;
    case UCP_ATOMIC_OP_CSWAP: return UCXDP_AMO_CSWAP;
    case UCP_ATOMIC_OP_AND: return UCXDP_AMO_AND;
    case UCP_ATOMIC_OP_OR: return UCXDP_AMO_OR;
    case UCP_ATOMIC_OP_XOR: return UCXDP_AMO_XOR;
    default: return UCXDP_AMO_LAST;        /* declined: the bridge reports it */
    }
}

/* The data plane does `op` at once, the old value (fetched when `reply` is
 * not NULL, or for a swap) into `reply`'s low `size` bytes: 1; else 0, with
 * nothing done (no data plane, or it declined: the bridge's path then runs). */
static int dp_now(ucp_ep_h ep, ucp_atomic_op_t op, size_t size, uint64_t value,
                  uint64_t compare, uint64_t remote_addr, ucp_rkey_h rkey, void *reply)
{
    uint64_t old;
    int fetch = reply != NULL || op == UCP_ATOMIC_OP_SWAP;

    if (ep->worker->dp == NULL || rkey->dp == NULL
            || ucxs_py->dp->atomic(ep->worker->dp, rkey->dp, remote_addr, (unsigned)size,
                                   dp_op(op), value, compare, fetch ? &old : NULL) != UCXDP_OK)
        return 0;
    ep->worker->ops.atomic++;
    if (reply != NULL)
        memcpy(reply, &old, size);         /* x86-64 and aarch64 are little-endian */
    return 1;
}

/* Post `op`: in the data plane (a mapped key), else through the bridge; `req`
 * NULL: an implicit post (flush completes it). */
static ucs_status_t submit(const char *entry, ucp_ep_h ep, ucp_atomic_op_t op, size_t size,
                           uint64_t value, uint64_t compare, uint64_t remote_addr,
                           ucp_rkey_h rkey, ucxs_req_t *req)
{
    int fetch = req != NULL && (req->flags & UCXS_REQ_FETCH);

    if (rkey->py == NULL) {
        ucxs_error(entry, "an atomic through the remote key of an empty region");
        return UCS_ERR_INVALID_PARAM;
    }
    /* a fetched old value goes where the core's would: the request's
     * result, which reaches the reply when the request finishes */
    if (dp_now(ep, op, size, value, compare, remote_addr, rkey,
               fetch ? &req->info.sender_tag : NULL))
        return UCS_OK;
    ep->worker->ops.atomic++;
    return ucxs_rma_posted(ep->worker, ucxs_py->atomic(
        ep->worker->py, ep->py, op, size, value, compare, remote_addr, rkey->py,
        fetch, req, req != NULL ? &req->info : NULL));
}

/* A request whose old value goes to `reply` (size bytes). */
static void fetch_into(ucxs_req_t *req, void *reply, size_t size)
{
    req->flags |= UCXS_REQ_FETCH;
    req->reply = reply;
    req->reply_size = size;
}

ucs_status_ptr_t ucp_atomic_op_nbx(ucp_ep_h ep, ucp_atomic_op_t opcode, const void *buffer,
                                   size_t count, uint64_t remote_addr, ucp_rkey_h rkey,
                                   const ucp_request_param_t *param)
{
    static const char entry[] = "ucp_atomic_op_nbx";
    ucp_datatype_t dt = ucxs_param_datatype(param);
    size_t size = (dt & UCP_DATATYPE_CLASS_MASK) == UCP_DATATYPE_CONTIG ? dt >> UCP_DATATYPE_SHIFT
                                                                          : 0;
    void *reply = (param->op_attr_mask & UCP_OP_ATTR_FIELD_REPLY_BUFFER) ? param->reply_buffer
                                                                         : NULL;
    if (!size_ok(entry, size))
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    if (count != 1 || opcode >= UCP_ATOMIC_OP_LAST) {
        ucxs_error(entry, "one element (count %zu) of a known operation (%d)", count, opcode);
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    }
    if (opcode == UCP_ATOMIC_OP_CSWAP && reply == NULL) {
        ucxs_error(entry, "a conditional swap takes its new value from the reply buffer");
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    }
    uint64_t operand = load(buffer, size), value = operand, compare = 0;
    if (opcode == UCP_ATOMIC_OP_CSWAP) {
        compare = operand;
        value = load(reply, size);
    }
    if (!ucxs_needs_request(param) && rkey->py != NULL
            && dp_now(ep, opcode, size, value, compare, remote_addr, rkey, reply))
        return NULL;                       /* done, no request */
    ucxs_req_t *req = ucxs_req_new(ep->worker, param, UCXS_CB_SEND, entry);
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    /* a swap must fetch to be a swap; its old value may be dropped */
    static uint64_t discard;
    if (reply != NULL || opcode == UCP_ATOMIC_OP_SWAP)
        fetch_into(req, reply != NULL ? reply : &discard, size);
    return ucxs_req_posted(req, submit(entry, ep, opcode, size, value, compare, remote_addr,
                                       rkey, req), param);
}

/* ucp_atomic_post_op_t's operations as ucp_atomic_op_t's. */
static int post_op(ucp_atomic_post_op_t op, ucp_atomic_op_t *out)
{
    switch (op) {
    case UCP_ATOMIC_POST_OP_ADD: *out = UCP_ATOMIC_OP_ADD; return 1;
    case UCP_ATOMIC_POST_OP_AND: *out = UCP_ATOMIC_OP_AND; return 1;
    case UCP_ATOMIC_POST_OP_OR: *out = UCP_ATOMIC_OP_OR; return 1;
    case UCP_ATOMIC_POST_OP_XOR: *out = UCP_ATOMIC_OP_XOR; return 1;
    default: return 0;
    }
}

ucs_status_t ucp_atomic_post(ucp_ep_h ep, ucp_atomic_post_op_t opcode, uint64_t value,
                             size_t op_size, uint64_t remote_addr, ucp_rkey_h rkey)
{
    ucp_atomic_op_t op;
    if (!size_ok("ucp_atomic_post", op_size))
        return UCS_ERR_INVALID_PARAM;
    if (!post_op(opcode, &op)) {
        ucxs_error("ucp_atomic_post", "unknown operation %d", opcode);
        return UCS_ERR_INVALID_PARAM;
    }
    ucs_status_t status = submit("ucp_atomic_post", ep, op, op_size, value, 0, remote_addr,
                                 rkey, NULL);
    return status == UCS_INPROGRESS ? UCS_OK : status;    /* posted: flush completes it */
}

/* ucp_atomic_fetch_op_t's operations as ucp_atomic_op_t's. */
static int fetch_op(ucp_atomic_fetch_op_t op, ucp_atomic_op_t *out)
{
    switch (op) {
    case UCP_ATOMIC_FETCH_OP_FADD: *out = UCP_ATOMIC_OP_ADD; return 1;
    case UCP_ATOMIC_FETCH_OP_SWAP: *out = UCP_ATOMIC_OP_SWAP; return 1;
    case UCP_ATOMIC_FETCH_OP_CSWAP: *out = UCP_ATOMIC_OP_CSWAP; return 1;
    case UCP_ATOMIC_FETCH_OP_FAND: *out = UCP_ATOMIC_OP_AND; return 1;
    case UCP_ATOMIC_FETCH_OP_FOR: *out = UCP_ATOMIC_OP_OR; return 1;
    case UCP_ATOMIC_FETCH_OP_FXOR: *out = UCP_ATOMIC_OP_XOR; return 1;
    default: return 0;
    }
}

ucs_status_ptr_t ucp_atomic_fetch_nb(ucp_ep_h ep, ucp_atomic_fetch_op_t opcode, uint64_t value,
                                     void *result, size_t op_size, uint64_t remote_addr,
                                     ucp_rkey_h rkey, ucp_send_callback_t cb)
{
    static const char entry[] = "ucp_atomic_fetch_nb";
    ucp_atomic_op_t op;
    uint64_t compare = 0;
    if (!size_ok(entry, op_size))
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    if (!fetch_op(opcode, &op)) {
        ucxs_error(entry, "unknown operation %d", opcode);
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    }
    if (op == UCP_ATOMIC_OP_CSWAP) {
        compare = value;
        value = load(result, op_size);
    }
    if (rkey->py != NULL && dp_now(ep, op, op_size, value, compare, remote_addr, rkey, result))
        return NULL;                       /* done, no request */
    ucxs_req_t *req = ucxs_req_new_old(ep->worker, cb, entry);
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    fetch_into(req, result, op_size);
    return ucxs_req_posted(req, submit(entry, ep, op, op_size, value, compare, remote_addr,
                                       rkey, req), NULL);
}

/* -- the blocking 1.x forms --------------------------------------------------------- */
static ucs_status_t wait_fetch(ucp_ep_h ep, ucp_atomic_fetch_op_t op, uint64_t value,
                               void *result, size_t size, uint64_t remote_addr, ucp_rkey_h rkey)
{
    ucs_status_ptr_t r = ucp_atomic_fetch_nb(ep, op, value, result, size, remote_addr, rkey, NULL);
    if (r == NULL || UCS_PTR_IS_ERR(r))
        return UCS_PTR_STATUS(r);
    ucs_status_t status;
    while ((status = ucp_request_check_status(r)) == UCS_INPROGRESS)
        ucp_worker_progress(ep->worker);
    ucp_request_free(r);
    return status;
}

ucs_status_t ucp_atomic_add32(ucp_ep_h ep, uint32_t add, uint64_t remote_addr, ucp_rkey_h rkey)
{
    return ucp_atomic_post(ep, UCP_ATOMIC_POST_OP_ADD, add, 4, remote_addr, rkey);
}

ucs_status_t ucp_atomic_add64(ucp_ep_h ep, uint64_t add, uint64_t remote_addr, ucp_rkey_h rkey)
{
    return ucp_atomic_post(ep, UCP_ATOMIC_POST_OP_ADD, add, 8, remote_addr, rkey);
}

ucs_status_t ucp_atomic_fadd32(ucp_ep_h ep, uint32_t add, uint64_t remote_addr, ucp_rkey_h rkey,
                               uint32_t *result)
{
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_FADD, add, result, 4, remote_addr, rkey);
}

ucs_status_t ucp_atomic_fadd64(ucp_ep_h ep, uint64_t add, uint64_t remote_addr, ucp_rkey_h rkey,
                               uint64_t *result)
{
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_FADD, add, result, 8, remote_addr, rkey);
}

ucs_status_t ucp_atomic_swap32(ucp_ep_h ep, uint32_t swap, uint64_t remote_addr, ucp_rkey_h rkey,
                               uint32_t *result)
{
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_SWAP, swap, result, 4, remote_addr, rkey);
}

ucs_status_t ucp_atomic_swap64(ucp_ep_h ep, uint64_t swap, uint64_t remote_addr, ucp_rkey_h rkey,
                               uint64_t *result)
{
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_SWAP, swap, result, 8, remote_addr, rkey);
}

ucs_status_t ucp_atomic_cswap32(ucp_ep_h ep, uint32_t compare, uint32_t swap,
                                uint64_t remote_addr, ucp_rkey_h rkey, uint32_t *result)
{
    *result = swap;
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_CSWAP, compare, result, 4, remote_addr, rkey);
}

ucs_status_t ucp_atomic_cswap64(ucp_ep_h ep, uint64_t compare, uint64_t swap,
                                uint64_t remote_addr, ucp_rkey_h rkey, uint64_t *result)
{
    *result = swap;
    return wait_fetch(ep, UCP_ATOMIC_FETCH_OP_CSWAP, compare, result, 8, remote_addr, rkey);
}
