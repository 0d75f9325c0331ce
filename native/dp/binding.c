/*
 * binding.c — ucxpy._dp: the one Python binding of the data plane (dp.h).
 *
 * Theory of operation.  Python makes the data plane's objects and hands them
 * what it decided; each is a small extension type that owns its C state:
 *
 *   Worker()                     a ucxdp_worker_t; counters() -> dict
 *   MappedKey(worker, mapped, base, length, guard=0, guard_value=0,
 *             atomics=False, keep=None)
 *                                a peer's region mapped here (ucxdp_rkey_t);
 *                                `keep` holds the mapping for the key's life
 *       .put(remote_addr, buffer) / .get(remote_addr, buffer) -> bool
 *       .fetch(remote_addr, size, op, value, compare) -> old value or None
 *       .post(remote_addr, size, op, value) -> bool
 *   Symmetric()                  a symmetric region (OpenSHMEM's heap): PE ->
 *                                MappedKey; open(...), set(pe, key),
 *                                enable(flag), close()
 *   Symmetric.call(kind, fn)     a callable that does OpenSHMEM's plain calls
 *                                on the table in C (below), else calls fn
 *   Matcher()                    the tag matcher alone (match.c): post, arrive,
 *                                probe, cancel of caller-named objects (the
 *                                equivalence test with ucxpy.tag)
 *
 * A call that returns False or None did nothing: the buffer was not one
 * contiguous block, or the data plane declined (out of range, a stale key, a
 * misaligned atomic).  The caller's Python path, the reference, then does the
 * operation or raises its error in its own words.  Copies of 1 MiB or more
 * run without the GIL.
 *
 * Symmetric calls (shmem's put, get, their _nbi forms, quiet and integer
 * atomics): a call with
 * exactly its positional arguments, whose symmetric array is an exact
 * ndarray lying in the local region, whose other array (put/get) is an exact
 * ndarray of the same element format, whose value is an int and whose PE has
 * a key, is one data-plane operation; the old value of a fetching atomic
 * comes back as a Python int (as shmem4py's does).  quiet() is done
 * when the context's list of requests in flight is empty.  Anything else,
 * and every call while the table is disabled (tracing), goes to fn.
 *
 * The capsule _C_API (dp.h's ucxdp_api_t) gives other extension modules and
 * libucp's bridge the C objects behind these types.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <ctype.h>
#include <limits.h>
#include <string.h>

#include "dp.h"
#include "proto.h"
#include "match.h"
#include "ucxpy_native.h"

#define BIG_COPY (1 << 20)                 /* copies from here on drop the GIL */

/* ucxdp_put (put) or ucxdp_get of `n` bytes at `buf`, without the GIL when
 * the copy is long */
static ucxdp_status_t copy_gil_free(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t raddr,
                                    void *buf, size_t n, int put)
{
    ucxdp_status_t status;

    if (n < BIG_COPY)
        return put ? ucxdp_put(w, key, raddr, buf, n) : ucxdp_get(w, key, raddr, buf, n);
    Py_BEGIN_ALLOW_THREADS
    status = put ? ucxdp_put(w, key, raddr, buf, n) : ucxdp_get(w, key, raddr, buf, n);
    Py_END_ALLOW_THREADS
    return status;
}

/* an int argument as 64 bits (masked, as a tag): 0, or -1 with an error */
static int tm_u64(PyObject *o, uint64_t *v)
{
    unsigned long long x = PyLong_AsUnsignedLongLongMask(o);

    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

/* A sequence of (first, last) pairs into `ranges` (at most `max`): how many,
 * or -1 with an error. */
static Py_ssize_t parse_ranges(PyObject *arg, const char *what, uint64_t (*ranges)[2],
                               Py_ssize_t max)
{
    PyObject *seq = PySequence_Fast(arg, "a sequence of (first, last) pairs");
    Py_ssize_t n;

    if (seq == NULL)
        return -1;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %zd ranges", what, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &lo, &hi)) {
            Py_DECREF(seq);
            return -1;
        }
        ranges[i][0] = lo;
        ranges[i][1] = hi;
    }
    Py_DECREF(seq);
    return n;
}

/* -- Worker ----------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    ucxdp_worker_t *w;
} WorkerObject;

static PyTypeObject WorkerType;

/* (the Stream type, below) */
typedef struct {
    PyObject_HEAD
    ucxdp_stream_t s;
} StreamObject;

static PyTypeObject StreamType;

#define STREAM_OBJECT(sp) ((StreamObject *)((char *)(sp) - offsetof(StreamObject, s)))

static PyObject *worker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":Worker") || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Worker() takes no arguments");
        return NULL;
    }
    WorkerObject *self = (WorkerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (ucxdp_worker_create(&self->w) != UCXDP_OK) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void worker_dealloc(WorkerObject *self)
{
    while (self->w->nstreams > 0) {       /* (the references its registrations kept) */
        ucxdp_stream_t *st = self->w->streams[0];
        ucxdp_streams_remove(self->w, st);
        Py_DECREF(STREAM_OBJECT(st));
    }
    ucxdp_worker_destroy(self->w);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *worker_counters(WorkerObject *self, PyObject *unused)
{
    ucxdp_counters_t c;
    PyObject *d = PyDict_New(), *v;

    if (d == NULL)
        return NULL;
    ucxdp_worker_counters(self->w, &c);
#define COUNTER_ITEM(name)                                                        \
    v = PyLong_FromUnsignedLongLong(c.name);                                      \
    if (v == NULL || PyDict_SetItemString(d, #name, v) < 0) {                     \
        Py_XDECREF(v);                                                            \
        Py_DECREF(d);                                                             \
        return NULL;                                                              \
    }                                                                             \
    Py_DECREF(v);
    UCXDP_COUNTERS(COUNTER_ITEM)
#undef COUNTER_ITEM
    return d;
}

/* An external caller's rendezvous sends (rndv.c), for Python's path:
 * rndv_answered(id, status) -> bool: the answer to send `id` (an ATS frame
 *   Python's path handled); False when no such send waits;
 * rndv_adopt(id) -> a read-only memoryview of the bytes of send `id`
 *   (valid until it is answered), or None: Python's sender side takes the
 *   send over when the receiver asks for frames or a split instead of
 *   reading, and answers it (rndv_answered) when it completes;
 * rndv_fail_peer(peer): the sends waiting for `peer` fail. */
static PyObject *worker_rndv_answered(WorkerObject *self, PyObject *args)
{
    unsigned long long id;
    unsigned int status;

    if (!PyArg_ParseTuple(args, "KI:rndv_answered", &id, &status))
        return NULL;
    return PyBool_FromLong(ucxdp_rndv_answered(self->w, id, (uint8_t)status));
}

static PyObject *worker_rndv_adopt(WorkerObject *self, PyObject *arg)
{
    uint64_t id;
    ucxdp_rndv_send_t *sd;

    if (tm_u64(arg, &id) < 0)
        return NULL;
    sd = ucxdp_rndv_adopt(self->w, id);
    if (sd == NULL)
        Py_RETURN_NONE;
    if (sd->length > PY_SSIZE_T_MAX) {     /* (never: a buffer's length) */
        ucxdp_rndv_answered(self->w, id, 2);
        Py_RETURN_NONE;
    }
    return PyMemoryView_FromMemory((char *)sd->buffer, (Py_ssize_t)sd->length, PyBUF_READ);
}

static PyObject *worker_rndv_fail_peer(WorkerObject *self, PyObject *arg)
{
    long long peer = PyLong_AsLongLong(arg);

    if (peer == -1 && PyErr_Occurred())
        return NULL;
    ucxdp_rndv_fail_peer(self->w, peer, UCXDP_ERR_CONNECTION_RESET);
    Py_RETURN_NONE;
}

/* add_stream(stream) / remove_stream(stream): a tcp connection's reader a C
 * caller's progress runs while it is lent (stream.c; kept alive while added) */
static PyObject *worker_add_stream(WorkerObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &StreamType)) {
        PyErr_SetString(PyExc_TypeError, "add_stream(Stream)");
        return NULL;
    }
    switch (ucxdp_streams_add(self->w, &((StreamObject *)arg)->s)) {
    case -1:
        return PyErr_NoMemory();
    case 1:
        Py_INCREF(arg);                    /* (the registration's reference) */
        break;
    default:
        break;
    }
    Py_RETURN_NONE;
}

static PyObject *worker_remove_stream(WorkerObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &StreamType)) {
        PyErr_SetString(PyExc_TypeError, "remove_stream(Stream)");
        return NULL;
    }
    if (ucxdp_streams_remove(self->w, &((StreamObject *)arg)->s))
        Py_DECREF(arg);
    Py_RETURN_NONE;
}

/* A protocol plug-in's C half (proto.c, proto.h):
 * set_proto(address, param, am_id, [(first, last), ...]): run the table at
 *   `address` (a ucxdp_proto_ops_t, which its cffi module gives, and which
 *   lives as long as that module) for C callers' messages of those sizes;
 *   set_proto(None) forgets it;
 * proto_frame(conn, header, payload) -> bool: a plug-in frame Python's path
 *   read on connection `conn`, offered to the C half (True: taken);
 * proto_owed -> bool: the C half has frames to push (a wait must not sleep). */
static PyObject *worker_set_proto(WorkerObject *self, PyObject *args)
{
    PyObject *address, *sizes = Py_None;
    unsigned long long param = 0;
    unsigned int am_id = 0;
    uint64_t ranges[8][2];
    Py_ssize_t n = 0;
    const ucxdp_proto_ops_t *ops = NULL;
    ucxdp_status_t st;

    if (!PyArg_ParseTuple(args, "O|KIO:set_proto", &address, &param, &am_id, &sizes))
        return NULL;
    if (address != Py_None) {
        uintptr_t a = (uintptr_t)PyLong_AsUnsignedLongLong(address);
        if (PyErr_Occurred())
            return NULL;
        ops = (const ucxdp_proto_ops_t *)a;
        if (ops == NULL || ops->abi != UCXDP_PROTO_ABI)
            return PyErr_Format(PyExc_ValueError, "set_proto: not a protocol table of ABI %d",
                                UCXDP_PROTO_ABI);
        n = parse_ranges(sizes, "set_proto", ranges, 8);
        if (n < 0)
            return NULL;
    }
    st = ucxdp_proto_set(self->w, ops, param, am_id, (const uint64_t (*)[2])ranges, (int)n);
    if (st == UCXDP_ERR_NO_MEMORY)
        return PyErr_NoMemory();
    if (st != UCXDP_OK)
        return PyErr_Format(PyExc_ValueError, "set_proto: bad sizes or frame id (%d)", (int)st);
    Py_RETURN_NONE;
}

static PyObject *worker_proto_frame(WorkerObject *self, PyObject *args)
{
    unsigned long long conn;
    Py_buffer header, payload;
    int taken;

    if (!PyArg_ParseTuple(args, "Ky*y*:proto_frame", &conn, &header, &payload))
        return NULL;
    taken = ucxdp_proto_frame(self->w, conn, header.buf, (size_t)header.len, payload.buf,
                              (size_t)payload.len);
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    return PyBool_FromLong(taken);
}

static PyObject *worker_proto_owed(WorkerObject *self, void *closure)
{
    return PyBool_FromLong(__atomic_load_n(&self->w->proto_owed, __ATOMIC_RELAXED) != 0);
}

static PyMethodDef worker_methods[] = {
    {"set_proto", (PyCFunction)worker_set_proto, METH_VARARGS,
     "set_proto(address, param, am_id, sizes) / set_proto(None): a protocol plug-in's C half"},
    {"proto_frame", (PyCFunction)worker_proto_frame, METH_VARARGS,
     "proto_frame(conn, header, payload) -> bool: a plug-in frame offered to the C half"},
    {"add_stream", (PyCFunction)worker_add_stream, METH_O,
     "add_stream(stream): a tcp connection's reader, run by a C caller's progress while lent"},
    {"remove_stream", (PyCFunction)worker_remove_stream, METH_O,
     "remove_stream(stream): forget it (a no-op when not added)"},
    {"counters", (PyCFunction)worker_counters, METH_NOARGS,
     "counters() -> dict: what this worker's data plane executed"},
    {"rndv_answered", (PyCFunction)worker_rndv_answered, METH_VARARGS,
     "rndv_answered(id, status) -> bool: an external caller's send answered"},
    {"rndv_adopt", (PyCFunction)worker_rndv_adopt, METH_O,
     "rndv_adopt(id) -> memoryview or None: an external caller's send, Python's to move"},
    {"rndv_fail_peer", (PyCFunction)worker_rndv_fail_peer, METH_O,
     "rndv_fail_peer(peer): an external caller's sends waiting for `peer` fail"},
    {NULL},
};

static PyObject *worker_get_py_poll(WorkerObject *self, void *closure)
{
    return PyLong_FromUnsignedLong(__atomic_load_n(&self->w->py_poll, __ATOMIC_RELAXED));
}

static int worker_set_py_poll(WorkerObject *self, PyObject *v, void *closure)
{
    unsigned long n = v != NULL ? PyLong_AsUnsignedLong(v) : 0;

    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "py_poll cannot be deleted");
        return -1;
    }
    if (n == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    __atomic_store_n(&self->w->py_poll, (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n),
                     __ATOMIC_RELAXED);
    return 0;
}

static PyObject *worker_get_poll_fds(WorkerObject *self, void *closure)
{
    PyObject *l = PyList_New(self->w->npoll_fds);

    for (int i = 0; l != NULL && i < self->w->npoll_fds; i++) {
        PyObject *v = PyLong_FromLong(self->w->poll_fds[i]);
        if (v == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static int worker_set_poll_fds(WorkerObject *self, PyObject *v, void *closure)
{
    PyObject *seq = v != NULL ? PySequence_Fast(v, "poll_fds: a sequence of descriptors") : NULL;
    int fds[UCXDP_POLL_FDS];
    Py_ssize_t n;

    if (seq == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "poll_fds cannot be deleted");
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > UCXDP_POLL_FDS)                /* (the rest: the C caller's timer pass) */
        n = UCXDP_POLL_FDS;
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        fds[i] = (int)fd;
    }
    Py_DECREF(seq);
    pthread_mutex_lock(&self->w->lock);
    memcpy(self->w->poll_fds, fds, (size_t)n * sizeof(int));
    self->w->npoll_fds = (int)n;
    pthread_mutex_unlock(&self->w->lock);
    return 0;
}

static PyGetSetDef worker_getset[] = {
    {"proto_owed", (getter)worker_proto_owed, NULL,
     "a protocol plug-in's C half has frames to push when the ring has room", NULL},
    {"poll_fds", (getter)worker_get_poll_fds, (setter)worker_set_poll_fds,
     "descriptors readable when Python's progress has work no C consumer sees (a "
     "connection request): a C caller's progress (libucp) polls them now and then (the "
     "first 8; its timer pass covers any more)", NULL},
    {"py_poll", (getter)worker_get_py_poll, (setter)worker_set_py_poll,
     "how many sources of work Python's progress polls beyond the data plane's inbox "
     "(another transport's endpoints, a layer's callbacks): a C caller's progress (libucp) "
     "runs Python's every time while it is not 0", NULL},
    {NULL},
};

static PyTypeObject WorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Worker",
    .tp_doc = "Worker(): the data plane of one core worker (its lock and counters).",
    .tp_basicsize = sizeof(WorkerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = worker_new,
    .tp_dealloc = (destructor)worker_dealloc,
    .tp_methods = worker_methods,
    .tp_getset = worker_getset,
};

/* -- MappedKey -------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    ucxdp_rkey_t key;
    WorkerObject *worker;                  /* strong */
    PyObject *keep;                        /* strong: holds the mapping */
} KeyObject;

static PyTypeObject KeyType;

static PyObject *key_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"worker", "mapped", "base", "length", "guard", "guard_value",
                            "atomics", "keep", NULL};
    PyObject *worker, *keep = Py_None;
    unsigned long long mapped, base, length, guard = 0, guard_value = 0;
    int atomics = 0;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!KKK|KKpO:MappedKey", names, &WorkerType,
                                     &worker, &mapped, &base, &length, &guard, &guard_value,
                                     &atomics, &keep))
        return NULL;
    if (mapped == 0 || base + length < base || mapped + length < mapped) {
        PyErr_SetString(PyExc_ValueError, "a mapped region needs an address and must not wrap");
        return NULL;
    }
    KeyObject *self = (KeyObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->key.mapped = (char *)(uintptr_t)mapped;
    self->key.base = base;
    self->key.length = length;
    self->key.guard = (const uint64_t *)(uintptr_t)guard;
    self->key.guard_value = guard_value;
    self->key.flags = atomics ? UCXDP_RKEY_ATOMICS : 0;
    self->worker = (WorkerObject *)Py_NewRef(worker);
    self->keep = Py_NewRef(keep);
    return (PyObject *)self;
}

static void key_dealloc(KeyObject *self)
{
    Py_XDECREF(self->worker);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* an int argument as 64 bits; 0 with an error set (TypeError, or OverflowError
 * for an address: callers decline those) */
static int arg_u64(PyObject *o, uint64_t *v)
{
    unsigned long long x;

    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "an int is required, not %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *v = x;
    return 1;
}

/* An address beyond 64 bits (or negative) is outside any region: declined. */
static int decline_overflow(void)
{
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* put (is_put) or get between `buffer` and the key's region; 1 done, 0
 * declined, -1 error */
static int key_copy(KeyObject *self, PyObject *raddr_obj, PyObject *buffer, int is_put)
{
    uint64_t raddr;
    Py_buffer view;
    ucxdp_status_t status;

    if (!arg_u64(raddr_obj, &raddr))
        return decline_overflow();
    if (PyObject_GetBuffer(buffer, &view, is_put ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0) {
        PyErr_Clear();                     /* not contiguous, read-only, no buffer */
        return 0;
    }
    status = copy_gil_free(self->worker->w, &self->key, raddr, view.buf, (size_t)view.len,
                           is_put);
    PyBuffer_Release(&view);
    return status == UCXDP_OK;
}

static PyObject *bool_or_null(int r)
{
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *key_put(KeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(remote_addr, buffer)");
        return NULL;
    }
    return bool_or_null(key_copy(self, args[0], args[1], 1));
}

static PyObject *key_get(KeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get(remote_addr, buffer)");
        return NULL;
    }
    return bool_or_null(key_copy(self, args[0], args[1], 0));
}

/* the atomic of args (remote_addr, size, op, value[, compare]); 1 done (*old
 * set when `old`), 0 declined, -1 error */
static int key_atomic(KeyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      uint64_t *old)
{
    uint64_t raddr, value, compare = 0;
    long size, op;

    /* value and compare first: a wrong type there is a TypeError; an address,
     * size or op beyond the C types is declined like any bad one */
    value = PyLong_AsUnsignedLongLongMask(args[3]);
    if (value == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    if (nargs > 4) {
        compare = PyLong_AsUnsignedLongLongMask(args[4]);
        if (compare == (uint64_t)-1 && PyErr_Occurred())
            return -1;
    }
    if (!arg_u64(args[0], &raddr))
        return decline_overflow();
    size = PyLong_AsLong(args[1]);
    if (size == -1 && PyErr_Occurred())
        return decline_overflow();
    op = PyLong_AsLong(args[2]);
    if (op == -1 && PyErr_Occurred())
        return decline_overflow();
    if (size < 0 || size > 8 || op < 0 || op >= UCXDP_AMO_LAST)
        return 0;
    return ucxdp_atomic(self->worker->w, &self->key, raddr, (unsigned)size, (ucxdp_amo_op_t)op,
                        value, compare, old) == UCXDP_OK;
}

static PyObject *key_fetch(KeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t old;
    int r;

    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "fetch(remote_addr, size, op, value, compare)");
        return NULL;
    }
    r = key_atomic(self, args, nargs, &old);
    if (r < 0)
        return NULL;
    if (!r)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(old);
}

static PyObject *key_post(KeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "post(remote_addr, size, op, value)");
        return NULL;
    }
    return bool_or_null(key_atomic(self, args, nargs, NULL));
}

static PyObject *key_get_mapped(KeyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong((uintptr_t)self->key.mapped);
}

static PyObject *key_get_base(KeyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->key.base);
}

static PyObject *key_get_length(KeyObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->key.length);
}

static PyObject *key_get_atomics(KeyObject *self, void *closure)
{
    return PyBool_FromLong(self->key.flags & UCXDP_RKEY_ATOMICS);
}

static PyGetSetDef key_getset[] = {
    {"mapped", (getter)key_get_mapped, NULL, "the region's first byte here", NULL},
    {"base", (getter)key_get_base, NULL, "the region's address at the peer", NULL},
    {"length", (getter)key_get_length, NULL, "the region's length", NULL},
    {"atomics", (getter)key_get_atomics, NULL, "CPU atomics are the key's atomic mode", NULL},
    {NULL},
};

static PyMethodDef key_methods[] = {
    {"put", (PyCFunction)(void (*)(void))key_put, METH_FASTCALL,
     "put(remote_addr, buffer) -> True, or False with nothing done"},
    {"get", (PyCFunction)(void (*)(void))key_get, METH_FASTCALL,
     "get(remote_addr, buffer) -> True, or False with nothing done"},
    {"fetch", (PyCFunction)(void (*)(void))key_fetch, METH_FASTCALL,
     "fetch(remote_addr, size, op, value, compare) -> the old value, or None with "
     "nothing done (op: ucxpy.atomics.OPS' code)"},
    {"post", (PyCFunction)(void (*)(void))key_post, METH_FASTCALL,
     "post(remote_addr, size, op, value) -> True, or False with nothing done "
     "(add, and, or, xor)"},
    {NULL},
};

static PyTypeObject KeyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.MappedKey",
    .tp_doc = "MappedKey(worker, mapped, base, length, guard=0, guard_value=0, "
              "atomics=False, keep=None): a peer's region mapped here.",
    .tp_basicsize = sizeof(KeyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = key_new,
    .tp_dealloc = (destructor)key_dealloc,
    .tp_methods = key_methods,
    .tp_getset = key_getset,
};

/* -- Symmetric: a symmetric region's keys, by PE --------------------------------------- */
typedef struct {
    PyObject_HEAD
    WorkerObject *worker;                  /* strong */
    uintptr_t local_base;                  /* the region here */
    uint64_t length;
    Py_ssize_t npes;
    KeyObject **keys;                      /* strong or NULL, npes of them */
    int enabled;
    PyObject *ndarray;                     /* the array type the calls take (strong) */
    PyObject *pending;                     /* list: the default context's requests */
} SymObject;

static PyTypeObject SymType;

static PyObject *sym_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":Symmetric") || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Symmetric() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

/* back to a closed table: no keys, every call declines */
static void sym_reset(SymObject *self)
{
    self->enabled = 0;
    for (Py_ssize_t i = 0; self->keys != NULL && i < self->npes; i++)
        Py_CLEAR(self->keys[i]);
    PyMem_Free(self->keys);
    self->keys = NULL;
    self->npes = 0;
    self->local_base = 0;
    self->length = 0;
    Py_CLEAR(self->worker);
    Py_CLEAR(self->ndarray);
    Py_CLEAR(self->pending);
}

static void sym_dealloc(SymObject *self)
{
    sym_reset(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* open(worker, local_base, length, npes, ndarray, pending) */
static PyObject *sym_open(SymObject *self, PyObject *args)
{
    PyObject *worker, *ndarray, *pending;
    unsigned long long base, length;
    Py_ssize_t npes;
    KeyObject **keys;

    if (!PyArg_ParseTuple(args, "O!KKnO!O!:open", &WorkerType, &worker, &base, &length, &npes,
                          &PyType_Type, &ndarray, &PyList_Type, &pending))
        return NULL;
    if (npes < 0 || base + length < base) {
        PyErr_SetString(PyExc_ValueError, "a region of a non-negative number of PEs");
        return NULL;
    }
    keys = PyMem_Calloc(npes ? (size_t)npes : 1, sizeof(KeyObject *));
    if (keys == NULL)
        return PyErr_NoMemory();
    sym_reset(self);
    self->keys = keys;
    self->npes = npes;
    self->worker = (WorkerObject *)Py_NewRef(worker);
    self->local_base = (uintptr_t)base;
    self->length = length;
    self->ndarray = Py_NewRef(ndarray);
    self->pending = Py_NewRef(pending);
    Py_RETURN_NONE;
}

static PyObject *sym_set(SymObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pe;

    if (nargs != 2 || (args[1] != Py_None && !PyObject_TypeCheck(args[1], &KeyType))) {
        PyErr_SetString(PyExc_TypeError, "set(pe, MappedKey or None)");
        return NULL;
    }
    pe = PyLong_AsSsize_t(args[0]);
    if (pe == -1 && PyErr_Occurred())
        return NULL;
    if (pe < 0 || pe >= self->npes) {
        PyErr_Format(PyExc_IndexError, "PE %zd of %zd", pe, self->npes);
        return NULL;
    }
    Py_XSETREF(self->keys[pe], args[1] == Py_None ? NULL : (KeyObject *)Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* enable(flag): the calls run here (True) or all go to their fn */
static PyObject *sym_enable(SymObject *self, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);

    if (on < 0)
        return NULL;
    if (on && self->worker == NULL) {
        PyErr_SetString(PyExc_ValueError, "enable: the table is not open");
        return NULL;
    }
    self->enabled = on;
    Py_RETURN_NONE;
}

static PyObject *sym_close(SymObject *self, PyObject *unused)
{
    sym_reset(self);
    Py_RETURN_NONE;
}

static PyObject *sym_call(SymObject *self, PyObject *const *args, Py_ssize_t nargs);

static PyMethodDef sym_methods[] = {
    {"set", (PyCFunction)(void (*)(void))sym_set, METH_FASTCALL,
     "set(pe, key): PE pe's region (a MappedKey, or None: reached otherwise)"},
    {"open", (PyCFunction)sym_open, METH_VARARGS,
     "open(worker, local_base, length, npes, array type, pending list): a region of npes "
     "PEs, no keys yet, disabled"},
    {"enable", (PyCFunction)sym_enable, METH_O, "enable(flag): calls run here or go to fn"},
    {"close", (PyCFunction)sym_close, METH_NOARGS, "drop everything; every call declines"},
    {"call", (PyCFunction)(void (*)(void))sym_call, METH_FASTCALL,
     "call(kind, fn) -> a callable doing fn's plain calls on this table in C"},
    {NULL},
};

static PyTypeObject SymType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Symmetric",
    .tp_doc = "Symmetric(): a symmetric region's mapped keys, by PE (closed until open()).",
    .tp_basicsize = sizeof(SymObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = sym_new,
    .tp_dealloc = (destructor)sym_dealloc,
    .tp_methods = sym_methods,
};

/* -- symmetric calls ----------------------------------------------------------------- */
/* The kinds: which OpenSHMEM call, with how many positional arguments. */
#define SYM_KINDS(X)                                                                    \
    X(PUT, 3) X(GET, 3) X(QUIET, 0) X(FETCH, 2) X(SET, 3) X(SWAP, 3) X(COMPARE_SWAP, 4)     \
    X(FETCH_INC, 2) X(INC, 2) X(FETCH_ADD, 3) X(ADD, 3) X(FETCH_AND, 3) X(AND, 3)           \
    X(FETCH_OR, 3) X(OR, 3) X(FETCH_XOR, 3) X(XOR, 3) X(PUT_NBI, 3) X(GET_NBI, 3)
#define SYM_ENUM(name, n) SYM_##name,
enum { SYM_KINDS(SYM_ENUM) SYM_COUNT };
#define SYM_NARGS(name, n) n,
static const Py_ssize_t sym_nargs[] = {SYM_KINDS(SYM_NARGS)};
#define SYM_NAME(name, n) #name,
static const char *const sym_names[] = {SYM_KINDS(SYM_NAME)};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *fn;                          /* the Python reference */
    SymObject *table;
    PyObject *dict;                        /* functools.update_wrapper's attributes */
} CallObject;

static PyTypeObject CallType;

/* The exact ndarray `o` as a contiguous buffer (with its format); 0 (no
 * error) when it is not one. */
static int sym_array(SymObject *t, PyObject *o, Py_buffer *view, int writable)
{
    if ((PyObject *)Py_TYPE(o) != t->ndarray)
        return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* the offset in the region of the symmetric array `view` (whole), or -1 */
static int64_t sym_offset(SymObject *t, const Py_buffer *view)
{
    uintptr_t p = (uintptr_t)view->buf;

    if (p < t->local_base || p - t->local_base > t->length
            || t->length - (p - t->local_base) < (uint64_t)view->len)
        return -1;
    return (int64_t)(p - t->local_base);
}

/* PE `o`'s key, or NULL (not an int, out of range, no key) */
static KeyObject *sym_key(SymObject *t, PyObject *o)
{
    Py_ssize_t pe;

    if (!PyLong_CheckExact(o))
        return NULL;
    pe = PyLong_AsSsize_t(o);
    if (pe == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    return pe >= 0 && pe < t->npes ? t->keys[pe] : NULL;
}

static int same_format(const Py_buffer *a, const Py_buffer *b)
{
    return a->itemsize == b->itemsize && a->format != NULL && b->format != NULL
        && strcmp(a->format, b->format) == 0;
}

/* put / get: 1 done, 0 declined */
static int sym_copy(SymObject *t, PyObject *const *args, int is_put)
{
    Py_buffer sym, local;
    KeyObject *key = sym_key(t, args[2]);
    int64_t off;
    int done = 0;

    if (key == NULL)
        return 0;
    /* put(target, source, pe): target symmetric; get(target, source, pe): source */
    if (!sym_array(t, args[is_put ? 0 : 1], &sym, 0))
        return 0;
    if (!sym_array(t, args[is_put ? 1 : 0], &local, !is_put)) {
        PyBuffer_Release(&sym);
        return 0;
    }
    off = sym_offset(t, &sym);
    if (off >= 0 && same_format(&sym, &local)) {
        Py_ssize_t n = sym.len < local.len ? sym.len : local.len;
        done = copy_gil_free(t->worker->w, &key->key, key->key.base + (uint64_t)off, local.buf,
                             (size_t)n, is_put) == UCXDP_OK;
    }
    PyBuffer_Release(&local);
    PyBuffer_Release(&sym);
    return done;
}

/* the kind's atomic: its op, whether it fetches, where its value is */
static int sym_amo_of(int kind, ucxdp_amo_op_t *op, int *fetch, int *value_at)
{
    static const struct { int kind, op, fetch, value_at; } table[] = {
        {SYM_FETCH, UCXDP_AMO_OR, 1, -1},       /* fetch: or 0 */
        {SYM_SET, UCXDP_AMO_SWAP, 0, 1},
        {SYM_SWAP, UCXDP_AMO_SWAP, 1, 1},
        {SYM_COMPARE_SWAP, UCXDP_AMO_CSWAP, 1, 2},
        {SYM_FETCH_INC, UCXDP_AMO_ADD, 1, -2},  /* inc: add 1 */
        {SYM_INC, UCXDP_AMO_ADD, 0, -2},
        {SYM_FETCH_ADD, UCXDP_AMO_ADD, 1, 1}, {SYM_ADD, UCXDP_AMO_ADD, 0, 1},
        {SYM_FETCH_AND, UCXDP_AMO_AND, 1, 1}, {SYM_AND, UCXDP_AMO_AND, 0, 1},
        {SYM_FETCH_OR, UCXDP_AMO_OR, 1, 1}, {SYM_OR, UCXDP_AMO_OR, 0, 1},
        {SYM_FETCH_XOR, UCXDP_AMO_XOR, 1, 1}, {SYM_XOR, UCXDP_AMO_XOR, 0, 1},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (table[i].kind == kind) {
            *op = (ucxdp_amo_op_t)table[i].op;
            *fetch = table[i].fetch;
            *value_at = table[i].value_at;
            return 1;
        }
    return 0;
}

/* an exact int operand, truncated to 64 bits; 0 when not one */
static int sym_operand(PyObject *o, uint64_t *v)
{
    if (!PyLong_CheckExact(o))
        return 0;
    *v = PyLong_AsUnsignedLongLongMask(o);
    if (*v == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* an atomic: the result (a new reference: Py_None for a non-fetching one,
 * else the old value as a Python int, signed as the word's format), or NULL
 * with no error set (declined) or with one (failed) */
static PyObject *sym_atomic(SymObject *t, int kind, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_amo_op_t op;
    int fetch, value_at, is_signed;
    uint64_t value = 0, compare = 0, old = 0;
    Py_buffer word;
    KeyObject *key;
    int64_t off;
    unsigned size;
    ucxdp_status_t status;

    if (!sym_amo_of(kind, &op, &fetch, &value_at))
        return NULL;
    key = sym_key(t, args[nargs - 1]);
    if (key == NULL)
        return NULL;
    if (value_at == -2)
        value = 1;
    else if (value_at >= 0 && !sym_operand(args[value_at], &value))
        return NULL;
    if (kind == SYM_COMPARE_SWAP && !sym_operand(args[1], &compare))
        return NULL;
    if (!sym_array(t, args[0], &word, 0))
        return NULL;
    /* one element of a native 4/8-byte integer format */
    size = (unsigned)word.itemsize;
    off = (size == 4 || size == 8) && word.len == word.itemsize && word.format != NULL
          && word.format[0] && strchr("iIlLqQ", word.format[0]) && !word.format[1]
          ? sym_offset(t, &word) : -1;
    is_signed = word.format != NULL && islower((unsigned char)word.format[0]);
    PyBuffer_Release(&word);
    if (off < 0)
        return NULL;
    status = ucxdp_atomic(t->worker->w, &key->key, key->key.base + (uint64_t)off, size, op,
                          value, compare, fetch || op == UCXDP_AMO_SWAP ? &old : NULL);
    if (status != UCXDP_OK)
        return NULL;
    if (!fetch)
        Py_RETURN_NONE;
    if (!is_signed)
        return PyLong_FromUnsignedLongLong(size == 8 ? old : (uint32_t)old);
    return PyLong_FromLongLong(size == 8 ? (long long)(int64_t)old
                                         : (long long)(int32_t)(uint32_t)old);
}

static PyObject *call_vectorcall(CallObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    SymObject *t = self->table;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);

    if (t->enabled && kwnames == NULL && nargs == sym_nargs[self->kind]) {
        switch (self->kind) {
        case SYM_PUT:
        case SYM_GET:
        case SYM_PUT_NBI:                  /* complete at once on mapped memory */
        case SYM_GET_NBI:
            if (sym_copy(t, args, self->kind == SYM_PUT || self->kind == SYM_PUT_NBI))
                Py_RETURN_NONE;
            break;
        case SYM_QUIET:
            if (PyList_GET_SIZE(t->pending) == 0) {
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                Py_RETURN_NONE;
            }
            break;
        default: {
            PyObject *res = sym_atomic(t, self->kind, args, nargs);
            if (res != NULL || PyErr_Occurred())
                return res;
        }
        }
    }
    return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
}

static PyObject *sym_call(SymObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long kind;

    if (nargs != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "call(kind, fn)");
        return NULL;
    }
    kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind >= SYM_COUNT) {
        PyErr_Format(PyExc_ValueError, "no symmetric call of kind %ld", kind);
        return NULL;
    }
    CallObject *c = PyObject_GC_New(CallObject, &CallType);
    if (c == NULL)
        return NULL;
    c->vectorcall = (vectorcallfunc)call_vectorcall;
    c->kind = (int)kind;
    c->fn = Py_NewRef(args[1]);
    c->table = (SymObject *)Py_NewRef(self);
    c->dict = NULL;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

static int call_traverse(CallObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->dict);
    return 0;
}

static int call_clear(CallObject *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->dict);
    return 0;
}

static void call_dealloc(CallObject *self)
{
    PyObject_GC_UnTrack(self);
    call_clear(self);
    Py_CLEAR(self->table);
    PyObject_GC_Del(self);
}

static PyObject *call_repr(CallObject *self)
{
    return PyUnicode_FromFormat("<symmetric %s of %R>", sym_names[self->kind], self->fn);
}

static PyGetSetDef call_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.SymmetricCall",
    .tp_doc = "An OpenSHMEM call whose plain case runs in the data plane (Symmetric.call).",
    .tp_basicsize = sizeof(CallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(CallObject, vectorcall),
    .tp_dictoffset = offsetof(CallObject, dict),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)call_dealloc,
    .tp_traverse = (traverseproc)call_traverse,
    .tp_clear = (inquiry)call_clear,
    .tp_repr = (reprfunc)call_repr,
    .tp_getset = call_getset,
};

/* -- Matcher: the matcher alone, driven from Python ------------------------------------ */
/* The equivalence test's handle on match.c (tests/test_dp_match.py feeds it
 * and ucxpy.tag.TagMatcher the same operations).  Receives and unexpected
 * messages are named by the caller's integers. */
typedef struct {
    ucxdp_recv_t r;
    long long ident;
} MRecv;

typedef struct {
    ucxdp_unexp_t u;
    long long ident;
} MUnexp;

typedef struct {
    PyObject_HEAD
    ucxdp_matcher_t m;
    int ready;
    PyObject *recvs;                       /* ident -> address of its MRecv (posted ones) */
} MatcherObject;

static PyTypeObject MatcherType;

static PyObject *matcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":Matcher"))
        return NULL;
    MatcherObject *self = (MatcherObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->recvs = PyDict_New();
    if (self->recvs == NULL || ucxdp_match_init(&self->m) < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ready = 1;
    return (PyObject *)self;
}

static void free_recv(ucxdp_recv_t *r, void *m)
{
    ucxdp_match_remove(m, r);
    PyMem_Free(r);
}

static void matcher_dealloc(MatcherObject *self)
{
    if (self->ready) {
        ucxdp_unexp_t *u;
        ucxdp_match_each_posted(&self->m, free_recv, &self->m);
        while ((u = ucxdp_match_probe(&self->m, UCXDP_ANY_SOURCE, 0, 0, 1)) != NULL)
            PyMem_Free(u);
        ucxdp_match_cleanup(&self->m);
    }
    Py_XDECREF(self->recvs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ident_or_none(long long ident, int found)
{
    if (!found)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(ident);
}

/* post(source, tag, mask, ident) -> the ident of the unexpected message it
 * took, or None: posted */
static PyObject *matcher_post(MatcherObject *self, PyObject *args)
{
    long long source, ident;
    unsigned long long tag, mask;
    MRecv *r;
    MUnexp *u;
    int err;

    if (!PyArg_ParseTuple(args, "LKKL:post", &source, &tag, &mask, &ident))
        return NULL;
    r = PyMem_Calloc(1, sizeof(*r));
    if (r == NULL)
        return PyErr_NoMemory();
    r->r.source = source;
    r->r.tag = tag;
    r->r.mask = mask;
    r->ident = ident;
    u = (MUnexp *)ucxdp_match_post(&self->m, &r->r, &err);
    if (u != NULL) {
        long long got = u->ident;
        PyMem_Free(u);
        PyMem_Free(r);
        return PyLong_FromLongLong(got);
    }
    PyObject *key = PyLong_FromLongLong(ident), *addr = PyLong_FromVoidPtr(r);
    if (key == NULL || addr == NULL || PyDict_SetItem(self->recvs, key, addr) < 0) {
        Py_XDECREF(key);
        Py_XDECREF(addr);
        ucxdp_match_remove(&self->m, &r->r);
        PyMem_Free(r);
        return NULL;
    }
    Py_DECREF(key);
    Py_DECREF(addr);
    Py_RETURN_NONE;
}

/* forget a receive the matcher gave back */
static int matcher_forget(MatcherObject *self, MRecv *r)
{
    PyObject *key = PyLong_FromLongLong(r->ident);
    int rc = key != NULL ? PyDict_DelItem(self->recvs, key) : -1;
    Py_XDECREF(key);
    PyMem_Free(r);
    return rc;
}

/* arrive(source, tag, ident) -> the ident of the receive it matched, or None
 * (queued as unexpected message ident) */
static PyObject *matcher_arrive(MatcherObject *self, PyObject *args)
{
    long long source, ident;
    unsigned long long tag;
    MRecv *r;

    if (!PyArg_ParseTuple(args, "LKL:arrive", &source, &tag, &ident))
        return NULL;
    r = (MRecv *)ucxdp_match_arrived(&self->m, source, tag);
    if (r != NULL) {
        long long got = r->ident;
        if (matcher_forget(self, r) < 0)
            return NULL;
        return PyLong_FromLongLong(got);
    }
    MUnexp *u = PyMem_Calloc(1, sizeof(*u));
    if (u == NULL)
        return PyErr_NoMemory();
    u->u.source = source;
    u->u.tag = tag;
    u->ident = ident;
    ucxdp_match_unexpected(&self->m, &u->u);
    Py_RETURN_NONE;
}

/* probe(source, tag, mask, remove) -> the ident of the oldest unexpected
 * message it matches, or None */
static PyObject *matcher_probe(MatcherObject *self, PyObject *args)
{
    long long source;
    unsigned long long tag, mask;
    int remove;
    MUnexp *u;
    long long ident;

    if (!PyArg_ParseTuple(args, "LKKp:probe", &source, &tag, &mask, &remove))
        return NULL;
    u = (MUnexp *)ucxdp_match_probe(&self->m, source, tag, mask, remove);
    if (u == NULL)
        Py_RETURN_NONE;
    ident = u->ident;
    if (remove)
        PyMem_Free(u);
    return ident_or_none(ident, 1);
}

/* cancel(ident) -> True when the receive was still posted (now removed) */
static PyObject *matcher_cancel(MatcherObject *self, PyObject *arg)
{
    PyObject *addr = PyDict_GetItemWithError(self->recvs, arg);
    MRecv *r;

    if (addr == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    r = PyLong_AsVoidPtr(addr);
    if (r == NULL)
        return NULL;
    ucxdp_match_remove(&self->m, &r->r);
    if (matcher_forget(self, r) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *matcher_set_bucket_mask(MatcherObject *self, PyObject *arg)
{
    unsigned long long mask = PyLong_AsUnsignedLongLong(arg);

    if (mask == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (ucxdp_match_set_bucket_mask(&self->m, mask) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the bucket mask changes only while nothing is posted");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *matcher_counts(MatcherObject *self, PyObject *unused)
{
    return Py_BuildValue("(nn)", (Py_ssize_t)ucxdp_match_posted_count(&self->m),
                         (Py_ssize_t)self->m.nunexp);
}

static PyMethodDef matcher_methods[] = {
    {"post", (PyCFunction)matcher_post, METH_VARARGS,
     "post(source, tag, mask, ident) -> ident of the unexpected message taken, or None"},
    {"arrive", (PyCFunction)matcher_arrive, METH_VARARGS,
     "arrive(source, tag, ident) -> ident of the receive matched, or None (unexpected)"},
    {"probe", (PyCFunction)matcher_probe, METH_VARARGS,
     "probe(source, tag, mask, remove) -> ident of the oldest match, or None"},
    {"cancel", (PyCFunction)matcher_cancel, METH_O,
     "cancel(ident) -> True when it was posted"},
    {"set_bucket_mask", (PyCFunction)matcher_set_bucket_mask, METH_O,
     "set_bucket_mask(mask): receives of one source with this mask are hashed too"},
    {"counts", (PyCFunction)matcher_counts, METH_NOARGS, "counts() -> (posted, unexpected)"},
    {NULL},
};

static PyTypeObject MatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Matcher",
    .tp_doc = "Matcher(): the data plane's tag matcher alone (match.c), for tests.",
    .tp_basicsize = sizeof(MatcherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = matcher_new,
    .tp_dealloc = (destructor)matcher_dealloc,
    .tp_methods = matcher_methods,
};

/* -- TagInfo: what a completed or probed tagged message carried ---------------------- */
/* ucxpy.request.TagInfo: TagInfo(source, tag, length), three attributes,
 * iterable as (source, tag, length), equal to anything whose tuple is the
 * same.  A C type so the data plane's completions make one without a Python
 * frame. */
typedef struct {
    PyObject_HEAD
    PyObject *source, *tag, *length;
} TagInfoObject;

static PyTypeObject TagInfoType;

static PyObject *ti_make(PyObject *source, PyObject *tag, PyObject *length)
{
    TagInfoObject *self = PyObject_New(TagInfoObject, &TagInfoType);

    if (self == NULL)
        return NULL;
    self->source = Py_NewRef(source);
    self->tag = Py_NewRef(tag);
    self->length = Py_NewRef(length);
    return (PyObject *)self;
}

static PyObject *ti_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"source", "tag", "length", NULL};
    PyObject *source, *tag, *length;
    TagInfoObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:TagInfo", names, &source, &tag, &length))
        return NULL;
    if (type == &TagInfoType)
        return ti_make(source, tag, length);
    self = (TagInfoObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->source = Py_NewRef(source);
    self->tag = Py_NewRef(tag);
    self->length = Py_NewRef(length);
    return (PyObject *)self;
}

static void ti_dealloc(TagInfoObject *self)
{
    Py_XDECREF(self->source);
    Py_XDECREF(self->tag);
    Py_XDECREF(self->length);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ti_tuple(TagInfoObject *self)
{
    return PyTuple_Pack(3, self->source, self->tag, self->length);
}

static PyObject *ti_iter(TagInfoObject *self)
{
    PyObject *t = ti_tuple(self), *it;

    if (t == NULL)
        return NULL;
    it = PyObject_GetIter(t);
    Py_DECREF(t);
    return it;
}

static PyObject *ti_richcompare(TagInfoObject *self, PyObject *other, int op)
{
    PyObject *a, *b, *r;

    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    if ((a = ti_tuple(self)) == NULL)
        return NULL;
    b = PySequence_Tuple(other);
    if (b == NULL) {
        Py_DECREF(a);
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();                     /* (not iterable: not equal) */
        return PyBool_FromLong(op == Py_NE);
    }
    r = PyObject_RichCompare(a, b, op);
    Py_DECREF(a);
    Py_DECREF(b);
    return r;
}

static PyObject *ti_repr(TagInfoObject *self)
{
    PyObject *tag = PyNumber_ToBase(self->tag, 16), *r;

    if (tag == NULL)
        return NULL;
    r = PyUnicode_FromFormat("TagInfo(source=%S, tag=%U, length=%S)", self->source, tag,
                             self->length);
    Py_DECREF(tag);
    return r;
}

static PyMemberDef ti_members[] = {
    {"source", T_OBJECT_EX, offsetof(TagInfoObject, source), 0, "the sender (worker id)"},
    {"tag", T_OBJECT_EX, offsetof(TagInfoObject, tag), 0, "the message's tag"},
    {"length", T_OBJECT_EX, offsetof(TagInfoObject, length), 0, "its length in bytes"},
    {NULL},
};

static PyTypeObject TagInfoType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy.request.TagInfo",
    .tp_doc = "TagInfo(source, tag, length): what a completed or probed tagged message carried.",
    .tp_basicsize = sizeof(TagInfoObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = ti_new,
    .tp_dealloc = (destructor)ti_dealloc,
    .tp_iter = (getiterfunc)ti_iter,
    .tp_richcompare = (richcmpfunc)ti_richcompare,
    .tp_repr = (reprfunc)ti_repr,
    .tp_members = ti_members,
};

/* -- RequestCore and RecvCore: the fields of ucxpy's requests, in C ------------------ */
/* ucxpy.request.Request derives from RequestCore and ucxpy.tag.RecvRequest
 * from RecvCore (and Request): their fields are these structs' members
 * (worker, done, exc, result, _callbacks, _cancel; buf, capacity, source,
 * tag, mask, seq), so the binding reads and completes a receive without
 * attribute lookups; Python keeps their methods.  RecvCore's __init__ is
 * RecvRequest's (worker, buf, source, tag, mask, cancel), with no Python
 * frame.  `handle` says whether the receive is posted in the data plane's
 * matcher (its C receive's address, else 0). */
typedef struct PRecv PRecv;

typedef struct {
    PyObject_HEAD
    PyObject *worker, *done, *exc, *result, *callbacks, *cancel;
    PyObject *weakrefs;
} RequestCoreObject;

typedef struct {
    RequestCoreObject base;
    PyObject *buf, *capacity, *source, *tag, *mask, *seq;
    PRecv *precv;                          /* posted here: its C receive */
} RecvCoreObject;

#define ANY_SIZE (1LL << 62)               /* ucxpy.tag.ANY_SIZE */

static PyTypeObject RequestCoreType, RecvCoreType;

static int rq_traverse(RequestCoreObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->worker);
    Py_VISIT(self->done);
    Py_VISIT(self->exc);
    Py_VISIT(self->result);
    Py_VISIT(self->callbacks);
    Py_VISIT(self->cancel);
    return 0;
}

static int rq_clear(RequestCoreObject *self)
{
    Py_CLEAR(self->worker);
    Py_CLEAR(self->done);
    Py_CLEAR(self->exc);
    Py_CLEAR(self->result);
    Py_CLEAR(self->callbacks);
    Py_CLEAR(self->cancel);
    return 0;
}

static int rc_clear(RecvCoreObject *self);

/* (a Python subclass's dealloc has cleared its own slots and calls this) */
static void rq_dealloc(RequestCoreObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (PyObject_TypeCheck((PyObject *)self, &RecvCoreType))
        rc_clear((RecvCoreObject *)self);
    else
        rq_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef rq_members[] = {
    {"worker", T_OBJECT_EX, offsetof(RequestCoreObject, worker), 0, NULL},
    {"done", T_OBJECT_EX, offsetof(RequestCoreObject, done), 0, NULL},
    {"exc", T_OBJECT_EX, offsetof(RequestCoreObject, exc), 0, NULL},
    {"result", T_OBJECT_EX, offsetof(RequestCoreObject, result), 0, NULL},
    {"_callbacks", T_OBJECT_EX, offsetof(RequestCoreObject, callbacks), 0, NULL},
    {"_cancel", T_OBJECT_EX, offsetof(RequestCoreObject, cancel), 0, NULL},
    {NULL},
};

static PyTypeObject RequestCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.RequestCore",
    .tp_doc = "The fields of ucxpy.request.Request (its base).",
    .tp_basicsize = sizeof(RequestCoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)rq_dealloc,
    .tp_traverse = (traverseproc)rq_traverse,
    .tp_clear = (inquiry)rq_clear,
    .tp_weaklistoffset = offsetof(RequestCoreObject, weakrefs),
    .tp_members = rq_members,
};

static int rc_traverse(RecvCoreObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buf);
    Py_VISIT(self->capacity);
    Py_VISIT(self->source);
    Py_VISIT(self->tag);
    Py_VISIT(self->mask);
    Py_VISIT(self->seq);
    return rq_traverse(&self->base, visit, arg);
}

static int rc_clear(RecvCoreObject *self)
{
    Py_CLEAR(self->buf);
    Py_CLEAR(self->capacity);
    Py_CLEAR(self->source);
    Py_CLEAR(self->tag);
    Py_CLEAR(self->mask);
    Py_CLEAR(self->seq);
    return rq_clear(&self->base);
}

/* RecvRequest(worker, buf, source, tag, mask, cancel): buf None is a
 * receive of any size (capacity ANY_SIZE) */
static int rc_init(RecvCoreObject *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"worker", "buf", "source", "tag", "mask", "cancel", NULL};
    PyObject *worker, *buf, *source, *tag, *mask, *cancel, *cap;
    RequestCoreObject *b = &self->base;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO:RecvRequest", names, &worker, &buf,
                                     &source, &tag, &mask, &cancel))
        return -1;
    if (buf == Py_None) {
        cap = PyLong_FromLongLong(ANY_SIZE);
    } else {
        Py_ssize_t n = PyObject_Length(buf);
        cap = n < 0 ? NULL : PyLong_FromSsize_t(n);
    }
    if (cap == NULL)
        return -1;
    Py_XSETREF(b->worker, Py_NewRef(worker));
    Py_XSETREF(b->done, Py_NewRef(Py_False));
    Py_XSETREF(b->exc, Py_NewRef(Py_None));
    Py_XSETREF(b->result, Py_NewRef(Py_None));
    Py_XSETREF(b->callbacks, Py_NewRef(Py_None));
    Py_XSETREF(b->cancel, Py_NewRef(cancel));
    Py_XSETREF(self->buf, Py_NewRef(buf));
    Py_XSETREF(self->capacity, cap);
    Py_XSETREF(self->source, Py_NewRef(source));
    Py_XSETREF(self->tag, Py_NewRef(tag));
    Py_XSETREF(self->mask, Py_NewRef(mask));
    Py_XSETREF(self->seq, PyLong_FromLong(0));
    return self->seq == NULL ? -1 : 0;
}

static PyObject *rc_get_handle(RecvCoreObject *self, void *closure)
{
    return PyLong_FromVoidPtr(self->precv);
}

static PyMemberDef rc_members[] = {
    {"buf", T_OBJECT_EX, offsetof(RecvCoreObject, buf), 0, NULL},
    {"capacity", T_OBJECT_EX, offsetof(RecvCoreObject, capacity), 0, NULL},
    {"source", T_OBJECT_EX, offsetof(RecvCoreObject, source), 0, NULL},
    {"tag", T_OBJECT_EX, offsetof(RecvCoreObject, tag), 0, NULL},
    {"mask", T_OBJECT_EX, offsetof(RecvCoreObject, mask), 0, NULL},
    {"seq", T_OBJECT_EX, offsetof(RecvCoreObject, seq), 0, NULL},
    {NULL},
};

static PyGetSetDef rc_getset[] = {
    {"handle", (getter)rc_get_handle, NULL,
     "the address of its C receive while posted in the data plane's matcher, else 0", NULL},
    {NULL},
};

static PyTypeObject RecvCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.RecvCore",
    .tp_doc = "The fields of ucxpy.tag.RecvRequest (its base) and its __init__.",
    .tp_basicsize = sizeof(RecvCoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_base = &RequestCoreType,
    .tp_init = (initproc)rc_init,
    .tp_traverse = (traverseproc)rc_traverse,
    .tp_clear = (inquiry)rc_clear,
    .tp_members = rc_members,
    .tp_getset = rc_getset,
};

/* -- TagMatcher and Inbox: the worker's matcher for Python's receives --------------- */
/* TagMatcher(worker, UnexpectedMessage, handoff): ucxpy.tag.
 * TagMatcher's interface on tag.c, the worker's one matcher:
 *   post(req) -> None, or the oldest unexpected message the RecvRequest
 *                matches (then it is not posted; the caller delivers it),
 *                or True when that message was an eager payload kept here
 *                that fits: delivered and the request completed
 *   post_new(...)                Worker.tag_recv_nb's common case in one call
 *   remove(req) -> bool          withdraw a posted receive (cancel)
 *   match_posted(source, tag)    the earliest posted receive that a message
 *                                the caller's path handles matches, taken
 *                                out, or None
 *   first_for(source, tag)       the same receive, left posted
 *   find_unexpected(source, tag, mask, remove), queue_unexpected(msg),
 *   unexpected_depth(), posted_count(), idle_for(source, tag, mask),
 *   requests_from(source), requests_matching(tag, mask)
 *   bucket_mask, notify_mask, notify   as ucxpy.tag.TagMatcher's
 *   deliver() -> n               complete the receives matched in C
 * A posted request (a RecvCore: its fields are C) names its C receive
 * (`handle`, 0 when not posted here).  The
 * data plane copies an eager payload into a receive whose buffer it fits;
 * deliver() then completes it with TagInfo(source, tag, length) (complete_recv),
 * then calls notify(req)
 * when the message's tag has notify_mask bits the receive's mask ignores
 * (what the Python matcher's callback does).  Any other match is handed
 * back: handoff(req, source, tag, payload).  An unexpected eager message
 * leaves the C queue as UnexpectedMessage(source, tag, length, data) (data
 * None when not removed: a probe reads its info only).
 *
 * Inbox(matcher, ring address, eager am id): a shm inbox's eager frames,
 * taken in C (inbox.c): add_conn(conn, source), forget_conn(conn),
 * dispatch(limit, spins) -> how many, plus WAKE_BIT when a producer waits
 * for space, plus BAD_BIT when the ring is corrupt; then deliver();
 * try_recv(conn, tag, mask, buffer, spins) -> (n, tag), a blocking
 * receive's shortcut; hand_sizes(ranges): the payload sizes whose messages
 * it leaves to the caller's (Python) protocol. */
#define PRECV_MAGIC 0x52454356u            /* "RECV" */
#define INBOX_WAKE_BIT (1LL << 62)
#define INBOX_BAD_BIT (1LL << 61)

struct PRecv {
    ucxdp_tag_recv_t r;
    unsigned magic;
    PyObject *req;                         /* the RecvRequest (strong) */
    Py_buffer view;                        /* its buffer while posted (.obj NULL: none) */
};

typedef struct {
    PyObject_HEAD
    WorkerObject *worker;
    PyObject *unexp_cls, *handoff, *notify, *bucket_mask;
    uint64_t notify_mask;
} TagMatcherObject;

static PyTypeObject TagMatcherType;
static PyObject *s_source, *s_tag, *s_length, *s_complete;

static PyObject *tm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *worker, *cls, *handoff;
    TagMatcherObject *self;

    if (!PyArg_ParseTuple(args, "O!OO:TagMatcher", &WorkerType, &worker, &cls, &handoff))
        return NULL;
    self = (TagMatcherObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->worker = (WorkerObject *)Py_NewRef(worker);
    self->unexp_cls = Py_NewRef(cls);
    self->handoff = Py_NewRef(handoff);
    self->notify = Py_NewRef(Py_None);
    self->bucket_mask = Py_NewRef(Py_None);
    return (PyObject *)self;
}

/* Release what a PRecv holds and free it; its request's handle becomes 0. */
static void precv_free(PRecv *p)
{

    if (p->view.obj != NULL)
        PyBuffer_Release(&p->view);
    if (p->req != NULL) {
        ((RecvCoreObject *)p->req)->precv = NULL;
        Py_DECREF(p->req);
    }
    p->magic = 0;
    PyMem_Free(p);
}

/* An external caller's receive (libucp's) that Python's path matched: the
 * caller's Python request standing for it (its adopt hook), or NULL with an
 * exception. */
static void *(*adopt_hook)(ucxdp_tag_recv_t *r);

static PyObject *adopt(ucxdp_tag_recv_t *r)
{
    if (adopt_hook == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a receive of an external caller, who gave no adopt hook");
        return NULL;
    }
    return (PyObject *)adopt_hook(r);
}

static inline int is_ext(const ucxdp_recv_t *m)
{
    return ((const ucxdp_tag_recv_t *)m)->owner == UCXDP_OWNER_EXT;
}

/* the posted PRecv of `req`, or NULL */
static PRecv *precv_of(PyObject *req)
{
    PRecv *p;

    if (!PyObject_TypeCheck(req, &RecvCoreType))
        return NULL;
    p = ((RecvCoreObject *)req)->precv;
    return p != NULL && p->magic == PRECV_MAGIC && p->req == req ? p : NULL;
}

static void unexp_free(ucxdp_worker_t *w, ucxdp_tag_unexp_t *u)
{
    Py_XDECREF((PyObject *)u->user);
    ucxdp_tag_unexp_free(w, u);
}

/* an unexpected message as Python sees it: the caller's object, or a new
 * UnexpectedMessage of an eager payload (its data when `with_data`) */
static PyObject *unexp_object(TagMatcherObject *self, ucxdp_tag_unexp_t *u, int with_data)
{
    PyObject *data, *r;

    if (u->user != NULL)
        return Py_NewRef((PyObject *)u->user);
    if (with_data)
        data = PyBytes_FromStringAndSize((const char *)u->data, (Py_ssize_t)u->length);
    else
        data = Py_NewRef(Py_None);
    if (data == NULL)
        return NULL;
    r = PyObject_CallFunction(self->unexp_cls, "LKKN", (long long)u->m.source,
                              (unsigned long long)u->m.tag, (unsigned long long)u->length, data);
    return r;
}


static PyObject *complete_recv(PyObject *req, int64_t source, uint64_t tag, uint64_t length);

static PyObject *tm_post(TagMatcherObject *self, PyObject *req)
{
    RecvCoreObject *rc = (RecvCoreObject *)req;
    ucxdp_tag_unexp_t *u;
    PyObject *out = NULL;
    long long source;
    PRecv *p;

    if (!PyObject_TypeCheck(req, &RecvCoreType)) {
        PyErr_SetString(PyExc_TypeError, "post: a ucxpy.tag.RecvRequest");
        return NULL;
    }
    if (rc->source == NULL || rc->tag == NULL || rc->mask == NULL || rc->buf == NULL) {
        PyErr_SetString(PyExc_TypeError, "post: a RecvRequest not initialized");
        return NULL;
    }
    p = PyMem_Calloc(1, sizeof(*p));
    if (p == NULL)
        return PyErr_NoMemory();
    source = PyLong_AsLongLong(rc->source);
    if ((source == -1 && PyErr_Occurred()) || tm_u64(rc->tag, &p->r.m.tag) < 0
            || tm_u64(rc->mask, &p->r.m.mask) < 0)
        goto fail;
    p->r.m.source = source;
    if (rc->buf != Py_None) {
        if (PyObject_GetBuffer(rc->buf, &p->view, PyBUF_WRITABLE) == 0) {
            p->r.buffer = p->view.buf;
            p->r.capacity = (uint64_t)p->view.len;
        } else {
            PyErr_Clear();                 /* (not one writable block: handed off) */
        }
    }
    if (ucxdp_tag_post(self->worker->w, &p->r, &u) != UCXDP_OK) {
        PyErr_NoMemory();
        goto fail;
    }
    if (u != NULL && u->user == NULL && p->r.buffer != NULL && u->length <= p->r.capacity) {
        /* an eager payload kept here, into a buffer it fits: delivered now,
         * one copy (True: done) */
        uint64_t rmask = p->r.m.mask;
        PyObject *r;

        memcpy(p->r.buffer, u->data, u->length);
        r = complete_recv(req, u->m.source, u->m.tag, u->length);
        if (r != NULL && (u->m.tag & self->notify_mask & ~rmask) && self->notify != Py_None) {
            Py_DECREF(r);
            r = PyObject_CallOneArg(self->notify, req);
        }
        unexp_free(self->worker->w, u);
        if (r != NULL) {
            Py_DECREF(r);
            out = Py_NewRef(Py_True);
        }
        goto fail;
    }
    if (u != NULL) {                       /* it arrived first: the caller delivers it */
        out = unexp_object(self, u, 1);
        if (out == NULL)
            ucxdp_tag_queue(self->worker->w, u);    /* (kept: no message lost) */
        else
            unexp_free(self->worker->w, u);
        goto fail;
    }
    p->magic = PRECV_MAGIC;
    p->req = Py_NewRef(req);
    rc->precv = p;
    return Py_NewRef(Py_None);
fail:
    precv_free(p);
    return out;
}

/* post_new(worker, buf, tag, mask, source, cls, cancel): Worker.tag_recv_nb's
 * common case in one call: a receive from a worker id (an int) into one
 * writable byte block (recv_view's answer: a flat 'B' memoryview), of class
 * `cls` (RecvRequest or a subclass), whose source's endpoint has not
 * failed, is made (RecvCore's fields filled as its __init__ fills them) and
 * posted as post() does.  Returns the request (posted, or done), or
 * (request, message) when an unexpected message that the caller's path
 * delivers took it, or None with nothing made (the Python lines then do it
 * all, and raise what they raise). */
static PyObject *tm_post_new(TagMatcherObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *worker, *buf, *tagobj, *mask, *source, *cls, *cancel, *mv = NULL, *eps = NULL,
             *ep, *failed = NULL, *cap = NULL, *seq = NULL, *req = NULL, *out = NULL, *r;
    RecvCoreObject *rc;
    Py_buffer *v;
    int overflow;

    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "post_new(worker, buf, tag, mask, source, cls, cancel)");
        return NULL;
    }
    worker = args[0], buf = args[1], tagobj = args[2], mask = args[3], source = args[4];
    cls = args[5], cancel = args[6];
    if (!PyLong_CheckExact(tagobj) || !PyLong_CheckExact(mask) || !PyLong_CheckExact(source)
            || !PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &RecvCoreType))
        Py_RETURN_NONE;
    if (PyLong_AsLongLongAndOverflow(source, &overflow) < 0 || overflow || PyErr_Occurred()) {
        PyErr_Clear();                     /* (ANY_SOURCE and the like: the Python lines) */
        Py_RETURN_NONE;
    }
    if (PyLong_AsUnsignedLongLong(tagobj) == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();                     /* (negative or wider than 64 bits: the Python
                                            * lines mask it) */
        Py_RETURN_NONE;
    }
    /* the buffer: what recv_view returns as it is */
    if (Py_TYPE(buf) == &PyMemoryView_Type)
        mv = Py_NewRef(buf);
    else if ((mv = PyMemoryView_FromObject(buf)) == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    v = PyMemoryView_GET_BUFFER(mv);
    if (v->readonly || v->ndim != 1 || (v->format != NULL && strcmp(v->format, "B"))
            || !PyBuffer_IsContiguous(v, 'C'))
        goto done;
    /* a source whose endpoint failed: the Python lines complete it with the error */
    if ((eps = PyObject_GetAttrString(worker, "endpoints")) == NULL || !PyDict_CheckExact(eps))
        goto done;
    ep = PyDict_GetItemWithError(eps, source);
    if (ep != NULL && ((failed = PyObject_GetAttrString(ep, "failed")) == NULL
                       || failed != Py_None))
        goto done;
    if (PyErr_Occurred() || (cap = PyLong_FromSsize_t(v->len)) == NULL
            || (seq = PyLong_FromLong(0)) == NULL
            || (req = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0)) == NULL)
        goto done;
    rc = (RecvCoreObject *)req;
    rc->base.worker = Py_NewRef(worker);
    rc->base.done = Py_NewRef(Py_False);
    rc->base.exc = Py_NewRef(Py_None);
    rc->base.result = Py_NewRef(Py_None);
    rc->base.callbacks = Py_NewRef(Py_None);
    rc->base.cancel = Py_NewRef(cancel);
    rc->buf = Py_NewRef(mv);
    rc->capacity = Py_NewRef(cap);
    rc->source = Py_NewRef(source);
    rc->tag = Py_NewRef(tagobj);
    rc->mask = Py_NewRef(mask);
    rc->seq = Py_NewRef(seq);
    r = tm_post(self, req);
    if (r == NULL)
        goto done;
    if (r == Py_None || r == Py_True) {
        Py_DECREF(r);
        out = Py_NewRef(req);
    } else {
        out = PyTuple_Pack(2, req, r);     /* (the caller's path delivers it) */
        Py_DECREF(r);
    }
done:
    Py_XDECREF(mv);
    Py_XDECREF(eps);
    Py_XDECREF(failed);
    Py_XDECREF(cap);
    Py_XDECREF(seq);
    Py_XDECREF(req);
    if (out != NULL || PyErr_Occurred())
        return out;
    Py_RETURN_NONE;
}

static PyObject *tm_remove(TagMatcherObject *self, PyObject *req)
{
    PRecv *p = precv_of(req);

    if (p == NULL || !ucxdp_tag_cancel(self->worker->w, &p->r))
        Py_RETURN_FALSE;
    precv_free(p);
    Py_RETURN_TRUE;
}

static PyObject *tm_match_posted(TagMatcherObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long source;
    uint64_t tag;
    ucxdp_tag_recv_t *r;
    PRecv *p;
    PyObject *req;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "match_posted(source, tag)");
        return NULL;
    }
    source = PyLong_AsLongLong(args[0]);
    if ((source == -1 && PyErr_Occurred()) || tm_u64(args[1], &tag) < 0)
        return NULL;
    r = ucxdp_tag_match(self->worker->w, source, tag);
    if (r == NULL)
        Py_RETURN_NONE;
    if (r->owner == UCXDP_OWNER_EXT)
        return adopt(r);
    p = (PRecv *)r;
    req = Py_NewRef(p->req);
    precv_free(p);
    return req;
}

/* first_for(source, tag) -> the posted receive match_posted would give
 * that message, left posted, or None; True when that is an external
 * caller's receive (libucp's) */
static PyObject *tm_first_for(TagMatcherObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = self->worker->w;
    long long source;
    uint64_t tag;
    ucxdp_recv_t *r;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first_for(source, tag)");
        return NULL;
    }
    source = PyLong_AsLongLong(args[0]);
    if ((source == -1 && PyErr_Occurred()) || tm_u64(args[1], &tag) < 0)
        return NULL;
    pthread_mutex_lock(&w->lock);
    r = ucxdp_match_peek(&w->matcher, source, tag);
    pthread_mutex_unlock(&w->lock);
    if (r == NULL)
        Py_RETURN_NONE;
    if (is_ext(r))
        Py_RETURN_TRUE;
    return Py_NewRef(((PRecv *)r)->req);
}

static PyObject *tm_find_unexpected(TagMatcherObject *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"source", "tag", "mask", "remove", NULL};
    long long source;
    unsigned long long tag_arg, mask_arg;
    uint64_t tag, mask;
    int remove;
    ucxdp_tag_unexp_t *u;
    PyObject *out;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LKKp:find_unexpected", names, &source,
                                     &tag_arg, &mask_arg, &remove))
        return NULL;
    tag = tag_arg;
    mask = mask_arg;
    if (!self->worker->w->matcher.nunexp)
        Py_RETURN_NONE;
    u = ucxdp_tag_probe(self->worker->w, source, tag, mask, remove);
    if (u == NULL)
        Py_RETURN_NONE;
    out = unexp_object(self, u, remove);
    if (remove) {
        if (out == NULL)
            ucxdp_tag_queue(self->worker->w, u);   /* (kept, as the newest: no loss) */
        else
            unexp_free(self->worker->w, u);
    }
    return out;
}

static PyObject *tm_queue_unexpected(TagMatcherObject *self, PyObject *msg)
{
    PyObject *src = NULL, *tag = NULL, *len = NULL;
    ucxdp_tag_unexp_t *u = ucxdp_tag_unexp_alloc(self->worker->w, 0);
    long long source;
    uint64_t t, n;
    int ok = 0;

    if (u == NULL)
        return PyErr_NoMemory();
    if ((src = PyObject_GetAttr(msg, s_source)) != NULL
            && (tag = PyObject_GetAttr(msg, s_tag)) != NULL
            && (len = PyObject_GetAttr(msg, s_length)) != NULL
            && !((source = PyLong_AsLongLong(src)) == -1 && PyErr_Occurred())
            && tm_u64(tag, &t) == 0 && tm_u64(len, &n) == 0) {
        u->m.source = source;
        u->m.tag = t;
        u->length = n;
        u->user = Py_NewRef(msg);
        ucxdp_tag_queue(self->worker->w, u);
        ok = 1;
    }
    Py_XDECREF(src);
    Py_XDECREF(tag);
    Py_XDECREF(len);
    if (!ok) {
        u->user = NULL;
        ucxdp_tag_unexp_free(self->worker->w, u);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *tm_unexpected_depth(TagMatcherObject *self, PyObject *unused)
{
    return PyLong_FromSize_t(self->worker->w->matcher.nunexp);
}

static PyObject *tm_posted_count(TagMatcherObject *self, PyObject *unused)
{
    return PyLong_FromSize_t(ucxdp_match_posted_count(&self->worker->w->matcher));
}

static PyObject *tm_idle_for(TagMatcherObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long source;
    uint64_t tag, mask;

    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "idle_for(source, tag, mask)");
        return NULL;
    }
    source = PyLong_AsLongLong(args[0]);
    if ((source == -1 && PyErr_Occurred()) || tm_u64(args[1], &tag) < 0
            || tm_u64(args[2], &mask) < 0)
        return NULL;
    return PyBool_FromLong(ucxdp_match_idle_for(&self->worker->w->matcher, source, tag, mask));
}

/* the posted receives a predicate selects, gathered under the lock, then
 * listed (Python is called only after the lock is dropped) */
typedef struct {
    int by_source;
    int64_t source;
    uint64_t tag, mask;
    ucxdp_tag_recv_t **found;
    size_t n, cap;
    int nomem;
} Gather;

static void gather_one(ucxdp_recv_t *r, void *arg)
{
    Gather *g = arg;

    if (g->by_source ? r->source != g->source : ((r->tag ^ g->tag) & g->mask) != 0)
        return;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        ucxdp_tag_recv_t **f = realloc(g->found, cap * sizeof(*f));
        if (f == NULL) {
            g->nomem = 1;
            return;
        }
        g->found = f;
        g->cap = cap;
    }
    g->found[g->n++] = (ucxdp_tag_recv_t *)r;
}

static PyObject *tm_gather(TagMatcherObject *self, Gather *g)
{
    ucxdp_worker_t *w = self->worker->w;
    PyObject *list;

    pthread_mutex_lock(&w->lock);
    ucxdp_match_each_posted(&w->matcher, gather_one, g);
    /* an external caller's receive leaves the matcher here: every caller
     * of these fails the receives it gathers (a failed peer, a revoked
     * communicator), and it is Python's to complete from now on */
    for (size_t i = 0; !g->nomem && i < g->n; i++)
        if (g->found[i]->owner == UCXDP_OWNER_EXT)
            ucxdp_match_remove(&w->matcher, &g->found[i]->m);
    pthread_mutex_unlock(&w->lock);
    if (g->nomem) {
        free(g->found);
        return PyErr_NoMemory();
    }
    list = PyList_New((Py_ssize_t)g->n);
    for (size_t i = 0; list != NULL && i < g->n; i++) {
        ucxdp_tag_recv_t *r = g->found[i];
        PyObject *o = r->owner == UCXDP_OWNER_EXT ? adopt(r) : Py_NewRef(((PRecv *)r)->req);

        if (o == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, o);
    }
    free(g->found);
    return list;
}

static PyObject *tm_requests_from(TagMatcherObject *self, PyObject *arg)
{
    Gather g = {.by_source = 1};
    long long source = PyLong_AsLongLong(arg);

    if (source == -1 && PyErr_Occurred())
        return NULL;
    g.source = source;
    return tm_gather(self, &g);
}

static PyObject *tm_requests_matching(TagMatcherObject *self, PyObject *const *args,
                                      Py_ssize_t nargs)
{
    Gather g = {.by_source = 0};

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "requests_matching(tag, mask)");
        return NULL;
    }
    if (tm_u64(args[0], &g.tag) < 0 || tm_u64(args[1], &g.mask) < 0)
        return NULL;
    return tm_gather(self, &g);
}

/* req.complete(TagInfo(source, tag, length)).  Its common case, a request
 * not done and without callbacks, is done here as Request.complete does it
 * (done True, the result, nothing left to cancel; its error stays None), on
 * its C fields (RequestCore): no Python frame.  Anything else calls
 * complete().  A new reference (None), or NULL with an exception. */
static PyObject *complete_recv(PyObject *req, int64_t source, uint64_t tag, uint64_t length)
{
    PyObject *s = PyLong_FromLongLong(source), *t = PyLong_FromUnsignedLongLong(tag),
             *n = PyLong_FromUnsignedLongLong(length), *info = NULL, *r = NULL;
    RequestCoreObject *q = (RequestCoreObject *)req;

    if (s == NULL || t == NULL || n == NULL || (info = ti_make(s, t, n)) == NULL)
        goto out;
    if (PyObject_TypeCheck(req, &RequestCoreType) && q->done == Py_False
            && (q->callbacks == NULL || q->callbacks == Py_None)) {
        Py_XSETREF(q->done, Py_NewRef(Py_True));
        Py_XSETREF(q->result, Py_NewRef(info));
        Py_XSETREF(q->cancel, Py_NewRef(Py_None));
        r = Py_NewRef(Py_None);
    } else {
        r = PyObject_CallMethodOneArg(req, s_complete, info);
    }
out:
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(n);
    Py_XDECREF(info);
    return r;
}

/* Complete the receives the data plane matched: how many, or -1 with the
 * exception of a completion (the rest stay on the done list, in order). */
static long tm_deliver_done(TagMatcherObject *self)
{
    ucxdp_worker_t *w = self->worker->w;
    ucxdp_link_t list, *l;
    PyObject *r, *req, *payload;
    long n = 0;

    ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
    while ((l = list.next) != &list) {
        PRecv *p = (PRecv *)UCXDP_DONE_RECV(l);
        ucxdp_tag_recv_t t = p->r;         /* (the outcome, kept: p is freed first) */
        int notify = (t.info_tag & self->notify_mask & ~t.m.mask) != 0;

        l->prev->next = l->next;           /* off the list */
        l->next->prev = l->prev;
        req = Py_NewRef(p->req);
        precv_free(p);                     /* (its handle is 0 before any callback runs) */
        if (t.status == UCXDP_OK) {
            r = complete_recv(req, t.info_source, t.info_tag, t.info_length);
            if (r != NULL && notify && self->notify != Py_None) {
                Py_DECREF(r);
                r = PyObject_CallOneArg(self->notify, req);
            }
        } else {                           /* HANDOFF; NO_MEMORY: payload None */
            payload = t.handoff == NULL ? Py_NewRef(Py_None)
                : PyBytes_FromStringAndSize(t.handoff, (Py_ssize_t)t.info_length);
            free(t.handoff);
            r = payload == NULL ? NULL
                : PyObject_CallFunction(self->handoff, "OLKN", req, (long long)t.info_source,
                                        (unsigned long long)t.info_tag, payload);
        }
        Py_DECREF(req);
        if (r == NULL) {
            ucxdp_tag_return_done(w, UCXDP_OWNER_PY, &list);
            return -1;
        }
        Py_DECREF(r);
        n++;
    }
    return n;
}

static PyObject *tm_deliver(TagMatcherObject *self, PyObject *unused)
{
    long n = __atomic_load_n(&self->worker->w->py_done, __ATOMIC_RELAXED)
        ? tm_deliver_done(self) : 0;

    return n < 0 ? NULL : PyLong_FromLong(n);
}

static void free_posted(ucxdp_recv_t *r, void *m)
{
    if (is_ext(r))                         /* (its owner's: left posted) */
        return;
    ucxdp_match_remove(m, r);
    precv_free((PRecv *)r);
}

/* Drop every receive and unexpected message the matcher holds (their
 * requests' handles become 0) and the callables it holds (None then: a
 * call after this raises, never crashes).  The worker stays until dealloc
 * (it holds no Python object). */
static int tm_clear(TagMatcherObject *self)
{
    ucxdp_worker_t *w = self->worker->w;
    ucxdp_link_t list, *l;
    ucxdp_tag_unexp_t *u;

    ucxdp_match_each_posted(&w->matcher, free_posted, &w->matcher);
    ucxdp_tag_take_done(w, UCXDP_OWNER_PY, &list);
    while ((l = list.next) != &list) {
        PRecv *p = (PRecv *)UCXDP_DONE_RECV(l);
        l->prev->next = l->next;
        l->next->prev = l->prev;
        free(p->r.handoff);
        precv_free(p);
    }
    while ((u = ucxdp_tag_probe(w, UCXDP_ANY_SOURCE, 0, 0, 1)) != NULL)
        unexp_free(self->worker->w, u);
    Py_SETREF(self->unexp_cls, Py_NewRef(Py_None));
    Py_SETREF(self->handoff, Py_NewRef(Py_None));
    Py_SETREF(self->notify, Py_NewRef(Py_None));
    return 0;
}

typedef struct {
    visitproc visit;
    void *arg;
    int rc;
} Visit;

static void visit_posted(ucxdp_recv_t *r, void *arg)
{
    Visit *v = arg;

    if (v->rc == 0 && !is_ext(r))
        v->rc = v->visit(((PRecv *)r)->req, v->arg);
}

/* The objects the matcher keeps alive: its callables, and the requests and
 * messages in its queues (a posted request refers back to its worker, which
 * holds the matcher: the collector sees that cycle through here). */
static int tm_traverse(TagMatcherObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->unexp_cls);
    Py_VISIT(self->handoff);
    Py_VISIT(self->notify);
    if (self->worker != NULL) {
        ucxdp_worker_t *w = self->worker->w;
        Visit v = {visit, arg, 0};
        ucxdp_link_t *l;

        pthread_mutex_lock(&w->lock);
        ucxdp_match_each_posted(&w->matcher, visit_posted, &v);
        ucxdp_link_t *done = &w->done[UCXDP_OWNER_PY];

        for (l = done->next; v.rc == 0 && l != done; l = l->next)
            v.rc = visit(((PRecv *)UCXDP_DONE_RECV(l))->req, arg);
        for (l = w->matcher.unexp.next; v.rc == 0 && l != &w->matcher.unexp; l = l->next) {
            ucxdp_tag_unexp_t *u = (ucxdp_tag_unexp_t *)((char *)l - offsetof(ucxdp_tag_unexp_t, m)
                                                         - offsetof(ucxdp_unexp_t, all));
            if (u->user != NULL)
                v.rc = visit((PyObject *)u->user, arg);
        }
        pthread_mutex_unlock(&w->lock);
        if (v.rc)
            return v.rc;
    }
    return 0;
}

static void tm_dealloc(TagMatcherObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->worker != NULL)
        tm_clear(self);
    Py_XDECREF(self->worker);
    Py_XDECREF(self->unexp_cls);
    Py_XDECREF(self->handoff);
    Py_XDECREF(self->notify);
    Py_XDECREF(self->bucket_mask);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tm_get_bucket_mask(TagMatcherObject *self, void *closure)
{
    return Py_NewRef(self->bucket_mask);
}

static int tm_set_bucket_mask(TagMatcherObject *self, PyObject *v, void *closure)
{
    uint64_t mask = 0;

    if (v == NULL || (v != Py_None && tm_u64(v, &mask) < 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "bucket_mask: an int or None");
        return -1;
    }
    if (ucxdp_match_set_bucket_mask(&self->worker->w->matcher, mask) < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "bucket_mask changes only while no receive is posted");
        return -1;
    }
    Py_SETREF(self->bucket_mask, Py_NewRef(v));
    return 0;
}

static PyObject *tm_get_notify_mask(TagMatcherObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->notify_mask);
}

static int tm_set_notify_mask(TagMatcherObject *self, PyObject *v, void *closure)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "notify_mask: an int");
        return -1;
    }
    return tm_u64(v, &self->notify_mask);
}

static PyObject *tm_get_notify(TagMatcherObject *self, void *closure)
{
    return Py_NewRef(self->notify);
}

static int tm_set_notify(TagMatcherObject *self, PyObject *v, void *closure)
{
    Py_SETREF(self->notify, Py_NewRef(v == NULL ? Py_None : v));
    return 0;
}

static PyObject *tm_counts(TagMatcherObject *self, PyObject *unused)
{
    return Py_BuildValue("(nn)", (Py_ssize_t)ucxdp_match_posted_count(&self->worker->w->matcher),
                         (Py_ssize_t)self->worker->w->matcher.nunexp);
}

static PyGetSetDef tm_getset[] = {
    {"bucket_mask", (getter)tm_get_bucket_mask, (setter)tm_set_bucket_mask,
     "a layer's common mask (None: none); set while no receive is posted", NULL},
    {"notify_mask", (getter)tm_get_notify_mask, (setter)tm_set_notify_mask,
     "tag bits whose match notify(req) hears of", NULL},
    {"notify", (getter)tm_get_notify, (setter)tm_set_notify, "notify(req), or None", NULL},
    {NULL},
};

#define FASTMETH(name, fn) {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL, NULL}
/* streams_progress(limit) -> (taken, left): the tcp streams lent to the data
 * plane read and their eager frames matched (stream.c), as a C caller's
 * progress does, for Python's own progress (a blocking wait of Python's
 * while libucp lends them); Python's receives they completed delivered;
 * `left`: a stream stopped and waits for the transport */
static PyObject *tm_streams_progress(TagMatcherObject *self, PyObject *arg)
{
    long limit = PyLong_AsLong(arg);
    long n;
    int left;

    if (limit == -1 && PyErr_Occurred())
        return NULL;
    n = ucxdp_streams_progress(self->worker->w, limit, &left);
    if ((n > 0 || __atomic_load_n(&self->worker->w->py_done, __ATOMIC_RELAXED))
            && tm_deliver_done(self) < 0)
        return NULL;
    return Py_BuildValue("(li)", n, left);
}

static PyMethodDef tm_methods[] = {
    {"streams_progress", (PyCFunction)tm_streams_progress, METH_O,
     "streams_progress(limit) -> (taken, left): the tcp streams lent to the data plane"},
    {"post", (PyCFunction)tm_post, METH_O, NULL},
    FASTMETH("post_new", tm_post_new),
    {"remove", (PyCFunction)tm_remove, METH_O, NULL},
    FASTMETH("match_posted", tm_match_posted),
    FASTMETH("first_for", tm_first_for),
    {"find_unexpected", (PyCFunction)(void (*)(void))tm_find_unexpected,
     METH_VARARGS | METH_KEYWORDS, NULL},
    {"queue_unexpected", (PyCFunction)tm_queue_unexpected, METH_O, NULL},
    {"unexpected_depth", (PyCFunction)tm_unexpected_depth, METH_NOARGS, NULL},
    {"posted_count", (PyCFunction)tm_posted_count, METH_NOARGS, NULL},
    FASTMETH("idle_for", tm_idle_for),
    {"requests_from", (PyCFunction)tm_requests_from, METH_O, NULL},
    FASTMETH("requests_matching", tm_requests_matching),
    {"deliver", (PyCFunction)tm_deliver, METH_NOARGS, NULL},
    {"counts", (PyCFunction)tm_counts, METH_NOARGS, "counts() -> (posted, unexpected)"},
    {NULL},
};

static PyTypeObject TagMatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.TagMatcher",
    .tp_doc = "TagMatcher(worker, UnexpectedMessage, handoff): the worker's one "
              "tag matcher (tag.c), with ucxpy.tag.TagMatcher's interface.",
    .tp_basicsize = sizeof(TagMatcherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = tm_new,
    .tp_dealloc = (destructor)tm_dealloc,
    .tp_traverse = (traverseproc)tm_traverse,
    .tp_clear = (inquiry)tm_clear,
    .tp_methods = tm_methods,
    .tp_getset = tm_getset,
};

/* -- Inbox -------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    TagMatcherObject *matcher;
    ucxpy_ring_t *ring;
    ucxdp_inbox_t in;
    int ready;
    PyObject *lanes;                       /* conn -> the Lane its ATS go by (kept alive) */
} InboxObject;

static PyObject *inbox_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *matcher;
    unsigned long long ring;
    unsigned int am_id;
    InboxObject *self;

    if (!PyArg_ParseTuple(args, "O!KI:Inbox", &TagMatcherType, &matcher, &ring, &am_id))
        return NULL;
    if (ring == 0 || am_id > 255) {
        PyErr_SetString(PyExc_ValueError, "Inbox: a ring address and an active-message id");
        return NULL;
    }
    self = (InboxObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->matcher = (TagMatcherObject *)Py_NewRef(matcher);
    if (ucxdp_inbox_init(&self->in, (struct ucxpy_ring *)(uintptr_t)ring, am_id) != UCXDP_OK) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ready = 1;
    if ((self->lanes = PyDict_New()) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->matcher->worker->w->inbox = &self->in;
    return (PyObject *)self;
}

static void inbox_dealloc(InboxObject *self)
{
    if (self->ready) {
        ucxdp_worker_t *w = self->matcher->worker->w;

        if (w->inbox == &self->in)
            w->inbox = NULL;
        ucxdp_inbox_cleanup(&self->in);
    }
    Py_XDECREF(self->lanes);
    Py_XDECREF(self->matcher);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *inbox_add_conn(InboxObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t conn;
    long long source;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add_conn(conn, source)");
        return NULL;
    }
    source = PyLong_AsLongLong(args[1]);
    if (tm_u64(args[0], &conn) < 0 || (source == -1 && PyErr_Occurred()))
        return NULL;
    if (ucxdp_inbox_add_conn(&self->in, conn, source) != UCXDP_OK) {
        if (conn == 0) {
            PyErr_SetString(PyExc_ValueError, "add_conn: connection id 0");
            return NULL;
        }
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyObject *inbox_forget_conn(InboxObject *self, PyObject *arg)
{
    ucxdp_worker_t *w = self->matcher->worker->w;
    uint64_t conn;

    if (tm_u64(arg, &conn) < 0)
        return NULL;
    pthread_mutex_lock(&w->lock);          /* (its owed answers go with it) */
    ucxdp_inbox_forget_conn(&self->in, conn);
    pthread_mutex_unlock(&w->lock);
    if (PyDict_DelItem(self->lanes, arg) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

/* (the Lane type, below) */
typedef struct {
    PyObject_HEAD
    ucxdp_lane_t lane;
} LaneObject;

static PyTypeObject LaneType;

/* set_lane(conn, lane or None): our Lane back to the source of connection
 * `conn`, which the ATS of offers the data plane reads from it go by (a
 * registered connection; kept alive while set) */
static PyObject *inbox_set_lane(InboxObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = self->matcher->worker->w;
    struct ucxdp_lane *lane = NULL;
    uint64_t conn;

    if (nargs != 2 || (args[1] != Py_None && !PyObject_TypeCheck(args[1], &LaneType))) {
        PyErr_SetString(PyExc_TypeError, "set_lane(conn, Lane or None)");
        return NULL;
    }
    if (tm_u64(args[0], &conn) < 0)
        return NULL;
    if (args[1] != Py_None) {
        if (PyDict_SetItem(self->lanes, args[0], args[1]) < 0)
            return NULL;
        lane = &((LaneObject *)args[1])->lane;
    }
    pthread_mutex_lock(&w->lock);
    ucxdp_inbox_set_lane(&self->in, conn, lane);
    pthread_mutex_unlock(&w->lock);
    if (lane == NULL && PyDict_DelItem(self->lanes, args[0]) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

/* rndv(rts am id, ats am id, rndv max): the rendezvous frames the inbox
 * takes (ucxdp_inbox_rndv) */
static PyObject *inbox_rndv(InboxObject *self, PyObject *args)
{
    unsigned int rts, ats;
    unsigned long long max;

    if (!PyArg_ParseTuple(args, "IIK:rndv", &rts, &ats, &max))
        return NULL;
    if (rts > 255 || ats > 255)
        return PyErr_Format(PyExc_ValueError, "rndv: active-message ids");
    ucxdp_inbox_rndv(&self->in, rts, ats, max);
    Py_RETURN_NONE;
}

/* am(am eager id): the active messages' eager frames the inbox takes for
 * the worker's C handlers (ucxdp_inbox_am; 0: none) */
static PyObject *inbox_am(InboxObject *self, PyObject *arg)
{
    unsigned long id = PyLong_AsUnsignedLong(arg);

    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (id > 255)
        return PyErr_Format(PyExc_ValueError, "am: an active-message id");
    ucxdp_inbox_am(&self->in, (unsigned)id);
    Py_RETURN_NONE;
}

/* take_wakes() -> (conns, all): the connections whose sleeping peer had an
 * answer pushed into its ring (all: more than were kept; wake every peer) */
static PyObject *inbox_take_wakes(InboxObject *self, PyObject *unused)
{
    ucxdp_worker_t *w = self->matcher->worker->w;
    uint64_t conns[UCXDP_INBOX_OWED];
    PyObject *t;
    int n, all;

    pthread_mutex_lock(&w->lock);
    n = self->in.nwake;
    all = self->in.wake_all;
    memcpy(conns, self->in.wake_conns, sizeof(conns[0]) * (size_t)n);
    self->in.nwake = self->in.wake_all = 0;
    pthread_mutex_unlock(&w->lock);
    if ((t = PyTuple_New(n)) == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *c = PyLong_FromUnsignedLongLong(conns[i]);
        if (c == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, c);
    }
    return Py_BuildValue("(NO)", t, all ? Py_True : Py_False);
}

static PyObject *inbox_dispatch(InboxObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long limit;
    int spins, wake, bad;
    long n;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "dispatch(limit, spins)");
        return NULL;
    }
    limit = PyLong_AsLongLong(args[0]);
    spins = (int)PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    n = ucxdp_inbox_dispatch(self->matcher->worker->w, &self->in, (long)limit, spins, &wake, &bad);
    if (__atomic_exchange_n(&self->in.owed_wake, 0, __ATOMIC_RELAXED))
        wake = 1;                          /* (a C caller's progress took that frame) */
    /* (and what a C caller's pass matched for Python: libucp's progress
     * takes most frames, and a receive of Python's is among them when a
     * C caller's post fell back to Python's path) */
    if ((n > 0 || __atomic_load_n(&self->matcher->worker->w->py_done, __ATOMIC_RELAXED))
            && tm_deliver_done(self->matcher) < 0)
        return NULL;
    return PyLong_FromLongLong((long long)n | (wake ? INBOX_WAKE_BIT : 0)
                               | (bad ? INBOX_BAD_BIT : 0));
}

/* try_recv(conn, tag, mask, buffer, spins) -> (n, its tag): n >= 0 the
 * message's length (plus WAKE_BIT when a producer waits for space); -1 no
 * frame; -2 another frame first (ucxdp_inbox_try_recv).  A buffer that is
 * not one writable block raises BufferError. */
static PyObject *inbox_try_recv(InboxObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t conn, tag, mask, got = 0;
    Py_buffer view;
    int spins, wake;
    int64_t n;

    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "try_recv(conn, tag, mask, buffer, spins)");
        return NULL;
    }
    if (tm_u64(args[0], &conn) < 0 || tm_u64(args[1], &tag) < 0 || tm_u64(args[2], &mask) < 0)
        return NULL;
    spins = (int)PyLong_AsLong(args[4]);
    if (spins == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    n = ucxdp_inbox_try_recv(self->matcher->worker->w, &self->in, conn, tag, mask, view.buf,
                             (uint64_t)view.len, spins, &got, &wake);
    PyBuffer_Release(&view);
    if (n >= 0 && wake)
        n |= INBOX_WAKE_BIT;
    return Py_BuildValue("(LK)", (long long)n, (unsigned long long)got);
}

/* hand_sizes([(first, last), ...]): the payload sizes whose messages the
 * caller's (Python) protocol runs; [] none */
static PyObject *inbox_hand_sizes(InboxObject *self, PyObject *arg)
{
    uint64_t ranges[UCXDP_INBOX_RANGES][2];
    Py_ssize_t n = parse_ranges(arg, "hand_sizes", ranges, UCXDP_INBOX_RANGES);

    if (n < 0)
        return NULL;
    ucxdp_inbox_hand_sizes(&self->in, (const uint64_t (*)[2])ranges, (int)n);
    Py_RETURN_NONE;
}

static PyObject *inbox_conns(InboxObject *self, PyObject *unused)
{
    return PyLong_FromSize_t(self->in.nconns);
}

static PyMethodDef inbox_methods[] = {
    FASTMETH("add_conn", inbox_add_conn),
    {"forget_conn", (PyCFunction)inbox_forget_conn, METH_O, NULL},
    FASTMETH("dispatch", inbox_dispatch),
    FASTMETH("set_lane", inbox_set_lane),
    {"am", (PyCFunction)inbox_am, METH_O,
     "am(am eager id): take active messages' eager frames for the worker's C handlers"},
    {"rndv", (PyCFunction)inbox_rndv, METH_VARARGS,
     "rndv(rts am id, ats am id, rndv max): the rendezvous frames the inbox takes"},
    {"take_wakes", (PyCFunction)inbox_take_wakes, METH_NOARGS,
     "take_wakes() -> (conns, all): peers an answer went to that sleep"},
    FASTMETH("try_recv", inbox_try_recv),
    {"hand_sizes", (PyCFunction)inbox_hand_sizes, METH_O,
     "hand_sizes([(first, last), ...]): sizes whose messages the Python protocol runs"},
    {"conns", (PyCFunction)inbox_conns, METH_NOARGS, "how many connections are registered"},
    {NULL},
};

static PyObject *inbox_get_busy(InboxObject *self, void *closure)
{
    return PyBool_FromLong(__atomic_load_n(&self->in.py_busy, __ATOMIC_RELAXED));
}

/* A flag attribute's new value `v`: 0 or 1, or -1 with an exception
 * (deleting `name`, or a value without a truth). */
static int flag_of(PyObject *v, const char *name)
{
    int b = v != NULL ? PyObject_IsTrue(v) : -1;

    if (b < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "%s cannot be deleted", name);
    return b;
}

static int inbox_set_busy(InboxObject *self, PyObject *v, void *closure)
{
    int b = flag_of(v, "busy");

    if (b < 0)
        return -1;
    __atomic_store_n(&self->in.py_busy, b, __ATOMIC_RELAXED);
    return 0;
}

static PyGetSetDef inbox_getset[] = {
    {"busy", (getter)inbox_get_busy, (setter)inbox_set_busy,
     "the transport has frames of its own queued (a full ring): a C caller's progress "
     "(libucp) then runs Python's", NULL},
    {NULL},
};

static PyTypeObject InboxType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Inbox",
    .tp_doc = "Inbox(matcher, ring address, eager am id): a shm inbox's eager messages, "
              "taken and matched in C (inbox.c).",
    .tp_basicsize = sizeof(InboxObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = inbox_new,
    .tp_dealloc = (destructor)inbox_dealloc,
    .tp_methods = inbox_methods,
    .tp_getset = inbox_getset,
};

/* -- Stream --------------------------------------------------------------------------- */
/* Stream(fd, source, eager am id, eager max): a tcp connection's reader in C
 * (stream.c), which the transport lends (`lent`) while nothing of the stream
 * is buffered in Python; `stopped` says why the data plane gave it back,
 * take() the bytes it read and did not take (the stream's head), reclaim()
 * takes it back; `out_open`: a frame written now is next (the transport
 * keeps it) */
static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int fd;
    long long source;
    unsigned int am_id, am_eager_id = 0;
    unsigned long long max;
    StreamObject *self;

    if (!PyArg_ParseTuple(args, "iLIK|I:Stream", &fd, &source, &am_id, &max, &am_eager_id))
        return NULL;
    if (fd < 0 || am_id > 255 || am_eager_id > 255)
        return PyErr_Format(PyExc_ValueError, "Stream: a socket and active-message ids");
    self = (StreamObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    ucxdp_stream_init(&self->s, fd, source, am_id, max);
    self->s.am_eager_id = am_eager_id;
    return (PyObject *)self;
}

static PyObject *stream_take(StreamObject *self, PyObject *unused)
{
    const uint8_t *bytes;
    size_t n;

    if (self->s.lent)
        return PyErr_Format(PyExc_RuntimeError, "Stream.take: the stream is lent");
    n = ucxdp_stream_take(&self->s, &bytes);
    self->s.stopped = 0;
    return PyBytes_FromStringAndSize((const char *)bytes, (Py_ssize_t)n);
}

static PyObject *stream_reclaim(StreamObject *self, PyObject *unused)
{
    ucxdp_stream_reclaim(&self->s);
    Py_RETURN_NONE;
}

static PyObject *stream_get_u32(StreamObject *self, void *closure)
{
    return PyLong_FromUnsignedLong(__atomic_load_n((uint32_t *)((char *)&self->s
                                                                 + (size_t)closure),
                                                   __ATOMIC_ACQUIRE));
}

static int stream_set_u32(StreamObject *self, PyObject *v, void *closure)
{
    int on = v != NULL ? PyObject_IsTrue(v) : -1;

    if (on < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "cannot be deleted");
        return -1;
    }
    if ((size_t)closure == offsetof(ucxdp_stream_t, lent) && on && self->s.start != self->s.end) {
        PyErr_SetString(PyExc_RuntimeError, "Stream.lent: take() its bytes first");
        return -1;
    }
    if ((size_t)closure == offsetof(ucxdp_stream_t, lent) && on)
        self->s.stopped = 0;
    __atomic_store_n((uint32_t *)((char *)&self->s + (size_t)closure), (uint32_t)on,
                     __ATOMIC_RELEASE);
    return 0;
}

static PyObject *stream_get_fd(StreamObject *self, void *closure)
{
    return PyLong_FromLong(self->s.fd);
}

static PyObject *stream_get_stopped(StreamObject *self, void *closure)
{
    return PyLong_FromUnsignedLong(self->s.stopped);
}

static PyMethodDef stream_methods[] = {
    {"take", (PyCFunction)stream_take, METH_NOARGS,
     "take() -> bytes: what the data plane read and did not take (the stream's head)"},
    {"reclaim", (PyCFunction)stream_reclaim, METH_NOARGS,
     "reclaim(): take the reading back (then take() its bytes)"},
    {NULL},
};

static PyGetSetDef stream_getset[] = {
    {"lent", (getter)stream_get_u32, (setter)stream_set_u32,
     "the data plane reads the socket (the transport lends it with nothing buffered)",
     (void *)offsetof(ucxdp_stream_t, lent)},
    {"out_open", (getter)stream_get_u32, (setter)stream_set_u32,
     "a frame written now is next in the connection's order",
     (void *)offsetof(ucxdp_stream_t, out_open)},
    {"dead", (getter)stream_get_u32, (setter)stream_set_u32,
     "the transport forgot it for good (its senders ask for another)",
     (void *)offsetof(ucxdp_stream_t, dead)},
    {"fd", (getter)stream_get_fd, NULL, "the socket", NULL},
    {"stopped", (getter)stream_get_stopped, NULL,
     "why the data plane gave the stream back (0: it did not)", NULL},
    {NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Stream",
    .tp_doc = "Stream(fd, source, eager am id, eager max): a tcp connection's reader in C "
              "(stream.c), lent by the transport.",
    .tp_basicsize = sizeof(StreamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = stream_new,
    .tp_methods = stream_methods,
    .tp_getset = stream_getset,
};

/* -- Lane ----------------------------------------------------------------------------- */
/* Lane(ring address, eager am id, max frame[, rts am id, ats am id[, am eager
 * id]]): a connection to a peer's inbox for the data plane's senders (lane.c,
 * rndv.c, am.c);
 * `open`, `dead` and `cma` are the transport's to keep current (start:
 * closed, alive, no CMA), and set_peer(pid, peer pid, cma) tells it the two
 * processes.  The core's per-message calls, each -1 when declined with
 * nothing done (the caller's path then does it), else 0, or 1 when the peer
 * sleeps (the caller wakes it):
 *   eager(worker, tag, buffer[, limit]): one eager frame (at most `limit`
 *     bytes of payload);
 *   rts(worker, tag, sreq id, buffer): the rendezvous offer of send `sreq id`
 *     (the caller keeps `buffer` until the answer);
 *   get_ack(worker, key, address, buffer, size, sreq id): reads an offer of
 *     the peer's by CMA into `buffer` and answers ATS(OK); 2: read, but the
 *     answer could not be pushed (the caller sends it). */

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    unsigned long long ring, max_frame;
    unsigned int am_id, rts_id = 0, ats_id = 0, am_eager_id = 0;
    LaneObject *self;

    if (!PyArg_ParseTuple(args, "KIK|III:Lane", &ring, &am_id, &max_frame, &rts_id, &ats_id,
                          &am_eager_id))
        return NULL;
    if (ring == 0 || am_id > 255 || rts_id > 255 || ats_id > 255 || am_eager_id > 255) {
        PyErr_SetString(PyExc_ValueError, "Lane: a ring address and active-message ids");
        return NULL;
    }
    self = (LaneObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lane.ring = (struct ucxpy_ring *)(uintptr_t)ring;
    self->lane.eager_am_id = am_id;
    self->lane.max_frame = max_frame;
    self->lane.rts_am_id = rts_id;
    self->lane.ats_am_id = ats_id;
    self->lane.am_eager_id = am_eager_id;
    return (PyObject *)self;
}

/* the worker of a Lane call's first argument, or NULL with TypeError naming `usage` */
static ucxdp_worker_t *lane_worker(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t lo,
                                   Py_ssize_t hi, const char *usage)
{
    if (nargs < lo || nargs > hi || !PyObject_TypeCheck(args[0], &WorkerType)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    return ((WorkerObject *)args[0])->w;
}

/* a size limit argument: 0, or -1 with an error (a negative one: nothing fits) */
static int limit_of(PyObject *o, long long *limit)
{
    *limit = PyLong_AsLongLong(o);
    return *limit == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *lane_eager(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = lane_worker(args, nargs, 3, 4, "eager(worker, tag, buffer[, limit])");
    uint64_t tag;
    long long limit = LLONG_MAX;
    Py_buffer view;
    ucxdp_status_t st;
    int wake;

    if (w == NULL || tm_u64(args[1], &tag) < 0 || (nargs == 4 && limit_of(args[3], &limit) < 0)
            || PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    st = (long long)view.len > limit ? UCXDP_ERR_NO_RESOURCE
         : ucxdp_lane_eager(w, &self->lane, tag, view.buf, (uint64_t)view.len, &wake);
    PyBuffer_Release(&view);
    return PyLong_FromLong(st != UCXDP_OK ? -1 : wake);
}

static PyObject *lane_rts(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = lane_worker(args, nargs, 4, 4, "rts(worker, tag, sreq id, buffer)");
    uint64_t tag, sreq_id;
    Py_buffer view;
    ucxdp_status_t st;
    int wake;

    if (w == NULL || tm_u64(args[1], &tag) < 0 || tm_u64(args[2], &sreq_id) < 0
            || PyObject_GetBuffer(args[3], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    /* (the address outlives the view: the caller keeps the buffer until ATS) */
    st = ucxdp_lane_rts(w, &self->lane, tag, sreq_id, view.buf, (uint64_t)view.len, &wake);
    PyBuffer_Release(&view);
    return PyLong_FromLong(st != UCXDP_OK ? -1 : wake);
}

static PyObject *lane_get_ack(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = lane_worker(args, nargs, 6, 6,
                                    "get_ack(worker, key, address, buffer, size, sreq id)");
    uint64_t addr, size, sreq_id;
    Py_buffer key, buf;
    ucxdp_status_t st;
    int wake = 0;

    if (w == NULL || tm_u64(args[2], &addr) < 0 || tm_u64(args[4], &size) < 0
            || tm_u64(args[5], &sreq_id) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &key, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &buf, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    st = size > (uint64_t)buf.len ? UCXDP_ERR_NO_RESOURCE
         : ucxdp_lane_get(w, &self->lane, key.buf, (size_t)key.len, addr, buf.buf, size);
    PyBuffer_Release(&key);
    PyBuffer_Release(&buf);
    if (st != UCXDP_OK)
        return PyLong_FromLong(-1);
    st = ucxdp_lane_ats(w, &self->lane, sreq_id, 0 /* wire.ATS_OK */, &wake);
    return PyLong_FromLong(st != UCXDP_OK ? 2 : wake);
}

static PyObject *lane_set_peer(LaneObject *self, PyObject *args)
{
    unsigned int pid, peer_pid;
    int cma;

    if (!PyArg_ParseTuple(args, "IIp:set_peer", &pid, &peer_pid, &cma))
        return NULL;
    self->lane.pid = pid;
    self->lane.peer_pid = peer_pid;
    self->lane.cma = cma;
    Py_RETURN_NONE;
}

#define LANE_FLAG(name)                                                                  \
    static PyObject *lane_get_##name(LaneObject *self, void *closure)                    \
    {                                                                                    \
        return PyBool_FromLong(self->lane.name);                                         \
    }                                                                                    \
    static int lane_set_##name(LaneObject *self, PyObject *v, void *closure)             \
    {                                                                                    \
        int b = flag_of(v, #name);                                                       \
        if (b < 0)                                                                       \
            return -1;                                                                   \
        self->lane.name = b;                                                             \
        return 0;                                                                        \
    }
LANE_FLAG(open)
LANE_FLAG(dead)
LANE_FLAG(cma)
#undef LANE_FLAG

static PyGetSetDef lane_getset[] = {
    {"open", (getter)lane_get_open, (setter)lane_set_open,
     "a frame pushed now is next in the connection's order", NULL},
    {"dead", (getter)lane_get_dead, (setter)lane_set_dead,
     "the connection is gone for good (set before its ring is unmapped)", NULL},
    {"cma", (getter)lane_get_cma, (setter)lane_set_cma,
     "CMA to the peer works (rendezvous reads go by it)", NULL},
    {NULL},
};

static PyMethodDef lane_methods[] = {
    FASTMETH("eager", lane_eager),
    FASTMETH("rts", lane_rts),
    FASTMETH("get_ack", lane_get_ack),
    {"set_peer", (PyCFunction)lane_set_peer, METH_VARARGS,
     "set_peer(pid, peer pid, cma): the processes whose memory offers name"},
    {NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._dp.Lane",
    .tp_doc = "Lane(ring address, eager am id, max frame[, rts am id, ats am id[, am eager "
              "id]]): a connection to a peer's shm inbox, for the data plane's senders (lane.c, "
              "rndv.c, am.c).",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lane_new,
    .tp_methods = lane_methods,
    .tp_getset = lane_getset,
};

/* -- the tcp eager path (tcp.c) ------------------------------------------------------- */
/* tcp_eager_send(worker, fd, am id, tag, buffer, limit) -> the bytes of the
 *   frame the socket did not take (0: all taken; the caller queues the tail
 *   of tcp_eager_head(...) + buffer), -1 none taken, -100 over `limit`.
 * tcp_eager_recv(worker, fd, am id, tag, mask, buffer, spins) -> (n, tag,
 *   spill): see ucxdp_tcp_eager_recv; spill is None or the bytes read and
 *   not taken.  OSError when the stream is out of step (the caller fails the
 *   connection).
 * tcp_eager_head(am id, tag, length) -> the frame's first bytes. */
/* an int argument: 0, or -1 with an error */
static int int_of(PyObject *o, int *v)
{
    long x = PyLong_AsLong(o);

    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < INT_MIN || x > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "an int argument out of range");
        return -1;
    }
    *v = (int)x;
    return 0;
}

static PyObject *dp_tcp_eager_send(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = lane_worker(args, nargs, 6, 6,
                                    "tcp_eager_send(worker, fd, am id, tag, buffer, limit)");
    uint64_t tag;
    long long limit;
    int fd, am_id;
    Py_buffer view;
    int64_t left;

    if (w == NULL || int_of(args[1], &fd) < 0 || int_of(args[2], &am_id) < 0 || am_id < 0
            || am_id > 255 || tm_u64(args[3], &tag) < 0 || limit_of(args[5], &limit) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "tcp_eager_send: a descriptor and an am id");
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    left = (long long)view.len > limit ? -100
           : ucxdp_tcp_eager_send(w, fd, (unsigned)am_id, tag, view.buf, (uint64_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(left);
}

/* the small way's bounce and spill buffer (calls hold the GIL: one at a time) */
static uint8_t tcp_spill[UCXDP_TCP_SPILL_MAX];

static PyObject *dp_tcp_eager_recv(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    ucxdp_worker_t *w = lane_worker(args, nargs, 7, 7,
                                    "tcp_eager_recv(worker, fd, am id, tag, mask, buffer, spins)");
    uint64_t tag, mask, got;
    int fd, am_id, spins;
    size_t spilled;
    Py_buffer view;
    PyObject *spill;
    int64_t n;

    if (w == NULL || int_of(args[1], &fd) < 0 || int_of(args[2], &am_id) < 0 || am_id < 0
            || am_id > 255 || tm_u64(args[3], &tag) < 0 || tm_u64(args[4], &mask) < 0
            || int_of(args[6], &spins) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "tcp_eager_recv: a descriptor and an am id");
        return NULL;
    }
    if (PyObject_GetBuffer(args[5], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    n = ucxdp_tcp_eager_recv(w, fd, (unsigned)am_id, tag, mask, view.buf, (uint64_t)view.len,
                             spins, &got, tcp_spill, &spilled);
    PyBuffer_Release(&view);
    if (n == -3) {
        /* a short read of a frame FIONREAD said was whole: the stream is out
         * of step with the caller's reader, which must not go on */
        PyErr_SetString(PyExc_OSError, "tcp eager path: short read of a queued frame");
        return NULL;
    }
    if (spilled == 0)
        spill = Py_NewRef(Py_None);
    else if ((spill = PyBytes_FromStringAndSize((const char *)tcp_spill, (Py_ssize_t)spilled))
             == NULL)
        return NULL;                       /* (bytes read are lost: raise) */
    return Py_BuildValue("(LKN)", (long long)n, (unsigned long long)got, spill);
}

static PyObject *dp_tcp_eager_head(PyObject *mod, PyObject *args)
{
    unsigned int am_id;
    unsigned long long tag, length;
    uint8_t head[UCXDP_TCP_EAGER_HEAD];

    if (!PyArg_ParseTuple(args, "IKK:tcp_eager_head", &am_id, &tag, &length))
        return NULL;
    ucxdp_tcp_eager_head(head, am_id, tag, length);
    return PyBytes_FromStringAndSize((const char *)head, sizeof head);
}

static PyMethodDef module_methods[] = {
    FASTMETH("tcp_eager_send", dp_tcp_eager_send),
    FASTMETH("tcp_eager_recv", dp_tcp_eager_recv),
    {"tcp_eager_head", dp_tcp_eager_head, METH_VARARGS,
     "tcp_eager_head(am id, tag, length): the first bytes of a tcp eager frame"},
    {NULL},
};

/* -- the capsule ------------------------------------------------------------------ */
static ucxdp_worker_t *api_worker_of(void *o)
{
    return o != NULL && PyObject_TypeCheck((PyObject *)o, &WorkerType)
        ? ((WorkerObject *)o)->w : NULL;
}

static const ucxdp_rkey_t *api_rkey_of(void *o)
{
    return o != NULL && PyObject_TypeCheck((PyObject *)o, &KeyType) ? &((KeyObject *)o)->key
                                                                     : NULL;
}

static ucxdp_worker_t *api_rkey_worker(void *o)
{
    return o != NULL && PyObject_TypeCheck((PyObject *)o, &KeyType)
        ? ((KeyObject *)o)->worker->w : NULL;
}

static long api_inbox_progress(ucxdp_worker_t *w, long limit, unsigned *flags)
{
    ucxdp_inbox_t *in = w->inbox;
    long n;
    int left;

    *flags = 0;
    n = in != NULL ? ucxdp_inbox_progress(w, in, limit, flags) : 0;
    if (w->nstreams > 0) {                 /* (and the tcp streams lent: stream.c) */
        n += ucxdp_streams_progress(w, limit, &left);
        /* (a receive of Python's matched: as ucxdp_inbox_progress says) */
        if (left || __atomic_load_n(&w->py_done, __ATOMIC_RELAXED))
            *flags |= UCXDP_INBOX_LEFT;
    }
    return n;
}

static ucxdp_stream_t *api_stream_of(void *o)
{
    return o != NULL && PyObject_TypeCheck((PyObject *)o, &StreamType)
        ? &((StreamObject *)o)->s : NULL;
}

static ucxdp_lane_t *api_lane_of(void *o)
{
    return o != NULL && PyObject_TypeCheck((PyObject *)o, &LaneType) ? &((LaneObject *)o)->lane
                                                                      : NULL;
}

static void api_set_adopt(void *(*fn)(ucxdp_tag_recv_t *r))
{
    adopt_hook = fn;
}

static const ucxdp_api_t api = {
    .version = UCXDP_API_VERSION,
    .worker_of = api_worker_of,
    .rkey_of = api_rkey_of,
    .rkey_worker = api_rkey_worker,
    .put = ucxdp_put,
    .get = ucxdp_get,
    .atomic = ucxdp_atomic,
    .tag_post = ucxdp_tag_post,
    .tag_cancel = ucxdp_tag_cancel,
    .tag_take_done = ucxdp_tag_take_done,
    .tag_unexp_free = ucxdp_tag_unexp_free,
    .tag_probe = ucxdp_tag_probe,
    .inbox_progress = api_inbox_progress,
    .set_adopt = api_set_adopt,
    .lane_of = api_lane_of,
    .lane_eager = ucxdp_lane_eager,
    .lane_rts = ucxdp_lane_rts,
    .lane_get = ucxdp_lane_get,
    .lane_ats = ucxdp_lane_ats,
    .rndv_send = ucxdp_rndv_send,
    .rndv_take_done = ucxdp_rndv_take_done,
    .am_set_hook = ucxdp_am_set_hook,
    .am_claim = ucxdp_am_claim,
    .lane_am = ucxdp_lane_am,
    .stream_of = api_stream_of,
    .stream_send = ucxdp_stream_send,
    .stream_am_send = ucxdp_stream_am_send,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ucxpy._dp",
    .m_doc = "ucxpy's native data plane (native/dp): Worker, MappedKey, Symmetric.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__dp(void)
{
    PyObject *m, *capsule, *ext_id;

    if (PyType_Ready(&WorkerType) < 0 || PyType_Ready(&KeyType) < 0
            || PyType_Ready(&SymType) < 0 || PyType_Ready(&CallType) < 0
            || PyType_Ready(&MatcherType) < 0 || PyType_Ready(&TagMatcherType) < 0
            || PyType_Ready(&InboxType) < 0 || PyType_Ready(&TagInfoType) < 0
            || PyType_Ready(&LaneType) < 0 || PyType_Ready(&StreamType) < 0
            || PyType_Ready(&RequestCoreType) < 0 || PyType_Ready(&RecvCoreType) < 0)
        return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
    INTERN(s_source, "source")
    INTERN(s_tag, "tag")
    INTERN(s_length, "length")
    INTERN(s_complete, "complete")
#undef INTERN

    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    capsule = PyCapsule_New((void *)&api, UCXDP_CAPSULE, NULL);
    ext_id = PyLong_FromUnsignedLongLong(UCXDP_RNDV_EXT_ID);
    if (PyModule_AddObjectRef(m, "Worker", (PyObject *)&WorkerType) < 0
            || PyModule_AddObjectRef(m, "MappedKey", (PyObject *)&KeyType) < 0
            || PyModule_AddObjectRef(m, "Symmetric", (PyObject *)&SymType) < 0
            || PyModule_AddObjectRef(m, "SymmetricCall", (PyObject *)&CallType) < 0
            || PyModule_AddObjectRef(m, "Matcher", (PyObject *)&MatcherType) < 0
            || PyModule_AddObjectRef(m, "TagMatcher", (PyObject *)&TagMatcherType) < 0
            || PyModule_AddObjectRef(m, "Inbox", (PyObject *)&InboxType) < 0
            || PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0
            || PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0
            || PyModule_AddObjectRef(m, "TagInfo", (PyObject *)&TagInfoType) < 0
            || PyModule_AddObjectRef(m, "RequestCore", (PyObject *)&RequestCoreType) < 0
            || PyModule_AddObjectRef(m, "RecvCore", (PyObject *)&RecvCoreType) < 0
            || PyModule_AddIntConstant(m, "WAKE_BIT", INBOX_WAKE_BIT) < 0
            || PyModule_AddIntConstant(m, "BAD_BIT", INBOX_BAD_BIT) < 0
            || ext_id == NULL || PyModule_AddObjectRef(m, "RNDV_EXT_ID", ext_id) < 0
            || capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_XDECREF(ext_id);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(ext_id);
    for (int k = 0; k < SYM_COUNT; k++)
        if (PyModule_AddIntConstant(m, sym_names[k], k) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
