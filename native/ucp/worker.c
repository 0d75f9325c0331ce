/*
 * worker.c — workers: explicit progress and the event queue.
 *
 * Entry points: ucp_worker_create, ucp_worker_destroy, ucp_worker_get_address,
 * ucp_worker_release_address, ucp_worker_query, ucp_worker_progress,
 * ucp_worker_flush_nb, ucp_worker_fence.
 *
 * Theory of operation.  Each worker is a core Worker (a CWorker on the Python
 * side).  Everything the core finishes — a request's completion, an active
 * message's arrival — is pushed on the worker's event queue by the bridge,
 * whichever call was running (ucxs_queue_push, under the worker's mutex).
 * ucp_worker_progress advances the core once (one bridge call), then
 * dispatches the queue in order, outside the GIL: that is the only place a
 * caller's callback runs, so a callback may call the library again (it
 * only appends to the queue, which this progress pass keeps draining).
 * On a host with more of the job's ranks than CPUs, a run of idle progress
 * calls yields the CPU (capi.oversubscribed), as the core's own waits do.
 *
 * With the data plane (w->dp_tag), progress is C first: the shm inbox's
 * eager messages are matched and libucp's receives completed there
 * (dp_progress), and Python's progress runs only when it has something to
 * do: a frame the data plane left for it, a producer to wake, a request
 * still running in Python, work Python polls beyond the inbox (another
 * transport's endpoints: py_poll), and otherwise at most once per
 * PY_EVERY_NS of calls (its timers: liveness, connection requests, which
 * that pass polls on every interface).  A steady-state exchange of eager
 * messages between same-host ranks then enters Python about once a
 * millisecond, whatever its rate.
 * A flush covers RMA and atomics (UCP's contract): it returns at once when
 * every one since the last worker flush was done within its call
 * (rma_in_flight, counted by rma.c and atomic.c), else the core flushes.
 */
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

#define MAX_AM_HEADER 512   /* within the core's limit for a user header */
#define LOOPBACK_PASSES 2   /* more core passes after a send to itself completed */
#define PY_EVERY_NS 1000000ULL  /* Python's progress at least this often, while called, */
#define PY_EVERY_MAX_NS 100000000ULL    /* or as rarely as this while the GIL is contended */
#define PY_SLOW_NS 200000ULL    /* a timer pass this long waited for the GIL */
#define CLOCK_EVERY 16      /* C-only progress calls between looks at the clock */
#define FDS_EVERY_NS 50000ULL   /* between polls of Python's descriptors (a syscall) */
#define DP_BATCH 64         /* inbox frames per progress call */

void ucxs_queue_push(ucp_worker_h worker, ucxs_event_t *ev)
{
    ev->next = NULL;
    pthread_mutex_lock(&worker->lock);
    if (worker->tail != NULL)
        worker->tail->next = ev;
    else
        worker->head = ev;
    worker->tail = ev;
    __atomic_fetch_add(&worker->queued, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&worker->lock);
}

int ucxs_queue_take(ucp_worker_h worker, ucxs_event_t *ev)
{
    ucxs_event_t **p, *prev = NULL;
    int found = 0;
    pthread_mutex_lock(&worker->lock);
    for (p = &worker->head; *p != NULL; prev = *p, p = &(*p)->next) {
        if (*p == ev) {
            *p = ev->next;
            if (worker->tail == ev)
                worker->tail = prev;
            __atomic_fetch_sub(&worker->queued, 1, __ATOMIC_RELAXED);
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&worker->lock);
    return found;
}

static ucxs_event_t *queue_pop(ucp_worker_h worker)
{
    ucxs_event_t *ev;
    /* (most progress calls find nothing: no lock for that) */
    if (__atomic_load_n(&worker->queued, __ATOMIC_ACQUIRE) == 0)
        return NULL;
    pthread_mutex_lock(&worker->lock);
    ev = worker->head;
    if (ev != NULL) {
        worker->head = ev->next;
        if (worker->head == NULL)
            worker->tail = NULL;
        __atomic_fetch_sub(&worker->queued, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&worker->lock);
    return ev;
}

static unsigned dispatch(ucp_worker_h worker)
{
    unsigned n = 0;
    ucxs_event_t *ev;
    while ((ev = queue_pop(worker)) != NULL) {
        if (ev->type == UCXS_EV_REQUEST)
            ucxs_req_dispatch((ucxs_req_t *)ev);
        else
            ucxs_am_dispatch(worker, ev);
        n++;
    }
    return n;
}

void ucxs_dispatch_except(ucp_worker_h worker, ucxs_event_t *keep)
{
    int kept = ucxs_queue_take(worker, keep);
    dispatch(worker);
    if (kept)
        ucxs_queue_push(worker, keep);
}

/* The packed address: its length (the API passes addresses without one),
 * then the core's address. */
static ucs_status_t worker_address(ucp_worker_h w)
{
    void *core_address;
    size_t length;
    ucs_status_t status = ucxs_py->worker_create(w->context->py, w, &w->ops, &w->py,
                                                 &core_address, &length, &w->oversubscribed,
                                                 &w->dp, &w->dp_tag);
    if (status != UCS_OK)
        return status;
    w->address_length = UCXS_ADDRESS_HEADER + length;
    w->address = malloc(w->address_length);
    if (w->address == NULL) {
        free(core_address);
        ucxs_py->worker_destroy(w->py);
        ucxs_py->release(w->py);
        return UCS_ERR_NO_MEMORY;
    }
    uint32_t n = (uint32_t)length;
    memcpy(w->address, &n, sizeof(n));
    memcpy((char *)w->address + UCXS_ADDRESS_HEADER, core_address, length);
    free(core_address);
    return UCS_OK;
}

ucs_status_t ucp_worker_create(ucp_context_h context, const ucp_worker_params_t *params,
                               ucp_worker_h *worker_p)
{
    (void)params;             /* thread mode: the core serializes under the GIL */
    ucs_status_t status;
    ucp_worker_h w = calloc(1, sizeof(*w));
    if (w == NULL)
        return UCS_ERR_NO_MEMORY;
    w->context = context;
    w->py_every = PY_EVERY_NS;
    pthread_mutex_init(&w->lock, NULL);
    status = worker_address(w);
    if (status != UCS_OK) {
        pthread_mutex_destroy(&w->lock);
        free(w);
        return status;
    }
    *worker_p = w;
    return UCS_OK;
}

void ucp_worker_destroy(ucp_worker_h w)
{
    ucxs_event_t *ev;
    ucxs_py->worker_destroy(w->py);
    ucxs_py->release(w->py);
    while ((ev = queue_pop(w)) != NULL) {   /* undelivered: nobody will ask any more */
        if (ev->type == UCXS_EV_REQUEST)
            ucxs_req_put((ucxs_req_t *)ev);
        else
            ucxs_am_dispatch(NULL, ev);      /* frees it */
    }
    pthread_mutex_destroy(&w->lock);
    free(w->am);
    free(w->address);
    free(w);
}

ucs_status_t ucp_worker_get_address(ucp_worker_h w, ucp_address_t **address_p,
                                    size_t *address_length_p)
{
    void *copy = malloc(w->address_length);
    if (copy == NULL)
        return UCS_ERR_NO_MEMORY;
    memcpy(copy, w->address, w->address_length);
    *address_p = copy;
    *address_length_p = w->address_length;
    return UCS_OK;
}

void ucp_worker_release_address(ucp_worker_h w, ucp_address_t *address)
{
    (void)w;
    free(address);
}

ucs_status_t ucp_worker_query(ucp_worker_h w, ucp_worker_attr_t *attr)
{
    if (attr->field_mask & UCP_WORKER_ATTR_FIELD_THREAD_MODE)
        attr->thread_mode = UCS_THREAD_MODE_MULTI;
    if (attr->field_mask & UCP_WORKER_ATTR_FIELD_ADDRESS) {
        ucs_status_t status = ucp_worker_get_address(w, &attr->address, &attr->address_length);
        if (status != UCS_OK)
            return status;
    }
    if (attr->field_mask & UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER)
        attr->max_am_header = MAX_AM_HEADER;
    return UCS_OK;
}

/* Idle progress calls in a row after which an oversubscribed worker gives
 * its CPU away: the caller's loop (MPICH's) would otherwise spin a whole
 * time slice while the rank that can make progress waits for the CPU. */
#define IDLE_YIELD 4

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Whether a descriptor Python's progress watches is readable (a
 * connection request, a control message). */
static int fds_ready(ucp_worker_h w)
{
    struct pollfd p[UCXDP_POLL_FDS];
    int n = w->dp->npoll_fds;

    for (int i = 0; i < n; i++) {
        p[i].fd = w->dp->poll_fds[i];
        p[i].events = POLLIN;
        p[i].revents = 0;
    }
    return n > 0 && poll(p, (nfds_t)n, 0) > 0;
}

/* The data plane's part of a progress call: its inbox, then libucp's
 * receives it completed.  *py: Python's progress has work now. */
static unsigned dp_progress(ucp_worker_h w, int *py)
{
    unsigned flags = 0;
    unsigned n;

    if (!ucxs_py->try_lock()) {            /* another thread is in Python */
        *py = 1;
        return 0;
    }
    n = (unsigned)ucxs_py->dp->inbox_progress(w->dp, DP_BATCH, &flags);
    ucxs_py->unlock();
    if (n != 0)                            /* (frames taken: receives they completed) */
        n += ucxs_dp_done(w);
    *py = flags != 0 || __atomic_load_n(&w->dp->py_poll, __ATOMIC_RELAXED) != 0
        || __atomic_load_n(ucxs_py->py_pending, __ATOMIC_RELAXED) != 0;
    return n;
}

unsigned ucp_worker_progress(ucp_worker_h w)
{
    int full = 0;
    uint64_t now = 0;
    w->loopback_done = 0;
    unsigned n = dispatch(w);               /* what earlier calls queued */
    if (w->dp_tag) {
        int py;

        n += dp_progress(w, &py);
        if (py || ++w->tick % CLOCK_EVERY == 0) {
            now = now_ns();
            full = now - w->py_last >= w->py_every;
            if (!py && !full && now - w->fds_last >= FDS_EVERY_NS) {
                w->fds_last = now;
                py = fds_ready(w);
            }
        }
        if (!py && !full) {
            w->ops.progress_c++;
            n += dispatch(w);
            goto idle;
        }
    }
    w->ops.progress_py++;
    n += ucxs_py->progress(w->py, full);
    if (w->dp_tag) {
        uint64_t end = now_ns();

        /* a timer pass that waited for the GIL (a Python thread of the
         * process holds it) makes the next ones twice as rare, so the C
         * path keeps its pace; a quick one an eighth less rare, so that a
         * holder letting go now and then does not bring them all back */
        if (full && end - now > PY_SLOW_NS)
            w->py_every = w->py_every * 2 < PY_EVERY_MAX_NS ? w->py_every * 2 : PY_EVERY_MAX_NS;
        else if (full)
            w->py_every = w->py_every - w->py_every / 8 > PY_EVERY_NS
                ? w->py_every - w->py_every / 8 : PY_EVERY_NS;
        w->py_last = end;
        n += ucxs_dp_done(w);               /* (Python's inbox pass completes ours too) */
    }
    n += dispatch(w);
    /* a send to this worker itself completed: the core completes the receive
     * it matched a pass later (its data follows the match); as with UCX's
     * self transport, the caller sees both from this call (Open MPI's
     * Testsome right after a synchronous send to self) */
    for (int pass = 0; w->loopback_done && pass < LOOPBACK_PASSES; pass++) {
        w->loopback_done = 0;
        n += ucxs_py->progress(w->py, 0);
        if (w->dp_tag)
            n += ucxs_dp_done(w);
        n += dispatch(w);
    }
idle:
    if (n != 0)
        w->idle = 0;
    else if (w->oversubscribed && ++w->idle >= IDLE_YIELD) {
        w->idle = 0;
        sched_yield();
    }
    return n;
}

ucs_status_t ucxs_flush(ucp_worker_h w, ucp_ep_h ep)
{
    /* most RMA here is done within its call (a same-host peer's mapped
     * memory, CMA): then there is nothing to wait for, and no Python call */
    uint64_t posted = __atomic_load_n(&w->rma_in_flight, __ATOMIC_RELAXED);
    if (posted == 0)
        return UCS_OK;
    ucs_status_t status = ucxs_py->flush(w->py, ep != NULL ? ep->py : NULL);
    if (status == UCS_OK && ep == NULL)    /* a worker flush completed those posted before it */
        __atomic_fetch_sub(&w->rma_in_flight, posted, __ATOMIC_RELAXED);
    return status;
}

ucs_status_ptr_t ucp_worker_flush_nb(ucp_worker_h w, unsigned flags, ucp_send_callback_t cb)
{
    (void)flags;
    (void)cb;                 /* done before returning: no request, no callback */
    ucs_status_t status = ucxs_flush(w, NULL);
    return status == UCS_OK ? NULL : UCS_STATUS_PTR(status);
}

ucs_status_ptr_t ucp_worker_flush_nbx(ucp_worker_h w, const ucp_request_param_t *param)
{
    ucxs_req_t *req = ucxs_req_new(w, param, UCXS_CB_SEND, "ucp_worker_flush_nbx");
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    return ucxs_req_posted(req, ucxs_flush(w, NULL), param);
}

ucs_status_t ucp_worker_fence(ucp_worker_h w)
{
    /* the core executes one endpoint's operations in issue order, and a
     * flush orders them across endpoints too */
    return ucxs_flush(w, NULL);
}
