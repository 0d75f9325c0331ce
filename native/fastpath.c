/* ucxpy._fastpath: what is left of the core's first native fast path, until
 * the native data plane (native/dp) takes the eager send and the rendezvous
 * over: an eager send pushed into a peer's ring, the rendezvous offer and
 * its CMA read, and the API lock.
 *
 * A CPython extension rather than a cffi function so a buffer is any
 * buffer-protocol object taken as it is, with no cffi export to create and
 * release per call.  It compiles native/ring.c in (the rings themselves are
 * created through the cffi module ucxpy._native; a ring handle is passed as
 * its address).
 *
 * send_tag(ring address, am_id, tag, buffer, max_payload) -> rc
 *   pushes one eager frame (header: the 8-byte little-endian tag, payload:
 *   the buffer's bytes) when the payload is at most ``max_payload`` bytes:
 *   rc is ucxpy_ring_push's (0 sent, 1 sent and the consumer wants a
 *   wake-up, <0 not sent: full, busy, too big, closed, corrupt); -100: longer than
 *   ``max_payload``, not sent.  A buffer that is not contiguous raises
 *   BufferError, as ``memoryview`` would.
 *
 * serialized(fn, lock) -> a callable that runs fn(*args, **kwargs) holding
 *   ``lock`` (acquire() before, release() after, also when fn raises), and
 *   binds like a function when stored on a class.  It has a __dict__, so
 *   functools.update_wrapper gives it fn's name, docstring and __wrapped__.
 *   What a Python wrapper costs on every call (a frame with *args and **kwargs
 *   and two bound-method calls) becomes one vectorcall. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

#include "ucxpy_native.h"
#include "pyfastcall.h"
#include "pyslots.h"
#include "tcp_fast.h"

#define WAKE_BIT (1LL << 62)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the frame header's tag is little-endian (wire.EAGER); send_tag copies it as is"
#endif

static PyObject *
send_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long ring, tag;
    long long max_payload;
    int am_id, rc;
    Py_buffer buf;
    uint64_t hdr;

    if (!fc_nargs("send_tag", nargs, 5) || !fc_ull(args[0], &ring) || !fc_int(args[1], &am_id)
            || !fc_ull(args[2], &tag) || !fc_ll(args[4], &max_payload)
            || !fc_buffer(args[3], &buf, 0))
        return NULL;
    if (buf.len > max_payload) {
        PyBuffer_Release(&buf);
        return PyLong_FromLong(-100);
    }
    hdr = (uint64_t)tag;     /* x86-64 and aarch64 are little-endian, like wire.EAGER */
    rc = ucxpy_ring_push((ucxpy_ring_t *)(uintptr_t)ring, (unsigned)am_id, &hdr, sizeof hdr,
                         buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromLong(rc);
}

/* -- ApiLock: a re-entrant lock whose owner takes it again in C ---------------
 *
 * threading.RLock's interface (acquire(blocking, timeout), release, the
 * context manager, and Condition's _is_owned/_release_save/_acquire_restore).
 * Its state (owner, count, waiters) changes only under the GIL, which every
 * caller holds: taking a free lock or dropping it is a few stores, no OS
 * call.  A thread that must wait releases the GIL and sleeps on ``wake``, an
 * OS lock used as a signal (held while nobody signals), which a drop to 0
 * with waiters releases; a waiter retakes the GIL and looks again, so a
 * stale or lost signal costs at most one slice of its wait.  serialized()
 * takes and drops it by C calls (api_lock_take / api_lock_drop) instead of
 * calling bound acquire and release methods: mpi_shim's THREAD_MULTIPLE lock
 * is taken on every API call. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock wake;
    unsigned long owner;         /* thread ident of the holder (valid when count > 0) */
    unsigned long count;
    unsigned long waiters;
} ApiLock;

static PyTypeObject ApiLockType;

static long long
now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#define API_LOCK_SLICE_US 5000   /* the longest sleep between looks */

/* 1 taken, 0 not within timeout_us (-1: forever), -1 error (a signal handler raised) */
static int
api_lock_take(ApiLock *l, long long timeout_us)
{
    unsigned long me = PyThread_get_thread_ident();
    long long deadline;
    int r = 0;

    if (!l->count) {
        l->owner = me;
        l->count = 1;
        return 1;
    }
    if (l->owner == me) {
        if (l->count == ULONG_MAX) {
            PyErr_SetString(PyExc_OverflowError, "lock taken too many times");
            return -1;
        }
        l->count++;
        return 1;
    }
    if (timeout_us == 0)
        return 0;
    deadline = timeout_us < 0 ? 0 : now_us() + timeout_us;
    l->waiters++;
    for (;;) {
        long long slice = API_LOCK_SLICE_US;
        if (timeout_us >= 0) {
            long long left = deadline - now_us();
            if (left <= 0)
                break;
            if (slice > left)
                slice = left;
        }
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock_timed(l->wake, slice, 0);    /* a signal, or the slice */
        Py_END_ALLOW_THREADS
        if (!l->count) {
            l->owner = me;
            l->count = 1;
            r = 1;
            break;
        }
        if (PyErr_CheckSignals() < 0) {
            r = -1;
            break;
        }
    }
    l->waiters--;
    return r;
}

/* let go of it entirely: wake a waiter, if any */
static void
api_lock_free(ApiLock *l)
{
    l->count = 0;
    l->owner = 0;
    if (l->waiters)
        PyThread_release_lock(l->wake);   /* (releasing it twice is harmless) */
}

/* 0, or -1 with RuntimeError when this thread does not hold it */
static int
api_lock_drop(ApiLock *l)
{
    if (!l->count || l->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (l->count == 1)
        api_lock_free(l);
    else
        l->count--;
    return 0;
}

static PyObject *
api_lock_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    ApiLock *l;

    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "ApiLock() takes no arguments");
        return NULL;
    }
    l = (ApiLock *)type->tp_alloc(type, 0);
    if (l == NULL)
        return NULL;
    l->wake = PyThread_allocate_lock();
    if (l->wake == NULL) {
        Py_DECREF(l);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    PyThread_acquire_lock(l->wake, WAIT_LOCK);     /* held: no signal yet */
    return (PyObject *)l;
}

static void
api_lock_dealloc(ApiLock *l)
{
    if (l->wake != NULL) {
        PyThread_release_lock(l->wake);
        PyThread_free_lock(l->wake);
    }
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyObject *
api_lock_acquire(ApiLock *l, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1, r;
    double timeout = -1;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:acquire", names, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    r = api_lock_take(l, !blocking ? 0 : timeout < 0 ? -1 : (long long)(timeout * 1e6));
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *
api_lock_release(ApiLock *l, PyObject *unused)
{
    if (api_lock_drop(l) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
api_lock_exit(ApiLock *l, PyObject *args)
{
    return api_lock_release(l, NULL);
}

static PyObject *
api_lock_is_owned(ApiLock *l, PyObject *unused)
{
    return PyBool_FromLong(l->count && l->owner == PyThread_get_thread_ident());
}

/* Condition's protocol: give the lock up whatever the count, and take it back */
static PyObject *
api_lock_release_save(ApiLock *l, PyObject *unused)
{
    unsigned long count = l->count, owner = l->owner;

    if (!count || owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return NULL;
    }
    api_lock_free(l);
    return Py_BuildValue("(kk)", count, owner);
}

static PyObject *
api_lock_acquire_restore(ApiLock *l, PyObject *state)
{
    unsigned long count, owner;
    int r;

    if (!PyArg_ParseTuple(state, "kk:_acquire_restore", &count, &owner))
        return NULL;
    if (!count) {
        PyErr_SetString(PyExc_ValueError, "_acquire_restore: a count of 0");
        return NULL;
    }
    r = api_lock_take(l, -1);
    if (r <= 0)
        return NULL;
    l->count = count;
    l->owner = owner;
    Py_RETURN_NONE;
}

static PyObject *
api_lock_repr(ApiLock *l)
{
    return PyUnicode_FromFormat("<%s %s object owner=%lu count=%lu at %p>",
                                l->count ? "locked" : "unlocked", Py_TYPE(l)->tp_name,
                                l->count ? l->owner : 0UL, l->count, l);
}

static PyMethodDef api_lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))api_lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)api_lock_release, METH_NOARGS, "release the lock once"},
    {"__enter__", (PyCFunction)(void (*)(void))api_lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire()"},
    {"__exit__", (PyCFunction)api_lock_exit, METH_VARARGS, "release()"},
    {"_is_owned", (PyCFunction)api_lock_is_owned, METH_NOARGS, "held by this thread"},
    {"_release_save", (PyCFunction)api_lock_release_save, METH_NOARGS,
     "release it whatever the count; the state for _acquire_restore"},
    {"_acquire_restore", (PyCFunction)api_lock_acquire_restore, METH_O,
     "take it back as _release_save left it"},
    {NULL},
};

static PyTypeObject ApiLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._fastpath.ApiLock",
    .tp_basicsize = sizeof(ApiLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ApiLock(): a re-entrant lock like threading.RLock that serialized() "
              "takes and releases in C",
    .tp_new = api_lock_new,
    .tp_dealloc = (destructor)api_lock_dealloc,
    .tp_repr = (reprfunc)api_lock_repr,
    .tp_methods = api_lock_methods,
};

typedef struct {
    PyObject_HEAD
    PyObject *fn, *acquire, *release, *dict;
    ApiLock *lock;               /* the lock when it is an ApiLock (taken in C), else NULL */
    vectorcallfunc vectorcall;
} Serialized;

/* take and drop the lock: an ApiLock by C calls, another by its methods;
 * 0, or -1 with an error */
static int
serialized_take(Serialized *s)
{
    PyObject *ok;

    if (s->lock != NULL)
        return api_lock_take(s->lock, -1) > 0 ? 0 : -1;
    ok = PyObject_CallNoArgs(s->acquire);
    Py_XDECREF(ok);
    return ok != NULL ? 0 : -1;
}

static int
serialized_drop(Serialized *s)
{
    PyObject *ok;

    if (s->lock != NULL)
        return api_lock_drop(s->lock);
    ok = PyObject_CallNoArgs(s->release);
    Py_XDECREF(ok);
    return ok != NULL ? 0 : -1;
}

static PyObject *
serialized_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Serialized *s = (Serialized *)op;
    PyObject *r, *exc_type, *exc, *tb;

    if (serialized_take(s) < 0)
        return NULL;
    r = PyObject_Vectorcall(s->fn, args, nargsf, kwnames);
    if (r == NULL) {
        PyErr_Fetch(&exc_type, &exc, &tb);
        if (serialized_drop(s) < 0)          /* releasing failed: report the first error */
            PyErr_Clear();
        PyErr_Restore(exc_type, exc, tb);
        return NULL;
    }
    if (serialized_drop(s) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *
serialized_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fn, *lock;
    Serialized *s;

    if (!PyArg_ParseTuple(args, "OO:serialized", &fn, &lock))
        return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "serialized: fn must be callable");
        return NULL;
    }
    s = (Serialized *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    if (Py_TYPE(lock) == &ApiLockType) {
        Py_INCREF(lock);
        s->lock = (ApiLock *)lock;
    }
    s->acquire = PyObject_GetAttrString(lock, "acquire");
    s->release = s->acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    if (s->release == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    Py_INCREF(fn);
    s->fn = fn;
    s->vectorcall = serialized_vectorcall;
    return (PyObject *)s;
}

static int
serialized_traverse(Serialized *s, visitproc visit, void *arg)
{
    Py_VISIT(s->fn);
    Py_VISIT(s->acquire);
    Py_VISIT(s->release);
    Py_VISIT(s->lock);
    Py_VISIT(s->dict);
    return 0;
}

static int
serialized_clear(Serialized *s)
{
    Py_CLEAR(s->fn);
    Py_CLEAR(s->lock);
    Py_CLEAR(s->acquire);
    Py_CLEAR(s->release);
    Py_CLEAR(s->dict);
    return 0;
}

static void
serialized_dealloc(Serialized *s)
{
    PyObject_GC_UnTrack(s);
    serialized_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
serialized_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *
serialized_repr(Serialized *s)
{
    return PyUnicode_FromFormat("<serialized %R>", s->fn);
}

static PyMemberDef serialized_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Serialized, vectorcall), READONLY, NULL},
    {"fn", T_OBJECT, offsetof(Serialized, fn), READONLY, "the wrapped callable"},
    {NULL},
};

static PyGetSetDef serialized_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject SerializedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._fastpath.serialized",
    .tp_basicsize = sizeof(Serialized),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "serialized(fn, lock): fn called holding lock",
    .tp_new = serialized_new,
    .tp_dealloc = (destructor)serialized_dealloc,
    .tp_traverse = (traverseproc)serialized_traverse,
    .tp_clear = (inquiry)serialized_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = serialized_get,
    .tp_repr = (reprfunc)serialized_repr,
    .tp_members = serialized_members,
    .tp_getset = serialized_getset,
    .tp_dictoffset = offsetof(Serialized, dict),
    .tp_vectorcall_offset = offsetof(Serialized, vectorcall),
};


/* -- the classes the rendezvous offer fills ------------------------------------------
 *
 * recv_configure(Request): the class whose slots offer_rts fills as its
 * __init__ would; rndv_configure(SendState) below.
 * (Slot offsets: this file goes with the rendezvous step of the native data
 * plane, native/dp.) */
static struct {
    Py_ssize_t worker, done, exc, result, callbacks, cancel;
    PyObject *s_owner_ep, *s_queue, *s_held, *s_exc, *s_closing, *s_tx, *s_tx_addr,
             *s_wake_peer, *s_peer_pid, *s_cma_ok, *s_sends, *s_ids, *s_worker;
    PyTypeObject *req_base;     /* Request */
    PyTypeObject *send;         /* rndv.SendState (offer_rts registers them), and its slots */
    Py_ssize_t sd_ep, sd_mv, sd_req, sd_reading, sd_busy;
} R;

static PyObject *
recv_configure(PyObject *self, PyObject *args)
{
    PyTypeObject *req;

    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &req))
        return NULL;
    const slot_spec_t slots[] = {
        {&req, &R.worker, "worker"}, {&req, &R.done, "done"}, {&req, &R.exc, "exc"},
        {&req, &R.result, "result"}, {&req, &R.callbacks, "_callbacks"},
        {&req, &R.cancel, "_cancel"},
        {NULL, NULL, NULL},
    };

    R.req_base = NULL;
    if (slot_offsets(slots) < 0)
        return NULL;
#define INTERN(field, text) \
    if (R.field == NULL && (R.field = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_owner_ep, "owner_ep");
    INTERN(s_queue, "_queue");
    INTERN(s_held, "_held");
    INTERN(s_exc, "_exc");
    INTERN(s_closing, "_closing");
    INTERN(s_tx, "_tx");
    INTERN(s_tx_addr, "_tx_addr");
    INTERN(s_wake_peer, "_wake_peer");
    INTERN(s_peer_pid, "_peer_pid");
    INTERN(s_cma_ok, "_cma_ok");
    INTERN(s_sends, "sends");
    INTERN(s_ids, "_ids");
    INTERN(s_worker, "worker");
#undef INTERN
    Py_XSETREF(R.req_base, (PyTypeObject *)Py_NewRef(req));
    Py_RETURN_NONE;
}

/* A new request of class ``cls`` (Request or a subclass) of ``worker`` with
 * the slots Request.__init__ sets set so (``cancel``: its cancel function,
 * or None); NULL with an exception set. */
static PyObject *
new_request(PyTypeObject *cls, PyObject *worker, PyObject *cancel)
{
    PyObject *req = cls->tp_alloc(cls, 0);

    if (req == NULL)
        return NULL;
    SLOT(req, R.worker) = Py_NewRef(worker);
    SLOT(req, R.done) = Py_NewRef(Py_False);
    SLOT(req, R.exc) = Py_NewRef(Py_None);
    SLOT(req, R.result) = Py_NewRef(Py_None);
    SLOT(req, R.callbacks) = Py_NewRef(Py_None);
    SLOT(req, R.cancel) = Py_NewRef(cancel);
    return req;
}

/* a new reference to attribute ``name`` of ``o``; NULL with no error set
 * only when the attribute is absent */
static PyObject *
attr(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);

    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

/* -- the rendezvous offer and its native get ----------------------------------------- */
#define AM_TAG_EAGER 2          /* ucxpy.wire.AmId (checked by ucxpy.worker at import) */
#define AM_TAG_RTS 3
#define AM_RNDV_ATS 6
#define RTS_SIZE 32             /* wire.RTS: tag, sreq id, size, address */
#define SHM_RKEY_SIZE 24        /* shm_md.RKEY: magic, pid, base, length */
#define ATS_SIZE 9              /* wire.ATS: sreq id, status */


/* The ring of a ShmEndpoint when a frame may be pushed straight into it (it
 * is open, nothing queued or held: what ShmEndpoint.send_eager checks), or
 * NULL (no exception set). */
static ucxpy_ring_t *
direct_ring(PyObject *lane)
{
    PyObject *v;
    ucxpy_ring_t *ring = NULL;
    int ok;

#define CHECK(name, test) \
    if ((v = attr(lane, R.name)) == NULL) { PyErr_Clear(); return NULL; } \
    ok = (test); Py_DECREF(v); if (!ok) return NULL;
    CHECK(s_queue, PyObject_Size(v) == 0)
    CHECK(s_held, v == Py_False)
    CHECK(s_exc, v == Py_None)
    CHECK(s_closing, v == Py_False)
    CHECK(s_tx, v != Py_None)
    CHECK(s_tx_addr, PyLong_CheckExact(v)
          && (ring = (ucxpy_ring_t *)(uintptr_t)PyLong_AsUnsignedLongLong(v)) != NULL)
#undef CHECK
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    return ring;
}

/* ATS(OK) for send ``sreq_id`` on ``lane``: pushed, or given to its send()
 * (which queues it).  A connection that broke meanwhile is not an error
 * here (as RendezvousProtocol._ack: the sender is gone, nothing waits). */
static void
send_ats(PyObject *lane, uint64_t sreq_id)
{
    uint8_t hdr[ATS_SIZE];
    ucxpy_ring_t *ring = direct_ring(lane);
    PyObject *r;
    int rc = UCXPY_RING_BUSY;

    memcpy(hdr, &sreq_id, 8);   /* little-endian, as wire.ATS */
    hdr[8] = 0;                 /* wire.ATS_OK */
    if (ring != NULL)
        rc = ucxpy_ring_push(ring, AM_RNDV_ATS, hdr, sizeof hdr, NULL, 0);
    if (rc == UCXPY_RING_OK)
        return;
    if (rc == UCXPY_RING_NOTIFY)
        r = PyObject_CallMethodNoArgs(lane, R.s_wake_peer);
    else
        r = PyObject_CallMethod(lane, "send", "iy#", AM_RNDV_ATS, (const char *)hdr,
                                (Py_ssize_t)sizeof hdr);
    Py_XDECREF(r);
    PyErr_Clear();
}

/* The pid a shm remote key ``key`` (shm_md.RKEY: "SHMK", pid, base, length)
 * lets CMA read [addr, addr + size) of, when that pid is the peer of the
 * ShmEndpoint ``tep`` and CMA to it is known to work (its _cma_ok True), or
 * 0 (no exception set). */
static uint32_t
cma_key(PyObject *tep, const uint8_t *key, uint64_t addr, uint64_t size)
{
    uint64_t base, length;
    uint32_t pid;
    long long peer_pid;
    PyObject *v;
    int ok;

    if (memcmp(key, "SHMK", 4) != 0)
        return 0;
    memcpy(&pid, key + 4, 4);
    memcpy(&base, key + 8, 8);
    memcpy(&length, key + 16, 8);
    if (addr < base || addr + size > base + length || addr + size < addr)
        return 0;
    if ((v = attr(tep, R.s_peer_pid)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    peer_pid = PyLong_CheckExact(v) ? PyLong_AsLongLong(v) : -1;
    Py_DECREF(v);
    if (peer_pid != (long long)pid || (v = attr(tep, R.s_cma_ok)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    ok = v == Py_True;
    Py_DECREF(v);
    return ok ? pid : 0;
}

/* Read a rendezvous offer whole by CMA: ``size`` bytes at ``addr`` of the
 * peer of ShmEndpoint ``tep`` into ``buf``, when its shm key ``key`` lets
 * CMA reach them (cma_key).  1 when read, 0 when not (the Python path then
 * reads it and reports), with no exception set. */
static int
read_offer(PyObject *tep, const uint8_t *key, uint64_t addr, void *buf, uint64_t size)
{
    uint32_t pid = cma_key(tep, key, addr, size);

    return pid != 0 && (size == 0 || ucxpy_cma_read((int)pid, buf, addr, (size_t)size)
                                     == (int64_t)size);
}

/* get_and_ack(tep, lane, key, address, buffer, sreq id) -> bool
 *   a rendezvous offer matched from the unexpected queue, taken as
 *   dispatch_tag takes one from the inbox: reads len(buffer) bytes at
 *   ``address`` of the peer of ShmEndpoint ``tep`` (``key``: the offer's shm
 *   key) into ``buffer`` by CMA, then answers ATS(OK) for ``sreq id`` on
 *   ``lane`` (the Endpoint's); False, with nothing answered, when the key
 *   is not the peer's, CMA is not known to work or the read fell short
 *   (RendezvousProtocol.start_recv then does it all and reports). */
static PyObject *
get_and_ack(PyObject *self, PyObject *args)
{
    PyObject *tep, *lane;
    Py_buffer key, buf;
    unsigned long long addr, sreq_id;
    int ok;

    if (!PyArg_ParseTuple(args, "OOy*Kw*K", &tep, &lane, &key, &addr, &buf, &sreq_id))
        return NULL;
    ok = key.len == SHM_RKEY_SIZE && PyBuffer_IsContiguous(&buf, 'C')
         && read_offer(tep, key.buf, addr, buf.buf, (uint64_t)buf.len);
    PyBuffer_Release(&key);
    PyBuffer_Release(&buf);
    if (ok)
        send_ats(lane, sreq_id);
    return PyBool_FromLong(ok);
}

/* Push the offer of send ``sreq_id``: am_id TAG_RTS, header wire.RTS(tag,
 * sreq id, size, address) followed by the shm key of [address, address +
 * size) for ``pid``, shm_md.RKEY("SHMK", pid, address, size); no payload.
 * ucxpy_ring_push's code. */
static int
push_rts(ucxpy_ring_t *ring, uint64_t tag, uint64_t sreq_id, uint64_t addr, uint64_t size,
         uint32_t pid)
{
    uint8_t hdr[RTS_SIZE + SHM_RKEY_SIZE];
    uint64_t w[4] = {tag, sreq_id, size, addr};

    memcpy(hdr, w, RTS_SIZE);
    memcpy(hdr + RTS_SIZE, "SHMK", 4);
    memcpy(hdr + RTS_SIZE + 4, &pid, 4);
    memcpy(hdr + RTS_SIZE + 8, &addr, 8);
    memcpy(hdr + RTS_SIZE + 16, &size, 8);
    return ucxpy_ring_push(ring, AM_TAG_RTS, hdr, sizeof hdr, NULL, 0);
}

/* send_rts(ring address, tag, sreq id, buffer, pid) -> rc
 *   pushes one rendezvous offer (push_rts): what Endpoint.send_message
 *   sends after RendezvousProtocol.post_send and
 *   ShmEndpoint.pack_local_key.  rc as ucxpy_ring_push's. */
static PyObject *
send_rts(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long ring, tag, sreq_id, pid_arg;
    Py_buffer buf;
    uint64_t addr, size;

    if (!fc_nargs("send_rts", nargs, 5) || !fc_ull(args[0], &ring) || !fc_ull(args[1], &tag)
            || !fc_ull(args[2], &sreq_id) || !fc_ull(args[4], &pid_arg)
            || !fc_buffer(args[3], &buf, 0))
        return NULL;
    addr = (uint64_t)(uintptr_t)buf.buf;
    size = (uint64_t)buf.len;
    PyBuffer_Release(&buf);        /* (the caller keeps the buffer until ATS) */
    return PyLong_FromLong(push_rts((ucxpy_ring_t *)(uintptr_t)ring, tag, sreq_id, addr, size,
                                    (uint32_t)pid_arg));
}

/* offer_rts(lane, pid, rndv, ep, buffer, tag, thresh) -> Request or None
 *   RendezvousProtocol.offer with ShmEndpoint.send_rts, in one call, for
 *   Endpoint.tag_send_nb (ShmEndpoint.offer_rts binds ``lane``, the
 *   ShmEndpoint, and ``pid``, its interface's): for a 1-D C-contiguous byte
 *   buffer of ``thresh`` bytes or more whose offer can be pushed into the
 *   peer's inbox now (direct_ring), registers the send as offer() does (the
 *   next id of ``rndv``, a Request of its worker, a SendState of ``ep``, the
 *   buffer's view and the request in ``rndv.sends``), pushes its RTS
 *   (push_rts; the peer woken if it sleeps) and returns the request.  None
 *   with nothing registered otherwise (the Python path then does it). */
static PyObject *
offer_rts(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *lane, *rndv, *ep, *mv = NULL, *sends = NULL, *ids = NULL, *worker = NULL,
             *id = NULL, *req = NULL, *s = NULL, *out = NULL, *r;
    unsigned long long pid, tag;
    long long thresh;
    ucxpy_ring_t *ring;
    Py_buffer *v;
    int rc;

    if (!fc_nargs("offer_rts", nargs, 7) || !fc_ull(args[1], &pid) || !fc_ull(args[5], &tag)
            || !fc_ll(args[6], &thresh))
        return NULL;
    if (R.send == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "offer_rts: rndv_configure() first");
        return NULL;
    }
    lane = args[0];
    rndv = args[2];
    ep = args[3];
    if (Py_TYPE(args[4]) == &PyMemoryView_Type)
        mv = Py_NewRef(args[4]);
    else if ((mv = PyMemoryView_FromObject(args[4])) == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    v = PyMemoryView_GET_BUFFER(mv);
    if (v->ndim != 1 || (v->format != NULL && strcmp(v->format, "B"))
            || !PyBuffer_IsContiguous(v, 'C') || v->len < thresh
            || (ring = direct_ring(lane)) == NULL)
        goto done;
    if ((sends = attr(rndv, R.s_sends)) == NULL || !PyDict_CheckExact(sends)
            || (ids = attr(rndv, R.s_ids)) == NULL || (worker = attr(rndv, R.s_worker)) == NULL
            || (id = PyIter_Next(ids)) == NULL
            || (req = new_request(R.req_base, worker, Py_None)) == NULL
            || (s = R.send->tp_alloc(R.send, 0)) == NULL)
        goto done;
    SLOT(s, R.sd_ep) = Py_NewRef(ep);
    SLOT(s, R.sd_mv) = Py_NewRef(mv);
    SLOT(s, R.sd_req) = Py_NewRef(req);
    SLOT(s, R.sd_reading) = Py_NewRef(Py_True);
    if ((SLOT(s, R.sd_busy) = PyLong_FromLong(0)) == NULL || PyDict_SetItem(sends, id, s) < 0)
        goto done;
    rc = push_rts(ring, tag, PyLong_AsUnsignedLongLong(id), (uint64_t)(uintptr_t)v->buf,
                  (uint64_t)v->len, (uint32_t)pid);
    if (PyErr_Occurred() || (rc != UCXPY_RING_OK && rc != UCXPY_RING_NOTIFY)) {
        PyErr_Clear();
        if (PyDict_DelItem(sends, id) < 0)      /* nothing sent: nothing registered */
            PyErr_Clear();
        goto done;
    }
    out = Py_NewRef(req);
    if (rc == UCXPY_RING_NOTIFY) {      /* (as send_ats: the offer is in, come what may) */
        r = PyObject_CallMethodNoArgs(lane, R.s_wake_peer);
        Py_XDECREF(r);
        PyErr_Clear();
    }
done:
    Py_XDECREF(mv);
    Py_XDECREF(sends);
    Py_XDECREF(ids);
    Py_XDECREF(worker);
    Py_XDECREF(id);
    Py_XDECREF(req);
    Py_XDECREF(s);
    if (out != NULL || PyErr_Occurred())
        return out;
    Py_RETURN_NONE;
}

/* rndv_configure(SendState): the class of the sends offer_rts registers (its
 * slots filled as its __init__ would). */
static PyObject *
rndv_configure(PyObject *self, PyObject *arg)
{
    PyTypeObject *send = (PyTypeObject *)arg;
    const slot_spec_t slots[] = {
        {&send, &R.sd_ep, "ep"}, {&send, &R.sd_mv, "mv"}, {&send, &R.sd_req, "req"},
        {&send, &R.sd_reading, "reading"}, {&send, &R.sd_busy, "busy"},
        {NULL, NULL, NULL},
    };

    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "rndv_configure(SendState): a class");
        return NULL;
    }
    if (R.req_base == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rndv_configure: recv_configure() first");
        return NULL;
    }
    if (slot_offsets(slots) < 0)
        return NULL;
    Py_XSETREF(R.send, (PyTypeObject *)Py_NewRef(send));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"send_tag", (PyCFunction)(void (*)(void))send_tag, METH_FASTCALL,
     "push one eager frame into a ring"},
    {"tcp_recv_tag", (PyCFunction)(void (*)(void))ucxpy_tcp_recv_tag, METH_FASTCALL,
     "the next eager frame of a tcp socket, if it is the one and all there (native/tcp_fast.c)"},
    {"tcp_send_tag", (PyCFunction)(void (*)(void))ucxpy_tcp_send_tag, METH_FASTCALL,
     "one eager frame into a tcp socket with one sendmsg: bytes taken (native/tcp_fast.c)"},
    {"recv_configure", recv_configure, METH_VARARGS,
     "recv_configure(Request): the class offer_rts fills"},
    {"send_rts", (PyCFunction)(void (*)(void))send_rts, METH_FASTCALL,
     "push one rendezvous offer with its shm key"},
    {"offer_rts", (PyCFunction)(void (*)(void))offer_rts, METH_FASTCALL,
     "a tagged send's rendezvous registered and offered in one call: its Request, or None"},
    {"rndv_configure", rndv_configure, METH_O,
     "rndv_configure(SendState): the class offer_rts registers sends as"},
    {"get_and_ack", get_and_ack, METH_VARARGS,
     "a matched rendezvous offer read by CMA and answered ATS: True, or False"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "ucxpy._fastpath", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    PyObject *m;

    if (PyType_Ready(&SerializedType) < 0 || PyType_Ready(&ApiLockType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "WAKE_BIT", WAKE_BIT) < 0 ||
            PyModule_AddObject(m, "DISPATCH_AM_IDS", Py_BuildValue("(iii)", AM_TAG_EAGER,
                                                                   AM_TAG_RTS, AM_RNDV_ATS)) < 0 ||
            PyModule_AddObjectRef(m, "serialized", (PyObject *)&SerializedType) < 0 ||
            PyModule_AddObjectRef(m, "ApiLock", (PyObject *)&ApiLockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
