/* ucxpy._fastpath: the native fast path of a blocking exact-tag receive
 * (UCXPY_FASTPATH; ucxpy.worker.Worker.tag_recv / recv_poller).
 *
 * A CPython extension rather than a cffi function so the receive buffer is
 * any writable buffer-protocol object taken as it is ("w*": bytearray,
 * memoryview, numpy array), with no cffi export to create and release per
 * call.  It compiles native/ring.c in (the rings themselves are created
 * through the cffi module ucxpy._native; the ring handle is passed as its
 * address).  The ring is a process's inbox, which all its same-host peers
 * write to; ``source`` is the connection whose frames a receive may take.
 *
 * recv_tag(ring address, source, am_id, tag, mask, buffer, spins) -> (n, tag)
 *   n >= 0: the next frame was an eager message of connection ``source``
 *           whose tag equals ``tag`` under ``mask``; n = payload length,
 *           plus WAKE_BIT when a producer waits for space (the caller wakes
 *           it); its tag
 *   -1:     no frame within ``spins`` polls (or a closed/corrupt ring: the
 *           Python path reports that)
 *   -2:     the next frame is another one (left in the ring, in order)
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
recv_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long ring, source, tag, mask;
    int am_id, spins;
    Py_buffer buf;
    uint64_t wake = 0, got = 0;
    int64_t n;

    if (!fc_nargs("recv_tag", nargs, 7) || !fc_ull(args[0], &ring) || !fc_ull(args[1], &source)
            || !fc_int(args[2], &am_id) || !fc_ull(args[3], &tag) || !fc_ull(args[4], &mask)
            || !fc_int(args[6], &spins) || !fc_buffer(args[5], &buf, 1))
        return NULL;
    n = ucxpy_ring_recv_tag((ucxpy_ring_t *)(uintptr_t)ring, source, (uint8_t)am_id, tag,
                            mask, buf.buf, (uint64_t)buf.len, spins, &wake, &got);
    PyBuffer_Release(&buf);
    if (n >= 0 && wake)
        n |= WAKE_BIT;
    return Py_BuildValue("(LK)", (long long)n, (unsigned long long)got);
}

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


/* -- the receive classes drain_tag, dispatch_tag and post_recv fill ------------------
 *
 * recv_configure(RecvRequest, TagInfo, deque, TagMatcher, UnexpectedMessage,
 * RtsInfo): the classes whose slots they fill as the classes' __init__ and
 * Request.complete would, collections.deque (the tag matcher's queues), the
 * tag matcher's class (post_recv reads and sets its slots) and those of the
 * unexpected queue's messages and of the rendezvous offers among them
 * (dispatch_tag queues them, post_recv takes them). */
static struct {
    PyTypeObject *req, *info;
    PyObject *deque;
    Py_ssize_t worker, done, exc, result, callbacks, cancel, buf, capacity, source, tag, mask,
               seq, i_source, i_tag, i_length;
    PyObject *s_popleft, *s_tr, *s_matcher, *s_endpoints, *s_failed, *s_exact,
             *s_cancel_recv, *s_append, *s_wild, *s_buckets, *s_bucket_mask,
             *s_notify_mask, *s_owner_ep, *s_remote_id, *s_queue, *s_held, *s_exc, *s_closing,
             *s_tx, *s_tx_addr, *s_wake_peer, *s_peer_pid, *s_cma_ok, *s_lane_tep, *s_busy,
             *s_req, *s_complete, *s_give, *s_copy, *s_payloads, *s_tep_held, *s_min, *s_iface,
             *s_split_floor, *s_sends, *s_ids, *s_worker;
    PyTypeObject *req_base;     /* Request, RecvRequest's base */
    PyTypeObject *req_sub;      /* the last subclass of RecvRequest seen (is_recv_request) */
    PyTypeObject *matcher;      /* TagMatcher, whose slots post_recv reads and sets */
    Py_ssize_t m_exact, m_buckets, m_bucket_mask, m_wild, m_unexpected, m_seq, m_spare,
               m_notify_mask;
    PyTypeObject *unexp;        /* UnexpectedMessage, and its slots */
    Py_ssize_t u_source, u_tag, u_length, u_data, u_rts;
    PyTypeObject *rts;          /* RtsInfo (rendezvous offers queued unexpected), and its slots */
    Py_ssize_t r_tep, r_sreq_id, r_size, r_raddr, r_rkey;
    PyTypeObject *send;         /* rndv.SendState (offer_rts registers them), and its slots */
    Py_ssize_t sd_ep, sd_mv, sd_req, sd_reading, sd_busy;
    PyObject *mask_obj;         /* the last mask mask_value() converted, and its value */
    unsigned long long mask_val;
} R;

static PyObject *
recv_configure(PyObject *self, PyObject *args)
{
    PyTypeObject *req, *info, *matcher, *unexp, *rts;
    PyObject *deque;

    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!", &PyType_Type, &req, &PyType_Type, &info,
                          &PyType_Type, &deque, &PyType_Type, &matcher, &PyType_Type, &unexp,
                          &PyType_Type, &rts))
        return NULL;
    const slot_spec_t slots[] = {
        {&req, &R.worker, "worker"}, {&req, &R.done, "done"}, {&req, &R.exc, "exc"},
        {&req, &R.result, "result"}, {&req, &R.callbacks, "_callbacks"},
        {&req, &R.cancel, "_cancel"}, {&req, &R.buf, "buf"}, {&req, &R.capacity, "capacity"},
        {&req, &R.source, "source"}, {&req, &R.tag, "tag"}, {&req, &R.mask, "mask"},
        {&req, &R.seq, "seq"},
        {&info, &R.i_source, "source"}, {&info, &R.i_tag, "tag"},
        {&info, &R.i_length, "length"},
        {&matcher, &R.m_exact, "exact"}, {&matcher, &R.m_buckets, "buckets"},
        {&matcher, &R.m_bucket_mask, "bucket_mask"}, {&matcher, &R.m_wild, "wild"},
        {&matcher, &R.m_unexpected, "unexpected"}, {&matcher, &R.m_seq, "_seq"},
        {&matcher, &R.m_spare, "spare"}, {&matcher, &R.m_notify_mask, "notify_mask"},
        {&unexp, &R.u_source, "source"}, {&unexp, &R.u_tag, "tag"},
        {&unexp, &R.u_length, "length"}, {&unexp, &R.u_data, "data"},
        {&unexp, &R.u_rts, "rts"},
        {&rts, &R.r_tep, "tep"}, {&rts, &R.r_sreq_id, "sreq_id"}, {&rts, &R.r_size, "size"},
        {&rts, &R.r_raddr, "raddr"}, {&rts, &R.r_rkey, "rkey"},
        {NULL, NULL, NULL},
    };

    R.req = NULL;
    if (slot_offsets(slots) < 0)
        return NULL;
#define INTERN(field, text) \
    if (R.field == NULL && (R.field = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_popleft, "popleft");
    INTERN(s_tr, "tr");
    INTERN(s_matcher, "matcher");
    INTERN(s_endpoints, "endpoints");
    INTERN(s_failed, "failed");
    INTERN(s_exact, "exact");
    INTERN(s_cancel_recv, "_cancel_recv");
    INTERN(s_append, "append");
    INTERN(s_wild, "wild");
    INTERN(s_buckets, "buckets");
    INTERN(s_bucket_mask, "bucket_mask");
    INTERN(s_notify_mask, "notify_mask");
    INTERN(s_owner_ep, "owner_ep");
    INTERN(s_remote_id, "remote_id");
    INTERN(s_queue, "_queue");
    INTERN(s_held, "_held");
    INTERN(s_exc, "_exc");
    INTERN(s_closing, "_closing");
    INTERN(s_tx, "_tx");
    INTERN(s_tx_addr, "_tx_addr");
    INTERN(s_wake_peer, "_wake_peer");
    INTERN(s_peer_pid, "_peer_pid");
    INTERN(s_cma_ok, "_cma_ok");
    INTERN(s_lane_tep, "_tep");
    INTERN(s_busy, "busy");
    INTERN(s_req, "req");
    INTERN(s_complete, "complete");
    INTERN(s_give, "give");
    INTERN(s_copy, "copy");
    INTERN(s_payloads, "_payloads");
    INTERN(s_tep_held, "held");
    INTERN(s_min, "MIN");
    INTERN(s_iface, "iface");
    INTERN(s_split_floor, "split_floor");
    INTERN(s_sends, "sends");
    INTERN(s_ids, "_ids");
    INTERN(s_worker, "worker");
#undef INTERN
    Py_XSETREF(R.deque, Py_NewRef(deque));
    Py_XSETREF(R.info, (PyTypeObject *)Py_NewRef(info));
    Py_XSETREF(R.req, (PyTypeObject *)Py_NewRef(req));
    Py_XSETREF(R.matcher, (PyTypeObject *)Py_NewRef(matcher));
    Py_XSETREF(R.unexp, (PyTypeObject *)Py_NewRef(unexp));
    Py_XSETREF(R.rts, (PyTypeObject *)Py_NewRef(rts));
    R.req_base = req->tp_base;      /* (held by R.req) */
    Py_RETURN_NONE;
}

/* Whether a call that fills the classes recv_configure() names may go on:
 * it got ``want`` arguments (else TypeError naming ``usage``) and
 * recv_configure() ran (else RuntimeError). */
static int
receive_call(Py_ssize_t nargs, Py_ssize_t want, const char *usage)
{
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    if (R.req == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: recv_configure() first", usage);
        return 0;
    }
    return 1;
}

/* The rest of Request.complete() for a request without callbacks: done,
 * nothing left to cancel (result and error as they are). */
static void
mark_done(PyObject *req)
{
    PyObject *old = SLOT(req, R.done);

    SLOT(req, R.done) = Py_NewRef(Py_True);
    Py_XDECREF(old);
    old = SLOT(req, R.cancel);
    SLOT(req, R.cancel) = Py_NewRef(Py_None);
    Py_XDECREF(old);
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

/* A new TagInfo(source, tag, n) (its slots set as __init__ sets them), or
 * NULL with an exception set */
static PyObject *
new_tag_info(PyObject *source, PyObject *tagobj, PyObject *lenobj)
{
    PyObject *info = R.info->tp_alloc(R.info, 0);

    if (info == NULL)
        return NULL;
    SLOT(info, R.i_source) = Py_NewRef(source);
    SLOT(info, R.i_tag) = Py_NewRef(tagobj);
    SLOT(info, R.i_length) = Py_NewRef(lenobj);
    return info;
}

/* Complete the plain RecvRequest ``req`` (no callbacks: its slots are set as
 * Request.complete sets them) with TagInfo(source, tag, n).  -1 with an
 * exception set when out of memory. */
static int
complete_plain(PyObject *req, PyObject *source, uint64_t tag, int64_t n)
{
    PyObject *info, *old, *tagobj, *lenobj;

    tagobj = PyLong_FromUnsignedLongLong(tag);
    lenobj = PyLong_FromLongLong(n);
    info = tagobj && lenobj ? new_tag_info(source, tagobj, lenobj) : NULL;
    Py_XDECREF(tagobj);
    Py_XDECREF(lenobj);
    if (info == NULL)
        return -1;
    old = SLOT(req, R.result);
    SLOT(req, R.result) = info;
    Py_XDECREF(old);
    mark_done(req);
    return 0;
}

/* Whether ``req`` is a RecvRequest: the class recv_configure() names, or a
 * subclass of it a layer above posts (post_recv's ``cls``), which adds slots
 * of its own and leaves completion to the base class's (the native paths
 * fill the base's slots and do what Request.complete does). */
static inline int
is_recv_request(PyObject *req)
{
    PyTypeObject *t = Py_TYPE(req);

    if (t == R.req || t == R.req_sub)
        return 1;
    if (!PyType_IsSubtype(t, R.req))
        return 0;
    Py_XSETREF(R.req_sub, (PyTypeObject *)Py_NewRef(t));     /* (held: its address stays its) */
    return 1;
}

/* Whether ``req`` is a receive the native paths may fill and complete: a
 * RecvRequest (is_recv_request), not done, without completion callbacks,
 * with a buffer. */
static int
plain_recv(PyObject *req)
{
    return is_recv_request(req) && SLOT(req, R.callbacks) == Py_None
           && SLOT(req, R.done) == Py_False && SLOT(req, R.buf) != NULL
           && SLOT(req, R.buf) != Py_None;
}

/* -- drain_tag: frames already in the ring into the receives posted for them --
 *
 * recv_configure() (above) names the classes.
 *
 * drain_tag(ring, connection, am_id, tag, queue, source) -> count (plus
 * WAKE_BIT when a producer waits for space: the caller wakes it)
 *   ``queue`` is the tag matcher's deque of exact receives posted for
 *   (source, tag), or of its bucket for them: while its first receive is a plain RecvRequest (no
 *   completion callbacks) and the ring's next frame is an eager message of
 *   ``connection``
 *   with exactly ``tag`` that fits its buffer, the frame is copied into the
 *   buffer and consumed, the receive leaves the queue and completes with
 *   TagInfo(source, tag, length).  Stops, consuming nothing more, at
 *   anything else (another frame, an empty ring, a receive with callbacks:
 *   the Python path goes on from there, in order). */
static PyObject *
drain_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long ring, conn, tag;
    long am_id;
    PyObject *queue, *source, *req, *r;
    long long count = 0;
    uint64_t wake = 0, got = 0;
    int64_t n;
    Py_buffer view;

    if (!receive_call(nargs, 6, "drain_tag(ring, connection, am_id, tag, queue, source)"))
        return NULL;
    ring = PyLong_AsUnsignedLongLong(args[0]);
    conn = PyLong_AsUnsignedLongLong(args[1]);
    am_id = PyLong_AsLong(args[2]);
    tag = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    queue = args[4];
    source = args[5];
    while (!wake && PySequence_Size(queue) > 0) {
        req = PySequence_GetItem(queue, 0);
        if (req == NULL)
            return NULL;
        if (!plain_recv(req)) {
            Py_DECREF(req);
            break;
        }
        if (PyObject_GetBuffer(SLOT(req, R.buf), &view, PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            Py_DECREF(req);
            break;
        }
        n = ucxpy_ring_recv_tag((ucxpy_ring_t *)(uintptr_t)ring, conn, (uint8_t)am_id, tag,
                                ~0ULL, view.buf, (uint64_t)view.len, 0, &wake, &got);
        PyBuffer_Release(&view);
        if (n < 0) {
            Py_DECREF(req);
            break;
        }
        /* consumed: the receive leaves the queue and completes */
        count++;
        r = PyObject_CallMethodNoArgs(queue, R.s_popleft);
        Py_XDECREF(r);
        if (r == NULL || complete_plain(req, source, got, n) < 0) {
            Py_DECREF(req);
            return NULL;
        }
        Py_DECREF(req);
    }
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(count | (wake ? WAKE_BIT : 0));
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

/* a new reference to the object in slot ``off`` of ``o``; NULL, with no
 * error set, when the slot is empty (as attr() for an absent attribute) */
static inline PyObject *
slot_ref(PyObject *o, Py_ssize_t off)
{
    PyObject *v = SLOT(o, off);

    return v == NULL ? NULL : Py_NewRef(v);
}

/* The tag mask int ``o`` as PyLong_AsUnsignedLongLong converts it.  A layer
 * posts its receives with one or two mask objects, and a mask of 64 bits
 * converts slowly (CPython's byte-array path above 30 bits): the value of
 * the last one converted is kept (post_recv, and match_head for every
 * frame it matches to a posted receive). */
static unsigned long long
mask_value(PyObject *o)
{
    unsigned long long v;

    if (o == R.mask_obj)
        return R.mask_val;
    v = PyLong_AsUnsignedLongLong(o);
    if (v != (unsigned long long)-1 || !PyErr_Occurred()) {
        Py_XSETREF(R.mask_obj, Py_NewRef(o));
        R.mask_val = v;
    }
    return v;
}

/* -- dispatch_tag: the inbox's tagged messages into the receives posted for them --
 *
 * dispatch_tag(ring, conns, matcher, limit, sends, split, pool) -> count (plus
 * WAKE_BIT when a producer waits for space: the caller wakes it)
 *   What ShmInterface.progress, Worker.recv_frame and the worker's handlers
 *   do for the commonest frames, in one call for a run of them.  ``conns``
 *   maps a source to its transport endpoint (ShmEndpoint), whose ucxpy
 *   Endpoint must be wired up and not failed.  While the next frame of the
 *   inbox ``ring`` is one of these, it is consumed:
 *
 *   TAG_EAGER  the receive TagMatcher.match_posted would give it (``matcher``:
 *              exact queue or bucket, the earlier posted first) is a plain
 *              RecvRequest (no callbacks, a buffer it fits, no notification
 *              wanted): the payload is copied in, the receive leaves its
 *              queue and completes with TagInfo(remote id, tag, length).
 *              When no receive is posted for it at all, it joins the
 *              unexpected queue (its payload copied by ``pool``, the
 *              worker's PayloadPool; not when ``pool`` is None).
 *   TAG_RTS    a rendezvous offer of fewer than ``split`` bytes with a shm
 *              key of the connection's peer, which CMA reaches, matched as
 *              above: the receive reads the sender's buffer by
 *              process_vm_readv, answers ATS(OK) on its Endpoint's lane
 *              (pushed when nothing is queued there, else by the lane's
 *              send()) and completes.  One with no receive posted for it
 *              joins the unexpected queue, as an eager message does
 *              (post_recv reads it so when a receive comes).
 *   RNDV_ATS   ATS(OK) of a send in ``sends`` (RendezvousProtocol.sends)
 *              with nothing else outstanding (busy 0) and a plain Request:
 *              the send leaves ``sends`` and completes.
 *
 *   At most ``limit`` frames.  Stops, consuming nothing more, at anything
 *   else (an empty ring, another kind of frame, an unknown, failed or held
 *   connection, an unexpected offer, a wildcard receive posted, callbacks,
 *   truncation, a key or copy CMA refuses, an error status): the Python path
 *   takes that frame, in order, and reports its errors. */

#define AM_TAG_EAGER 2          /* ucxpy.wire.AmId (checked by ucxpy.worker at import) */
#define AM_TAG_RTS 3
#define AM_RNDV_ATS 6
#define RTS_SIZE 32             /* wire.RTS: tag, sreq id, size, address */
#define SHM_RKEY_SIZE 24        /* shm_md.RKEY: magic, pid, base, length */
#define ATS_SIZE 9              /* wire.ATS: sreq id, status */

/* what dispatch_tag reads of the matcher once per call */
typedef struct {
    PyObject *exact, *buckets;
    uint64_t bmask, nmask;
    int have_buckets;
    PyObject *unexp, *pool;     /* the unexpected queue and its PayloadPool, or NULL */
    long long pool_min;         /* the pool's MIN: smaller payloads are kept as bytes */
} match_state_t;

/* The receive match_posted would give a message (rid, tag), left in its
 * queue: *req (new reference), *q (borrowed) and *table and *key (key: a new
 * reference) to remove it.  0 with *req NULL when none (or not one the
 * native path may take: callbacks, a notification wanted, no buffer), -1
 * on error. */
static int
match_head(match_state_t *ms, PyObject *rid, uint64_t tag, PyObject **req, PyObject **q,
           PyObject **table, PyObject **key)
{
    PyObject *ktag, *bkey, *b, *e0, *b0, *r;
    uint64_t rmask;
    int earlier;

    *req = NULL;
    if ((ktag = PyLong_FromUnsignedLongLong(tag)) == NULL)
        return -1;
    *key = PyTuple_Pack(2, rid, ktag);
    Py_DECREF(ktag);
    if (*key == NULL)
        return -1;
    *table = ms->exact;
    *q = PyDict_GetItemWithError(ms->exact, *key);
    if (*q != NULL && PySequence_Size(*q) <= 0)
        *q = NULL;
    if (ms->have_buckets && !PyErr_Occurred()) {
        if ((ktag = PyLong_FromUnsignedLongLong(tag & ms->bmask)) == NULL)
            return -1;
        bkey = PyTuple_Pack(2, rid, ktag);
        Py_DECREF(ktag);
        if (bkey == NULL)
            return -1;
        b = PyDict_GetItemWithError(ms->buckets, bkey);
        if (b != NULL && PySequence_Size(b) > 0) {
            earlier = 1;
            if (*q != NULL) {           /* the lower sequence number wins */
                e0 = PySequence_GetItem(*q, 0);
                b0 = PySequence_GetItem(b, 0);
                earlier = e0 && b0 && is_recv_request(e0) && is_recv_request(b0)
                          && PyObject_RichCompareBool(SLOT(b0, R.seq), SLOT(e0, R.seq),
                                                      Py_LT) == 1;
                Py_XDECREF(e0);
                Py_XDECREF(b0);
            }
            if (earlier) {
                *q = b;
                *table = ms->buckets;
                Py_SETREF(*key, Py_NewRef(bkey));
            }
        }
        Py_DECREF(bkey);
    }
    if (PyErr_Occurred())
        return -1;
    if (*q == NULL)
        return 0;
    r = PySequence_GetItem(*q, 0);
    if (r == NULL)
        return -1;
    if (!plain_recv(r) || !PyLong_CheckExact(SLOT(r, R.mask))) {
        Py_DECREF(r);
        return 0;
    }
    rmask = mask_value(SLOT(r, R.mask));
    if (PyErr_Occurred() || (tag & ms->nmask & ~rmask)) {
        Py_DECREF(r);
        PyErr_Clear();
        return 0;
    }
    *req = r;
    return 0;
}

/* The receive at the head of ``q`` (just filled) leaves it, and ``key`` leaves
 * ``table`` when that emptied it, as match_posted does.  -1 on error. */
static int
pop_head(PyObject *q, PyObject *table, PyObject *key)
{
    PyObject *r = PyObject_CallMethodNoArgs(q, R.s_popleft);

    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if (PySequence_Size(q) == 0 && PyDict_GetItemWithError(table, key) == q)
        return PyDict_DelItem(table, key);
    return PyErr_Occurred() ? -1 : 0;
}

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

/* A tag frame that no receive is posted for into the unexpected queue, as
 * Worker._on_tag_eager and _on_tag_rts queue one: an UnexpectedMessage of
 * ``size`` bytes whose data is its eager payload's copy by the PayloadPool
 * (``payload``: in the inbox; ``bytes`` below the pool's MIN, without a
 * call), or, when ``payload`` is NULL, whose rts is the RtsInfo of an offer
 * on ``tep`` (``hdr``: its wire.RTS words, ``key``: its shm key).  1 when
 * queued, -1 on error. */
static int
keep_unexpected(match_state_t *ms, PyObject *rid, uint64_t tag, uint64_t size,
                const uint8_t *payload, PyObject *tep, const uint64_t *hdr, const uint8_t *key)
{
    PyObject *data = NULL, *rts = NULL, *mv, *msg = NULL, *r = NULL;

    if (payload == NULL) {
        data = Py_NewRef(Py_None);
        if ((rts = R.rts->tp_alloc(R.rts, 0)) == NULL)
            goto out;
        SLOT(rts, R.r_tep) = Py_NewRef(tep);
        if ((SLOT(rts, R.r_sreq_id) = PyLong_FromUnsignedLongLong(hdr[1])) == NULL
                || (SLOT(rts, R.r_size) = PyLong_FromUnsignedLongLong(size)) == NULL
                || (SLOT(rts, R.r_raddr) = PyLong_FromUnsignedLongLong(hdr[3])) == NULL
                || (SLOT(rts, R.r_rkey) = PyBytes_FromStringAndSize((const char *)key,
                                                                    SHM_RKEY_SIZE)) == NULL)
            goto out;
    } else {
        rts = Py_NewRef(Py_None);
        if ((long long)size < ms->pool_min) {
            data = PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)size);
        } else if ((mv = PyMemoryView_FromMemory((char *)payload, (Py_ssize_t)size,
                                                 PyBUF_READ)) != NULL) {
            data = PyObject_CallMethodOneArg(ms->pool, R.s_copy, mv);
            Py_DECREF(mv);
        }
    }
    if (data == NULL || (msg = R.unexp->tp_alloc(R.unexp, 0)) == NULL)
        goto out;
    SLOT(msg, R.u_source) = Py_NewRef(rid);
    SLOT(msg, R.u_data) = Py_NewRef(data);
    SLOT(msg, R.u_rts) = Py_NewRef(rts);
    if ((SLOT(msg, R.u_tag) = PyLong_FromUnsignedLongLong(tag)) == NULL
            || (SLOT(msg, R.u_length) = PyLong_FromUnsignedLongLong(size)) == NULL)
        goto out;
    r = PyObject_CallMethodOneArg(ms->unexp, R.s_append, msg);
out:
    Py_XDECREF(data);
    Py_XDECREF(rts);
    Py_XDECREF(msg);
    Py_XDECREF(r);
    return r == NULL ? -1 : 1;
}

/* A tag frame (eager or RTS) into the receive posted for it, or into the
 * unexpected queue when no receive is posted for it (keep_unexpected, when
 * ``ms`` names the queue).  1 when done, 0 when the Python path must take it,
 * -1 on error. */
static int
take_tag(match_state_t *ms, ucxpy_ring_t *ring, const uint64_t *out, PyObject *tep,
         PyObject *owner, PyObject *rid, long long split)
{
    PyObject *req = NULL, *q, *table, *key = NULL, *lane = NULL;
    uint64_t tag, hdr[RTS_SIZE / 8], size;
    uint8_t *h = ring->data + out[1];
    Py_buffer view;
    int rc = 0, rts = out[0] == AM_TAG_RTS;

    memcpy(&tag, h, sizeof tag);
    if (rts) {
        if (out[2] != RTS_SIZE + SHM_RKEY_SIZE || out[4] != 0)
            return 0;
        memcpy(hdr, h, RTS_SIZE);
        size = hdr[2];
    } else {
        size = out[4];
    }
    if (match_head(ms, rid, tag, &req, &q, &table, &key) < 0) {
        rc = -1;
        goto out;
    }
    if (req == NULL) {
        if (q == NULL && ms->unexp != NULL)     /* nothing posted for it */
            rc = keep_unexpected(ms, rid, tag, size, rts ? NULL : ring->data + out[3], tep, hdr,
                                 h + RTS_SIZE);
        goto out;
    }
    if (rts && (size >= (uint64_t)split || (lane = attr(owner, R.s_lane_tep)) == NULL
                || lane == Py_None))
        goto out;
    if (PyObject_GetBuffer(SLOT(req, R.buf), &view, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        goto out;
    }
    if ((uint64_t)view.len < size) {
        PyBuffer_Release(&view);
        goto out;           /* truncation: the Python path reports it */
    }
    if (rts) {
        if (!read_offer(tep, h + RTS_SIZE, hdr[3], view.buf, size)) {
            PyBuffer_Release(&view);
            goto out;       /* the Python path reads again and reports */
        }
    } else if (size) {
        memcpy(view.buf, ring->data + out[3], size);
    }
    PyBuffer_Release(&view);
    Py_INCREF(q);
    rc = pop_head(q, table, key);
    Py_DECREF(q);
    if (rc == 0 && rts)
        send_ats(lane, hdr[1]);
    if (rc == 0)
        rc = complete_plain(req, rid, tag, (int64_t)size) < 0 ? -1 : 1;
out:
    Py_XDECREF(req);
    Py_XDECREF(key);
    Py_XDECREF(lane);
    if (rc == 0)
        PyErr_Clear();
    return rc;
}

/* ATS(OK) of a send of ``sends`` that waits for nothing else: it completes.
 * 1 when done, 0 when the Python path must take it, -1 on error. */
static int
take_ats(PyObject *sends, ucxpy_ring_t *ring, const uint64_t *out)
{
    uint8_t *h = ring->data + out[1];
    uint64_t sreq_id;
    PyObject *id, *s, *req = NULL, *busy = NULL;
    int rc = 0;

    if (out[2] != ATS_SIZE || h[8] != 0 || !PyDict_CheckExact(sends))
        return 0;
    memcpy(&sreq_id, h, 8);
    if ((id = PyLong_FromUnsignedLongLong(sreq_id)) == NULL)
        return -1;
    s = PyDict_GetItemWithError(sends, id);
    if (s == NULL || (busy = attr(s, R.s_busy)) == NULL || !PyLong_CheckExact(busy)
            || PyLong_AsLong(busy) != 0
            || (req = attr(s, R.s_req)) == NULL || Py_TYPE(req) != R.req_base
            || SLOT(req, R.callbacks) != Py_None || SLOT(req, R.done) != Py_False)
        goto out;
    if (PyDict_DelItem(sends, id) < 0) {
        rc = -1;
        goto out;
    }
    mark_done(req);             /* Request.complete(): no result, no error, no callbacks */
    rc = 1;
out:
    Py_DECREF(id);
    Py_XDECREF(busy);
    Py_XDECREF(req);
    if (rc == 0)
        PyErr_Clear();
    return rc;
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
    if (R.req == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rndv_configure: recv_configure() first");
        return NULL;
    }
    if (slot_offsets(slots) < 0)
        return NULL;
    Py_XSETREF(R.send, (PyTypeObject *)Py_NewRef(send));
    Py_RETURN_NONE;
}

static PyObject *
dispatch_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxpy_ring_t *ring;
    PyObject *conns, *matcher, *sends, *wild = NULL, *bmask_o = NULL, *nmask_o = NULL,
             *src, *tep, *held = NULL, *owner = NULL, *failed = NULL, *rid = NULL;
    match_state_t ms = {NULL, NULL, 0, 0, 0, NULL, NULL, 0};
    PyObject *min;
    uint64_t out[UCXPY_RING_PEEK_OUT];
    long long count = 0, limit, split;
    int wake = 0, rc;

    if (!receive_call(nargs, 7, "dispatch_tag(ring, conns, matcher, limit, sends, split, pool)"))
        return NULL;
    ring = (ucxpy_ring_t *)(uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    limit = PyLong_AsLongLong(args[3]);
    split = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    conns = args[1];
    matcher = args[2];
    sends = args[4];
    if (!PyDict_CheckExact(conns))
        return PyLong_FromLong(0);
    /* the matcher's state, as match_posted reads it */
    if ((wild = attr(matcher, R.s_wild)) == NULL || !PyList_CheckExact(wild)
            || PyList_GET_SIZE(wild) != 0
            || (ms.exact = attr(matcher, R.s_exact)) == NULL || !PyDict_CheckExact(ms.exact)
            || (ms.buckets = attr(matcher, R.s_buckets)) == NULL
            || !PyDict_CheckExact(ms.buckets)
            || (bmask_o = attr(matcher, R.s_bucket_mask)) == NULL
            || (nmask_o = attr(matcher, R.s_notify_mask)) == NULL
            || !PyLong_CheckExact(nmask_o))
        goto done;
    ms.nmask = PyLong_AsUnsignedLongLong(nmask_o);
    ms.have_buckets = PyDict_GET_SIZE(ms.buckets) > 0;
    if (ms.have_buckets) {
        if (!PyLong_CheckExact(bmask_o))
            goto done;
        ms.bmask = PyLong_AsUnsignedLongLong(bmask_o);
    }
    if (PyErr_Occurred())
        goto done;
    if (args[6] != Py_None && Py_TYPE(matcher) == R.matcher
            && (ms.unexp = slot_ref(matcher, R.m_unexpected)) != NULL) {
        if (Py_TYPE(ms.unexp) == (PyTypeObject *)R.deque
                && (min = attr(args[6], R.s_min)) != NULL) {
            ms.pool = args[6];
            ms.pool_min = PyLong_AsLongLong(min);
            Py_DECREF(min);
        }
        if (ms.pool == NULL || PyErr_Occurred())
            Py_CLEAR(ms.unexp);
        PyErr_Clear();
    }
    while (count < limit && !wake) {
        if (ucxpy_ring_peek(ring, out) != 1)
            break;
        if (out[0] == AM_RNDV_ATS) {
            rc = take_ats(sends, ring, out);
        } else {
            if ((out[0] != AM_TAG_EAGER || out[2] != 8) && out[0] != AM_TAG_RTS)
                break;
            /* the connection, and its endpoint as Worker.recv_frame checks it */
            if ((src = PyLong_FromUnsignedLongLong(out[5])) == NULL)
                break;
            tep = PyDict_GetItemWithError(conns, src);
            Py_DECREF(src);
            if (tep == NULL || (held = attr(tep, R.s_tep_held)) == NULL || held != Py_None
                    || (owner = attr(tep, R.s_owner_ep)) == NULL || owner == Py_None
                    || (failed = attr(owner, R.s_failed)) == NULL || failed != Py_None
                    || (rid = attr(owner, R.s_remote_id)) == NULL || !PyLong_CheckExact(rid))
                break;
            rc = take_tag(&ms, ring, out, tep, owner, rid, split);
            Py_CLEAR(held);
            Py_CLEAR(owner);
            Py_CLEAR(failed);
            Py_CLEAR(rid);
        }
        if (rc <= 0)
            break;
        wake = ucxpy_ring_release(ring) == UCXPY_RING_NOTIFY;
        count++;
    }
done:
    Py_XDECREF(wild);
    Py_XDECREF(ms.exact);
    Py_XDECREF(ms.buckets);
    Py_XDECREF(bmask_o);
    Py_XDECREF(nmask_o);
    Py_XDECREF(ms.unexp);
    Py_XDECREF(held);
    Py_XDECREF(owner);
    Py_XDECREF(failed);
    Py_XDECREF(rid);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(count | (wake ? WAKE_BIT : 0));
}

/* -- TagInfo and completion from Python's fast paths -------------------------------
 *
 * tag_info(source, tag, length) -> TagInfo(source, tag, length), without
 *   its __init__'s frame.
 * complete_recv(req, source, tag, length) -> None: req.complete(TagInfo(...))
 *   for the receive a fast path took a message for (Worker._wait_exact, the
 *   poll of recv_poller, _fast_drain); a RecvRequest
 *   without callbacks, not done, gets its slots set here as complete() sets
 *   them, anything else has its complete() called. */
static PyObject *
tag_info(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!receive_call(nargs, 3, "tag_info(source, tag, length)"))
        return NULL;
    return new_tag_info(args[0], args[1], args[2]);
}

static PyObject *
complete_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *req, *info, *old, *r;

    if (!receive_call(nargs, 4, "complete_recv(req, source, tag, length)"))
        return NULL;
    req = args[0];
    info = new_tag_info(args[1], args[2], args[3]);
    if (info == NULL)
        return NULL;
    if (is_recv_request(req) && SLOT(req, R.callbacks) == Py_None
            && SLOT(req, R.done) == Py_False) {
        old = SLOT(req, R.result);
        SLOT(req, R.result) = info;
        Py_XDECREF(old);
        mark_done(req);
        Py_RETURN_NONE;
    }
    r = PyObject_CallMethodOneArg(req, R.s_complete, info);
    Py_DECREF(info);
    return r;
}

/* -- post_recv: Worker.tag_recv_nb's common case ---------------------------------
 *
 * Helpers first: the request, and the unexpected queue as Worker._post
 * looks at it. */

/* A new request of class ``cls`` (RecvRequest or a subclass) for the buffer
 * ``mv`` of ``len`` bytes, with its slots set as RecvRequest.__init__ sets
 * them and numbered ``seq``; NULL with an exception set. */
static PyObject *
new_recv(PyTypeObject *cls, PyObject *worker, PyObject *mv, Py_ssize_t len, PyObject *source,
         PyObject *tag, PyObject *mask, PyObject *seq, PyObject *cancel)
{
    PyObject *cap = PyLong_FromSsize_t(len),
             *req = cap != NULL ? new_request(cls, worker, cancel) : NULL;

    if (req == NULL) {
        Py_XDECREF(cap);
        return NULL;
    }
    SLOT(req, R.buf) = Py_NewRef(mv);
    SLOT(req, R.capacity) = cap;
    SLOT(req, R.source) = Py_NewRef(source);
    SLOT(req, R.tag) = Py_NewRef(tag);
    SLOT(req, R.mask) = Py_NewRef(mask);
    SLOT(req, R.seq) = Py_NewRef(seq);
    return req;
}

/* The oldest message of the unexpected queue ``unexp`` (a deque, in arrival
 * order) from worker ``source`` whose tag matches ``tag`` under ``mask``, as
 * TagMatcher.find_unexpected finds it: its index, *msg a new reference to
 * it; -1 when there is none; -2 when the Python path must look (an entry
 * that is not a plain UnexpectedMessage, or an error, left set).  A loop in
 * C: the queue an all-to-all leaves (a message of every peer that ran
 * first) costs nanoseconds per entry here. */
static Py_ssize_t
find_unexpected(PyObject *unexp, long long source, uint64_t tag, uint64_t mask, PyObject **msg)
{
    PyObject *it = PyObject_GetIter(unexp), *m, *s, *t;
    Py_ssize_t i = 0, found = -1;
    unsigned long long mt;

    if (it == NULL)
        return -2;
    while (found == -1 && (m = PyIter_Next(it)) != NULL) {
        s = SLOT(m, R.u_source);
        t = SLOT(m, R.u_tag);
        if (Py_TYPE(m) != R.unexp || s == NULL || t == NULL || !PyLong_CheckExact(s)
                || !PyLong_CheckExact(t)) {
            found = -2;
        } else if (PyLong_AsLongLong(s) == source) {
            mt = PyLong_AsUnsignedLongLong(t);
            if (PyErr_Occurred())
                found = -2;
            else if (((mt ^ tag) & mask) == 0) {
                *msg = Py_NewRef(m);
                found = i;
            }
        } else if (PyErr_Occurred()) {
            found = -2;
        }
        Py_DECREF(m);
        i++;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -2 : found;
}

/* Whether a receive may read the rendezvous offer ``rts`` (an RtsInfo) of
 * the unexpected queue into ``v`` natively (read_offer then reads it), as
 * Worker._recv_rndv lets ShmEndpoint.get_and_ack: it fits, it carries a shm
 * key, the Endpoint of its ShmEndpoint has a lane (*lane, a new reference,
 * for the ATS), and it is not one the receiver splits (below its
 * interface's split_floor, which the core sets).  The offer's size and ids
 * go to *size, *addr and *sreq_id.  0 when not, with no exception set. */
static int
rts_readable(PyObject *rts, Py_buffer *v, PyObject **lane, uint64_t *size, uint64_t *addr,
             uint64_t *sreq_id)
{
    PyObject *tep, *key, *owner = NULL, *iface = NULL, *floor = NULL;
    long long split;
    int ok = 0;

    *lane = NULL;
    if (Py_TYPE(rts) != R.rts)
        return 0;
    tep = SLOT(rts, R.r_tep);
    key = SLOT(rts, R.r_rkey);
    if (tep == NULL || key == NULL || !PyBytes_CheckExact(key)
            || PyBytes_GET_SIZE(key) != SHM_RKEY_SIZE)
        return 0;
    *size = PyLong_AsUnsignedLongLong(SLOT(rts, R.r_size));
    *addr = PyLong_AsUnsignedLongLong(SLOT(rts, R.r_raddr));
    *sreq_id = PyLong_AsUnsignedLongLong(SLOT(rts, R.r_sreq_id));
    if (PyErr_Occurred() || *size > (uint64_t)v->len)
        goto out;
    if ((iface = attr(tep, R.s_iface)) == NULL || (floor = attr(iface, R.s_split_floor)) == NULL
            || ((split = PyLong_AsLongLong(floor)) == -1 && PyErr_Occurred())
            || split < 0 || *size >= (uint64_t)split)
        goto out;
    if ((owner = attr(tep, R.s_owner_ep)) == NULL || owner == Py_None
            || (*lane = attr(owner, R.s_lane_tep)) == NULL || *lane == Py_None)
        goto out;
    ok = 1;
out:
    Py_XDECREF(owner);
    Py_XDECREF(iface);
    Py_XDECREF(floor);
    if (!ok)
        Py_CLEAR(*lane);
    PyErr_Clear();
    return ok;
}

/* A new receive (for the buffer ``mv``, ``v``: post_recv's arguments ``args``)
 * given ``msg``, the message at index ``k`` of the unexpected queue
 * ``unexp`` of matcher ``m`` that it matches, as Worker._post and
 * _deliver_unexpected give it one: an eager payload copied in (its buffer
 * back to the worker's PayloadPool), or a rendezvous offer read by CMA and
 * answered ATS (rts_readable); the message out of the queue, the request
 * completed.  NULL with no error set when the Python path must do it (a
 * notification wanted, a message larger than the buffer: it reports the
 * truncation, an offer not readable so). */
static PyObject *
recv_unexpected(PyObject *worker, PyObject *m, PyObject *unexp, Py_ssize_t k, PyObject *msg,
                PyObject *mv, Py_buffer *v, PyTypeObject *cls, PyObject *const *args,
                uint64_t mask)
{
    PyObject *data = SLOT(msg, R.u_data), *rts = SLOT(msg, R.u_rts), *nm = SLOT(m, R.m_notify_mask),
             *t = SLOT(msg, R.u_tag), *lane = NULL, *pool, *r, *req, *zero;
    unsigned long long mt, nmask;
    uint64_t size, addr, sreq_id;
    const uint8_t *key;
    Py_ssize_t n;
    Py_buffer dv;

    if (data == NULL || rts == NULL || (data == Py_None) == (rts == Py_None) || nm == NULL
            || !PyLong_CheckExact(nm))
        return NULL;
    mt = PyLong_AsUnsignedLongLong(t);
    nmask = PyLong_AsUnsignedLongLong(nm);
    if (PyErr_Occurred() || (mt & nmask & ~mask)) {
        PyErr_Clear();
        return NULL;
    }
    if (rts != Py_None) {               /* an offer: read by CMA, answered ATS */
        if (!rts_readable(rts, v, &lane, &size, &addr, &sreq_id))
            return NULL;
        key = (const uint8_t *)PyBytes_AS_STRING(SLOT(rts, R.r_rkey));   /* (rts_readable) */
        if (!read_offer(SLOT(rts, R.r_tep), key, addr, v->buf, size)) {
            Py_DECREF(lane);
            return NULL;                /* the Python path reads again and reports */
        }
        n = (Py_ssize_t)size;
        if (PySequence_DelItem(unexp, k) == 0)
            send_ats(lane, sreq_id);
        Py_DECREF(lane);
        if (PyErr_Occurred())
            return NULL;
    } else {                            /* eager: its copy out of the pool's buffer */
        if (PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            return NULL;
        }
        n = dv.len;
        if (n > v->len) {
            PyBuffer_Release(&dv);
            return NULL;
        }
        memcpy(v->buf, dv.buf, (size_t)n);
        PyBuffer_Release(&dv);
        if (PySequence_DelItem(unexp, k) < 0)
            return NULL;
        SLOT(msg, R.u_data) = Py_NewRef(Py_None);       /* (its reference is ours now) */
        if ((pool = attr(worker, R.s_payloads)) != NULL) {
            r = PyObject_CallMethodOneArg(pool, R.s_give, data);
            Py_DECREF(pool);
            Py_XDECREF(r);
        }
        Py_DECREF(data);
        if (PyErr_Occurred())
            return NULL;
    }
    if ((zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    req = new_recv(cls, worker, mv, v->len, args[4], args[2], args[3], zero, Py_None);
    Py_DECREF(zero);
    if (req != NULL && complete_plain(req, args[4], mt, n) < 0)
        Py_CLEAR(req);
    return req;
}

/* recv_configure() (above) names the classes.
 *
 * post_recv(worker, buf, tag, mask, source[, cls]) -> the posted RecvRequest
 * (of class ``cls`` when given: a subclass of RecvRequest whose own slots the
 * caller fills, as Worker.tag_recv_nb's ``request_class``; TypeError for
 * another class), or None having done nothing (the Python method then does
 * it all)
 *   for a receive from a worker id (a tag and mask of 64 bits), into a
 *   writable 1-D C-contiguous byte buffer (format "B"), with tracing off
 *   and the source's endpoint not failed: makes the request (buf: a
 *   memoryview of ``buf``).  When the unexpected queue holds a message it
 *   matches (find_unexpected), that message completes it (recv_unexpected:
 *   an eager one, wanting no notification, that fits; else the Python
 *   method does it all).  When none, it is posted as TagMatcher.post does:
 *   numbered, then appended to the queue for (source, tag) when the mask
 *   is all ones, to the bucket for (source, tag & mask) when it is the
 *   matcher's bucket_mask, else to the masked list. */
static PyObject *
post_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *worker, *buf, *mv = NULL, *tr = NULL, *m = NULL, *unexp = NULL, *eps = NULL,
             *ep, *failed = NULL, *posted = NULL, *seq = NULL, *next = NULL, *cancel = NULL,
             *key = NULL, *q, *sp, *req = NULL, *tup, *r, *out = NULL, *bmask = NULL,
             *ktag = NULL, *msg = NULL;
    Py_buffer *v;
    PyTypeObject *cls = R.req;
    long long source;
    unsigned long long mask, tag;
    Py_ssize_t k;
    int overflow, empty, queued;

    if ((nargs != 5 && nargs != 6) || R.req == NULL)
        Py_RETURN_NONE;
    if (nargs == 6 && args[5] != Py_None) {
        if (!PyType_Check(args[5]) || !PyType_IsSubtype((PyTypeObject *)args[5], R.req)) {
            PyErr_SetString(PyExc_TypeError, "post_recv: cls must be a subclass of RecvRequest");
            return NULL;
        }
        cls = (PyTypeObject *)args[5];
    }
    worker = args[0];
    buf = args[1];
    if (!PyLong_CheckExact(args[2]) || !PyLong_CheckExact(args[3]) || !PyLong_CheckExact(args[4]))
        Py_RETURN_NONE;
    mask = mask_value(args[3]);
    tag = PyLong_AsUnsignedLongLong(args[2]);       /* (a tag of 64 bits at most) */
    source = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (overflow || source < 0)
        Py_RETURN_NONE;
    /* the state the Python method looks at */
    if ((tr = attr(worker, R.s_tr)) == NULL || tr != Py_None)
        goto done;
    if ((m = attr(worker, R.s_matcher)) == NULL || Py_TYPE(m) != R.matcher
            || (unexp = slot_ref(m, R.m_unexpected)) == NULL)
        goto done;
    empty = PyObject_Not(unexp);
    if (empty < 0 || (!empty && Py_TYPE(unexp) != (PyTypeObject *)R.deque))
        goto done;
    if ((eps = attr(worker, R.s_endpoints)) == NULL || !PyDict_CheckExact(eps))
        goto done;
    ep = PyDict_GetItemWithError(eps, args[4]);
    if (ep != NULL && ((failed = attr(ep, R.s_failed)) == NULL || failed != Py_None))
        goto done;
    /* where TagMatcher.post puts it: the exact queues, a bucket, or the masked list */
    if (PyErr_Occurred() || (bmask = slot_ref(m, R.m_bucket_mask)) == NULL)
        goto done;
    queued = mask == ~0ULL || bmask == args[3];
    if (!queued && PyLong_CheckExact(bmask)) {
        queued = PyLong_AsUnsignedLongLong(bmask) == mask;
        if (PyErr_Occurred())
            goto done;
    }
    if ((posted = slot_ref(m, mask == ~0ULL ? R.m_exact : queued ? R.m_buckets : R.m_wild)) == NULL
            || (queued ? !PyDict_CheckExact(posted) : !PyList_CheckExact(posted)))
        goto done;
    /* the buffer: what recv_view returns as is */
    if (Py_TYPE(buf) == &PyMemoryView_Type)
        mv = Py_NewRef(buf);
    else if ((mv = PyMemoryView_FromObject(buf)) == NULL) {
        PyErr_Clear();
        goto done;
    }
    v = PyMemoryView_GET_BUFFER(mv);
    if (v->readonly || v->ndim != 1 || (v->format != NULL && strcmp(v->format, "B"))
            || !PyBuffer_IsContiguous(v, 'C'))
        goto done;
    if (!empty) {           /* what arrived first, else posted below */
        k = find_unexpected(unexp, source, tag, mask, &msg);
        if (k == -2)
            goto done;
        if (k >= 0) {
            out = recv_unexpected(worker, m, unexp, k, msg, mv, v, cls, args, mask);
            goto done;
        }
    }
    if ((seq = slot_ref(m, R.m_seq)) == NULL || !PyLong_CheckExact(seq)
            || (next = PyLong_FromLongLong(PyLong_AsLongLong(seq) + 1)) == NULL
            || PyErr_Occurred()
            || (cancel = attr(worker, R.s_cancel_recv)) == NULL
            || (ktag = PyLong_FromUnsignedLongLong(tag & mask)) == NULL
            || (key = PyTuple_Pack(2, args[4], ktag)) == NULL)
        goto done;
    req = new_recv(cls, worker, mv, v->len, args[4], args[2], args[3], next, cancel);
    if (req == NULL)
        goto done;
    Py_XSETREF(SLOT(m, R.m_seq), Py_NewRef(next));
    if (!queued) {                           /* masked: the list, in posting order */
        if (PyList_Append(posted, req) < 0)
            goto done;
        out = Py_NewRef(req);
        goto done;
    }
    q = PyDict_GetItemWithError(posted, key);
    if (q != NULL) {
        r = PyObject_CallMethodOneArg(q, R.s_append, req);
    } else if (PyErr_Occurred()) {
        goto done;
    } else {
        /* a new queue: the matcher's spare one (emptied, TagMatcher.post), else a deque */
        sp = SLOT(m, R.m_spare);
        if (sp != NULL && Py_TYPE(sp) == (PyTypeObject *)R.deque && PySequence_Size(sp) == 0) {
            q = Py_NewRef(sp);
            Py_XSETREF(SLOT(m, R.m_spare), Py_NewRef(Py_None));
            r = PyObject_CallMethodOneArg(q, R.s_append, req);
        } else {
            tup = PyTuple_Pack(1, req);
            q = tup != NULL ? PyObject_CallOneArg(R.deque, tup) : NULL;
            Py_XDECREF(tup);
            r = q != NULL ? Py_NewRef(Py_None) : NULL;
        }
        if (r != NULL && PyDict_SetItem(posted, key, q) < 0)
            Py_CLEAR(r);
        Py_XDECREF(q);
    }
    if (r == NULL)
        goto done;
    Py_DECREF(r);
    out = Py_NewRef(req);

done:
    Py_XDECREF(mv);
    Py_XDECREF(tr);
    Py_XDECREF(m);
    Py_XDECREF(unexp);
    Py_XDECREF(eps);
    Py_XDECREF(failed);
    Py_XDECREF(posted);
    Py_XDECREF(seq);
    Py_XDECREF(next);
    Py_XDECREF(cancel);
    Py_XDECREF(msg);
    Py_XDECREF(key);
    Py_XDECREF(ktag);
    Py_XDECREF(bmask);
    Py_XDECREF(req);
    if (out != NULL || PyErr_Occurred())
        return out;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"send_tag", (PyCFunction)(void (*)(void))send_tag, METH_FASTCALL,
     "push one eager frame into a ring"},
    {"recv_tag", (PyCFunction)(void (*)(void))recv_tag, METH_FASTCALL,
     "the next eager frame of a ring, if it is the one"},
    {"tcp_recv_tag", (PyCFunction)(void (*)(void))ucxpy_tcp_recv_tag, METH_FASTCALL,
     "the next eager frame of a tcp socket, if it is the one and all there (native/tcp_fast.c)"},
    {"tcp_send_tag", (PyCFunction)(void (*)(void))ucxpy_tcp_send_tag, METH_FASTCALL,
     "one eager frame into a tcp socket with one sendmsg: bytes taken (native/tcp_fast.c)"},
    {"recv_configure", recv_configure, METH_VARARGS,
     "recv_configure(RecvRequest, TagInfo, deque, TagMatcher, UnexpectedMessage, RtsInfo): "
     "the classes drain_tag, dispatch_tag and post_recv fill"},
    {"tag_info", (PyCFunction)(void (*)(void))tag_info, METH_FASTCALL,
     "TagInfo(source, tag, length), made in C"},
    {"complete_recv", (PyCFunction)(void (*)(void))complete_recv, METH_FASTCALL,
     "req.complete(TagInfo(source, tag, length)), in C for a plain RecvRequest"},
    {"post_recv", (PyCFunction)(void (*)(void))post_recv, METH_FASTCALL,
     "Worker.tag_recv_nb's common case: the posted request, or None"},
    {"drain_tag", (PyCFunction)(void (*)(void))drain_tag, METH_FASTCALL,
     "frames in the ring into the posted receives of a queue: count"},
    {"send_rts", (PyCFunction)(void (*)(void))send_rts, METH_FASTCALL,
     "push one rendezvous offer with its shm key"},
    {"offer_rts", (PyCFunction)(void (*)(void))offer_rts, METH_FASTCALL,
     "a tagged send's rendezvous registered and offered in one call: its Request, or None"},
    {"rndv_configure", rndv_configure, METH_O,
     "rndv_configure(SendState): the class offer_rts registers sends as"},
    {"get_and_ack", get_and_ack, METH_VARARGS,
     "a matched rendezvous offer read by CMA and answered ATS: True, or False"},
    {"dispatch_tag", (PyCFunction)(void (*)(void))dispatch_tag, METH_FASTCALL,
     "the inbox's tagged messages, rendezvous offers and ATS into what waits for them: count"},
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
