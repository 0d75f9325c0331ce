/* ucxpy's libfabric shim: one RDM endpoint with its fabric, domain, address
 * vector and completion queue behind an opaque handle.
 *
 * libfabric's data-path calls (fi_send, fi_read, fi_cq_read, ...) are static
 * inline functions dispatching through ops tables, so Python cannot call them
 * through a shared library; these thin wrappers are compiled into
 * ucxpy._ofi by native/build_rdma.py.  Operation contexts are slots of an
 * array owned by the handle: Python names an operation by its slot number and
 * gets that number back in the completion, never a pointer.
 */
#ifndef UCXPY_OFI_SHIM_H
#define UCXPY_OFI_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define UXOFI_NO_SLOT 0xFFFFFFFFu
#define UXOFI_ERRLEN 256

/* What the opened endpoint offers: filled by uxofi_open. */
typedef struct uxofi_attrs {
    char     provider[64];
    char     fabric[128];
    char     domain[128];
    uint64_t caps;
    uint64_t mode;
    uint64_t mr_mode;
    uint64_t mr_key_size;
    uint64_t max_msg_size;
    uint64_t inject_size;
    uint64_t tx_size;
    uint64_t rx_size;
    uint64_t msg_order;
    uint32_t api_version;
    int      wait_fd;           /* -1: the CQ cannot be waited on with an fd */
} uxofi_attrs_t;

/* One completion, success or error. */
typedef struct uxofi_comp {
    uint32_t slot;              /* UXOFI_NO_SLOT if the provider gave no context */
    int32_t  err;               /* 0 or a positive FI_E* / errno value */
    int32_t  prov_errno;
    uint32_t pad;
    uint64_t flags;             /* FI_SEND, FI_RECV, FI_READ, FI_WRITE, ... */
    uint64_t len;
} uxofi_comp_t;

typedef struct uxofi uxofi_t;

const char *uxofi_strerror(int err);
uint32_t    uxofi_version(void);

/* fi_getinfo only: 0 and a one-line description in `out`, or -FI_E* */
int  uxofi_probe(const char *provider, char *out, size_t outlen);

/* Open fabric/domain/endpoint/AV/CQ for `provider` ("tcp;ofi_rxm", "shm"...)
 * with `nslots` operation contexts.  `domain` may be NULL or "" for the first
 * domain the provider lists.  Returns 0 or -FI_E*; on error `err` says where. */
int  uxofi_open(const char *provider, const char *domain, uint32_t nslots,
                uxofi_t **out, uxofi_attrs_t *attrs, char *err, size_t errlen);
/* Close the endpoint only (cancels posted operations): then the caller
 * closes its memory registrations, then uxofi_close releases the rest. */
void uxofi_close_ep(uxofi_t *h);
void uxofi_close(uxofi_t *h);

int  uxofi_getname(uxofi_t *h, void *addr, size_t *addrlen);
int  uxofi_av_insert(uxofi_t *h, const void *addr, uint64_t *fi_addr);
int  uxofi_av_remove(uxofi_t *h, uint64_t fi_addr);

/* Registration: `requested_key` is used unless the provider picks keys
 * (FI_MR_PROV_KEY).  Binds to the endpoint when FI_MR_ENDPOINT is required. */
int  uxofi_mr_reg(uxofi_t *h, void *buf, size_t len, uint64_t access,
                  uint64_t requested_key, struct fid_mr **mr, uint64_t *key,
                  void **desc);
int  uxofi_mr_close(struct fid_mr *mr);

/* Data path: 0, -FI_EAGAIN (retry after reading the CQ) or -FI_E*. */
ssize_t uxofi_send(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                   void *desc, uint64_t dest);
ssize_t uxofi_inject(uxofi_t *h, const void *buf, size_t len, uint64_t dest);
ssize_t uxofi_recv(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc);
ssize_t uxofi_read(uxofi_t *h, uint32_t slot, void *buf, size_t len, void *desc,
                   uint64_t src, uint64_t addr, uint64_t key);
ssize_t uxofi_write(uxofi_t *h, uint32_t slot, const void *buf, size_t len,
                    void *desc, uint64_t dest, uint64_t addr, uint64_t key);

/* Up to `n` completions into `out`; returns how many (0: none), or -FI_E*.
 * Error completions are returned in order with `err` set. */
int  uxofi_poll(uxofi_t *h, uxofi_comp_t *out, int n);
/* Last error completion's provider message (valid until the next poll). */
const char *uxofi_last_error(uxofi_t *h);

/* 1 if the caller may sleep on attrs.wait_fd now, 0 if work is pending. */
int  uxofi_trywait(uxofi_t *h);

#endif
