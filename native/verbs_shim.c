/* See verbs_shim.h.  Compiled into ucxpy._verbs by native/build_rdma.py. */
#include "verbs_shim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct uxv {
    struct ibv_context      *ctx;
    struct ibv_pd           *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq           *cq;
    uint8_t                  port;
    struct ibv_wc            wc[32];
};

int uxv_device_count(char *names, size_t len)
{
    int n = 0, i;
    size_t off = 0;
    struct ibv_device **list;

    errno = 0;
    list = ibv_get_device_list(&n);
    if (!list)
        return errno ? -errno : -ENOSYS;
    if (names && len) {
        names[0] = '\0';
        for (i = 0; i < n && off < len; i++)
            off += snprintf(names + off, len - off, "%s%s", i ? "," : "",
                            ibv_get_device_name(list[i]));
    }
    ibv_free_device_list(list);
    return n;
}

static int fail(char *err, size_t errlen, const char *what, int e)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %s", what, strerror(e ? e : EIO));
    return -(e ? e : EIO);
}

int uxv_open(const char *device, int port, int gid_index, int cq_size,
             uxv_t **out, uxv_attrs_t *attrs, char *err, size_t errlen)
{
    struct ibv_device **list;
    struct ibv_device *dev = NULL;
    struct ibv_device_attr dattr;
    struct ibv_port_attr pattr;
    union ibv_gid gid;
    uxv_t *h;
    int n = 0, i, rc, flags;

    *out = NULL;
    list = ibv_get_device_list(&n);
    if (!list)
        return fail(err, errlen, "ibv_get_device_list", errno);
    for (i = 0; i < n; i++)
        if (!device || !*device || !strcmp(ibv_get_device_name(list[i]), device)) {
            dev = list[i];
            break;
        }
    if (!dev) {
        ibv_free_device_list(list);
        if (err && errlen)
            snprintf(err, errlen, "no RDMA device %s(ibv_get_device_list returned %d)",
                     device && *device ? device : "", n);
        return -ENODEV;
    }
    h = calloc(1, sizeof(*h));
    if (!h) {
        ibv_free_device_list(list);
        return fail(err, errlen, "calloc", ENOMEM);
    }
    h->port = (uint8_t)port;
    memset(attrs, 0, sizeof(*attrs));
    snprintf(attrs->device, sizeof(attrs->device), "%s", ibv_get_device_name(dev));
    attrs->node_guid = ibv_get_device_guid(dev);
    h->ctx = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!h->ctx) {
        rc = fail(err, errlen, "ibv_open_device", errno);
        uxv_close(h);
        return rc;
    }
    if ((rc = ibv_query_device(h->ctx, &dattr))) {
        rc = fail(err, errlen, "ibv_query_device", rc);
        uxv_close(h);
        return rc;
    }
    if ((rc = ibv_query_port(h->ctx, h->port, &pattr))) {
        rc = fail(err, errlen, "ibv_query_port", rc);
        uxv_close(h);
        return rc;
    }
    memset(&gid, 0, sizeof(gid));
    if (gid_index >= 0 && (rc = ibv_query_gid(h->ctx, h->port, gid_index, &gid))) {
        rc = fail(err, errlen, "ibv_query_gid", rc);
        uxv_close(h);
        return rc;
    }
    h->pd = ibv_alloc_pd(h->ctx);
    if (!h->pd) {
        rc = fail(err, errlen, "ibv_alloc_pd", errno);
        uxv_close(h);
        return rc;
    }
    h->channel = ibv_create_comp_channel(h->ctx);
    if (!h->channel) {
        rc = fail(err, errlen, "ibv_create_comp_channel", errno);
        uxv_close(h);
        return rc;
    }
    flags = fcntl(h->channel->fd, F_GETFL);
    fcntl(h->channel->fd, F_SETFL, flags | O_NONBLOCK);
    h->cq = ibv_create_cq(h->ctx, cq_size, NULL, h->channel, 0);
    if (!h->cq) {
        rc = fail(err, errlen, "ibv_create_cq", errno);
        uxv_close(h);
        return rc;
    }
    attrs->port = h->port;
    attrs->port_state = pattr.state;
    attrs->link_layer = pattr.link_layer;
    attrs->gid_index = gid_index < 0 ? 0 : (uint8_t)gid_index;
    attrs->lid = pattr.lid;
    attrs->active_mtu = pattr.active_mtu;
    attrs->max_msg_sz = pattr.max_msg_sz;
    memcpy(attrs->gid, gid.raw, 16);
    attrs->atomic_cap = dattr.atomic_cap;
    attrs->max_qp_wr = dattr.max_qp_wr;
    attrs->max_qp_rd_atom = dattr.max_qp_rd_atom;
    attrs->max_qp_init_rd_atom = dattr.max_qp_init_rd_atom;
    attrs->comp_fd = h->channel->fd;
    *out = h;
    return 0;
}

void uxv_close(uxv_t *h)
{
    if (!h)
        return;
    if (h->cq)
        ibv_destroy_cq(h->cq);
    if (h->channel)
        ibv_destroy_comp_channel(h->channel);
    if (h->pd)
        ibv_dealloc_pd(h->pd);
    if (h->ctx)
        ibv_close_device(h->ctx);
    free(h);
}

struct ibv_qp *uxv_qp_create(uxv_t *h, uint32_t max_send_wr, uint32_t max_recv_wr,
                             uint32_t max_inline, uint32_t *qp_num)
{
    struct ibv_qp_init_attr a;
    struct ibv_qp *qp;

    memset(&a, 0, sizeof(a));
    a.send_cq = h->cq;
    a.recv_cq = h->cq;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 0;
    a.cap.max_send_wr = max_send_wr;
    a.cap.max_recv_wr = max_recv_wr;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = max_inline;
    qp = ibv_create_qp(h->pd, &a);
    if (qp)
        *qp_num = qp->qp_num;
    return qp;
}

int uxv_qp_modify(struct ibv_qp *qp, const uxv_qp_params_t *p, int mask)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = (enum ibv_qp_state)p->qp_state;
    a.qp_access_flags = p->access;
    a.pkey_index = p->pkey_index;
    a.port_num = p->port;
    a.path_mtu = (enum ibv_mtu)p->path_mtu;
    a.dest_qp_num = p->dest_qpn;
    a.rq_psn = p->rq_psn;
    a.sq_psn = p->sq_psn;
    a.max_dest_rd_atomic = p->max_dest_rd_atomic;
    a.max_rd_atomic = p->max_rd_atomic;
    a.min_rnr_timer = p->min_rnr_timer;
    a.timeout = p->timeout;
    a.retry_cnt = p->retry_cnt;
    a.rnr_retry = p->rnr_retry;
    a.ah_attr.dlid = p->dlid;
    a.ah_attr.sl = p->sl;
    a.ah_attr.port_num = p->port;
    a.ah_attr.is_global = p->is_global;
    if (p->is_global) {
        memcpy(a.ah_attr.grh.dgid.raw, p->dgid, 16);
        a.ah_attr.grh.sgid_index = p->sgid_index;
        a.ah_attr.grh.hop_limit = p->hop_limit ? p->hop_limit : 64;
    }
    return ibv_modify_qp(qp, &a, mask);
}

int uxv_qp_destroy(struct ibv_qp *qp)
{
    return qp ? ibv_destroy_qp(qp) : 0;
}

struct ibv_mr *uxv_reg_mr(uxv_t *h, void *addr, size_t len, int access,
                          uint32_t *lkey, uint32_t *rkey)
{
    struct ibv_mr *mr = ibv_reg_mr(h->pd, addr, len, access);
    if (mr) {
        *lkey = mr->lkey;
        *rkey = mr->rkey;
    }
    return mr;
}

int uxv_dereg_mr(struct ibv_mr *mr)
{
    return mr ? ibv_dereg_mr(mr) : 0;
}

int uxv_post_send(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint64_t laddr,
                  uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                  uint64_t compare_add, uint64_t swap, int send_flags)
{
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad = NULL;

    sge.addr = laddr;
    sge.length = len;
    sge.lkey = lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = (enum ibv_wr_opcode)opcode;
    wr.send_flags = send_flags | IBV_SEND_SIGNALED;
    switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        break;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
        wr.wr.atomic.remote_addr = raddr;
        wr.wr.atomic.rkey = rkey;
        wr.wr.atomic.compare_add = compare_add;
        wr.wr.atomic.swap = swap;
        break;
    default:
        break;
    }
    return ibv_post_send(qp, &wr, &bad);
}

int uxv_post_recv(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len,
                  uint32_t lkey)
{
    struct ibv_sge sge;
    struct ibv_recv_wr wr, *bad = NULL;

    sge.addr = addr;
    sge.length = len;
    sge.lkey = lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(qp, &wr, &bad);
}

int uxv_poll(uxv_t *h, uxv_wc_t *out, int n)
{
    int i, got;
    if (n > 32)
        n = 32;
    got = ibv_poll_cq(h->cq, n, h->wc);
    for (i = 0; i < got; i++) {
        out[i].wr_id = h->wc[i].wr_id;
        out[i].status = h->wc[i].status;
        out[i].opcode = h->wc[i].opcode;
        out[i].byte_len = h->wc[i].byte_len;
        out[i].qp_num = h->wc[i].qp_num;
        out[i].vendor_err = h->wc[i].vendor_err;
    }
    return got;
}

int uxv_arm(uxv_t *h)
{
    return ibv_req_notify_cq(h->cq, 0);
}

int uxv_drain_events(uxv_t *h)
{
    struct ibv_cq *cq;
    void *ctx;
    int n = 0;
    while (ibv_get_cq_event(h->channel, &cq, &ctx) == 0)
        n++;
    if (n)
        ibv_ack_cq_events(h->cq, n);
    return n;
}

const char *uxv_wc_status_str(int status)
{
    return ibv_wc_status_str((enum ibv_wc_status)status);
}
