/*
 * bridge.c — ucxpy._ucp_bridge: every call from libucp.so.0 into Python.
 *
 * Theory of operation.  This extension module is the only C that touches the
 * Python C API for libucp (bridge.h says why).  When imported it imports the
 * adapter ucxpy.capi, looks up the adapter's functions once (FNS), hands the
 * adapter this module (for `am_event`, `ops` and the UCS_* codes of the real
 * header), and publishes its table of operations in a capsule, which libucp
 * imports (attach.c).
 *
 * Every operation has one shape: take the GIL and libucp's lock (ENTER:
 * the lock is waited for with the GIL given up), build the arguments (raw
 * memory as memoryviews over the caller's bytes, handles as the references
 * we hold), make one call — an adapter function, or for the hot operations
 * (send, receive, progress, put/get, active messages) the core's public
 * method directly (`method`) — turn its result or its exception into a
 * ucs_status_t at one `out:`, drop both (LEAVE).  A core Request still
 * pending gets a Completion, which queues its outcome for the C request
 * (`track`) and is counted (`py_pending`: libucp's progress runs Python's
 * while any).  An exception is printed to stderr once, here, with the
 * entry point it failed, and mapped by capi.status_of; a status is never
 * lost (no PyErr_Clear without one).
 *
 * The data plane's receives of libucp that Python's path matches come back
 * here through its adopt hook (b_adopt): a core RecvRequest over the C
 * buffer, tracked like any other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bridge.h"

#define FNS(X)                                                                           \
    X(context_create) X(worker_create) X(worker_destroy) X(ep_create) X(ep_close)         \
    X(flush) X(tag_probe) X(am_handler) X(am_drop) X(mem_map) X(mem_unmap) X(rkey_pack)   \
    X(rkey_unpack) X(rkey_map) X(context_info) X(status_of) X(failure) X(ep_lane)         \
    X(wake_peer) X(stream_tail) X(ep_perf) X(arm) X(flush_nb)

#define FN_ENUM(name) FN_##name,
#define FN_NAME(name) #name,
enum { FNS(FN_ENUM) FN_COUNT };
static const char *const fn_names[] = {FNS(FN_NAME)};
static PyObject *fns[FN_COUNT];            /* the adapter's functions */
static const ucxs_core_t *core;            /* libucp's completion entry points */
static PyObject *tag_info_type;            /* ucxpy.TagInfo: a receive's result */
static PyObject *recv_request_type;        /* ucxpy.tag.RecvRequest */
/* attribute names, interned once */
#define NAMES(X) X(done) X(exc) X(result) X(tag) X(length) X(pending) X(add_done_callback) \
    X(cancel) X(worker) X(progress) X(tag_send_nb) X(tag_send_sync_nb) X(tag_recv_nb)      \
    X(tag_recv_message_nb) X(am_send_nb) X(receive) X(put_nb) X(get_nb) X(atomic_post)      \
    X(atomic_fetch_nb) X(atomic_fetch_now) X(add) X(swap) X(cswap) X(and) X(or) X(xor)     \
    X(progress_all) X(_post_taken) X(_cancel_recv) X(lock) X(tr)
#define NAME_DECL(n) static PyObject *s_##n;
NAMES(NAME_DECL)

static ucxs_bridge_t table;                /* the operations (below) */
/* calls from libucp into Python in this process (entries(): the proof that
 * a steady-state message needs none) */
static uint64_t py_entries;
/* libucp's one lock (bridge.h: try_lock / lock / unlock) */
static pthread_mutex_t py_lock;
/* core requests still pending in Python for libucp (Completions not yet called) */
static uint64_t py_pending;

/* -- the one template ---------------------------------------------------------- */
/* The status of the exception being raised, printed once; clears it. */
static ucs_status_t raised(const char *op)
{
    PyObject *type, *value, *tb, *code;
    ucs_status_t status = UCS_ERR_IO_ERROR;

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    code = value != NULL ? PyObject_CallOneArg(fns[FN_status_of], value) : NULL;
    if (code != NULL) {
        status = (ucs_status_t)PyLong_AsLong(code);
        Py_DECREF(code);
    }
    PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
    fprintf(stderr, "ucxpy libucp: %s: %s: %s\n", op,
            type != NULL ? ((PyTypeObject *)type)->tp_name : "?",
            text != NULL ? PyUnicode_AsUTF8(text) : "?");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();                         /* anything the report itself raised: reported */
    return status;
}

/* Call adapter function `fn` with `args` (a new tuple or NULL: consumed). */
static PyObject *call(int fn, PyObject *args)
{
    if (args == NULL)
        return NULL;
    PyObject *res = PyObject_Call(fns[fn], args, NULL);
    Py_DECREF(args);
    return res;
}

/* A result with no value: UCS_OK, or the exception's status. */
static ucs_status_t plain(int fn, PyObject *res)
{
    if (res == NULL)
        return raised(fn_names[fn]);
    Py_DECREF(res);
    return UCS_OK;
}

/* The outcome of a done core Request: status, tag and length. */
static ucs_status_t outcome_of(PyObject *r, const char *op, ucp_tag_recv_info_t *info)
{
    ucs_status_t status = UCS_OK;
    PyObject *exc = PyObject_GetAttr(r, s_exc), *res = NULL, *v = NULL;
    uint64_t tag = 0;
    Py_ssize_t length = 0;

    if (exc == NULL)
        return raised(op);
    if (exc != Py_None) {                  /* failed: capi.failure says how */
        int st;
        v = PyObject_CallOneArg(fns[FN_failure], exc);
        if (v == NULL || !PyArg_ParseTuple(v, "in", &st, &length)) {
            status = raised(op);
            goto out;
        }
        status = (ucs_status_t)st;
        goto out;
    }
    res = PyObject_GetAttr(r, s_result);
    if (res == NULL) {
        status = raised(op);
        goto out;
    }
    if (Py_TYPE(res) == (PyTypeObject *)tag_info_type) {
        PyObject *t = PyObject_GetAttr(res, s_tag), *n = PyObject_GetAttr(res, s_length);
        if (t != NULL && n != NULL) {
            tag = PyLong_AsUnsignedLongLong(t);
            length = PyLong_AsSsize_t(n);
        }
        Py_XDECREF(t);
        Py_XDECREF(n);
        if (PyErr_Occurred())
            status = raised(op);
    } else if (PyLong_Check(res)) {       /* a length, or an atomic's old value */
        tag = PyLong_AsUnsignedLongLongMask(res);
        length = (Py_ssize_t)tag;
        if (PyErr_Occurred())
            status = raised(op);
    }
out:
    if (info != NULL) {
        info->sender_tag = tag;
        info->length = (size_t)length;
    }
    Py_XDECREF(exc);
    Py_XDECREF(res);
    Py_XDECREF(v);
    return status;
}

/* Completion: the callback the bridge hangs on a pending core Request; it
 * takes the request out of its worker's pending table and queues the outcome
 * for C request `req` (ucxs_core_t.complete). */
typedef struct {
    PyObject_HEAD
    void *req;
    PyObject *pending;
    PyObject *key;
} completion_t;

static void completion_dealloc(completion_t *self)
{
    Py_XDECREF(self->pending);
    Py_XDECREF(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *completion_call(completion_t *self, PyObject *args, PyObject *kwargs)
{
    ucp_tag_recv_info_t info;
    PyObject *r;
    if (!PyArg_ParseTuple(args, "O", &r))
        return NULL;
    ucs_status_t status = outcome_of(r, "completion", &info);
    if (PyDict_DelItem(self->pending, self->key) < 0)
        PyErr_Clear();                     /* not pending (never was): nothing to undo */
    __atomic_fetch_sub(&py_pending, 1, __ATOMIC_RELAXED);
    core->complete(self->req, status, info.sender_tag, info.length);
    Py_RETURN_NONE;
}

static PyTypeObject completion_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._ucp_bridge.Completion",
    .tp_basicsize = sizeof(completion_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)completion_dealloc,
    .tp_call = (ternaryfunc)completion_call,
    .tp_doc = "queues a core Request's outcome for a C request (bridge.c)",
};

/* A request operation's result `r` (a new reference, or NULL: raised):
 * its outcome now into `info`, or UCS_INPROGRESS with the completion
 * routed to C request `req` (NULL: the implicit RMA forms, not tracked). */
static ucs_status_t track(const char *op, PyObject *r, PyObject *worker, void *req,
                          ucp_tag_recv_info_t *info)
{
    ucs_status_t status = UCS_INPROGRESS;
    PyObject *done, *pending = NULL, *res = NULL;
    completion_t *c = NULL;

    if (r == NULL)
        return raised(op);
    done = PyObject_GetAttr(r, s_done);
    if (done == NULL) {
        status = raised(op);
        goto out;
    }
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (is_done) {
        status = outcome_of(r, op, info);
        goto out;
    }
    if (req == NULL)
        goto out;                          /* implicit: the core keeps it for flush */
    pending = PyObject_GetAttr(worker, s_pending);
    c = PyObject_New(completion_t, &completion_type);
    if (pending == NULL || c == NULL) {
        status = raised(op);
        goto out;
    }
    c->req = req;
    c->pending = Py_NewRef(pending);
    c->key = PyLong_FromVoidPtr(req);
    if (c->key == NULL || PyDict_SetItem(pending, c->key, r) < 0 ||
        (res = PyObject_CallMethodOneArg(r, s_add_done_callback, (PyObject *)c)) == NULL)
        status = raised(op);
    else
        __atomic_fetch_add(&py_pending, 1, __ATOMIC_RELAXED);
out:
    Py_XDECREF(res);
    Py_XDECREF((PyObject *)c);
    Py_XDECREF(pending);
    Py_DECREF(r);
    return status;
}

/* Call method `name` of `self` with `n` more arguments (new references or
 * NULL, all consumed): the core's public API, with no adapter frame. */
static PyObject *method(PyObject *name, PyObject *self, int n, PyObject **more)
{
    /* slot 0 is spare: PY_VECTORCALL_ARGUMENTS_OFFSET lets the callee use
     * the slot before the arguments */
    PyObject *slots[8] = {NULL, self};
    PyObject *res = NULL;
    int ok = self != NULL && n <= 6;
    for (int i = 0; i < n; i++) {
        slots[i + 2] = more[i];
        ok = ok && more[i] != NULL;
    }
    if (ok)
        res = PyObject_VectorcallMethod(name, slots + 1,
                                        (size_t)(n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    for (int i = 0; i < n; i++)
        Py_XDECREF(more[i]);
    return res;
}

/* The core Worker of a CWorker (a new reference). */
static PyObject *core_worker(void *worker)
{
    return PyObject_GetAttr((PyObject *)worker, s_worker);
}

/* A new reference out through `out`. */
static ucs_status_t object(int fn, PyObject *res, void **out)
{
    if (res == NULL)
        return raised(fn_names[fn]);
    *out = res;
    return UCS_OK;
}

static PyObject *view(const void *p, size_t n, int flags)
{
    static char empty;
    return PyMemoryView_FromMemory(p != NULL ? (char *)p : &empty, (Py_ssize_t)n, flags);
}

static PyObject *py(void *obj)
{
    return obj != NULL ? (PyObject *)obj : Py_None;
}

/* Take the GIL, unless the interpreter is gone: mpi4py finalizes MPI from
 * Py_AtExit, after Python's own finalization, so teardown (and anything
 * else) then answers `dead` without Python. */
#define ENTER_OR(dead)                                                                   \
    if (!Py_IsInitialized())                                                             \
        return dead;                                                                     \
    __atomic_fetch_add(&py_entries, 1, __ATOMIC_RELAXED);                                \
    PyGILState_STATE gil_ = PyGILState_Ensure();                                         \
    b_lock()
#define LEAVE                                                                            \
    b_unlock();                                                                          \
    PyGILState_Release(gil_)

/* -- the lock ------------------------------------------------------------------- */
static int b_try_lock(void)
{
    return pthread_mutex_trylock(&py_lock) == 0;
}

/* Wait for the lock without holding the GIL: its holder may be waiting for
 * the GIL (a bridge operation), or about to finish without it (libucp's
 * data-plane calls, which never take the GIL while they hold the lock). */
static void b_lock(void)
{
    if (pthread_mutex_trylock(&py_lock) == 0)
        return;
    if (Py_IsInitialized() && PyGILState_Check()) {
        PyThreadState *ts = PyEval_SaveThread();
        pthread_mutex_lock(&py_lock);
        PyEval_RestoreThread(ts);
    } else {
        pthread_mutex_lock(&py_lock);
    }
}

static void b_unlock(void)
{
    pthread_mutex_unlock(&py_lock);
}

/* -- operations ------------------------------------------------------------------ */
static void b_attach(const ucxs_core_t *c)
{
    core = c;
}

static void b_release(void *obj)
{
    ENTER_OR();
    Py_XDECREF((PyObject *)obj);
    LEAVE;
}

static ucs_status_t b_context_create(const char *prefix, const char *modified, void **ctx)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = object(FN_context_create, call(FN_context_create,
                                                    Py_BuildValue("(ss)", prefix, modified)),
                            ctx);
    LEAVE;
    return s;
}

/* The data plane's C object behind attribute `attr` of `obj`: its worker
 * (`key` 0) or its mapped key (1); NULL when there is none (no data plane,
 * the attribute missing or None). */
static const void *dp_object(PyObject *obj, const char *attr, int key)
{
    const ucxdp_api_t *dp = table.dp;
    PyObject *o = dp != NULL ? PyObject_GetAttrString(obj, attr) : NULL;
    const void *c = o == NULL ? NULL : key ? (const void *)dp->rkey_of(o)
                                           : (const void *)dp->worker_of(o);

    if (o == NULL)
        PyErr_Clear();
    Py_XDECREF(o);
    return c;
}

static ucs_status_t b_worker_create(void *ctx, void *cworker, const ucxs_ops_t *ops,
                                    void **worker, void **address, size_t *address_length,
                                    int *oversubscribed, ucxdp_worker_t **dp, int *dp_tag)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *w = NULL, *a = NULL, *core_worker = NULL;
    ucs_status_t s = UCS_OK;
    PyObject *res = call(FN_worker_create, Py_BuildValue("(ONN)", py(ctx), PyLong_FromVoidPtr(cworker),
                                                         PyLong_FromVoidPtr((void *)ops)));
    if (res == NULL || !PyArg_ParseTuple(res, "OSp", &w, &a, oversubscribed)) {
        s = raised("ucp_worker_create");
        goto out;
    }
    core_worker = PyObject_GetAttr(w, s_worker);
    if (core_worker == NULL) {
        s = raised("ucp_worker_create");
        goto out;
    }
    *dp = (ucxdp_worker_t *)dp_object(core_worker, "dp", 0);
    *dp_tag = 0;
    if (*dp != NULL) {
        /* not while the core traces (each receive is an event there) or a
         * progress thread drives the worker (its own lock) */
        PyObject *lock = PyObject_GetAttr(core_worker, s_lock);
        PyObject *tr = lock != NULL ? PyObject_GetAttr(core_worker, s_tr) : NULL;
        if (tr == NULL) {
            s = raised("ucp_worker_create");
            Py_XDECREF(lock);
            goto out;
        }
        *dp_tag = lock == Py_None && tr == Py_None;
        Py_DECREF(lock);
        Py_DECREF(tr);
    }
    *address_length = (size_t)PyBytes_GET_SIZE(a);
    *address = malloc(*address_length);
    if (*address == NULL) {
        s = UCS_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(*address, PyBytes_AS_STRING(a), *address_length);
    Py_INCREF(w);
    *worker = w;
out:
    Py_XDECREF(core_worker);
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_worker_destroy(void *worker)
{
    ENTER_OR(UCS_OK);
    ucs_status_t s = plain(FN_worker_destroy, call(FN_worker_destroy, Py_BuildValue("(O)", py(worker))));
    LEAVE;
    return s;
}

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static unsigned b_progress(void *worker, int full, uint64_t *wait_ns)
{
    uint64_t start;

    *wait_ns = 0;
    if (!Py_IsInitialized())
        return 0;
    __atomic_fetch_add(&py_entries, 1, __ATOMIC_RELAXED);
    start = clock_ns();
    PyGILState_STATE gil_ = PyGILState_Ensure();
    *wait_ns = clock_ns() - start;          /* (the GIL's wait alone, not the lock's) */
    b_lock();
    unsigned n = 0;
    PyObject *w = core_worker(worker);
    PyObject *res = w != NULL ? PyObject_CallMethodNoArgs(w, full ? s_progress_all : s_progress)
                              : NULL;
    if (res == NULL)
        raised("ucp_worker_progress");
    else {
        n = (unsigned)PyLong_AsUnsignedLong(res);
        if (PyErr_Occurred())
            raised("ucp_worker_progress");
    }
    Py_XDECREF(res);
    Py_XDECREF(w);
    LEAVE;
    return n;
}

static void b_unblocked(void (*fn)(void *), void *arg)
{
    if (Py_IsInitialized() && PyGILState_Check()) {
        PyThreadState *ts = PyEval_SaveThread();
        fn(arg);
        PyEval_RestoreThread(ts);
    } else
        fn(arg);
}

static int b_alive(void)
{
    return Py_IsInitialized();
}

static int b_holds_gil(void)
{
    return Py_IsInitialized() && PyGILState_Check();
}

static int b_has_tstate(void)
{
    return PyGILState_GetThisThreadState() != NULL;
}

/* Adapter function `fn` of a handle and bytes, giving a new handle. */
static ucs_status_t from_bytes(int fn, void *obj, const void *bytes, size_t length, void **out)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = object(fn, call(fn, Py_BuildValue("(Oy#)", py(obj), (const char *)bytes,
                                                       (Py_ssize_t)length)), out);
    LEAVE;
    return s;
}

static ucs_status_t b_ep_create(void *worker, const void *address, size_t length, void **ep)
{
    return from_bytes(FN_ep_create, worker, address, length, ep);
}

/* Adapter function `fn` of two handles, for its effect only (teardown and
 * flush: done without Python once the interpreter is gone). */
static ucs_status_t on_pair(int fn, void *a, void *b)
{
    ENTER_OR(UCS_OK);
    ucs_status_t s = plain(fn, call(fn, Py_BuildValue("(OO)", py(a), py(b))));
    LEAVE;
    return s;
}

static ucs_status_t b_ep_close(void *worker, void *ep)
{
    return on_pair(FN_ep_close, worker, ep);
}

static ucs_status_t b_ep_lane(void *ep, void **ref, ucxdp_lane_t **lane,
                             ucxdp_stream_t **stream, uint64_t *eager_max, uint64_t *rndv_max,
                             int64_t *peer)
{
    ENTER_OR(UCS_ERR_UNSUPPORTED);
    ucs_status_t s = UCS_ERR_UNSUPPORTED;
    PyObject *l = NULL;
    unsigned long long max, rmax;
    long long peer_id;
    PyObject *res = call(FN_ep_lane, Py_BuildValue("(O)", py(ep)));

    if (res == NULL) {
        s = raised("ucp_tag_send_nbx");
    } else if (res != Py_None && table.dp != NULL) {
        if (!PyArg_ParseTuple(res, "OKKL", &l, &max, &rmax, &peer_id)) {
            s = raised("ucp_tag_send_nbx");
        } else if ((*lane = table.dp->lane_of(l)) != NULL
                   || (*stream = table.dp->stream_of(l)) != NULL) {
            *ref = Py_NewRef(l);
            *eager_max = max;
            *rndv_max = rmax;
            *peer = peer_id;
            s = UCS_OK;
        }
    }
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static void b_wake_peer(void *ep)
{
    ENTER_OR();
    plain(FN_wake_peer, call(FN_wake_peer, Py_BuildValue("(O)", py(ep))));
    LEAVE;
}

static ucs_status_t b_stream_tail(void *ep, const void *bytes, size_t length)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = plain(FN_stream_tail, call(FN_stream_tail,
                                                Py_BuildValue("(Oy#)", py(ep), (const char *)bytes,
                                                              (Py_ssize_t)length)));
    LEAVE;
    return s;
}

static ucs_status_t b_flush(void *worker, void *ep)
{
    return on_pair(FN_flush, worker, ep);
}

static ucs_status_t b_flush_nb(void *worker, void *ep, void *req)
{
    ENTER_OR(UCS_OK);
    ucs_status_t s = track(ep != NULL ? "ucp_ep_flush_nbx" : "ucp_worker_flush_nbx",
                           call(FN_flush_nb, Py_BuildValue("(OO)", py(worker), py(ep))),
                           worker, req, NULL);
    LEAVE;
    return s;
}

static ucs_status_t b_cancel(void *worker, void *req)
{
    ENTER_OR(UCS_OK);
    ucs_status_t s = UCS_OK;
    PyObject *pending = PyObject_GetAttr(worker, s_pending), *key = PyLong_FromVoidPtr(req);
    PyObject *r = pending != NULL && key != NULL ? PyDict_GetItemWithError(pending, key) : NULL;
    if (r != NULL) {
        PyObject *res = PyObject_CallMethodNoArgs(r, s_cancel);
        if (res == NULL)
            s = raised("ucp_request_cancel");
        Py_XDECREF(res);
    } else if (PyErr_Occurred()) {
        s = raised("ucp_request_cancel");
    }
    Py_XDECREF(pending);
    Py_XDECREF(key);
    LEAVE;
    return s;
}

static ucs_status_t b_tag_send(void *worker, void *ep, const void *buf, size_t length,
                               uint64_t tag, int sync, void *req, ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *args[] = {view(buf, length, PyBUF_READ), PyLong_FromUnsignedLongLong(tag)};
    ucs_status_t s = track("ucp_tag_send_nbx", method(sync ? s_tag_send_sync_nb : s_tag_send_nb,
                           ep, 2, args), worker, req, info);
    LEAVE;
    return s;
}

static ucs_status_t b_tag_recv(void *worker, void *buf, size_t length, uint64_t tag,
                               uint64_t mask, void *req, ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *w = core_worker(worker);
    PyObject *args[] = {view(buf, length, PyBUF_WRITE), PyLong_FromUnsignedLongLong(tag),
                        PyLong_FromUnsignedLongLong(mask)};
    ucs_status_t s = track("ucp_tag_recv_nbx", method(s_tag_recv_nb, w, 3, args), worker, req,
                           info);
    Py_XDECREF(w);
    LEAVE;
    return s;
}

/* A core RecvRequest for the data-plane receive `r` of CWorker `worker` (a
 * new reference, or NULL: raised): r's buffer, source, tag and mask. */
static PyObject *recv_request(PyObject *worker, ucxdp_tag_recv_t *r, PyObject *cancel)
{
    PyObject *w = core_worker(worker), *req;

    if (w == NULL)
        return NULL;
    req = PyObject_CallFunction(recv_request_type, "ONLKKO", w,
                                view(r->buffer, (size_t)r->capacity, PyBUF_WRITE),
                                (long long)r->m.source, (unsigned long long)r->m.tag,
                                (unsigned long long)r->m.mask, cancel);
    Py_DECREF(w);
    return req;
}

static ucs_status_t b_tag_recv_taken(void *worker, ucxdp_worker_t *dp, ucxdp_tag_recv_t *r,
                                     ucxdp_tag_unexp_t *u, void *req, ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *user = (PyObject *)u->user, *w = core_worker(worker), *cancel = NULL, *rr = NULL;
    ucs_status_t s;

    u->user = NULL;
    table.dp->tag_unexp_free(dp, u);
    if (w != NULL && (cancel = PyObject_GetAttr(w, s__cancel_recv)) != NULL
            && (rr = recv_request(worker, r, cancel)) != NULL) {
        PyObject *args[] = {Py_NewRef(rr), Py_NewRef(user)};
        s = track("ucp_tag_recv_nbx", method(s__post_taken, w, 2, args), worker, req, info);
    } else {
        s = raised("ucp_tag_recv_nbx");
    }
    Py_XDECREF(rr);
    Py_XDECREF(cancel);
    Py_XDECREF(w);
    Py_DECREF(user);
    LEAVE;
    return s;
}

/* The data plane's adopt hook (dp.h's set_adopt): libucp's receive `r`,
 * which Python's path matched (or gathered to fail), as a core RecvRequest
 * whose completion reaches libucp's request.  Called in Python's path, so
 * with the GIL and the lock held. */
static void *b_adopt(ucxdp_tag_recv_t *r)
{
    void *req, *worker;
    PyObject *rr;

    core->ext_recv(r, &req, &worker);
    rr = recv_request(worker, r, Py_None);
    if (rr == NULL)
        return NULL;
    if (track("ucp_tag_recv_nbx", Py_NewRef(rr), worker, req, NULL) != UCS_INPROGRESS) {
        Py_DECREF(rr);
        PyErr_SetString(PyExc_RuntimeError,
                        "libucp: cannot follow a receive Python's path matched");
        return NULL;
    }
    return rr;
}

static ucs_status_t b_tag_probe(void *worker, uint64_t tag, uint64_t mask, int remove,
                                ucp_tag_recv_info_t *info, void **message)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_ERR_NO_MESSAGE;
    unsigned long long got;
    Py_ssize_t length;
    PyObject *msg;
    PyObject *res = call(FN_tag_probe, Py_BuildValue("(OKKi)", py(worker), (unsigned long long)tag,
                                                     (unsigned long long)mask, remove));
    if (res == NULL) {
        s = raised("ucp_tag_probe_nb");
        goto out;
    }
    if (res == Py_None)
        goto out;
    if (!PyArg_ParseTuple(res, "KnO", &got, &length, &msg)) {
        s = raised("ucp_tag_probe_nb");
        goto out;
    }
    info->sender_tag = got;
    info->length = (size_t)length;
    Py_INCREF(msg);
    *message = msg;
    s = UCS_OK;
out:
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_msg_recv(void *worker, void *buf, size_t length, void *message, void *req,
                               ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *w = core_worker(worker);
    PyObject *args[] = {view(buf, length, PyBUF_WRITE), Py_NewRef(py(message))};
    ucs_status_t s = track("ucp_tag_msg_recv_nbx", method(s_tag_recv_message_nb, w, 2, args),
                           worker, req, info);
    Py_XDECREF(w);
    LEAVE;
    return s;
}

static ucs_status_t b_am_handler(void *worker, unsigned id, int on)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = plain(FN_am_handler, call(FN_am_handler, Py_BuildValue("(OIi)", py(worker),
                           id, on)));
    LEAVE;
    return s;
}

static ucs_status_t b_am_send(void *worker, void *ep, unsigned id, const void *header,
                              size_t header_length, const void *data, size_t length, void *req,
                              ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *args[] = {PyLong_FromUnsignedLong(id), view(header, header_length, PyBUF_READ),
                        view(data, length, PyBUF_READ)};
    ucs_status_t s = track("ucp_am_send_nbx", method(s_am_send_nb, ep, 3, args), worker, req,
                           info);
    LEAVE;
    return s;
}

static ucs_status_t b_am_recv(void *worker, void *desc, void *buf, size_t length, void *req,
                              ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *args[] = {view(buf, length, PyBUF_WRITE)};
    ucs_status_t s = track("ucp_am_recv_data_nbx", method(s_receive, desc, 1, args), worker, req,
                           info);
    LEAVE;
    return s;
}

static void b_am_drop(void *desc)
{
    ENTER_OR();
    plain(FN_am_drop, call(FN_am_drop, Py_BuildValue("(O)", py(desc))));
    Py_XDECREF((PyObject *)desc);
    LEAVE;
}

static ucs_status_t b_mem_map(void *ctx, void *address, size_t length, void *fixed,
                              void **mem, void **address_out)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    PyObject *mh, *buf = address != NULL ? view(address, length, PyBUF_WRITE) : Py_NewRef(Py_None);
    PyObject *res = call(FN_mem_map, Py_BuildValue("(ONnK)", py(ctx), buf, (Py_ssize_t)length,
                                                   (unsigned long long)(uintptr_t)fixed));
    unsigned long long at;
    if (res == NULL || !PyArg_ParseTuple(res, "OK", &mh, &at)) {
        s = raised("ucp_mem_map");
        goto out;
    }
    Py_INCREF(mh);
    *mem = mh;
    *address_out = (void *)(uintptr_t)at;
out:
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_mem_unmap(void *ctx, void *mem)
{
    return on_pair(FN_mem_unmap, ctx, mem);
}

/* The packed key in a malloc'd buffer: its 32-bit length, then the core's bytes. */
static ucs_status_t b_rkey_pack(void *mem, void **buffer, size_t *length)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    PyObject *res = call(FN_rkey_pack, Py_BuildValue("(O)", py(mem)));
    if (res == NULL || !PyBytes_Check(res)) {
        s = res == NULL ? raised("ucp_rkey_pack") : UCS_ERR_INVALID_PARAM;
        goto out;
    }
    uint32_t n = (uint32_t)PyBytes_GET_SIZE(res);
    *length = sizeof(n) + n;
    *buffer = malloc(*length);
    if (*buffer == NULL) {
        s = UCS_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(*buffer, &n, sizeof(n));
    memcpy((char *)*buffer + sizeof(n), PyBytes_AS_STRING(res), n);
out:
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_rkey_unpack(void *ep, const void *buffer, size_t length, void **rkey,
                                  const ucxdp_rkey_t **dp)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = object(FN_rkey_unpack, call(FN_rkey_unpack, Py_BuildValue(
        "(Oy#)", py(ep), (const char *)buffer, (Py_ssize_t)length)), rkey);
    *dp = s == UCS_OK ? dp_object(*rkey, "native", 1) : NULL;
    LEAVE;
    return s;
}

static ucs_status_t b_rma(void *worker, void *ep, int put, void *buf, size_t length,
                          uint64_t remote_addr, void *rkey, void *req, ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *args[] = {view(buf, length, put ? PyBUF_READ : PyBUF_WRITE),
                        PyLong_FromUnsignedLongLong(remote_addr), Py_NewRef(py(rkey))};
    ucs_status_t s = track(put ? "ucp_put" : "ucp_get", method(put ? s_put_nb : s_get_nb, ep, 3,
                           args), worker, req, info);
    LEAVE;
    return s;
}

/* The core's names of ucp_atomic_op_t's operations. */
static PyObject *atomic_name(ucp_atomic_op_t op)
{
    switch (op) {
    case UCP_ATOMIC_OP_ADD: return s_add;
    case UCP_ATOMIC_OP_SWAP: return s_swap;
    case UCP_ATOMIC_OP_CSWAP: return s_cswap;
    case UCP_ATOMIC_OP_AND: return s_and;
    case UCP_ATOMIC_OP_OR: return s_or;
    case UCP_ATOMIC_OP_XOR: return s_xor;
    default: return NULL;
    }
}

static ucs_status_t b_atomic(void *worker, void *ep, ucp_atomic_op_t op, size_t size,
                             uint64_t value, uint64_t compare, uint64_t remote_addr, void *rkey,
                             int fetch, void *req, ucp_tag_recv_info_t *info)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    PyObject *name = atomic_name(op);
    ucs_status_t s;
    /* first the core's immediate form (Endpoint.atomic_fetch_now: the key
     * maps the peer's memory here, CPU atomics): the old value, no request */
    PyObject *now[] = {Py_XNewRef(name), PyLong_FromUnsignedLongLong(value),
                       PyLong_FromUnsignedLongLong(remote_addr), Py_NewRef(py(rkey)),
                       PyLong_FromSize_t(size), PyLong_FromUnsignedLongLong(compare)};
    PyObject *old = method(s_atomic_fetch_now, ep, 6, now);
    if (old != NULL && old != Py_None) {
        uint64_t v = PyLong_AsUnsignedLongLongMask(old);
        s = PyErr_Occurred() ? raised("ucp_atomic") : UCS_OK;
        if (s == UCS_OK && info != NULL) {
            info->sender_tag = v;
            info->length = size;
        }
        Py_DECREF(old);
        LEAVE;
        return s;
    }
    if (old == NULL)                       /* (it reports bad input as None, not raising) */
        PyErr_Clear();
    Py_XDECREF(old);
    PyObject *args[] = {Py_XNewRef(name), PyLong_FromUnsignedLongLong(value),
                        PyLong_FromUnsignedLongLong(remote_addr), Py_NewRef(py(rkey)),
                        PyLong_FromSize_t(size), PyLong_FromUnsignedLongLong(compare)};
    s = track("ucp_atomic", method(fetch ? s_atomic_fetch_nb : s_atomic_post, ep,
                                   fetch ? 6 : 5, args), worker, req, info);
    if (!fetch)
        Py_XDECREF(args[5]);               /* not passed */
    LEAVE;
    return s;
}

static ucs_status_t b_rkey_map(void *rkey, void **map, void **address, uint64_t *base,
                               size_t *length)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    PyObject *view = NULL;
    unsigned long long b;
    Py_buffer buf;
    PyObject *res = call(FN_rkey_map, Py_BuildValue("(O)", py(rkey)));
    if (res == NULL) {
        s = raised("ucp_rkey_ptr");
        goto out;
    }
    if (res == Py_None) {
        s = UCS_ERR_UNREACHABLE;
        goto out;
    }
    if (!PyArg_ParseTuple(res, "OK", &view, &b) ||
        PyObject_GetBuffer(view, &buf, PyBUF_WRITABLE) < 0) {
        s = raised("ucp_rkey_ptr");
        goto out;
    }
    *address = buf.buf;                    /* valid while the view lives: kept in *map */
    *length = (size_t)buf.len;
    PyBuffer_Release(&buf);
    *base = b;
    *map = Py_NewRef(view);
out:
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_context_info(void *ctx, char **text)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    Py_ssize_t n;
    PyObject *res = call(FN_context_info, Py_BuildValue("(O)", py(ctx)));
    const char *utf8 = res != NULL ? PyUnicode_AsUTF8AndSize(res, &n) : NULL;
    if (utf8 == NULL)
        s = raised("ucp_context_print_info");
    else if ((*text = malloc((size_t)n + 1)) == NULL)
        s = UCS_ERR_NO_MEMORY;
    else
        memcpy(*text, utf8, (size_t)n + 1);
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_ep_perf(void *ep, size_t size, double *seconds)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    PyObject *res = call(FN_ep_perf, Py_BuildValue("(On)", py(ep), (Py_ssize_t)size));
    if (res == NULL || (*seconds = PyFloat_AsDouble(res), PyErr_Occurred()))
        s = raised("ucp_ep_evaluate_perf");
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucs_status_t b_arm(void *worker, int **fds, int *nfds, int *busy)
{
    ENTER_OR(UCS_ERR_NOT_CONNECTED);
    ucs_status_t s = UCS_OK;
    PyObject *res = call(FN_arm, Py_BuildValue("(O)", py(worker)));
    *fds = NULL;
    *nfds = 0;
    *busy = 0;
    if (res == NULL) {
        s = raised("ucp_worker_arm");
    } else if (res == Py_None) {
        *busy = 1;                          /* work now: progress first */
    } else {
        Py_ssize_t n = PySequence_Length(res);
        if (n < 0 || (*fds = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1))) == NULL) {
            s = n < 0 ? raised("ucp_worker_arm") : UCS_ERR_NO_MEMORY;
        } else {
            for (Py_ssize_t i = 0; i < n && s == UCS_OK; i++) {
                PyObject *item = PySequence_GetItem(res, i);
                long fd = item != NULL ? PyLong_AsLong(item) : -1;
                Py_XDECREF(item);
                if (PyErr_Occurred())
                    s = raised("ucp_worker_arm");
                (*fds)[i] = (int)fd;
            }
            *nfds = (int)n;
            if (s != UCS_OK) {
                free(*fds);
                *fds = NULL;
                *nfds = 0;
            }
        }
    }
    Py_XDECREF(res);
    LEAVE;
    return s;
}

static ucxs_bridge_t table = {
    .abi = UCXS_BRIDGE_ABI,
    .ep_perf = b_ep_perf,
    .flush_nb = b_flush_nb,
    .arm = b_arm,
    .attach = b_attach,
    .try_lock = b_try_lock,
    .lock = b_lock,
    .unlock = b_unlock,
    .py_pending = &py_pending,
    .tag_recv_taken = b_tag_recv_taken,
    .release = b_release,
    .context_create = b_context_create,
    .worker_create = b_worker_create,
    .worker_destroy = b_worker_destroy,
    .progress = b_progress,
    .unblocked = b_unblocked,
    .alive = b_alive,
    .holds_gil = b_holds_gil,
    .has_tstate = b_has_tstate,
    .ep_create = b_ep_create,
    .ep_close = b_ep_close,
    .ep_lane = b_ep_lane,
    .wake_peer = b_wake_peer,
    .stream_tail = b_stream_tail,
    .flush = b_flush,
    .cancel = b_cancel,
    .tag_send = b_tag_send,
    .tag_recv = b_tag_recv,
    .tag_probe = b_tag_probe,
    .msg_recv = b_msg_recv,
    .am_handler = b_am_handler,
    .am_send = b_am_send,
    .am_recv = b_am_recv,
    .am_drop = b_am_drop,
    .mem_map = b_mem_map,
    .mem_unmap = b_mem_unmap,
    .rkey_pack = b_rkey_pack,
    .rkey_unpack = b_rkey_unpack,
    .rma = b_rma,
    .atomic = b_atomic,
    .rkey_map = b_rkey_map,
    .context_info = b_context_info,
};

/* -- what the adapter calls ---------------------------------------------------------- */
static PyObject *m_am_event(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cworker, *desc;
    Py_buffer header, data = {0};
    PyObject *data_obj;
    unsigned id;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "OIy*OnO", &cworker, &id, &header, &data_obj, &length, &desc))
        return NULL;
    if (data_obj != Py_None && PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&header);
        return NULL;
    }
    void *d = NULL;
    if (desc != Py_None) {
        Py_INCREF(desc);                   /* dropped by am_drop */
        d = desc;
    }
    core->am_arrived(PyLong_AsVoidPtr(cworker), id, header.buf, (size_t)header.len, data.buf,
                     (size_t)length, d);
    PyBuffer_Release(&header);
    if (data.obj != NULL)
        PyBuffer_Release(&data);
    Py_RETURN_NONE;
}

static PyObject *m_ops(PyObject *self, PyObject *arg)
{
    (void)self;
    const ucxs_ops_t *ops = PyLong_AsVoidPtr(arg);
    if (ops == NULL)
        return PyErr_Occurred() ? NULL : PyDict_New();
#define OP(name) #name, (unsigned long long)ops->name
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsK}", OP(tag_send), OP(tag_recv),
                         OP(am_send), OP(am_recv), OP(put), OP(get), OP(atomic),
                         OP(progress_py), OP(progress_c), OP(py_left), OP(py_poll),
                         OP(py_busy),
                         OP(py_fds), OP(py_timer), OP(py_loopback), OP(py_ns),
                         OP(py_thread));
#undef OP
}

static PyObject *m_entries(PyObject *self, PyObject *unused)
{
    (void)self;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&py_entries, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"entries", m_entries, METH_NOARGS,
     "entries(): calls from libucp into Python in this process so far"},
    {"ops", m_ops, METH_O, "ops(address): a C worker's operation counts (ucxs_ops_t)"},
    {"am_event", m_am_event, METH_VARARGS,
     "am_event(cworker, id, header, data, length, desc): queue an active message"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ucxpy._ucp_bridge",
    "The Python side of libucp.so.0's calls (native/ucp/bridge.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

static int add_codes(PyObject *m)
{
#define CODE(name) PyModule_AddIntConstant(m, #name, name) < 0 ||
    return CODE(UCS_OK) CODE(UCS_INPROGRESS) CODE(UCS_ERR_NO_MESSAGE) CODE(UCS_ERR_NO_RESOURCE)
        CODE(UCS_ERR_IO_ERROR) CODE(UCS_ERR_NO_MEMORY) CODE(UCS_ERR_INVALID_PARAM)
        CODE(UCS_ERR_UNREACHABLE) CODE(UCS_ERR_INVALID_ADDR) CODE(UCS_ERR_NOT_IMPLEMENTED)
        CODE(UCS_ERR_MESSAGE_TRUNCATED) CODE(UCS_ERR_NO_DEVICE) CODE(UCS_ERR_CANCELED)
        CODE(UCS_ERR_TIMED_OUT) CODE(UCS_ERR_EXCEEDS_LIMIT) CODE(UCS_ERR_UNSUPPORTED)
        CODE(UCS_ERR_CONNECTION_RESET) CODE(UCS_ERR_ENDPOINT_TIMEOUT) 0 ? -1 : 0;
#undef CODE
}

PyMODINIT_FUNC PyInit__ucp_bridge(void)
{
    PyObject *m = PyModule_Create(&module_def), *adapter = NULL, *res = NULL;
    if (m == NULL || add_codes(m) < 0)
        goto fail;
#define NAME_INIT(n) if ((s_##n = PyUnicode_InternFromString(#n)) == NULL) goto fail;
    NAMES(NAME_INIT)
    if (PyType_Ready(&completion_type) < 0)
        goto fail;
    adapter = PyImport_ImportModule("ucxpy.capi");
    if (adapter == NULL)
        goto fail;
    tag_info_type = PyObject_GetAttrString(adapter, "TagInfo");
    if (tag_info_type == NULL)
        goto fail;
    recv_request_type = PyObject_GetAttrString(adapter, "RecvRequest");
    if (recv_request_type == NULL)
        goto fail;
    {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&py_lock, &a);
        pthread_mutexattr_destroy(&a);
    }
    for (int i = 0; i < FN_COUNT; i++) {
        fns[i] = PyObject_GetAttrString(adapter, fn_names[i]);
        if (fns[i] == NULL)
            goto fail;
    }
    res = PyObject_CallMethod(adapter, "attach", "O", m);
    if (res == NULL)
        goto fail;
    /* the data plane, when the core runs one (a build without it: everything
     * goes through the core) */
    table.dp = PyCapsule_Import(UCXDP_CAPSULE, 0);
    if (table.dp == NULL || table.dp->version != UCXDP_API_VERSION) {
        PyErr_Clear();
        table.dp = NULL;
    } else {
        table.dp->set_adopt(b_adopt);
    }
    PyObject *cap = PyCapsule_New((void *)&table, UCXS_BRIDGE_CAPSULE, NULL);
    if (cap == NULL || PyModule_AddObject(m, "table", cap) < 0) {
        Py_XDECREF(cap);
        goto fail;
    }
    Py_DECREF(res);
    Py_DECREF(adapter);
    return m;
fail:
    Py_XDECREF(res);
    Py_XDECREF(adapter);
    Py_XDECREF(m);
    return NULL;
}
