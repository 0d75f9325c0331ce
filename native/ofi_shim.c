/* See ofi_shim.h.  Compiled into ucxpy._ofi by native/build_rdma.py. */
#include "ofi_shim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UXOFI_API FI_VERSION(1, 9)
#define CQ_BATCH 32

struct uxofi {
    struct fi_info    *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep     *ep;
    struct fid_av     *av;
    struct fid_cq     *cq;
    int                wait_fd;
    uint32_t           nslots;
    struct fi_context2 *ctx;
    /* completions read from the CQ but not yet handed out */
    struct fi_cq_data_entry batch[CQ_BATCH];
    char               errmsg[UXOFI_ERRLEN];
};

const char *uxofi_strerror(int err)
{
    return fi_strerror(err < 0 ? -err : err);
}

uint32_t uxofi_version(void)
{
    return fi_version();
}

static struct fi_info *make_hints(const char *provider, const char *domain)
{
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    /* We own a context per operation; offering FI_CONTEXT/2 admits providers
     * that need one (verbs;ofi_rxm, psm2 ...). */
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    /* Frames of one endpoint must arrive in order (the core's FIFO rule). */
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (provider && *provider)
        hints->fabric_attr->prov_name = strdup(provider);
    if (domain && *domain)
        hints->domain_attr->name = strdup(domain);
    return hints;
}

int uxofi_probe(const char *provider, char *out, size_t outlen)
{
    struct fi_info *hints = make_hints(provider, NULL), *info = NULL, *i;
    int rc, n = 0;
    if (!hints)
        return -FI_ENOMEM;
    rc = fi_getinfo(UXOFI_API, NULL, NULL, 0, hints, &info);
    fi_freeinfo(hints);
    if (rc)
        return rc;
    for (i = info; i; i = i->next)
        n++;
    if (out && outlen)
        snprintf(out, outlen, "%s fabric %s domain %s (%d choices)",
                 info->fabric_attr->prov_name, info->fabric_attr->name,
                 info->domain_attr->name, n);
    fi_freeinfo(info);
    return 0;
}

static int fail(char *err, size_t errlen, const char *what, int rc)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %s", what, fi_strerror(rc < 0 ? -rc : rc));
    return rc < 0 ? rc : -rc;
}

int uxofi_open(const char *provider, const char *domain, uint32_t nslots,
               uxofi_t **out, uxofi_attrs_t *attrs, char *err, size_t errlen)
{
    struct fi_info *hints;
    struct fi_cq_attr cq_attr;
    struct fi_av_attr av_attr;
    uxofi_t *h;
    int rc;

    *out = NULL;
    h = calloc(1, sizeof(*h));
    if (!h)
        return fail(err, errlen, "calloc", -FI_ENOMEM);
    h->wait_fd = -1;
    h->nslots = nslots;
    h->ctx = calloc(nslots ? nslots : 1, sizeof(*h->ctx));
    hints = make_hints(provider, domain);
    if (!h->ctx || !hints) {
        fi_freeinfo(hints);
        uxofi_close(h);
        return fail(err, errlen, "calloc", -FI_ENOMEM);
    }
    rc = fi_getinfo(UXOFI_API, NULL, NULL, 0, hints, &h->info);
    fi_freeinfo(hints);
    if (rc) {
        uxofi_close(h);
        return fail(err, errlen, "fi_getinfo", rc);
    }
    rc = fi_fabric(h->info->fabric_attr, &h->fabric, NULL);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_fabric", rc); }
    rc = fi_domain(h->fabric, h->info, &h->domain, NULL);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_domain", rc); }

    memset(&cq_attr, 0, sizeof(cq_attr));
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = h->info->tx_attr->size + h->info->rx_attr->size;
    cq_attr.wait_obj = FI_WAIT_FD;
    rc = fi_cq_open(h->domain, &cq_attr, &h->cq, NULL);
    if (rc) {
        /* some providers (shm) cannot hand out an fd: poll only */
        cq_attr.wait_obj = FI_WAIT_NONE;
        rc = fi_cq_open(h->domain, &cq_attr, &h->cq, NULL);
    } else if (fi_control(&h->cq->fid, FI_GETWAIT, &h->wait_fd) != 0) {
        h->wait_fd = -1;
    }
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_cq_open", rc); }

    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type = h->info->domain_attr->av_type != FI_AV_UNSPEC ?
                   h->info->domain_attr->av_type : FI_AV_MAP;
    rc = fi_av_open(h->domain, &av_attr, &h->av, NULL);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_av_open", rc); }
    rc = fi_endpoint(h->domain, h->info, &h->ep, NULL);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_endpoint", rc); }
    rc = fi_ep_bind(h->ep, &h->av->fid, 0);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_ep_bind(av)", rc); }
    rc = fi_ep_bind(h->ep, &h->cq->fid, FI_TRANSMIT | FI_RECV);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_ep_bind(cq)", rc); }
    rc = fi_enable(h->ep);
    if (rc) { uxofi_close(h); return fail(err, errlen, "fi_enable", rc); }

    memset(attrs, 0, sizeof(*attrs));
    snprintf(attrs->provider, sizeof(attrs->provider), "%s", h->info->fabric_attr->prov_name);
    snprintf(attrs->fabric, sizeof(attrs->fabric), "%s", h->info->fabric_attr->name);
    snprintf(attrs->domain, sizeof(attrs->domain), "%s", h->info->domain_attr->name);
    attrs->caps = h->info->caps;
    attrs->mode = h->info->mode;
    attrs->mr_mode = (uint64_t)h->info->domain_attr->mr_mode;
    attrs->mr_key_size = h->info->domain_attr->mr_key_size;
    attrs->max_msg_size = h->info->ep_attr->max_msg_size;
    attrs->inject_size = h->info->tx_attr->inject_size;
    attrs->tx_size = h->info->tx_attr->size;
    attrs->rx_size = h->info->rx_attr->size;
    attrs->msg_order = h->info->tx_attr->msg_order;
    attrs->api_version = fi_version();
    attrs->wait_fd = h->wait_fd;
    *out = h;
    return 0;
}

void uxofi_close_ep(uxofi_t *h)
{
    if (h && h->ep) {
        fi_close(&h->ep->fid);
        h->ep = NULL;
    }
}

void uxofi_close(uxofi_t *h)
{
    if (!h)
        return;
    uxofi_close_ep(h);
    if (h->av)
        fi_close(&h->av->fid);
    if (h->cq)
        fi_close(&h->cq->fid);
    if (h->domain)
        fi_close(&h->domain->fid);
    if (h->fabric)
        fi_close(&h->fabric->fid);
    if (h->info)
        fi_freeinfo(h->info);
    free(h->ctx);
    free(h);
}

int uxofi_getname(uxofi_t *h, void *addr, size_t *addrlen)
{
    return fi_getname(&h->ep->fid, addr, addrlen);
}

int uxofi_av_insert(uxofi_t *h, const void *addr, uint64_t *fi_addr)
{
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    int n = fi_av_insert(h->av, addr, 1, &a, 0, NULL);
    if (n != 1)
        return n < 0 ? n : -FI_EINVAL;
    *fi_addr = a;
    return 0;
}

int uxofi_av_remove(uxofi_t *h, uint64_t fi_addr)
{
    fi_addr_t a = fi_addr;
    return fi_av_remove(h->av, &a, 1, 0);
}

int uxofi_mr_reg(uxofi_t *h, void *buf, size_t len, uint64_t access,
                 uint64_t requested_key, struct fid_mr **mr, uint64_t *key,
                 void **desc)
{
    int rc = fi_mr_reg(h->domain, buf, len, access, 0, requested_key, 0, mr, NULL);
    if (rc)
        return rc;
    if (h->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        rc = fi_mr_bind(*mr, &h->ep->fid, 0);
        if (!rc)
            rc = fi_mr_enable(*mr);
        if (rc) {
            fi_close(&(*mr)->fid);
            *mr = NULL;
            return rc;
        }
    }
    *key = fi_mr_key(*mr);
    if (*key == FI_KEY_NOTAVAIL) {
        fi_close(&(*mr)->fid);
        *mr = NULL;
        return -FI_ENOKEY;
    }
    *desc = fi_mr_desc(*mr);
    return 0;
}

int uxofi_mr_close(struct fid_mr *mr)
{
    return mr ? fi_close(&mr->fid) : 0;
}

static void *slot_ctx(uxofi_t *h, uint32_t slot)
{
    return slot < h->nslots ? (void *)&h->ctx[slot] : NULL;
}

ssize_t uxofi_send(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                   void *desc, uint64_t dest)
{
    if (slot >= h->nslots)
        return -FI_EINVAL;
    return fi_send(h->ep, buf, len, desc, dest, slot_ctx(h, slot));
}

ssize_t uxofi_inject(uxofi_t *h, const void *buf, size_t len, uint64_t dest)
{
    return fi_inject(h->ep, buf, len, dest);
}

ssize_t uxofi_recv(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc)
{
    if (slot >= h->nslots)
        return -FI_EINVAL;
    return fi_recv(h->ep, buf, len, desc, FI_ADDR_UNSPEC, slot_ctx(h, slot));
}

ssize_t uxofi_read(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc,
                   uint64_t src, uint64_t addr, uint64_t key)
{
    if (slot >= h->nslots)
        return -FI_EINVAL;
    return fi_read(h->ep, buf, len, desc, src, addr, key, slot_ctx(h, slot));
}

ssize_t uxofi_write(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                    void *desc, uint64_t dest, uint64_t addr, uint64_t key)
{
    struct iovec iov;
    struct fi_rma_iov rma;
    struct fi_msg_rma msg;

    if (slot >= h->nslots)
        return -FI_EINVAL;
    /* A put completes when its data is visible at the target, not when it
     * left our buffer (the default, transmit-complete, on ofi_rxm). */
    iov.iov_base = (void *)buf;
    iov.iov_len = len;
    rma.addr = addr;
    rma.len = len;
    rma.key = key;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = slot_ctx(h, slot);
    return fi_writemsg(h->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
}

static uint32_t ctx_slot(uxofi_t *h, void *ctx)
{
    struct fi_context2 *c = ctx;
    if (!c || c < h->ctx || c >= h->ctx + h->nslots)
        return UXOFI_NO_SLOT;
    return (uint32_t)(c - h->ctx);
}

int uxofi_poll(uxofi_t *h, uxofi_comp_t *out, int n)
{
    int i, total = 0;
    while (total < n) {
        int want = n - total < CQ_BATCH ? n - total : CQ_BATCH;
        ssize_t got = fi_cq_read(h->cq, h->batch, want);
        if (got == -FI_EAGAIN)
            break;
        if (got == -FI_EAVAIL) {
            struct fi_cq_err_entry e;
            memset(&e, 0, sizeof(e));
            got = fi_cq_readerr(h->cq, &e, 0);
            if (got == -FI_EAGAIN)
                break;
            if (got < 0)
                return total ? total : (int)got;
            out[total].slot = ctx_slot(h, e.op_context);
            out[total].err = e.err ? e.err : FI_EOTHER;
            out[total].prov_errno = e.prov_errno;
            out[total].flags = e.flags;
            out[total].len = e.len;
            snprintf(h->errmsg, sizeof(h->errmsg), "%s (provider: %s)",
                     fi_strerror(out[total].err),
                     fi_cq_strerror(h->cq, e.prov_errno, e.err_data, NULL, 0));
            total++;
            continue;
        }
        if (got < 0)
            return total ? total : (int)got;
        for (i = 0; i < got; i++, total++) {
            out[total].slot = ctx_slot(h, h->batch[i].op_context);
            out[total].err = 0;
            out[total].prov_errno = 0;
            out[total].flags = h->batch[i].flags;
            out[total].len = h->batch[i].len;
        }
        if (got < want)
            break;
    }
    return total;
}

const char *uxofi_last_error(uxofi_t *h)
{
    return h->errmsg;
}

int uxofi_trywait(uxofi_t *h)
{
    struct fid *fids[1];
    if (h->wait_fd < 0)
        return 0;
    fids[0] = &h->cq->fid;
    return fi_trywait(h->fabric, fids, 1) == 0;
}
