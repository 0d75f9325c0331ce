/* mpi_shim._accel: mpi_shim's hottest entry points as C callables.
 *
 * An MPI call from Python pays for its own frame and for inspecting its
 * arguments (a memoryview, its format and flags) before ucxpy does any work;
 * for a call that ucxpy completes in one native step (a put on mapped
 * memory, an eager message on a shm ring) that is most of its cost.
 *
 * accel(kind, fn) wraps the Python method ``fn`` (which stays the reference
 * implementation and handles every case) into a callable that binds like a
 * function when stored on a class.  A call first tries the common case in C,
 * checking what the Python method checks; whatever it does not take, it
 * passes to ``fn`` with the same arguments, untouched:
 *
 *   SEND   Comm.Send(buf, dest, tag=0): a whole contiguous numpy array,
 *          bytearray or bytes of a predefined element type to a rank of a
 *          communicator that is not revoked -> Endpoint.tag_send_nb
 *          (the core's own fast path), waited on unless COMPLETED
 *   RECV   Comm.Recv(buf, source, tag=ANY_TAG, status=None): the same kind
 *          of writable buffer from a rank -> Worker.tag_try_recv (the
 *          core's native receive); a message that is not there yet goes to
 *          the configured ``recv_wait(comm, buf, source, tag, status)``
 *   PUT    Win.Put(origin, rank, disp=None) and GET Win.Get: a whole buffer
 *          at a displacement of a target whose memory is mapped here -> one
 *          data-plane put/get (native/dp: the WinTargets entry of the window
 *          holds the target's ucxpy._dp.MappedKey, which checks the range and
 *          that the region is still registered)
 *   FLUSH  Win.Flush(rank) with nothing outstanding -> nothing, except every
 *          ``flush_every``-th call, which runs ``flush_progress()``
 *   FOP    Win.Fetch_and_op(origin, result, rank, disp=0, op=SUM) and CAS
 *          Win.Compare_and_swap(origin, compare, result, rank, disp=0): one
 *          4/8-byte integer of one type, a predefined op, a mapped target
 *          with CPU atomics -> one data-plane atomic
 *
 * Keyword arguments, subclasses of the buffer types, other formats, a
 * window or communicator in another state: all go to ``fn``.  Errors of
 * ucxpy (UcxpyError) are raised as ``translate(error)``, like the Python
 * path.  configure(dict) sets what the calls need (types, slot names,
 * constants, helpers); ``enabled`` false (UCXPY_FASTPATH=n, tracing) sends
 * every call to ``fn``.
 *
 * WinTargets(size, reqs, after, inflight) is a window's table of mapped
 * targets, with the window's own containers of outstanding work (which the
 * Python side mutates in place): set(rank, key, offset, disp_unit), mapped(rank).
 * It reaches the data plane through ucxpy._dp's C API (its capsule). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* numpy's own headers, for the accessors of an array's fields (no API table:
 * nothing of numpy is called, so no import_array) */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>

#include "dp/dp.h"

enum { K_SEND, K_RECV, K_PUT, K_GET, K_FLUSH, K_FOP, K_CAS, K_ISEND, K_IRECV, K_WAITALL,
       K_COUNT };

/* the result of a fast attempt: handled (result set), declined, error */
enum { DECLINED = 0, HANDLED = 1, FAILED = -1 };

static struct {
    int enabled;
    PyTypeObject *handle, *comm_impl, *op_type, *ndarray, *request, *recv_op, *send_op,
                 *ucxpy_request, *posted_recv;
    /* the worker's post_new (None: off), _post_taken and _cancel_recv */
    PyObject *post_new, *post_taken, *cancel_recv;
    /* the member descriptors of the __slots__ the calls read and fill (looked
     * up once by name on their classes; read and set through the
     * descriptor's own get and set, as attribute access does) */
    PyObject *h_d, *const_d, *revoked_d, *eps_d, *peers_d, *p2p_d;
    PyObject *ro_ureq, *ro_comm, *ro_msg, *ro_staging, *so_ureq, *so_ack, *so_keep, *ur_done,
             *ur_exc, *pr_comm;
    PyObject *completed, *ucxpy_error, *translate, *worker, *recv_wait, *recv_ack,
             *flush_progress, *op_codes, *sum_op, *sent_op,
             *wait_op, *mask_tag_obj, *mask_any_tag_obj;
    unsigned long long handled[K_COUNT];
    unsigned long long tag_ub, mask_tag, mask_any_tag, seq_mask, user_mask;
    long long any_tag;
    unsigned long flush_every, flushes;
    PyObject *s_tag_send_nb, *s_wait, *s_tag_try_recv, *s_tag, *s_length, *s_set,
             *s_native, *s_tag_recv_nb, *s_lock, *s_finish, *s_wait_for, *s_wait_all,
             *s_oversubscribed;
} S;

/* -- helpers ---------------------------------------------------------------------- */

/* the object in the slot of member descriptor ``d`` of ``obj`` (borrowed:
 * the slot keeps its reference; NULL when unset or ``obj`` is not of the
 * descriptor's class) */
static inline PyObject *
slot(PyObject *obj, PyObject *d)
{
    PyObject *v = Py_TYPE(d)->tp_descr_get(d, obj, (PyObject *)Py_TYPE(obj));

    if (v == NULL) {
        PyErr_Clear();                     /* (unset: the callers decline) */
        return NULL;
    }
    Py_DECREF(v);
    return v;
}

/* ``value`` into the slot of member descriptor ``d`` of ``obj`` (the old
 * value released): 0, or -1 with an error */
static inline int
set_slot(PyObject *obj, PyObject *d, PyObject *value)
{
    return Py_TYPE(d)->tp_descr_set(d, obj, value);
}

/* the handle's implementation object (borrowed), or NULL */
static inline PyObject *
impl_of(PyObject *self)
{
    if (S.handle == NULL || !PyObject_TypeCheck(self, S.handle))
        return NULL;
    return slot(self, S.h_d);
}

/* an exact int as a C long long; 0 (declined, no error set) when not one
 * or too big */
static inline int
exact_ll(PyObject *o, long long *v)
{
    int overflow;

    if (!PyLong_CheckExact(o))
        return 0;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (*v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow;
}

/* buffer formats of predefined MPI types, one element a plain C value */
static inline int
plain_format(const char *f)
{
    return f == NULL || (f[0] && !f[1] && strchr("bBhHiIlLqQfd", f[0]) != NULL);
}

/* the size of one element of numpy type character ``c`` among the plain
 * ones, or 0 */
static inline int
np_itemsize(char c)
{
    switch (c) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'l': case 'L': return (int)sizeof(long);
    case 'q': case 'Q': case 'd': return 8;
    default: return 0;
    }
}

/* A C-contiguous numpy array of a plain native type (writable if asked),
 * read through numpy's accessors (the buffer protocol would format a type
 * string on every export): its data, byte count and type character in
 * ``v`` (buf, len, format[0]; nothing to release), 1; else 0. */
static int
np_view(PyObject *o, Py_buffer *v, char *fmt, int writable)
{
    PyArrayObject *a = (PyArrayObject *)o;
    PyArray_Descr *d = PyArray_DESCR(a);
    npy_intp *dims = PyArray_DIMS(a);
    Py_ssize_t n;
    int i, size, flags = PyArray_FLAGS(a);

    if (!(flags & NPY_ARRAY_C_CONTIGUOUS) || (writable && !(flags & NPY_ARRAY_WRITEABLE))
            || d == NULL || (d->byteorder != '=' && d->byteorder != '|')
            || !(size = np_itemsize(d->type)))
        return 0;
    n = size;
    for (i = 0; i < PyArray_NDIM(a); i++)
        if (__builtin_mul_overflow(n, dims[i], &n))
            return 0;
    v->buf = PyArray_DATA(a);
    v->len = n;
    v->itemsize = size;
    v->obj = NULL;
    fmt[0] = d->type;
    fmt[1] = 0;
    v->format = fmt;
    return 1;
}

/* ``o`` is a whole contiguous numpy array, bytearray or bytes of a plain
 * format, not empty (and writable if asked): its buffer in ``v`` (release
 * it with release()), 1; else 0 with no error.  ``fmt`` (2 chars) holds a
 * numpy array's format. */
/* ``t`` is numpy's array type.  Numpy is imported on first use
 * (ucxpy.lazy): when it was not at configure() the type is learned from the
 * first array seen, which only an imported numpy can have made. */
static inline int
is_ndarray(PyTypeObject *t)
{
    if (t == S.ndarray)
        return 1;
    if (S.ndarray == NULL && strcmp(t->tp_name, "numpy.ndarray") == 0) {
        S.ndarray = (PyTypeObject *)Py_NewRef(t);
        return 1;
    }
    return 0;
}

static int
plain_view(PyObject *o, Py_buffer *v, char *fmt, int writable)
{
    PyTypeObject *t = Py_TYPE(o);

    if (is_ndarray(t))
        return np_view(o, v, fmt, writable) && v->len > 0;
    if (t != &PyByteArray_Type && t != &PyBytes_Type)
        return 0;
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                           (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (v->len <= 0 || !plain_format(v->format)) {
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

static inline void
release(Py_buffer *v)
{
    if (v->obj != NULL)
        PyBuffer_Release(v);
}

/* the pending error, a ucxpy one as translate() makes it (``from None``) */
static int
failed(void)
{
    PyObject *type, *value, *tb, *e;

    if (S.ucxpy_error == NULL || !PyErr_ExceptionMatches(S.ucxpy_error))
        return FAILED;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    e = PyObject_CallOneArg(S.translate, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (e != NULL) {
        PyException_SetCause(e, NULL);          /* and __suppress_context__ */
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return FAILED;
}

/* the communicator behind a Comm handle when plain traffic may take the fast
 * path (borrowed), else NULL */
static PyObject *
live_comm(PyObject *self)
{
    PyObject *c = impl_of(self), *revoked;

    if (c == NULL || Py_TYPE(c) != S.comm_impl)
        return NULL;
    revoked = slot(c, S.revoked_d);
    return revoked == Py_False ? c : NULL;
}

static int
tag_of(PyObject *c, long long tag, unsigned long long *out)
{
    PyObject *p2p = slot(c, S.p2p_d);
    unsigned long long base;

    if (p2p == NULL || !PyLong_CheckExact(p2p))
        return 0;
    base = PyLong_AsUnsignedLongLong(p2p);
    if (base == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = base | (unsigned long long)tag;
    return 1;
}

/* -- point to point --------------------------------------------------------------- */

/* a new instance of the slotted class ``type`` with ``values`` in the slots
 * of member descriptors ``slots`` (what object.__new__ and the assignments
 * do), or NULL with an error */
static PyObject *
new_slotted(PyTypeObject *type, int n, PyObject *const *slots, PyObject *const *values)
{
    PyObject *o = type->tp_alloc(type, 0);
    int i;

    if (o == NULL)
        return NULL;
    for (i = 0; i < n; i++)
        if (set_slot(o, slots[i], values[i]) < 0) {
            Py_DECREF(o);
            return NULL;
        }
    return o;
}

/* a Request handle of ``op`` (Request._wrap) */
static PyObject *
request_of(PyObject *op)
{
    PyObject *slots[2] = {S.h_d, S.const_d};
    PyObject *values[2] = {op, Py_False};

    return new_slotted(S.request, 2, slots, values);
}

/* Send's and Isend's common case: the ucxpy request of the eager or
 * rendezvous send (new reference), NULL with an error, or ``*declined`` */
static PyObject *
post_send(PyObject *const *args, Py_ssize_t nargs, int *declined)
{
    PyObject *c, *eps, *ep, *tagobj, *req, *call[3];
    long long dest, tag = 0;
    unsigned long long wire;
    Py_buffer v;
    char fmt[2];

    *declined = 1;
    if (nargs < 3 || nargs > 4 || (c = live_comm(args[0])) == NULL)
        return NULL;
    if (!exact_ll(args[2], &dest) || (nargs == 4 && !exact_ll(args[3], &tag)))
        return NULL;
    if (tag < 0 || (unsigned long long)tag > S.tag_ub)
        return NULL;
    eps = slot(c, S.eps_d);
    if (eps == NULL || !PyList_CheckExact(eps) || dest < 0 || dest >= PyList_GET_SIZE(eps))
        return NULL;
    if (!plain_view(args[1], &v, fmt, 0))
        return NULL;
    release(&v);
    if (!tag_of(c, tag, &wire))
        return NULL;
    *declined = 0;
    ep = PyList_GET_ITEM(eps, dest);
    tagobj = PyLong_FromUnsignedLongLong(wire);
    if (tagobj == NULL)
        return NULL;
    Py_INCREF(ep);
    call[0] = ep;
    call[1] = args[1];
    call[2] = tagobj;
    req = PyObject_VectorcallMethod(S.s_tag_send_nb, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                    NULL);
    Py_DECREF(ep);
    Py_DECREF(tagobj);
    if (req == NULL)
        failed();
    return req;
}

static int
fast_send(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    int declined;
    PyObject *done, *req = post_send(args, nargs, &declined);

    if (req == NULL)
        return declined ? DECLINED : FAILED;
    if (req != S.completed) {
        done = PyObject_CallMethodNoArgs(req, S.s_wait);
        Py_DECREF(req);
        if (done == NULL)
            return failed();
        Py_DECREF(done);
    } else {
        Py_DECREF(req);
    }
    *result = Py_NewRef(Py_None);
    return HANDLED;
}

static int
fast_isend(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    int declined;
    PyObject *req = post_send(args, nargs, &declined), *op;
    PyObject *slots[3];
    PyObject *values[3];

    if (req == NULL)
        return declined ? DECLINED : FAILED;
    if (req == S.completed) {
        *result = request_of(S.sent_op);
    } else {
        /* in flight: SendOp(req, None, buf), which keeps the buffer */
        slots[0] = S.so_ureq;
        slots[1] = S.so_ack;
        slots[2] = S.so_keep;
        values[0] = req;
        values[1] = Py_None;
        values[2] = args[1];
        op = new_slotted(S.send_op, 3, slots, values);
        *result = op != NULL ? request_of(op) : NULL;
        Py_XDECREF(op);
    }
    Py_DECREF(req);
    return *result != NULL ? HANDLED : FAILED;
}

/* Recv's and Irecv's common case: ``worker.<method>(buf, tag, mask,
 * source's worker id)`` (tag_recv_nb: with request_class PostedRecv) for the
 * Comm ``args[0]``, buffer ``args[1]``, source
 * rank ``args[2]`` and tag ``tagarg`` (NULL: ANY_TAG, which only ``any_ok``
 * takes).  Its result (new reference), NULL with the error as raised, or
 * NULL with ``*declined`` set; ``*comm`` (unless NULL): the communicator
 * (borrowed). */
static PyObject *
call_recv(PyObject *const *args, PyObject *tagarg, int any_ok, PyObject *method,
          PyObject **comm, int *declined)
{
    PyObject *c, *peers, *tagobj, *r, *call[7];
    Py_ssize_t n = method == S.s_tag_recv_nb ? 6 : 5;
    long long source, tag = S.any_tag;
    unsigned long long wire;
    Py_buffer v;
    char fmt[2];
    int any;

    *declined = 1;
    if ((c = live_comm(args[0])) == NULL || !exact_ll(args[2], &source)
            || (tagarg != NULL && !exact_ll(tagarg, &tag)))
        return NULL;
    any = tag == S.any_tag;
    if (any ? !any_ok : tag < 0 || (unsigned long long)tag > S.tag_ub)
        return NULL;
    peers = slot(c, S.peers_d);
    if (peers == NULL || !PyTuple_CheckExact(peers) || source < 0
            || source >= PyTuple_GET_SIZE(peers))
        return NULL;
    if (!plain_view(args[1], &v, fmt, 1))
        return NULL;
    release(&v);
    if (!tag_of(c, any ? 0 : tag, &wire))
        return NULL;
    *declined = 0;
    if (comm != NULL)
        *comm = c;
    tagobj = PyLong_FromUnsignedLongLong(wire);
    if (tagobj == NULL)
        return NULL;
    call[0] = S.worker;
    call[1] = args[1];
    call[2] = tagobj;
    call[3] = any ? S.mask_any_tag_obj : S.mask_tag_obj;
    call[4] = PyTuple_GET_ITEM(peers, source);
    call[5] = (PyObject *)S.posted_recv;    /* (tag_recv_nb's request_class) */
    call[6] = S.cancel_recv;
    r = NULL;
    if (method == S.s_tag_recv_nb && S.post_new != Py_None) {
        /* tag_recv_nb's common case without its Python frame: the data
         * plane's post_new (None: it declined; the method does it all).
         * Not when a progress thread's lock serializes the worker's calls. */
        PyObject *lock = PyObject_GetAttr(S.worker, S.s_lock);

        if (lock == NULL) {
            Py_DECREF(tagobj);
            return NULL;
        }
        if (lock == Py_None)
            r = PyObject_Vectorcall(S.post_new, call, 7, NULL);
        Py_DECREF(lock);
        if (r == Py_None) {
            Py_CLEAR(r);
        } else if (r != NULL && PyTuple_CheckExact(r)) {
            /* (request, message): the Python path delivers the message */
            PyObject *taken = PyObject_Vectorcall(S.post_taken, &PyTuple_GET_ITEM(r, 0), 2,
                                                  NULL);
            Py_DECREF(r);
            Py_DECREF(tagobj);
            return taken;
        } else if (r == NULL) {
            Py_DECREF(tagobj);
            return NULL;
        }
    }
    if (r == NULL)
        r = PyObject_VectorcallMethod(method, call, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(tagobj);
    return r;
}

/* Irecv(buf, source, tag) with a tag (not ANY_TAG): the receive posted in
 * ucxpy's matcher as a PostedRecv (its comm set here), its Request; a
 * request of another class (a wrapped method's) goes in a RecvOp */
static int
fast_irecv(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    PyObject *ureq, *op;
    PyObject *slots[4];
    PyObject *values[4];
    int declined;

    if (nargs != 4)
        return DECLINED;
    ureq = call_recv(args, args[3], 0, S.s_tag_recv_nb, NULL, &declined);
    if (ureq == NULL)
        return declined ? DECLINED : failed();
    if (Py_TYPE(ureq) == S.posted_recv) {
        if (set_slot(ureq, S.pr_comm, args[0]) < 0) {
            Py_DECREF(ureq);
            return FAILED;
        }
        *result = request_of(ureq);
        Py_DECREF(ureq);
        return *result != NULL ? HANDLED : FAILED;
    }
    /* RecvOp(ureq, comm): its slots (a synchronous send's acknowledgement
     * is the tag matcher's: ENGINE.attach) */
    slots[0] = S.ro_ureq;
    slots[1] = S.ro_comm;
    slots[2] = S.ro_msg;
    slots[3] = S.ro_staging;
    values[0] = ureq;
    values[1] = args[0];
    values[2] = values[3] = Py_None;
    op = new_slotted(S.recv_op, 4, slots, values);
    Py_DECREF(ureq);
    if (op == NULL)
        return FAILED;
    *result = request_of(op);
    Py_DECREF(op);
    return *result != NULL ? HANDLED : FAILED;
}

static int
fast_recv(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    PyObject *c, *info, *got_obj, *r, *call[4];
    PyObject *status = nargs > 4 ? args[4] : Py_None;
    unsigned long long got;
    int declined;

    if (nargs < 3 || nargs > 5)
        return DECLINED;
    info = call_recv(args, nargs > 3 ? args[3] : NULL, 1, S.s_tag_try_recv, &c, &declined);
    if (info == NULL)
        return declined ? DECLINED : FAILED;
    if (info == Py_None) {                  /* not there yet: the usual wait */
        Py_DECREF(info);
        *result = PyObject_Vectorcall(S.recv_wait, args, nargs, NULL);
        return *result != NULL ? HANDLED : FAILED;
    }
    got_obj = PyObject_GetAttr(info, S.s_tag);
    if (got_obj == NULL) {
        Py_DECREF(info);
        return FAILED;
    }
    got = PyLong_AsUnsignedLongLong(got_obj);
    if (got == (unsigned long long)-1 && PyErr_Occurred()) {
        Py_DECREF(got_obj);
        Py_DECREF(info);
        return FAILED;
    }
    if (got & S.seq_mask) {                 /* a synchronous send: acknowledge it */
        call[0] = c;
        call[1] = args[2];
        call[2] = got_obj;
        r = PyObject_Vectorcall(S.recv_ack, call, 3, NULL);
        if (r == NULL) {
            Py_DECREF(got_obj);
            Py_DECREF(info);
            return FAILED;
        }
        Py_DECREF(r);
    }
    Py_DECREF(got_obj);
    if (status != Py_None) {
        PyObject *length = PyObject_GetAttr(info, S.s_length), *utag;

        utag = length ? PyLong_FromUnsignedLongLong(got & S.user_mask) : NULL;
        if (utag == NULL) {
            Py_XDECREF(length);
            Py_DECREF(info);
            return FAILED;
        }
        call[0] = status;
        call[1] = args[2];
        call[2] = utag;
        call[3] = length;
        r = PyObject_VectorcallMethod(S.s_set, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(utag);
        Py_DECREF(length);
        if (r == NULL) {
            Py_DECREF(info);
            return FAILED;
        }
        Py_DECREF(r);
    }
    Py_DECREF(info);
    *result = Py_NewRef(Py_None);
    return HANDLED;
}

/* Request.Waitall(requests) without statuses, every request plain: None,
 * a standard send (done at once, or in flight) or a posted receive.  Waits
 * for each in turn (ENGINE.wait, as _wait_each), then completes them in
 * order (the handle becomes null; an op whose ucxpy request failed, or a
 * receive with a staging buffer, finishes in Python); the first error is
 * raised once all are completed, as Waitall does. */

/* the op types fast_waitall takes: a send done at once, a SendOp, a
 * PostedRecv, a RecvOp */
static inline int
plain_op(PyObject *op)
{
    return op == S.sent_op || Py_TYPE(op) == S.posted_recv || Py_TYPE(op) == S.recv_op
        || Py_TYPE(op) == S.send_op;
}

/* the ucxpy request of a receive op (borrowed; NULL for another op) */
static inline PyObject *
recv_ureq(PyObject *op)
{
    if (Py_TYPE(op) == S.posted_recv)
        return op;
    return Py_TYPE(op) == S.recv_op ? slot(op, S.ro_ureq) : NULL;
}

/* 1 the op is done, 0 not yet; for the op types fast_waitall takes */
static int
op_done(PyObject *op)
{
    PyObject *u, *ack;

    if (op == S.sent_op)
        return 1;
    if (Py_TYPE(op) == S.posted_recv)
        return slot(op, S.ur_done) == Py_True;
    if (Py_TYPE(op) == S.recv_op)
        return (u = slot(op, S.ro_ureq)) != NULL && slot(u, S.ur_done) == Py_True;
    u = slot(op, S.so_ureq);
    ack = slot(op, S.so_ack);
    return u != NULL && slot(u, S.ur_done) == Py_True
        && (ack == Py_None || (ack != NULL && slot(ack, S.ur_done) == Py_True));
}

/* an op that finishes with nothing to do: its requests succeeded, nothing to unpack */
static int
op_clean(PyObject *op)
{
    PyObject *u, *ack;

    if (op == S.sent_op)
        return 1;
    if (Py_TYPE(op) == S.posted_recv)
        return slot(op, S.ur_exc) == Py_None;
    if (Py_TYPE(op) == S.recv_op)
        return slot(op, S.ro_staging) == Py_None
            && (u = slot(op, S.ro_ureq)) != NULL && slot(u, S.ur_exc) == Py_None;
    u = slot(op, S.so_ureq);
    ack = slot(op, S.so_ack);
    return u != NULL && slot(u, S.ur_exc) == Py_None
        && (ack == Py_None || (ack != NULL && slot(ack, S.ur_exc) == Py_None));
}

/* no other Python thread: nobody else can want the library lock meanwhile
 * (only a running thread can start another, and this one is here) */
static int
only_thread(void)
{
    PyThreadState *head = PyInterpreterState_ThreadHead(
        PyThreadState_GetInterpreter(PyThreadState_Get()));

    return head != NULL && PyThreadState_Next(head) == NULL;
}

/* wait for ``op`` to complete: a posted receive, with no other thread, by
 * ucxpy's wait on its request (which tries the native receive first);
 * anything else by ENGINE.wait, which lets other threads have the library
 * lock while it waits.  The result of the call, or NULL (translated) */
static PyObject *
wait_op(PyObject *op)
{
    PyObject *ureq, *r;

    if ((ureq = recv_ureq(op)) == NULL || !only_thread())
        return PyObject_CallOneArg(S.wait_op, op);
    r = PyObject_CallMethodOneArg(S.worker, S.s_wait_for, ureq);
    if (r == NULL)
        failed();
    return r;
}

/* With no other thread, more ranks than CPUs (Worker.oversubscribed) and
 * more than one op to wait for, every one of them a posted receive or a
 * standard send: ucxpy's Worker.wait_all on their ucxpy requests, one wait
 * for them all.  0 when done or not applicable (the per-op waits follow and
 * find what is done: with a CPU of its own, the first receive's wait
 * completes those behind it), -1 on error (translated). */
static int
wait_ops(PyObject *reqs)
{
    PyObject *pending, *op, *u, *ack = NULL, *r;
    Py_ssize_t i;
    int rc = 0, share;

    if (!only_thread())
        return 0;
    r = PyObject_CallMethodNoArgs(S.worker, S.s_oversubscribed);
    share = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    if (share <= 0 || (pending = PyList_New(0)) == NULL)
        return share < 0 || PyErr_Occurred() ? -1 : 0;
    for (i = 0; i < PyList_GET_SIZE(reqs) && rc == 0; i++) {
        op = slot(PyList_GET_ITEM(reqs, i), S.h_d);
        if (op == NULL || op == Py_None || op_done(op))
            continue;
        if ((u = recv_ureq(op)) != NULL) {
            ack = Py_None;
        } else if (Py_TYPE(op) == S.send_op) {
            u = slot(op, S.so_ureq);
            ack = slot(op, S.so_ack);
        } else {
            u = NULL;
        }
        if (u == NULL || ack == NULL)
            rc = 1;                         /* not one of these: the per-op waits */
        else if (PyList_Append(pending, u) < 0
                 || (ack != Py_None && PyList_Append(pending, ack) < 0))
            rc = -1;
    }
    if (rc == 0 && PyList_GET_SIZE(pending) > 1) {
        r = PyObject_CallMethodOneArg(S.worker, S.s_wait_all, pending);
        if (r == NULL)
            rc = failed();
        Py_XDECREF(r);
    }
    Py_DECREF(pending);
    return rc < 0 ? -1 : 0;
}

static int
fast_waitall(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    PyObject *reqs, *r, *op, *done, *exc_type = NULL, *exc = NULL, *tb = NULL;
    Py_ssize_t i, n;

    if (nargs < 2 || nargs > 3 || (nargs == 3 && args[2] != Py_None)
            || !PyList_CheckExact(reqs = args[1]))
        return DECLINED;
    n = PyList_GET_SIZE(reqs);
    for (i = 0; i < n; i++) {
        r = PyList_GET_ITEM(reqs, i);
        if (Py_TYPE(r) != S.request)
            return DECLINED;
        op = slot(r, S.h_d);
        if (op != NULL && op != Py_None && !plain_op(op))
            return DECLINED;
    }
    Py_INCREF(reqs);                        /* (callbacks may change the list) */
    if (wait_ops(reqs) < 0) {
        Py_DECREF(reqs);
        return FAILED;
    }
    for (i = 0; i < PyList_GET_SIZE(reqs); i++) {
        r = PyList_GET_ITEM(reqs, i);
        op = slot(r, S.h_d);
        if (op == NULL || op == Py_None || op_done(op))
            continue;
        Py_INCREF(op);
        done = wait_op(op);
        Py_DECREF(op);
        if (done == NULL) {
            Py_DECREF(reqs);
            return FAILED;
        }
        Py_DECREF(done);
    }
    for (i = 0; i < PyList_GET_SIZE(reqs); i++) {
        r = PyList_GET_ITEM(reqs, i);
        op = slot(r, S.h_d);
        if (op == NULL || op == Py_None)
            continue;
        if (Py_TYPE(r) != S.request || !plain_op(op)) {
            done = PyObject_CallMethod(r, "_complete", "O", Py_None);   /* (changed meanwhile) */
        } else {
            /* the handle becomes null, then the op finishes (Request._complete;
             * the slot's reference to op becomes ours) */
            Py_INCREF(op);
            if (set_slot(r, S.h_d, Py_None) < 0)
                done = NULL;
            else if (op_clean(op))
                done = Py_NewRef(Py_None);
            else
                done = PyObject_CallMethodOneArg(op, S.s_finish, Py_None);
            Py_DECREF(op);
        }
        if (done == NULL) {
            if (exc_type == NULL)
                PyErr_Fetch(&exc_type, &exc, &tb);
            else
                PyErr_Clear();
        } else {
            Py_DECREF(done);
        }
    }
    Py_DECREF(reqs);
    if (exc_type != NULL) {
        PyErr_Restore(exc_type, exc, tb);
        return FAILED;
    }
    *result = Py_NewRef(Py_True);
    return HANDLED;
}

/* -- windows ---------------------------------------------------------------------- */

/* A target reached through the data plane: its mapped key (dp.h), and where
 * the window starts in the key's region and its displacement unit. */
typedef struct {
    PyObject *key;                 /* the ucxpy._dp.MappedKey (strong), or NULL: not mapped */
    const ucxdp_rkey_t *rkey;      /* the key's C object */
    ucxdp_worker_t *dp;            /* the worker it counts on */
    long long offset, disp_unit;
} Target;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    Target *t;
    PyObject *reqs, *after, *inflight;   /* the window's dict, list, dict */
} WinTargets;

static PyTypeObject WinTargetsType;

/* the data plane's C API (ucxpy._dp's capsule), imported with the first table */
static const ucxdp_api_t *dp_api;

static PyObject *
targets_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t n;
    PyObject *reqs, *after, *inflight;
    WinTargets *w;

    if (!PyArg_ParseTuple(args, "nO!O!O!:WinTargets", &n, &PyDict_Type, &reqs, &PyList_Type,
                          &after, &PyDict_Type, &inflight))
        return NULL;
    if (n < 0 || n > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "WinTargets: a window of 0 to 2**24 ranks");
        return NULL;
    }
    if (dp_api == NULL) {
        const ucxdp_api_t *api = PyCapsule_Import(UCXDP_CAPSULE, 0);
        if (api == NULL)
            return NULL;
        if (api->version != UCXDP_API_VERSION) {
            PyErr_Format(PyExc_ImportError, "ucxpy._dp's C API is version %d, not %d",
                         api->version, UCXDP_API_VERSION);
            return NULL;
        }
        dp_api = api;
    }
    w = (WinTargets *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->t = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Target));
    if (w->t == NULL) {
        Py_DECREF(w);
        return PyErr_NoMemory();
    }
    w->n = n;
    w->reqs = Py_NewRef(reqs);
    w->after = Py_NewRef(after);
    w->inflight = Py_NewRef(inflight);
    return (PyObject *)w;
}

static int
targets_traverse(WinTargets *w, visitproc visit, void *arg)
{
    Py_VISIT(w->reqs);
    Py_VISIT(w->after);
    Py_VISIT(w->inflight);
    for (Py_ssize_t i = 0; w->t != NULL && i < w->n; i++)
        Py_VISIT(w->t[i].key);
    return 0;
}

static int
targets_clear_refs(WinTargets *w)
{
    Py_CLEAR(w->reqs);
    Py_CLEAR(w->after);
    Py_CLEAR(w->inflight);
    for (Py_ssize_t i = 0; w->t != NULL && i < w->n; i++)
        Py_CLEAR(w->t[i].key);
    return 0;
}

static void
targets_dealloc(WinTargets *w)
{
    PyObject_GC_UnTrack(w);
    targets_clear_refs(w);
    PyMem_Free(w->t);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *
targets_set(WinTargets *w, PyObject *args)
{
    Py_ssize_t r;
    PyObject *key;
    long long offset, disp_unit;
    const ucxdp_rkey_t *rkey;

    if (!PyArg_ParseTuple(args, "nOLL:set", &r, &key, &offset, &disp_unit))
        return NULL;
    if (r < 0 || r >= w->n || disp_unit <= 0) {
        PyErr_SetString(PyExc_ValueError, "WinTargets.set: no such rank, or a unit below 1");
        return NULL;
    }
    if ((rkey = dp_api->rkey_of(key)) == NULL) {
        PyErr_SetString(PyExc_TypeError, "WinTargets.set: the key is a ucxpy._dp.MappedKey");
        return NULL;
    }
    Py_XSETREF(w->t[r].key, Py_NewRef(key));
    w->t[r].rkey = rkey;
    w->t[r].dp = dp_api->rkey_worker(key);
    w->t[r].offset = offset;
    w->t[r].disp_unit = disp_unit;
    Py_RETURN_NONE;
}

static PyObject *
targets_mapped(WinTargets *w, PyObject *arg)
{
    Py_ssize_t r = PyNumber_AsSsize_t(arg, PyExc_OverflowError);

    if (r == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(r >= 0 && r < w->n && w->t[r].key != NULL);
}

static PyMethodDef targets_methods[] = {
    {"set", (PyCFunction)targets_set, METH_VARARGS,
     "set(rank, MappedKey, offset, disp_unit): offset, where the window starts in the "
     "key's region"},
    {"mapped", (PyCFunction)targets_mapped, METH_O, "mapped(rank) -> bool"},
    {NULL},
};

static PyTypeObject WinTargetsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpi_shim._accel.WinTargets",
    .tp_basicsize = sizeof(WinTargets),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "WinTargets(size, reqs, after, inflight): a window's mapped targets",
    .tp_new = targets_new,
    .tp_dealloc = (destructor)targets_dealloc,
    .tp_traverse = (traverseproc)targets_traverse,
    .tp_clear = (inquiry)targets_clear_refs,
    .tp_methods = targets_methods,
};

/* the window's target table (new reference), or NULL (no error) */
static WinTargets *
targets_of(PyObject *self)
{
    PyObject *w = impl_of(self), *t;

    if (w == NULL || w == Py_None)
        return NULL;
    t = PyObject_GetAttr(w, S.s_native);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (Py_TYPE(t) != &WinTargetsType) {
        Py_DECREF(t);
        return NULL;
    }
    return (WinTargets *)t;
}

/* The mapped entry of ``rank`` (an exact int) for an access at ``disp`` (None
 * or an exact int >= 0): the target, and the remote address in *raddr; or
 * NULL.  The data plane checks the range, alignment and validity. */
static Target *
target_of(WinTargets *w, PyObject *rank, PyObject *disp, uint64_t *raddr)
{
    long long r, d = 0, off;
    Target *t;

    if (!exact_ll(rank, &r) || (disp != Py_None && !exact_ll(disp, &d)))
        return NULL;
    if (r < 0 || r >= w->n || d < 0 || (t = &w->t[r])->key == NULL)
        return NULL;
    if (__builtin_mul_overflow(d, t->disp_unit, &off) || __builtin_add_overflow(off, t->offset, &off)
            || off < 0)
        return NULL;
    *raddr = t->rkey->base + (uint64_t)off;
    return t;
}

static int
fast_copy(PyObject *const *args, Py_ssize_t nargs, PyObject **result, int put)
{
    WinTargets *w;
    Py_buffer v;
    char fmt[2];
    Target *t;
    uint64_t raddr;
    ucxdp_status_t status = UCXDP_ERR_OUT_OF_RANGE;

    if (nargs < 3 || nargs > 4 || (w = targets_of(args[0])) == NULL)
        return DECLINED;
    if (!plain_view(args[1], &v, fmt, !put)) {
        Py_DECREF(w);
        return DECLINED;
    }
    t = target_of(w, args[2], nargs > 3 ? args[3] : Py_None, &raddr);
    if (t != NULL) {
        int gil_free = v.len >= (1 << 20);       /* long copies let other threads run */
        PyThreadState *ts = gil_free ? PyEval_SaveThread() : NULL;
        status = put ? dp_api->put(t->dp, t->rkey, raddr, v.buf, (size_t)v.len)
                     : dp_api->get(t->dp, t->rkey, raddr, v.buf, (size_t)v.len);
        if (gil_free)
            PyEval_RestoreThread(ts);
    }
    Py_DECREF(w);
    release(&v);
    if (status != UCXDP_OK)
        return DECLINED;
    *result = Py_NewRef(Py_None);
    return HANDLED;
}

/* nothing of the window outstanding toward ``rank``: 1; else 0 (-1 error) */
static int
quiet_target(WinTargets *w, PyObject *rank)
{
    PyObject *n;

    if (PyDict_GET_SIZE(w->reqs) || PyList_GET_SIZE(w->after))
        return 0;
    if (!PyDict_GET_SIZE(w->inflight))
        return 1;
    n = PyDict_GetItemWithError(w->inflight, rank);
    if (n == NULL)
        return PyErr_Occurred() ? -1 : 1;
    return !PyObject_IsTrue(n);
}

static int
fast_flush(PyObject *const *args, Py_ssize_t nargs, PyObject **result)
{
    WinTargets *w;
    int quiet;

    if (nargs != 2 || !PyLong_CheckExact(args[1]) || (w = targets_of(args[0])) == NULL)
        return DECLINED;
    quiet = quiet_target(w, args[1]);
    Py_DECREF(w);
    if (quiet <= 0) {
        PyErr_Clear();
        return DECLINED;
    }
    if (++S.flushes % S.flush_every == 0) {
        /* serve peers' passive-target requests now and then (win.Flush) */
        *result = PyObject_CallNoArgs(S.flush_progress);
        return *result ? HANDLED : FAILED;
    }
    *result = Py_NewRef(Py_None);
    return HANDLED;
}

/* one integer element of 4 or 8 bytes; its size, or 0 */
static int
int_word(Py_buffer *v)
{
    if (v->format == NULL || !v->format[0] || v->format[1] || !strchr("iIlLqQ", v->format[0]))
        return 0;
    return (v->len == 4 || v->len == 8) && v->itemsize == v->len ? (int)v->len : 0;
}

/* the 4- or 8-byte word at ``p`` (any alignment), zero-extended */
static inline unsigned long long
word_of(const void *p, int size)
{
    uint64_t w8;
    uint32_t w4;

    if (size == 8) {
        memcpy(&w8, p, 8);
        return w8;
    }
    memcpy(&w4, p, 4);
    return w4;
}

/* Fetch_and_op(origin, result, rank, disp=0, op=SUM), or with ``cas``
 * Compare_and_swap(origin, compare, result, rank, disp=0) */
static int
fast_atomic(PyObject *const *args, Py_ssize_t nargs, PyObject **result, int cas)
{
    WinTargets *w;
    PyObject *origin = args[1], *res, *cmp = NULL, *rank, *disp, *code_obj;
    Py_buffer o, r, c;
    char fo[2], fr[2], fc[2];
    int size, code = UCXDP_AMO_CSWAP, noop = 0, ok = 0;
    uint64_t value = 0, compare = 0, old, raddr;
    Target *t;

    if (cas) {
        if (nargs < 5 || nargs > 6)
            return DECLINED;
        cmp = args[2];
        res = args[3];
        rank = args[4];
        disp = nargs > 5 ? args[5] : NULL;
    } else {
        PyObject *op, *h;
        long c;

        if (nargs < 4 || nargs > 6)
            return DECLINED;
        res = args[2];
        rank = args[3];
        disp = nargs > 4 ? args[4] : NULL;
        op = nargs > 5 ? args[5] : S.sum_op;
        if (op == NULL || Py_TYPE(op) != S.op_type || (h = slot(op, S.h_d)) == NULL)
            return DECLINED;
        code_obj = PyDict_GetItemWithError(S.op_codes, h);
        if (code_obj == NULL) {
            PyErr_Clear();
            return DECLINED;
        }
        c = PyLong_AsLong(code_obj);
        if (c < 0) {
            PyErr_Clear();
            return DECLINED;
        }
        code = (int)(c & 7);
        noop = (c & 8) != 0;
    }
    if (!is_ndarray(Py_TYPE(origin)) || Py_TYPE(res) != Py_TYPE(origin)
            || (cmp != NULL && Py_TYPE(cmp) != Py_TYPE(origin)))
        return DECLINED;
    if (disp == NULL)
        disp = Py_None;                    /* 0 */
    else if (!PyLong_CheckExact(disp))
        return DECLINED;
    if ((w = targets_of(args[0])) == NULL)
        return DECLINED;
    if (!plain_view(origin, &o, fo, 0))
        goto no_origin;
    if (!plain_view(res, &r, fr, 1))
        goto no_result;
    if (cmp != NULL && !plain_view(cmp, &c, fc, 0))
        goto no_compare;
    size = int_word(&o);
    if (size && int_word(&r) == size && !strcmp(o.format, r.format)
            && (cmp == NULL || (int_word(&c) == size && !strcmp(o.format, c.format)))
            && !PyDict_GET_SIZE(w->inflight)) {
        t = target_of(w, rank, disp, &raddr);
        if (!noop)
            value = word_of(o.buf, size);
        if (cmp != NULL)
            compare = word_of(c.buf, size);
        if (t != NULL && dp_api->atomic(t->dp, t->rkey, raddr, (unsigned)size,
                                        (ucxdp_amo_op_t)code, value, compare, &old) == UCXDP_OK) {
            if (size == 8) {
                uint64_t w = old;
                memcpy(r.buf, &w, 8);
            } else {
                uint32_t w = (uint32_t)old;
                memcpy(r.buf, &w, 4);
            }
            ok = 1;
        }
    }
    if (cmp != NULL)
        release(&c);
no_compare:
    release(&r);
no_result:
    release(&o);
no_origin:
    Py_DECREF(w);
    PyErr_Clear();
    if (!ok)
        return DECLINED;
    *result = Py_NewRef(Py_None);
    return HANDLED;
}

/* -- the callable ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *fn, *dict;
    vectorcallfunc vectorcall;
} Accel;

static PyObject *
accel_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Accel *a = (Accel *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = NULL;
    int r = DECLINED;

    if (S.enabled && kwnames == NULL && nargs > 0) {
        switch (a->kind) {
        case K_SEND: r = fast_send(args, nargs, &result); break;
        case K_RECV: r = fast_recv(args, nargs, &result); break;
        case K_PUT: r = fast_copy(args, nargs, &result, 1); break;
        case K_GET: r = fast_copy(args, nargs, &result, 0); break;
        case K_FLUSH: r = fast_flush(args, nargs, &result); break;
        case K_FOP: r = fast_atomic(args, nargs, &result, 0); break;
        case K_CAS: r = fast_atomic(args, nargs, &result, 1); break;
        case K_ISEND: r = fast_isend(args, nargs, &result); break;
        case K_IRECV: r = fast_irecv(args, nargs, &result); break;
        case K_WAITALL: r = fast_waitall(args, nargs, &result); break;
        }
        if (r == HANDLED) {
            S.handled[a->kind]++;
            return result;
        }
        if (r == FAILED)
            return NULL;
    }
    return PyObject_Vectorcall(a->fn, args, nargsf, kwnames);
}

static PyObject *
accel_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int kind;
    PyObject *fn;
    Accel *a;

    if (!PyArg_ParseTuple(args, "iO:accel", &kind, &fn))
        return NULL;
    if (kind < 0 || kind >= K_COUNT || !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_ValueError, "accel(kind, fn): an unknown kind or fn not callable");
        return NULL;
    }
    a = (Accel *)type->tp_alloc(type, 0);
    if (a == NULL)
        return NULL;
    a->kind = kind;
    a->fn = Py_NewRef(fn);
    a->vectorcall = accel_vectorcall;
    return (PyObject *)a;
}

static int
accel_traverse(Accel *a, visitproc visit, void *arg)
{
    Py_VISIT(a->fn);
    Py_VISIT(a->dict);
    return 0;
}

static int
accel_clear(Accel *a)
{
    Py_CLEAR(a->fn);
    Py_CLEAR(a->dict);
    return 0;
}

static void
accel_dealloc(Accel *a)
{
    PyObject_GC_UnTrack(a);
    accel_clear(a);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *
accel_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *
accel_repr(Accel *a)
{
    return PyUnicode_FromFormat("<accel %R>", a->fn);
}

static PyMemberDef accel_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Accel, vectorcall), READONLY, NULL},
    {"fn", T_OBJECT, offsetof(Accel, fn), READONLY, "the Python implementation"},
    {"kind", T_INT, offsetof(Accel, kind), READONLY, "which call"},
    {NULL},
};

static PyGetSetDef accel_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject AccelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpi_shim._accel.accel",
    .tp_basicsize = sizeof(Accel),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "accel(kind, fn): fn with its common case in C",
    .tp_new = accel_new,
    .tp_dealloc = (destructor)accel_dealloc,
    .tp_traverse = (traverseproc)accel_traverse,
    .tp_clear = (inquiry)accel_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = accel_get,
    .tp_repr = (reprfunc)accel_repr,
    .tp_members = accel_members,
    .tp_getset = accel_getset,
    .tp_dictoffset = offsetof(Accel, dict),
    .tp_vectorcall_offset = offsetof(Accel, vectorcall),
};

/* -- configuration ---------------------------------------------------------------- */

static int
take(PyObject *cfg, const char *name, PyObject **out)
{
    PyObject *v = PyDict_GetItemString(cfg, name);

    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", name);
        return -1;
    }
    Py_XSETREF(*out, Py_NewRef(v));
    return 0;
}

static int
take_type(PyObject *cfg, const char *name, PyTypeObject **out)
{
    PyObject *v = NULL;

    if (take(cfg, name, &v) < 0)
        return -1;
    if (!PyType_Check(v)) {
        Py_DECREF(v);
        PyErr_Format(PyExc_TypeError, "configure: %s is not a type", name);
        return -1;
    }
    Py_XSETREF(*out, (PyTypeObject *)v);
    return 0;
}

static int
take_ull(PyObject *cfg, const char *name, unsigned long long *out)
{
    PyObject *v = PyDict_GetItemString(cfg, name);

    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", name);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* one slot to look up: ``*d`` becomes the member descriptor of slot ``name``
 * of class ``*type`` */
typedef struct {
    PyTypeObject **type;
    PyObject **d;
    const char *name;
} slot_spec_t;

/* the descriptors of ``specs`` (a NULL name ends them): 0, or -1 with
 * TypeError (AttributeError when there is no such attribute) */
static int
slot_descriptors(const slot_spec_t *specs)
{
    PyObject *d;

    for (; specs->name != NULL; specs++) {
        d = PyObject_GetAttrString((PyObject *)*specs->type, specs->name);
        if (d == NULL)
            return -1;
        if (Py_TYPE(d) != &PyMemberDescr_Type || Py_TYPE(d)->tp_descr_set == NULL) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", (*specs->type)->tp_name,
                         specs->name);
            Py_DECREF(d);
            return -1;
        }
        Py_XSETREF(*specs->d, d);
    }
    return 0;
}

static PyObject *
configure(PyObject *module, PyObject *cfg)
{
    PyObject *v;
    unsigned long long every = 0;
    long long any_tag;
    const slot_spec_t slots[] = {
        {&S.handle, &S.h_d, "_h"}, {&S.handle, &S.const_d, "_const"},
        {&S.recv_op, &S.ro_ureq, "ureq"}, {&S.recv_op, &S.ro_comm, "comm"},
        {&S.recv_op, &S.ro_msg, "msg"}, {&S.recv_op, &S.ro_staging, "staging"},
        {&S.posted_recv, &S.pr_comm, "comm"},
        {&S.send_op, &S.so_ureq, "ureq"}, {&S.send_op, &S.so_ack, "ack"},
        {&S.send_op, &S.so_keep, "keep"},
        {&S.ucxpy_request, &S.ur_done, "done"}, {&S.ucxpy_request, &S.ur_exc, "exc"},
        {&S.comm_impl, &S.revoked_d, "revoked"}, {&S.comm_impl, &S.eps_d, "eps"},
        {&S.comm_impl, &S.peers_d, "peers"}, {&S.comm_impl, &S.p2p_d, "p2p"},
        {NULL, NULL, NULL},
    };

    if (!PyDict_Check(cfg)) {
        PyErr_SetString(PyExc_TypeError, "configure(dict)");
        return NULL;
    }
    S.enabled = 0;
    if ((v = PyDict_GetItemString(cfg, "enabled")) != NULL && PyDict_Size(cfg) == 1) {
        S.enabled = PyObject_IsTrue(v) > 0 && S.handle != NULL;
        Py_RETURN_NONE;                    /* switching only */
    }
    if (take_type(cfg, "handle", &S.handle) < 0 || take_type(cfg, "comm_impl", &S.comm_impl) < 0
            || take_type(cfg, "op_type", &S.op_type) < 0
            || (PyDict_GetItemString(cfg, "ndarray") != Py_None     /* (None: learned later) */
                && take_type(cfg, "ndarray", &S.ndarray) < 0)
            || take_type(cfg, "request", &S.request) < 0
            || take_type(cfg, "recv_op", &S.recv_op) < 0
            || take_type(cfg, "posted_recv", &S.posted_recv) < 0
            || take(cfg, "post_new", &S.post_new) < 0
            || take(cfg, "post_taken", &S.post_taken) < 0
            || take(cfg, "cancel_recv", &S.cancel_recv) < 0
            || take_type(cfg, "send_op", &S.send_op) < 0
            || take_type(cfg, "ucxpy_request", &S.ucxpy_request) < 0
            || take(cfg, "wait_op", &S.wait_op) < 0
            || take(cfg, "sent_op", &S.sent_op) < 0
            || take(cfg, "completed", &S.completed) < 0
            || take(cfg, "ucxpy_error", &S.ucxpy_error) < 0
            || take(cfg, "translate", &S.translate) < 0 || take(cfg, "worker", &S.worker) < 0
            || take(cfg, "recv_wait", &S.recv_wait) < 0 || take(cfg, "recv_ack", &S.recv_ack) < 0
            || take(cfg, "flush_progress", &S.flush_progress) < 0
            || take(cfg, "op_codes", &S.op_codes) < 0 || take(cfg, "sum_op", &S.sum_op) < 0
            || take_ull(cfg, "tag_ub", &S.tag_ub) < 0 || take_ull(cfg, "mask_tag", &S.mask_tag) < 0
            || take_ull(cfg, "mask_any_tag", &S.mask_any_tag) < 0
            || take_ull(cfg, "seq_mask", &S.seq_mask) < 0
            || take_ull(cfg, "user_mask", &S.user_mask) < 0
            || take_ull(cfg, "flush_every", &every) < 0)
        goto bad;
    if (!PyDict_Check(S.op_codes) || every == 0) {
        PyErr_SetString(PyExc_ValueError, "configure: op_codes a dict, flush_every > 0");
        goto bad;
    }
    if ((v = PyDict_GetItemString(cfg, "any_tag")) == NULL
            || ((any_tag = PyLong_AsLongLong(v)) == -1 && PyErr_Occurred()))
        goto bad;
    S.any_tag = any_tag;
    Py_XSETREF(S.mask_tag_obj, PyLong_FromUnsignedLongLong(S.mask_tag));
    Py_XSETREF(S.mask_any_tag_obj, PyLong_FromUnsignedLongLong(S.mask_any_tag));
    if (S.mask_tag_obj == NULL || S.mask_any_tag_obj == NULL)
        goto bad;
    S.flush_every = (unsigned long)every;
    if (slot_descriptors(slots) < 0)
        goto bad;
    S.enabled = (v = PyDict_GetItemString(cfg, "enabled")) != NULL && PyObject_IsTrue(v) > 0;
    Py_RETURN_NONE;

bad:
    Py_CLEAR(S.handle);                    /* half configured: nothing is taken */
    S.enabled = 0;
    return NULL;
}

static PyObject *
enabled(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(S.enabled);
}

static PyObject *
counts(PyObject *module, PyObject *unused)
{
    PyObject *t = PyTuple_New(K_COUNT);
    int i;

    for (i = 0; t != NULL && i < K_COUNT; i++) {
        PyObject *n = PyLong_FromUnsignedLongLong(S.handled[i]);
        if (n == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, n);
    }
    return t;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O,
     "configure(dict): what the calls need; configure({'enabled': b}) switches them"},
    {"enabled", enabled, METH_NOARGS, "whether calls try their C path"},
    {"counts", counts, METH_NOARGS, "calls done in C so far, by kind"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "mpi_shim._accel", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    PyObject *m;

    if (PyType_Ready(&AccelType) < 0 || PyType_Ready(&WinTargetsType) < 0)
        return NULL;
#define INTERN(field, text) if ((S.field = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_tag_send_nb, "tag_send_nb");
    INTERN(s_wait, "wait");
    INTERN(s_tag_try_recv, "tag_try_recv");
    INTERN(s_tag, "tag");
    INTERN(s_length, "length");
    INTERN(s_set, "_set");
    INTERN(s_native, "_native");
    INTERN(s_tag_recv_nb, "tag_recv_nb");
    INTERN(s_lock, "lock");
    INTERN(s_finish, "finish");
    INTERN(s_wait_for, "wait_for");
    INTERN(s_wait_all, "wait_all");
    INTERN(s_oversubscribed, "oversubscribed");
#undef INTERN
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "accel", (PyObject *)&AccelType) < 0
            || PyModule_AddObjectRef(m, "WinTargets", (PyObject *)&WinTargetsType) < 0
            || PyModule_AddIntConstant(m, "SEND", K_SEND) < 0
            || PyModule_AddIntConstant(m, "RECV", K_RECV) < 0
            || PyModule_AddIntConstant(m, "PUT", K_PUT) < 0
            || PyModule_AddIntConstant(m, "GET", K_GET) < 0
            || PyModule_AddIntConstant(m, "FLUSH", K_FLUSH) < 0
            || PyModule_AddIntConstant(m, "FETCH_AND_OP", K_FOP) < 0
            || PyModule_AddIntConstant(m, "COMPARE_AND_SWAP", K_CAS) < 0
            || PyModule_AddIntConstant(m, "ISEND", K_ISEND) < 0
            || PyModule_AddIntConstant(m, "IRECV", K_IRECV) < 0
            || PyModule_AddIntConstant(m, "WAITALL", K_WAITALL) < 0
            || PyModule_AddIntConstant(m, "NOOP_BIT", 8) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
