/*
 * bridge.h — the one interface between libucp.so.0 (pure C) and Python.
 *
 * libucp.so.0 carries no reference to the Python C API: it must load into a
 * C program that has no interpreter, and into a Python process whose
 * interpreter it must not duplicate.  So the only code that touches Python
 * is the extension module ucxpy._ucp_bridge (bridge.c), and the two meet
 * through the tables below, exchanged once (attach.c): libucp gets the
 * bridge's operations, the bridge gets libucp's two completion entry points.
 *
 * Python objects travel as opaque `void *` references owned by the bridge:
 * each one returned through an `out` pointer is a new reference, dropped by
 * `release`.  Operations that may complete later take the C request (`req`)
 * and return UCS_OK with `info` filled, UCS_INPROGRESS (the completion comes
 * later through ucxs_core_t.complete, from inside a bridge call), or an
 * error.  Every operation takes and drops the GIL itself, and libucp's lock
 * (try_lock / lock / unlock below).
 */
#ifndef UCXPY_UCP_BRIDGE_H
#define UCXPY_UCP_BRIDGE_H

#include <ucp/api/ucp.h>

#include "../dp/dp.h"

#define UCXS_BRIDGE_ABI 7
#define UCXS_BRIDGE_CAPSULE "ucxpy._ucp_bridge.table"

/* What a worker carried, counted by libucp (the proof-of-use report reads
 * it through the bridge: ucxpy/capi.py). */
typedef struct ucxs_ops {
    uint64_t tag_send, tag_recv, am_send, am_recv, put, get, atomic;
    /* ucp_worker_progress calls that ran Python's progress / the data
     * plane's alone (worker.c) */
    uint64_t progress_py, progress_c;
    /* why those with Python's ran (one reason each, in this order): a frame
     * or request the data plane left to Python, endpoints only Python
     * polls, another thread in Python, a descriptor Python watches, its
     * timer pass; the passes after a send to itself; and the time all of
     * them took (ns), GIL waits included */
    uint64_t py_left, py_poll, py_busy, py_fds, py_timer, py_loopback, py_ns;
    /* passes the worker's timer thread ran (worker.c) */
    uint64_t py_thread;
} ucxs_ops_t;

/* libucp's side: called by the bridge with the GIL held. */
typedef struct ucxs_core {
    /* a pending request is done: queue it for the next ucp_worker_progress */
    void (*complete)(void *req, ucs_status_t status, uint64_t tag, size_t length);
    /* an active message arrived (copies header and data; desc: a rendezvous
     * message's reference, NULL when the data is here) */
    void (*am_arrived)(void *cworker, unsigned id, const void *header, size_t header_length,
                       const void *data, size_t length, void *desc);
    /* a receive libucp posted in the data plane (`r`), which Python's path
     * matched: its C request and the CWorker it belongs to; from now on it
     * completes through `complete` */
    void (*ext_recv)(ucxdp_tag_recv_t *r, void **req, void **worker);
} ucxs_core_t;

/* The bridge's side: every operation libucp needs from the core. */
typedef struct ucxs_bridge {
    int abi;
    /* the process's native data plane (ucxpy._dp's C API), or NULL: libucp
     * runs its stock operations there, without Python (see rma.c) */
    const ucxdp_api_t *dp;
    void (*attach)(const ucxs_core_t *core);
    /* The one lock of libucp's use of the core: every bridge operation holds
     * it while in Python, and libucp holds it around its own data-plane
     * calls, so Python and C never drive one worker at once.  try_lock does
     * not wait (libucp's fast paths: on failure they take the bridge's way,
     * which waits without holding the GIL); lock waits (a thread holding the
     * GIL gives it up while it waits).  Recursive. */
    int (*try_lock)(void);
    void (*lock)(void);
    void (*unlock)(void);
    /* requests the core still runs in Python for libucp (each completes
     * through `complete`): while any, libucp's progress runs Python's */
    const uint64_t *py_pending;
    void (*release)(void *obj);
    /* `prefix`: ucp_config_read's; `modified`: ucp_config_modify's "NAME=VALUE\n" lines */
    ucs_status_t (*context_create)(const char *prefix, const char *modified, void **ctx);
    /* `*dp`: the core worker's data plane, or NULL (UCXPY_FASTPATH=n);
     * `*dp_tag`: libucp may post receives and progress there itself (no
     * tracing, no progress thread) */
    ucs_status_t (*worker_create)(void *ctx, void *cworker, const ucxs_ops_t *ops,
                                  void **worker, void **address, size_t *address_length,
                                  int *oversubscribed, ucxdp_worker_t **dp, int *dp_tag);
    ucs_status_t (*worker_destroy)(void *worker);
    /* `full`: poll every interface, those without endpoints too (libucp's
     * timer pass, when it progressed in C alone for a while); `*wait_ns`:
     * how long it waited for the GIL and the lock */
    unsigned (*progress)(void *worker, int full, uint64_t *wait_ns);
    /* run fn(arg) without holding the GIL (given up if this thread holds
     * it): libucp waits for its timer thread (worker.c) so */
    void (*unblocked)(void (*fn)(void *), void *arg);
    /* whether the interpreter still runs (not yet finalized) */
    int (*alive)(void);
    /* whether the calling thread holds the GIL (a pass of its own waits for
     * nobody then) */
    int (*holds_gil)(void);
    /* this thread has a Python thread state (a Python thread, or the C
     * program's thread that started the interpreter) */
    int (*has_tstate)(void);
    ucs_status_t (*ep_create)(void *worker, const void *address, size_t length, void **ep);
    ucs_status_t (*ep_close)(void *worker, void *ep);
    /* The data plane's view of the connection Endpoint `ep` sends on: `*ref`
     * a new reference keeping it, `*lane` its C lane, `*eager_max` the
     * largest message sent eagerly, `*rndv_max` the largest offered by the
     * data plane's rendezvous (0: none), `*peer` the peer's worker id;
     * `*stream` instead of `*lane` for a tcp connection read and written in
     * C (native/dp/stream.c);
     * UCS_ERR_UNSUPPORTED where there is none (not connected yet, another
     * transport). */
    ucs_status_t (*ep_lane)(void *ep, void **ref, ucxdp_lane_t **lane, ucxdp_stream_t **stream,
                            uint64_t *eager_max, uint64_t *rndv_max, int64_t *peer);
    /* a push into `ep`'s lane found its peer asleep: wake it */
    void (*wake_peer)(void *ep);
    /* the rest of a frame `ep`'s tcp stream took only part of (`length`
     * bytes): queued by the transport before anything else */
    ucs_status_t (*stream_tail)(void *ep, const void *bytes, size_t length);
    ucs_status_t (*flush)(void *worker, void *ep_or_null);
    /* the same without waiting: done now (UCS_OK or an error), or
     * UCS_INPROGRESS with the outcome routed to C request `req` */
    ucs_status_t (*flush_nb)(void *worker, void *ep_or_null, void *req);
    ucs_status_t (*cancel)(void *worker, void *req);
    ucs_status_t (*tag_send)(void *worker, void *ep, const void *buf, size_t length,
                             uint64_t tag, int sync, void *req, ucp_tag_recv_info_t *info);
    ucs_status_t (*tag_recv)(void *worker, void *buf, size_t length, uint64_t tag,
                             uint64_t mask, void *req, ucp_tag_recv_info_t *info);
    /* `r` (posted by libucp) took the unexpected message `u`, whose protocol
     * Python runs (u->user: its Python object): Python delivers it into r's
     * buffer; `u` is freed here */
    ucs_status_t (*tag_recv_taken)(void *worker, ucxdp_worker_t *dp, ucxdp_tag_recv_t *r,
                                   ucxdp_tag_unexp_t *u, void *req, ucp_tag_recv_info_t *info);
    ucs_status_t (*tag_probe)(void *worker, uint64_t tag, uint64_t mask, int remove,
                              ucp_tag_recv_info_t *info, void **message);
    ucs_status_t (*msg_recv)(void *worker, void *buf, size_t length, void *message,
                             void *req, ucp_tag_recv_info_t *info);
    ucs_status_t (*am_handler)(void *worker, unsigned id, int on);
    ucs_status_t (*am_send)(void *worker, void *ep, unsigned id, const void *header,
                            size_t header_length, const void *data, size_t length,
                            void *req, ucp_tag_recv_info_t *info);
    ucs_status_t (*am_recv)(void *worker, void *desc, void *buf, size_t length,
                            void *req, ucp_tag_recv_info_t *info);
    void (*am_drop)(void *desc);
    /* `address` NULL: allocate, at `fixed` when not NULL */
    ucs_status_t (*mem_map)(void *ctx, void *address, size_t length, void *fixed, void **mem,
                            void **address_out);
    ucs_status_t (*mem_unmap)(void *ctx, void *mem);
    ucs_status_t (*rkey_pack)(void *mem, void **buffer, size_t *length);
    /* `*dp`: the key's data-plane key (a mapped region), else NULL; it lives
     * as long as the `*rkey` reference */
    ucs_status_t (*rkey_unpack)(void *ep, const void *buffer, size_t length, void **rkey,
                                const ucxdp_rkey_t **dp);
    ucs_status_t (*rma)(void *worker, void *ep, int put, void *buf, size_t length,
                        uint64_t remote_addr, void *rkey, void *req, ucp_tag_recv_info_t *info);
    /* `op` a ucp_atomic_op_t; `fetch`: the old value comes back as the
     * request's info.sender_tag (else a non-fetching post) */
    ucs_status_t (*atomic)(void *worker, void *ep, ucp_atomic_op_t op, size_t size,
                           uint64_t value, uint64_t compare, uint64_t remote_addr, void *rkey,
                           int fetch, void *req, ucp_tag_recv_info_t *info);
    /* the region of `rkey` mapped here: `*map` a new reference keeping the
     * mapping, `*address` its first byte, `*base` its remote address;
     * UCS_ERR_UNREACHABLE where no memory domain of this process maps it */
    ucs_status_t (*rkey_map)(void *rkey, void **map, void **address, uint64_t *base,
                             size_t *length);
    /* ucp_context_print_info's text (malloc'd, NUL-terminated) */
    ucs_status_t (*context_info)(void *ctx, char **text);
    /* ucp_ep_evaluate_perf: the seconds the endpoint's lane takes to move
     * `size` bytes, by the core's cost model (TransportAttrs.estimate) */
    ucs_status_t (*ep_perf)(void *ep, size_t size, double *seconds);
    /* ucp_worker_arm: arm the worker's wake-ups; `*fds` (malloc'd, `*nfds` of
     * them) the descriptors that become readable once it has work, or
     * `*busy` when it has work now (capi.arm) */
    ucs_status_t (*arm)(void *worker, int **fds, int *nfds, int *busy);
} ucxs_bridge_t;

#endif
