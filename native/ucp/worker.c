/*
 * worker.c — workers: explicit progress and the event queue.
 *
 * Entry points: ucp_worker_create, ucp_worker_destroy, ucp_worker_get_address,
 * ucp_worker_release_address, ucp_worker_query, ucp_worker_progress,
 * ucp_worker_flush_nb, ucp_worker_fence, ucp_worker_get_efd, ucp_worker_arm,
 * ucp_worker_signal.
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
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
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

/* The queue's first event, unless it is an active message and *ams (the
 * call's allowance of them) is used up: then it stays first. */
static ucxs_event_t *queue_pop(ucp_worker_h worker, unsigned *ams)
{
    ucxs_event_t *ev;
    /* (most progress calls find nothing: no lock for that) */
    if (__atomic_load_n(&worker->queued, __ATOMIC_ACQUIRE) == 0)
        return NULL;
    pthread_mutex_lock(&worker->lock);
    ev = worker->head;
    if (ev != NULL && ev->type == UCXS_EV_AM) {
        if (*ams == 0)
            ev = NULL;
        else
            --*ams;
    }
    if (ev != NULL) {
        worker->head = ev->next;
        if (worker->head == NULL)
            worker->tail = NULL;
        __atomic_fetch_sub(&worker->queued, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&worker->lock);
    return ev;
}

/* Run the queued callbacks, in order, up to the `*ams`-th active message.
 *
 * One active-message callback per ucp_worker_progress call: a caller counting
 * them sees every count.  MPICH's PSCW does: MPI_Win_start progresses while
 * its group's size != the posts counted, then zeroes the count, so a pass
 * that handed it this epoch's last post and another peer's first post of
 * the next epoch (both in the inbox when the rank got the CPU back) left
 * it waiting forever (rma/pscw_ordering_shm, 4 ranks on 2 cores).  What stays
 * queued behind runs in the next calls, in order; the call still counts
 * it as progress, so a caller's loop goes on. */
static unsigned dispatch(ucp_worker_h worker, unsigned *ams)
{
    unsigned n = 0;
    ucxs_event_t *ev;
    while ((ev = queue_pop(worker, ams)) != NULL) {
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
    unsigned ams = 0;                       /* (a send's call: none of them) */
    int kept = ucxs_queue_take(worker, keep);
    dispatch(worker, &ams);
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
    w->efd = w->evfd = -1;
    if (params != NULL && (params->field_mask & UCP_WORKER_PARAM_FIELD_EVENT_FD)) {
        w->efd = params->event_fd;          /* the caller's epoll set: ours join it */
        w->efd_external = 1;
    }
    pthread_mutex_init(&w->lock, NULL);
    status = worker_address(w);
    if (status != UCS_OK) {
        pthread_mutex_destroy(&w->lock);
        free(w);
        return status;
    }
    if (w->dp_tag)                          /* active messages for our handlers (am.c) */
        ucxs_py->dp->am_set_hook(w->dp, ucxs_dp_am_arrived, w);
    *worker_p = w;
    return UCS_OK;
}

static int timer_stop(ucp_worker_h w);
static void wakeup_release(ucp_worker_h w);

void ucp_worker_destroy(ucp_worker_h w)
{
    ucxs_event_t *ev;
    unsigned all = UINT_MAX;
    int free_it = timer_stop(w);
    if (w->dp_tag)
        ucxs_py->dp->am_set_hook(w->dp, NULL, NULL);
    ucxs_py->worker_destroy(w->py);
    ucxs_py->release(w->py);
    while ((ev = queue_pop(w, &all)) != NULL) { /* undelivered: nobody will ask any more */
        if (ev->type == UCXS_EV_REQUEST)
            ucxs_req_put((ucxs_req_t *)ev);
        else
            ucxs_am_dispatch(NULL, ev);      /* frees it */
    }
    wakeup_release(w);
    if (!free_it)                           /* its timer thread may still touch it */
        return;
    ucxs_am_kept_free(w);
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

/* Why a progress call runs Python's progress (counted in ucxs_ops_t). */
enum { PY_NO, PY_LEFT, PY_POLL, PY_BUSY, PY_FDS, PY_TIMER };

/* The data plane's part of a progress call: its inbox, then libucp's
 * receives it completed.  *why: whether Python's progress has work now. */
static unsigned dp_progress(ucp_worker_h w, int *why)
{
    unsigned flags = 0;
    unsigned n;

    if (!ucxs_py->try_lock()) {            /* another thread is in Python */
        *why = PY_BUSY;
        return 0;
    }
    n = (unsigned)ucxs_py->dp->inbox_progress(w->dp, DP_BATCH, &flags);
    ucxs_py->unlock();
    if (n != 0)                            /* (frames taken: receives they completed) */
        n += ucxs_dp_done(w);
    if (flags != 0 || __atomic_load_n(ucxs_py->py_pending, __ATOMIC_RELAXED) != 0)
        *why = PY_LEFT;
    else if (__atomic_load_n(&w->dp->py_poll, __ATOMIC_RELAXED) != 0)
        *why = PY_POLL;
    else
        *why = PY_NO;
    return n;
}

static void count_why(ucp_worker_h w, int why)
{
    switch (why) {
    case PY_LEFT: w->ops.py_left++; break;
    case PY_POLL: w->ops.py_poll++; break;
    case PY_BUSY: w->ops.py_busy++; break;
    case PY_FDS: w->ops.py_fds++; break;
    case PY_TIMER: w->ops.py_timer++; break;
    default: break;
    }
}

/* After a timer pass that waited `wait` ns for the GIL and ended at `end`:
 * one that waited (a Python thread of the process holds the GIL) makes the
 * next ones twice as rare, a quick one an eighth less rare, so that a
 * holder letting go now and then does not bring them all back. */
static void pace(ucp_worker_h w, uint64_t wait, uint64_t end)
{
    uint64_t every = __atomic_load_n(&w->py_every, __ATOMIC_RELAXED);
    if (wait > PY_SLOW_NS)
        every = every * 2 < PY_EVERY_MAX_NS ? every * 2 : PY_EVERY_MAX_NS;
    else
        every = every - every / 8 > PY_EVERY_NS ? every - every / 8 : PY_EVERY_NS;
    __atomic_store_n(&w->py_every, every, __ATOMIC_RELAXED);
    __atomic_store_n(&w->py_last, end, __ATOMIC_RELAXED);
}

/* -- the timer thread ------------------------------------------------------------
 * A timer or descriptor pass that waited for the GIL (a Python thread of
 * the process holds it: one in pure Python keeps it for its switch
 * interval, 5 ms, before it must let go) hands those passes to a thread of
 * the worker from then on: progress asks for one and goes on in C, so the
 * wait stops the C path no longer.  What such a pass completes reaches the
 * caller as any other: the event queue, and the data plane's done list,
 * which the next progress call looks at when the thread's count of passes
 * moved (timer_seen).  Passes that Python has work for (a frame, a request
 * running in Python) stay on the caller's thread, and so do all of them when
 * the caller holds the GIL itself (a binding that calls the library without
 * giving it up): it waits for nobody, and a thread would wait for it. */
struct ucxs_timer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ucp_worker_h w;
    pid_t pid;                  /* the process that started it (a fork's child has none) */
    int asked, busy, stop;      /* under mu */
    int arm_asked;              /* an arm pass (ucp_worker_arm from a foreign thread), under mu */
    int pending;                /* asked or busy (read without mu) */
    int arm_pending;            /* arm_asked or its pass running (read without mu) */
    uint64_t passes;            /* done */
};

static ucs_status_t arm_now(ucp_worker_h w, int *busy);
static void wakeup_signal(ucp_worker_h w);

static void *timer_main(void *arg)
{
    struct ucxs_timer *t = arg;
    ucp_worker_h w = t->w;
    uint64_t wait;

    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->asked && !t->arm_asked && !t->stop)
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->stop)
            break;
        int pass = t->asked, arm = t->arm_asked, busy = 0;
        t->asked = t->arm_asked = 0;
        t->busy = 1;
        pthread_mutex_unlock(&t->mu);
        if (pass) {
            __atomic_fetch_add(&w->ops.py_thread, 1, __ATOMIC_RELAXED);
            ucxs_py->progress(w->py, 1, &wait);
            pace(w, wait, now_ns());
        }
        /* an arm pass that found work wakes whoever sleeps on the descriptor */
        if (arm && arm_now(w, &busy) == UCS_OK && busy)
            wakeup_signal(w);
        pthread_mutex_lock(&t->mu);
        t->busy = 0;
        if (pass) {
            __atomic_fetch_add(&t->passes, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&t->pending, 0, __ATOMIC_RELEASE);
        }
        if (arm)
            __atomic_store_n(&t->arm_pending, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void timer_start(ucp_worker_h w)
{
    struct ucxs_timer *t = calloc(1, sizeof(*t));
    sigset_t all, old;

    if (t == NULL)
        return;                             /* (passes stay on the caller's thread) */
    t->w = w;
    t->pid = getpid();
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    sigfillset(&all);                       /* signals stay the application's threads' */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&t->thread, NULL, timer_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return;
    }
    w->timer = t;
}

/* The worker's timer thread, when this process started it (not so in a
 * fork's child, which has its memory but not its threads). */
static struct ucxs_timer *timer_of(ucp_worker_h w)
{
    struct ucxs_timer *t = w->timer;
    return t != NULL && t->pid == getpid() ? t : NULL;
}

/* Ask the timer thread for a pass (`*asked`, its flag under mu; `*pending`,
 * read without it); 0 when one is asked for or running. */
static int timer_ask_for(struct ucxs_timer *t, int *asked, int *pending)
{
    if (__atomic_load_n(pending, __ATOMIC_ACQUIRE))
        return 0;
    __atomic_store_n(pending, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&t->mu);
    *asked = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 1;
}

/* A progress pass; an arm pass (ucp_worker_arm from a foreign thread). */
static int timer_ask(struct ucxs_timer *t)
{
    return timer_ask_for(t, &t->asked, &t->pending);
}

static int timer_ask_arm(struct ucxs_timer *t)
{
    return timer_ask_for(t, &t->arm_asked, &t->arm_pending);
}

/* The timer thread, started if need be (NULL: none can be). */
static struct ucxs_timer *timer_needed(ucp_worker_h w)
{
    if (w->timer == NULL)
        timer_start(w);
    return timer_of(w);
}

static void timer_join(void *arg)
{
    pthread_join(((struct ucxs_timer *)arg)->thread, NULL);
}

/* Stop and join the timer thread (with the GIL given up: its pass may be
 * waiting for it).  0: the worker must not be freed, the thread may still
 * use it — it was in a pass when the interpreter went away, which it will
 * never finish (the process is exiting; both stay allocated). */
static int timer_stop(ucp_worker_h w)
{
    struct ucxs_timer *t = w->timer;
    int busy;

    if (t == NULL)
        return 1;
    w->timer = NULL;
    if (t->pid != getpid())
        return 1;                           /* (a fork's child: not its thread) */
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    busy = t->busy;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (busy && !ucxs_py->alive())
        return 0;
    ucxs_py->unblocked(timer_join, t);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return 1;
}

unsigned ucp_worker_progress(ucp_worker_h w)
{
    int full = 0;
    int why = PY_NO;
    uint64_t now = 0, start, wait;
    struct ucxs_timer *timer = NULL;
    unsigned ams = 1;                       /* active messages this call runs */
    w->loopback_done = 0;
    unsigned n = dispatch(w, &ams);         /* what earlier calls queued */
    if (w->dp_tag) {
        if (__atomic_load_n(&w->dp_owed, __ATOMIC_RELAXED))
            n += ucxs_dp_done(w);           /* (a foreign thread's call could not take them) */
        n += dp_progress(w, &why);
        timer = w->timer;
        if (timer != NULL) {
            uint64_t passes = __atomic_load_n(&timer->passes, __ATOMIC_ACQUIRE);
            if (passes != w->timer_seen) {  /* what its passes completed */
                w->timer_seen = passes;
                n += ucxs_dp_done(w);
            }
            /* (the lock is the timer thread's, for a moment: no need to wait) */
            if (why == PY_BUSY && __atomic_load_n(&timer->pending, __ATOMIC_ACQUIRE))
                why = PY_NO;
        }
        if (why != PY_NO || ++w->tick % CLOCK_EVERY == 0) {
            now = now_ns();
            full = now - __atomic_load_n(&w->py_last, __ATOMIC_RELAXED)
                   >= __atomic_load_n(&w->py_every, __ATOMIC_RELAXED);
            if (why == PY_NO && full)
                why = PY_TIMER;
            if (why == PY_NO && now - w->fds_last >= FDS_EVERY_NS) {
                w->fds_last = now;
                if (fds_ready(w))
                    why = PY_FDS;
            }
        }
        if (timer != NULL && (why == PY_TIMER || why == PY_FDS) && timer_of(w) != NULL
                && !ucxs_py->holds_gil()) {         /* (a caller holding it passes itself) */
            if (timer_ask(timer))
                count_why(w, why);
            why = PY_NO;
        }
        if (why == PY_NO) {
            w->ops.progress_c++;
            n += dispatch(w, &ams);
            goto idle;
        }
    }
    if (ucxs_foreign()) {
        /* a C thread of a Python program: Python's pass goes to the timer
         * thread, this one never waits for the GIL (a Python thread holding
         * it may be joining this one: NIXL's agent, destroyed) */
        struct ucxs_timer *t = timer_needed(w);

        if (t != NULL) {
            if (timer_ask(t))
                count_why(w, why);
            w->ops.progress_c++;
            n += dispatch(w, &ams);
            goto idle;
        }
    }
    w->ops.progress_py++;
    count_why(w, why);
    start = now_ns();
    n += ucxs_py->progress(w->py, full, &wait);
    if (w->dp_tag) {
        uint64_t end = now_ns();

        if (full)
            pace(w, wait, end);
        else
            __atomic_store_n(&w->py_last, end, __ATOMIC_RELAXED);
        if (wait > PY_SLOW_NS && (why == PY_TIMER || why == PY_FDS) && w->timer == NULL)
            timer_start(w);
        n += ucxs_dp_done(w);               /* (Python's inbox pass completes ours too) */
    }
    n += dispatch(w, &ams);
    /* a send to this worker itself completed: the core completes the receive
     * it matched a pass later (its data follows the match); as with UCX's
     * self transport, the caller sees both from this call (Open MPI's
     * Testsome right after a synchronous send to self) */
    for (int pass = 0; w->loopback_done && pass < LOOPBACK_PASSES; pass++) {
        w->loopback_done = 0;
        w->ops.py_loopback++;
        n += ucxs_py->progress(w->py, 0, &wait);
        if (w->dp_tag)
            n += ucxs_dp_done(w);
        n += dispatch(w, &ams);
    }
    w->ops.py_ns += now_ns() - start;
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

/* The request forms: as ucxs_flush, without waiting inside the call when
 * something is in flight (the core's flush_nb request, completed by later
 * progress: the peer may be another worker of this process, which another
 * thread progresses and which could not while this call held libucp's lock;
 * NIXL's agents, two in one process, flush so). */
ucs_status_ptr_t ucxs_flush_nbx(ucp_worker_h w, ucp_ep_h ep, const ucp_request_param_t *param,
                                const char *entry)
{
    uint64_t posted = __atomic_load_n(&w->rma_in_flight, __ATOMIC_RELAXED);
    ucs_status_t status = UCS_OK;
    ucxs_req_t *req;

    if (posted == 0 && !ucxs_needs_request(param))
        return UCS_STATUS_PTR(UCS_OK);
    req = ucxs_req_new(w, param, UCXS_CB_SEND, entry);
    if (req == NULL)
        return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
    if (posted != 0) {
        status = ucxs_py->flush_nb(w->py, ep != NULL ? ep->py : NULL, req);
        if (status == UCS_OK && ep == NULL) /* (done now: those posted before it are) */
            __atomic_fetch_sub(&w->rma_in_flight, posted, __ATOMIC_RELAXED);
    }
    return ucxs_req_posted(req, status, param);
}

ucs_status_ptr_t ucp_worker_flush_nbx(ucp_worker_h w, const ucp_request_param_t *param)
{
    return ucxs_flush_nbx(w, NULL, param, "ucp_worker_flush_nbx");
}

ucs_status_t ucp_worker_fence(ucp_worker_h w)
{
    /* the core executes one endpoint's operations in issue order, and a
     * flush orders them across endpoints too */
    return ucxs_flush(w, NULL);
}

/* -- wakeup -------------------------------------------------------------------
 * The worker's event descriptor is an epoll set of the descriptors its core
 * worker sleeps on: each interface's (the shm inbox's socket, which its
 * producers signal once its consumer is armed; tcp's epoll set; the peers'
 * pidfds), the tcp connections libucp reads in C, the wake sources
 * (Worker.wait_fds), and an eventfd of libucp's own (ucp_worker_signal).
 * ucp_worker_arm arms them and puts exactly them in the set (they change as
 * interfaces connect and peers come and go: the set is rebuilt, which also
 * drops a number closed and reused since); it answers UCS_ERR_BUSY, arming
 * nothing, while the worker has work now: callbacks queued for the next
 * ucp_worker_progress, completions the data plane holds, a descriptor
 * readable already.  From a C thread of a Python program (ucxs_foreign:
 * NIXL's progress thread) arming is the timer thread's pass, asked for and
 * not waited for: arm says UCS_OK at once, and the pass, if it finds work,
 * signals the eventfd, so the sleeper wakes as it would have from a BUSY.
 * With UCP_WORKER_PARAM_FIELD_EVENT_FD the set is the caller's own, and
 * ucp_worker_get_efd has none to give (UCS_ERR_UNSUPPORTED), as with UCX.
 * All of it needs UCP_FEATURE_WAKEUP in the context's features. */

static ucs_status_t wakeup_feature(ucp_worker_h w, const char *op)
{
    if (w->context->features & UCP_FEATURE_WAKEUP)
        return UCS_OK;
    ucxs_error(op, "the context was made without UCP_FEATURE_WAKEUP");
    return UCS_ERR_INVALID_PARAM;
}

/* The set and the eventfd in it, made once (under w->lock). */
static ucs_status_t wakeup_efd(ucp_worker_h w)
{
    if (w->efd < 0 && (w->efd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return UCS_ERR_IO_ERROR;
    if (w->evfd < 0) {
        struct epoll_event ev = {.events = EPOLLIN};

        if ((w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
            return UCS_ERR_IO_ERROR;
        ev.data.fd = w->evfd;
        if (epoll_ctl(w->efd, EPOLL_CTL_ADD, w->evfd, &ev) != 0) {
            close(w->evfd);
            w->evfd = -1;
            return UCS_ERR_IO_ERROR;
        }
    }
    return UCS_OK;
}

/* wakeup_efd under the worker's lock: the set and its eventfd exist. */
static ucs_status_t wakeup_made(ucp_worker_h w)
{
    pthread_mutex_lock(&w->lock);
    ucs_status_t status = wakeup_efd(w);
    pthread_mutex_unlock(&w->lock);
    return status;
}

static void wakeup_signal(ucp_worker_h w)
{
    uint64_t one = 1;
    if (w->evfd >= 0 && write(w->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        ucxs_error("ucp_worker_signal", "write to the worker's eventfd failed");
}

static void wakeup_release(ucp_worker_h w)
{
    if (w->efd >= 0 && w->efd_external) {   /* (the caller's set outlives the worker) */
        for (int i = 0; i < w->efd_nfds; i++)
            epoll_ctl(w->efd, EPOLL_CTL_DEL, w->efd_fds[i], NULL);
        if (w->evfd >= 0)
            epoll_ctl(w->efd, EPOLL_CTL_DEL, w->evfd, NULL);
    } else if (w->efd >= 0) {
        close(w->efd);
    }
    if (w->evfd >= 0)
        close(w->evfd);
    w->efd = w->evfd = -1;
    free(w->efd_fds);
    w->efd_fds = NULL;
    w->efd_nfds = 0;
}

ucs_status_t ucp_worker_get_efd(ucp_worker_h w, int *fd)
{
    ucs_status_t status = wakeup_feature(w, "ucp_worker_get_efd");

    if (status != UCS_OK)
        return status;
    if (w->efd_external)
        return UCS_ERR_UNSUPPORTED;
    status = wakeup_made(w);
    if (status == UCS_OK)
        *fd = w->efd;                       /* (made once, never changed) */
    return status;
}

ucs_status_t ucp_worker_signal(ucp_worker_h w)
{
    ucs_status_t status = wakeup_feature(w, "ucp_worker_signal");

    if (status != UCS_OK)
        return status;
    status = wakeup_made(w);
    if (status == UCS_OK)
        wakeup_signal(w);
    return status;
}

/* Arm the core worker's descriptors and put them in the set: *busy (and
 * nothing armed) when it has work now. */
static ucs_status_t arm_now(ucp_worker_h w, int *busy)
{
    int *fds = NULL, nfds = 0;
    ucs_status_t status = ucxs_py->arm(w->py, &fds, &nfds, busy);

    if (status != UCS_OK || *busy) {
        free(fds);
        return status;
    }
    pthread_mutex_lock(&w->lock);
    status = wakeup_efd(w);
    for (int i = 0; status == UCS_OK && i < w->efd_nfds; i++)
        epoll_ctl(w->efd, EPOLL_CTL_DEL, w->efd_fds[i], NULL);   /* (ENOENT: closed) */
    free(w->efd_fds);
    w->efd_fds = fds;
    w->efd_nfds = status == UCS_OK ? nfds : 0;
    for (int i = 0; i < w->efd_nfds; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};

        if (epoll_ctl(w->efd, EPOLL_CTL_ADD, fds[i], &ev) != 0 && errno != EEXIST) {
            ucxs_error("ucp_worker_arm", "epoll_ctl(ADD) of a worker descriptor failed");
            status = UCS_ERR_IO_ERROR;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return status;
}

ucs_status_t ucp_worker_arm(ucp_worker_h w)
{
    ucs_status_t status = wakeup_feature(w, "ucp_worker_arm");
    uint64_t drained;
    int busy = 0;

    if (status != UCS_OK || (status = wakeup_made(w)) != UCS_OK)
        return status;
    if (read(w->evfd, &drained, sizeof(drained)) == sizeof(drained))
        return UCS_ERR_BUSY;                /* signalled: progress first */
    if (w->dp_tag)                          /* (completions the data plane holds: queued) */
        ucxs_dp_done(w);
    if (__atomic_load_n(&w->queued, __ATOMIC_ACQUIRE) != 0)
        return UCS_ERR_BUSY;
    if (ucxs_foreign()) {
        struct ucxs_timer *t = timer_needed(w);

        if (t != NULL) {
            timer_ask_arm(t);
            return UCS_OK;
        }
    }
    status = arm_now(w, &busy);
    if (status == UCS_OK && busy)
        return UCS_ERR_BUSY;
    if (status == UCS_OK && __atomic_load_n(&w->queued, __ATOMIC_ACQUIRE) != 0)
        status = UCS_ERR_BUSY;              /* (queued meanwhile, by another thread) */
    return status;
}
