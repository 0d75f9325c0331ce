/*
 * shim.h — what the files of libucp.so.0 share: the handles' structs, the
 * request layout, the completion queue, and the internal helpers.
 *
 * Internal names start with ucxs_; only ucp_* and ucs_* are exported
 * (libucp.map).  Every exported function checks its arguments, then goes to
 * the core through the bridge (bridge.h); an error is logged once, where it
 * is detected (ucxs_error), and returned as a ucs_status_t.
 */
#ifndef UCXPY_UCP_SHIM_H
#define UCXPY_UCP_SHIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "bridge.h"

/* UCP API versions this library implements (callers may be 1.13 .. 1.20) */
#define UCXS_API_MAJOR 1
#define UCXS_API_MINOR 20
/* Callers built against later headers, up to this minor, are accepted too
 * (NIXL's wheel bundles UCX 1.23): UCP's parameter structures only grow at
 * their ends, each field named by a field-mask bit, and this library reads
 * the fields of the bits it knows (a bit it does not know asks for
 * something it does not do: ignored, as by an older UCX). */
#define UCXS_API_MINOR_ACCEPTED 23

/* the bridge, once attached (attach.c); NULL until ucp_init */
extern const ucxs_bridge_t *ucxs_py;
ucs_status_t ucxs_attach(void);
/* free what persistent active-message handlers kept (am.c) */
void ucxs_am_kept_free(ucp_worker_h worker);
/* the process is a Python program (libucp attached to its interpreter),
 * not a C program whose interpreter libucp started */
extern int ucxs_python_host;

/* A thread of a Python program's C code (no Python thread state: NIXL's
 * progress thread): it never waits for the GIL, which a Python thread may
 * hold while it waits for this thread (joining it). */
static inline int ucxs_foreign(void)
{
    return ucxs_python_host && !ucxs_py->has_tstate();
}

void ucxs_error(const char *entry, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
_Noreturn void ucxs_fatal(const char *entry, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* -- events: what ucp_worker_progress dispatches, in arrival order ------- */
typedef enum { UCXS_EV_REQUEST, UCXS_EV_AM } ucxs_event_type_t;

typedef struct ucxs_event {
    struct ucxs_event *next;
    ucxs_event_type_t type;
} ucxs_event_t;

/* -- handles -------------------------------------------------------------- */
/* ucp_config_read's prefix and what ucp_config_modify set, "NAME=VALUE\n"
 * lines: the core maps UCX's names to its own at ucp_init (ucxpy/tools/ucxvars.py) */
struct ucp_config {
    char *prefix;
    char *modified;
    size_t length;
};

typedef struct ucxs_req ucxs_req_t;

struct ucp_context {
    void *py;                              /* CContext */
    uint64_t features;
    size_t user_size;                      /* params->request_size */
    ucp_request_init_callback_t init;
    ucp_request_cleanup_callback_t cleanup;
    pthread_mutex_t pool_lock;
    ucxs_req_t *pool;                      /* free requests, initialized once */
};

typedef struct {
    int is_nbx;                            /* set_am_recv_handler, or set_am_handler */
    void *cb;
    void *arg;
    uint32_t flags;
} ucxs_am_slot_t;

#define UCXS_AM_IDS 65536

struct ucp_worker {
    ucp_context_h context;
    void *py;                              /* CWorker */
    ucxdp_worker_t *dp;                    /* its core worker's data plane, or NULL */
    void *address;                         /* packed, malloc'd */
    size_t address_length;
    pthread_mutex_t lock;                  /* the event queue */
    ucxs_event_t *head, *tail;
    unsigned queued;                       /* events in the queue (read without the lock) */
    ucxs_am_slot_t *am;                    /* UCXS_AM_IDS slots, made on first use */
    struct ucxs_am_kept *am_kept;          /* data persistent handlers kept (am.c) */
    ucxs_ops_t ops;                        /* operations posted (proof of use) */
    int oversubscribed;                    /* more local ranks than CPUs */
    uint64_t rma_in_flight;                /* RMA/atomics not done within their call,
                                              since the last worker flush (ucxs_rma_posted) */
    unsigned idle;                         /* progress calls in a row that found nothing */
    unsigned loopback_done;                /* sends to itself completed this progress call */
    int dp_tag;                            /* receives posted and progressed in the data
                                              plane (tag.c, worker.c) */
    uint64_t py_last;                      /* when progress last ran Python's (ns) */
    uint64_t py_every;                     /* its timer pass's interval now (ns) */
    unsigned tick;                         /* C-only progress calls (worker.c) */
    uint64_t fds_last;                     /* when they last polled Python's descriptors */
    struct ucxs_timer *timer;              /* the thread running those timer passes, once
                                              one waited for the GIL (worker.c), or NULL */
    uint64_t timer_seen;                   /* its passes whose completions progress took */
    int dp_owed;                           /* ucxs_dp_done could not take the lock (a foreign
                                              thread's call): the next progress call takes it */
    int efd;                               /* ucp_worker_get_efd's epoll descriptor, or -1 */
    int *efd_fds;                          /* what the last ucp_worker_arm put in it */
    int efd_nfds;
    int efd_external;                      /* efd is the caller's (UCP_WORKER_PARAM_FIELD_EVENT_FD) */
    int evfd;                              /* an eventfd always in efd's set: ucp_worker_signal,
                                              and an arm pass of the timer thread that found
                                              work; -1 until ucp_worker_get_efd / arm */
};

/* A worker address (ucp_address_t): a 32-bit length, then the core's packed
 * WorkerAddress. */
#define UCXS_ADDRESS_HEADER 8

static inline size_t ucxs_address_size(const ucp_address_t *address)
{
    uint32_t n;
    __builtin_memcpy(&n, address, sizeof(n));
    return n;
}

static inline const void *ucxs_address_bytes(const ucp_address_t *address)
{
    return (const char *)address + UCXS_ADDRESS_HEADER;
}

struct ucp_ep {
    ucp_worker_h worker;
    void *py;                              /* ucxpy.Endpoint */
    int loopback;                          /* to its own worker (tag.c: as UCX's self) */
    /* the data plane's view of the connection it sends on (tag.c), or NULL */
    ucxdp_lane_t *lane;
    ucxdp_stream_t *stream;                /* or a tcp connection's, written in C (tag.c) */
    void *lane_ref;                        /* the bridge's reference keeping it */
    uint64_t eager_max;                    /* the largest eager message */
    uint64_t rndv_max;                     /* the largest offered in C (0: none; tag.c) */
    int64_t peer;                          /* its peer's worker id (the data plane's key) */
    unsigned lane_asks;                    /* times the bridge found none */
};

struct ucp_mem {
    ucp_context_h context;
    void *py;                              /* ucxpy.rma.MemHandle */
    void *address;
    size_t length;
};

struct ucp_rkey {
    void *py;                              /* ucxpy.rma.RemoteKey */
    const ucxdp_rkey_t *dp;                /* its data-plane key (kept by py), or NULL */
    void *map;                             /* ucp_rkey_ptr's mapping (a reference), or NULL */
    char *mapped;                          /* its first byte here */
    uint64_t base;                         /* the region's remote address */
    size_t length;
};

struct ucp_recv_desc {                     /* a probed message (ucp_tag_message_h) */
    void *py;                              /* ucxpy.TagMessage */
};

/* -- datatypes (datatype.c) ------------------------------------------------ */
/* Where a request's bytes are while the core moves them: the caller's
 * buffer itself (contiguous), or a bounce buffer to scatter / unpack into
 * the caller's layout when a receive completes (iov, generic), or to free
 * when a send completes. */
typedef struct {
    ucp_datatype_t datatype;
    void *user;                            /* the caller's buffer (receives) */
    size_t count;
    void *bounce;                          /* malloc'd, or NULL */
    size_t length;                         /* bytes at the data pointer */
} ucxs_dt_t;

ucs_status_t ucxs_dt_send(ucp_datatype_t dt, const void *buf, size_t count,
                          ucxs_dt_t *st, const void **data);
ucs_status_t ucxs_dt_recv(ucp_datatype_t dt, void *buf, size_t count,
                          ucxs_dt_t *st, void **data);
/* After the core finished: a receive unpacks `received` bytes; both free. */
ucs_status_t ucxs_dt_finish(ucxs_dt_t *st, int is_recv, ucs_status_t status, size_t received);
ucp_datatype_t ucxs_param_datatype(const ucp_request_param_t *param);

/* -- requests (request.c) --------------------------------------------------- */
typedef enum {
    UCXS_CB_NONE,
    UCXS_CB_SEND,                          /* ucp_send_nbx_callback_t */
    UCXS_CB_SEND_OLD,                      /* ucp_send_callback_t */
    UCXS_CB_TAG_RECV,                      /* ucp_tag_recv_nbx_callback_t */
    UCXS_CB_AM_RECV,                       /* ucp_am_recv_data_nbx_callback_t */
} ucxs_cb_kind_t;

enum {
    UCXS_REQ_COMPLETED = 1,
    UCXS_REQ_RELEASED = 2,                 /* freed by the caller before completion */
    UCXS_REQ_CALLER_MEMORY = 4,            /* UCP_OP_ATTR_FIELD_REQUEST: not ours to pool */
    UCXS_REQ_RECV = 8,                     /* ucxs_dt_finish unpacks */
    UCXS_REQ_AM = 16,                      /* recv_info is a length, not a tag_info */
    UCXS_REQ_FETCH = 32,                   /* an atomic's old value (info.sender_tag) to `reply` */
    UCXS_REQ_LOOPBACK = 64,                /* a send to its own worker (tag.c) */
    UCXS_REQ_DP = 128,                     /* a receive posted in the data plane (`dtr`) */
    UCXS_REQ_DP_SEND = 256,                /* a rendezvous offered by the data plane (`dts`) */
};

struct ucxs_req {
    ucxs_event_t ev;                       /* first: queued as an event */
    ucp_worker_h worker;
    uint32_t flags;
    ucxs_cb_kind_t kind;
    ucs_status_t status;
    ucp_tag_recv_info_t info;
    void *cb;
    void *user_data;
    ucxs_dt_t dt;
    void *reply;                           /* UCXS_REQ_FETCH: reply_size bytes */
    size_t reply_size;
    ucxs_req_t *next_free;
    ucxdp_tag_recv_t dtr;                  /* UCXS_REQ_DP: the data plane's receive */
    ucxdp_rndv_send_t dts;                 /* UCXS_REQ_DP_SEND: its rendezvous send */
};

/* The caller's area follows our header, 16-byte aligned; a request handle is
 * the address of that area (UCP: the caller's request_size bytes). */
#define UCXS_REQ_HEADER ((sizeof(ucxs_req_t) + 15) & ~(size_t)15)

static inline void *ucxs_req_handle(ucxs_req_t *req)
{
    return (char *)req + UCXS_REQ_HEADER;
}

static inline ucxs_req_t *ucxs_req_of(void *handle)
{
    return (ucxs_req_t *)((char *)handle - UCXS_REQ_HEADER);
}

/* A request for an operation of `worker` taking `param` (the caller's
 * memory when it gives some); NULL with the error logged. */
ucxs_req_t *ucxs_req_new(ucp_worker_h worker, const ucp_request_param_t *param,
                         ucxs_cb_kind_t kind, const char *entry);
ucxs_req_t *ucxs_req_new_old(ucp_worker_h worker, ucp_send_callback_t cb, const char *entry);
/* Return what a ucp_*_nb(x) call gives its caller after the bridge answered
 * `status` for `req`: NULL / an error pointer (done now, request freed), or
 * the request handle (completion from a later progress). */
ucs_status_ptr_t ucxs_req_posted(ucxs_req_t *req, ucs_status_t status,
                                 const ucp_request_param_t *param);
void ucxs_req_put(ucxs_req_t *req);
void ucxs_pool_destroy(ucp_context_h context);

/* -- the data plane (dp.h) ------------------------------------------------------ */
/* Its status values are UCS's: a status passes between the two as it is. */
_Static_assert(UCXDP_OK == (int)UCS_OK && UCXDP_INPROGRESS == (int)UCS_INPROGRESS
               && UCXDP_ERR_NO_MEMORY == (int)UCS_ERR_NO_MEMORY
               && UCXDP_ERR_INVALID_PARAM == (int)UCS_ERR_INVALID_PARAM
               && UCXDP_ERR_INVALID_ADDR == (int)UCS_ERR_INVALID_ADDR
               && UCXDP_ERR_OUT_OF_RANGE == (int)UCS_ERR_OUT_OF_RANGE
               && UCXDP_ERR_NO_RESOURCE == (int)UCS_ERR_NO_RESOURCE,
               "the data plane's status values are UCS's");

/* The data plane runs a put/get (`put`) or an atomic for `ep` through `rkey`
 * when both have one: UCS_OK done; else nothing was done (no data plane, or
 * it declined: the bridge's path then does it or says why). */
static inline ucs_status_t ucxs_dp_rma(ucp_ep_h ep, int put, void *buffer, size_t length,
                                       uint64_t remote_addr, ucp_rkey_h rkey)
{
    ucxdp_worker_t *dp = ep->worker->dp;

    if (dp == NULL || rkey->dp == NULL)
        return UCS_ERR_UNSUPPORTED;
    return (ucs_status_t)(put ? ucxs_py->dp->put(dp, rkey->dp, remote_addr, buffer, length)
                              : ucxs_py->dp->get(dp, rkey->dp, remote_addr, buffer, length));
}

/* An operation done within its call needs no request unless the caller
 * gives its own or wants one whatever happens. */
static inline int ucxs_needs_request(const ucp_request_param_t *param)
{
    return param != NULL
        && (param->op_attr_mask & (UCP_OP_ATTR_FLAG_NO_IMM_CMPL | UCP_OP_ATTR_FIELD_REQUEST));
}

/* -- RMA bookkeeping (worker.c) ----------------------------------------------- */
/* The bridge answered `status` for an RMA or atomic operation of `worker`:
 * one not done within its call is in flight until a flush (returns status). */
static inline ucs_status_t ucxs_rma_posted(ucp_worker_h worker, ucs_status_t status)
{
    if (status == UCS_INPROGRESS)          /* (threads may post while another flushes) */
        __atomic_fetch_add(&worker->rma_in_flight, 1, __ATOMIC_RELAXED);
    return status;
}

/* A flush of `worker` (ep NULL) or of one endpoint: at once when no RMA or
 * atomic is in flight (UCP's flush covers those), else the core's. */
ucs_status_t ucxs_flush(ucp_worker_h worker, ucp_ep_h ep);
ucs_status_ptr_t ucxs_flush_nbx(ucp_worker_h w, ucp_ep_h ep, const ucp_request_param_t *param,
                                const char *entry);

/* -- the event queue (worker.c) ----------------------------------------------- */
void ucxs_queue_push(ucp_worker_h worker, ucxs_event_t *ev);
/* Take `ev` out of the queue if it is there (1), for dispatch now. */
int ucxs_queue_take(ucp_worker_h worker, ucxs_event_t *ev);
/* Dispatch what is queued now, except `keep` (left queued for progress). */
void ucxs_dispatch_except(ucp_worker_h worker, ucxs_event_t *keep);
void ucxs_req_dispatch(ucxs_req_t *req);          /* request.c */
void ucxs_am_dispatch(ucp_worker_h worker, ucxs_event_t *ev);   /* am.c */
void ucxs_core_complete(void *req, ucs_status_t status, uint64_t tag, size_t length);
void ucxs_core_ext_recv(ucxdp_tag_recv_t *r, void **req, void **cworker);
/* Complete libucp's receives the data plane matched (its done list): how
 * many were queued for dispatch (request.c). */
unsigned ucxs_dp_done(ucp_worker_h worker);
void ucxs_core_am_arrived(void *cworker, unsigned id, const void *header,
                          size_t header_length, const void *data, size_t length, void *desc);
/* The data plane's hook for the eager active messages of ids this worker's
 * handlers claimed (am.c; `arg` the ucp_worker_h). */
void ucxs_dp_am_arrived(void *arg, int64_t source, unsigned id, const void *header,
                        uint64_t header_length, const void *data, uint64_t length);
/* After a send the core made: the data plane's lane to send by from now on,
 * if there is one (tag.c). */
void ucxs_find_lane(ucp_ep_h ep);
/* After a push into `ep`'s lane under the bridge's lock (held): let it go;
 * 1 when the push took (status `st`), its peer woken if it sleeps (`wake`),
 * else 0 (the core's way) (tag.c). */
int ucxs_dp_pushed(ucp_ep_h ep, ucxdp_status_t st, int wake);
int ucxs_dp_streamed(const char *entry, ucp_ep_h ep, ucxdp_status_t st, uint64_t rest,
                     const uint8_t *head, size_t head_length, const void *data, size_t length);

#endif
