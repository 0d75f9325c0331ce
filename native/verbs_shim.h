/* ucxpy's libibverbs shim: device/port discovery, RC queue pairs, memory
 * registration, work requests and completion polling with flat arguments.
 *
 * Work-request and QP-attribute structures of verbs.h hold nested unions
 * that cffi's cdef cannot describe partially; these helpers take scalar
 * arguments instead and fill the structures in C.  ibv_post_send,
 * ibv_poll_cq, ibv_req_notify_cq and ibv_query_port are static inline (or
 * macros) in rdma-core, so they must be called from compiled code anyway.
 * The QP state machine itself (which attributes each transition sets) lives
 * in Python (ucxpy/transports/verbs.py): uxv_qp_modify applies one mask.
 */
#ifndef UCXPY_VERBS_SHIM_H
#define UCXPY_VERBS_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#define UXV_ERRLEN 256

typedef struct uxv_attrs {
    char     device[64];
    uint64_t node_guid;
    uint8_t  port;
    uint8_t  port_state;       /* enum ibv_port_state */
    uint8_t  link_layer;       /* IBV_LINK_LAYER_* */
    uint8_t  gid_index;
    uint16_t lid;
    uint16_t pad;
    uint32_t active_mtu;       /* enum ibv_mtu */
    uint32_t max_msg_sz;
    uint8_t  gid[16];
    int      atomic_cap;       /* enum ibv_atomic_cap */
    int      max_qp_wr;
    int      max_qp_rd_atom;
    int      max_qp_init_rd_atom;
    int      comp_fd;          /* completion channel fd (readable on CQ events) */
} uxv_attrs_t;

/* Everything any QP transition may set; uxv_qp_modify uses what `mask` names. */
typedef struct uxv_qp_params {
    int      qp_state;         /* enum ibv_qp_state */
    int      access;           /* IBV_ACCESS_* */
    uint16_t pkey_index;
    uint8_t  port;
    uint8_t  is_global;        /* RoCE and routed IB need the GRH */
    int      path_mtu;         /* enum ibv_mtu */
    uint32_t dest_qpn;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint16_t dlid;
    uint8_t  sl;
    uint8_t  sgid_index;
    uint8_t  hop_limit;
    uint8_t  max_dest_rd_atomic;
    uint8_t  max_rd_atomic;
    uint8_t  min_rnr_timer;
    uint8_t  timeout;
    uint8_t  retry_cnt;
    uint8_t  rnr_retry;
    uint8_t  dgid[16];
} uxv_qp_params_t;

typedef struct uxv_wc {
    uint64_t wr_id;
    int      status;           /* enum ibv_wc_status */
    int      opcode;           /* enum ibv_wc_opcode */
    uint32_t byte_len;
    uint32_t qp_num;
    uint32_t vendor_err;
} uxv_wc_t;

typedef struct uxv uxv_t;

/* Number of devices (0 here without RDMA hardware), names comma-separated
 * into `names`; -errno if the device list cannot be read. */
int  uxv_device_count(char *names, size_t len);

int  uxv_open(const char *device, int port, int gid_index, int cq_size,
              uxv_t **out, uxv_attrs_t *attrs, char *err, size_t errlen);
void uxv_close(uxv_t *h);

struct ibv_qp *uxv_qp_create(uxv_t *h, uint32_t max_send_wr, uint32_t max_recv_wr,
                             uint32_t max_inline, uint32_t *qp_num);
int  uxv_qp_modify(struct ibv_qp *qp, const uxv_qp_params_t *p, int mask);
int  uxv_qp_destroy(struct ibv_qp *qp);

struct ibv_mr *uxv_reg_mr(uxv_t *h, void *addr, size_t len, int access,
                          uint32_t *lkey, uint32_t *rkey);
int  uxv_dereg_mr(struct ibv_mr *mr);

/* One work request, signaled; `opcode` is enum ibv_wr_opcode.  For atomics
 * `len` must be 8, `compare_add`/`swap` as in ibv_send_wr.wr.atomic. */
int  uxv_post_send(struct ibv_qp *qp, uint64_t wr_id, int opcode, uint64_t laddr,
                   uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap, int send_flags);
int  uxv_post_recv(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr, uint32_t len,
                   uint32_t lkey);
int  uxv_poll(uxv_t *h, uxv_wc_t *out, int n);

/* Arm the CQ's event (before sleeping on comp_fd); drain pending events. */
int  uxv_arm(uxv_t *h);
int  uxv_drain_events(uxv_t *h);

const char *uxv_wc_status_str(int status);

#endif
