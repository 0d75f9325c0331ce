/*
 * datatype.c — UCP datatypes: contiguous, iov and generic (pack/unpack callbacks).
 *
 * Entry points: ucp_dt_create_generic, ucp_dt_destroy.
 *
 * Theory of operation.  The core moves contiguous bytes.  A contiguous
 * datatype is the caller's buffer itself (no copy).  An iov is gathered into
 * a bounce buffer for a send, and a receive lands in one and is scattered
 * when it completes.  A generic datatype is packed by the caller's callbacks
 * into a bounce buffer before a send, and a receive lands in a bounce buffer
 * of the callbacks' packed_size and is unpacked when it completes.  The
 * bounce buffer lives in the request (ucxs_dt_t) and is freed by
 * ucxs_dt_finish, on the request's completion.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

typedef struct {
    ucp_generic_dt_ops_t ops;
    void *context;
} ucxs_generic_t;

ucs_status_t ucp_dt_create_generic(const ucp_generic_dt_ops_t *ops, void *context,
                                   ucp_datatype_t *datatype_p)
{
    ucxs_generic_t *g = malloc(sizeof(*g));
    if (g == NULL)
        return UCS_ERR_NO_MEMORY;
    _Static_assert(_Alignof(ucxs_generic_t) > UCP_DATATYPE_CLASS_MASK,
                   "the class bits of a generic datatype sit in its pointer's low bits");
    g->ops = *ops;
    g->context = context;
    *datatype_p = (ucp_datatype_t)(uintptr_t)g | UCP_DATATYPE_GENERIC;
    return UCS_OK;
}

void ucp_dt_destroy(ucp_datatype_t datatype)
{
    if ((datatype & UCP_DATATYPE_CLASS_MASK) == UCP_DATATYPE_GENERIC)
        free((void *)(uintptr_t)(datatype & ~(ucp_datatype_t)UCP_DATATYPE_CLASS_MASK));
}

static ucxs_generic_t *generic_of(ucp_datatype_t dt)
{
    return (ucxs_generic_t *)(uintptr_t)(dt & ~(ucp_datatype_t)UCP_DATATYPE_CLASS_MASK);
}

ucp_datatype_t ucxs_param_datatype(const ucp_request_param_t *param)
{
    if (param != NULL && (param->op_attr_mask & UCP_OP_ATTR_FIELD_DATATYPE))
        return param->datatype;
    return ucp_dt_make_contig(1);
}

static size_t iov_total(const ucp_dt_iov_t *iov, size_t count)
{
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        n += iov[i].length;
    return n;
}

ucs_status_t ucxs_dt_send(ucp_datatype_t dt, const void *buf, size_t count, ucxs_dt_t *st,
                          const void **data)
{
    memset(st, 0, sizeof(*st));
    st->datatype = dt;
    switch (dt & UCP_DATATYPE_CLASS_MASK) {
    case UCP_DATATYPE_CONTIG:
        st->length = count * (dt >> UCP_DATATYPE_SHIFT);
        *data = buf;
        return UCS_OK;
    case UCP_DATATYPE_IOV: {
        const ucp_dt_iov_t *iov = buf;
        st->length = iov_total(iov, count);
        st->bounce = malloc(st->length ? st->length : 1);
        if (st->bounce == NULL)
            return UCS_ERR_NO_MEMORY;
        char *p = st->bounce;
        for (size_t i = 0; i < count; p += iov[i].length, i++)
            memcpy(p, iov[i].buffer, iov[i].length);
        *data = st->bounce;
        return UCS_OK;
    }
    case UCP_DATATYPE_GENERIC: {
        ucxs_generic_t *g = generic_of(dt);
        void *state = g->ops.start_pack(g->context, buf, count);
        st->length = g->ops.packed_size(state);
        st->bounce = malloc(st->length ? st->length : 1);
        if (st->bounce == NULL) {
            g->ops.finish(state);
            return UCS_ERR_NO_MEMORY;
        }
        size_t packed = g->ops.pack(state, 0, st->bounce, st->length);
        g->ops.finish(state);
        if (packed != st->length) {
            free(st->bounce);
            st->bounce = NULL;
            return UCS_ERR_INVALID_PARAM;
        }
        *data = st->bounce;
        return UCS_OK;
    }
    default:
        return UCS_ERR_INVALID_PARAM;
    }
}

ucs_status_t ucxs_dt_recv(ucp_datatype_t dt, void *buf, size_t count, ucxs_dt_t *st,
                          void **data)
{
    memset(st, 0, sizeof(*st));
    st->datatype = dt;
    st->user = buf;
    st->count = count;
    switch (dt & UCP_DATATYPE_CLASS_MASK) {
    case UCP_DATATYPE_CONTIG:
        st->length = count * (dt >> UCP_DATATYPE_SHIFT);
        *data = buf;
        return UCS_OK;
    case UCP_DATATYPE_IOV:
        st->length = iov_total(buf, count);
        break;
    case UCP_DATATYPE_GENERIC: {
        ucxs_generic_t *g = generic_of(dt);
        void *state = g->ops.start_unpack(g->context, buf, count);
        st->length = g->ops.packed_size(state);
        g->ops.finish(state);
        break;
    }
    default:
        return UCS_ERR_INVALID_PARAM;
    }
    st->bounce = malloc(st->length ? st->length : 1);
    if (st->bounce == NULL)
        return UCS_ERR_NO_MEMORY;
    *data = st->bounce;
    return UCS_OK;
}

static ucs_status_t unpack(ucxs_dt_t *st, size_t received)
{
    if ((st->datatype & UCP_DATATYPE_CLASS_MASK) == UCP_DATATYPE_IOV) {
        const ucp_dt_iov_t *iov = st->user;
        const char *p = st->bounce;
        for (size_t i = 0; i < st->count && received; i++) {
            size_t n = iov[i].length < received ? iov[i].length : received;
            memcpy(iov[i].buffer, p, n);
            p += n;
            received -= n;
        }
        return UCS_OK;
    }
    ucxs_generic_t *g = generic_of(st->datatype);
    void *state = g->ops.start_unpack(g->context, st->user, st->count);
    ucs_status_t status = g->ops.unpack(state, 0, st->bounce, received);
    g->ops.finish(state);
    return status;
}

ucs_status_t ucxs_dt_finish(ucxs_dt_t *st, int is_recv, ucs_status_t status, size_t received)
{
    if (st->bounce == NULL)
        return status;
    if (is_recv && status == UCS_OK)
        status = unpack(st, received);
    free(st->bounce);
    st->bounce = NULL;
    return status;
}
