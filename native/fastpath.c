/* ucxpy._fastpath: the native fast path of a blocking exact-tag receive
 * (UCXPY_FASTPATH; ucxpy.worker.Worker.tag_recv / recv_poller).
 *
 * A CPython extension rather than a cffi function so the receive buffer is
 * any writable buffer-protocol object taken as it is ("w*": bytearray,
 * memoryview, numpy array), with no cffi export to create and release per
 * call.  It compiles native/ring.c in (the rings themselves are created
 * through the cffi module ucxpy._native; the ring handle is passed as its
 * address).
 *
 * recv_tag(ring address, am_id, tag, mask, buffer, spins) -> (n, tag)
 *   n >= 0: the next frame was an eager message whose tag equals ``tag``
 *           under ``mask``; n = payload length, plus WAKE_BIT when the
 *           producer waits for space (the caller wakes it); its tag
 *   -1:     no frame within ``spins`` polls (or a closed/corrupt ring: the
 *           Python path reports that)
 *   -2:     the next frame is another one (left in the ring, in order)
 *
 * send_tag(ring address, am_id, tag, buffer, max_payload) -> rc
 *   pushes one eager frame (header: the 8-byte little-endian tag, payload:
 *   the buffer's bytes) when the payload is at most ``max_payload`` bytes:
 *   rc is ucxpy_ring_push's (0 sent, 1 sent and the consumer wants a
 *   wake-up, <0 not sent: full, too big, corrupt); -100: longer than
 *   ``max_payload``, not sent.  A buffer that is not contiguous raises
 *   BufferError, as ``memoryview`` would.
 *
 * mapped_copy(map, offset, buffer, put) -> True, or False with nothing done
 *   a put (buffer -> peer) or get (peer -> buffer) on a peer's memory mapped
 *   here (ucxpy.rma's MAPPED mode): ``map`` is the remote key's (mapped
 *   address, length, guard address, guard value) tuple, ``offset`` where in
 *   the region.  False when the buffer is not contiguous (or, for a get, not
 *   writable), the range is outside [0, length), or the guard word (where
 *   its address is not 0) no longer holds the guard value (the owner
 *   unregistered the region): the caller's Python path reports why.
 *
 * mapped_atomic(map, offset, size, op, value, compare) -> old value or None
 *   a fetching atomic there (CPU atomics), ``map`` as above; op is ucxpy.atomics.OPS'
 *   code (add, and, or, xor, swap, cswap with ``compare``); value and
 *   compare are truncated to ``size`` (4 or 8) bytes.  None, with nothing
 *   done, when the word is outside [0, length), misaligned, the op or size
 *   unknown, or the guard word (where its address is not 0) no longer holds
 *   the guard value (the owner unregistered the region): the caller's
 *   Python path then reports that as an error.
 *
 * serialized(fn, lock) -> a callable that runs fn(*args, **kwargs) holding
 *   ``lock`` (acquire() before, release() after, also when fn raises), and
 *   binds like a function when stored on a class.  It has a __dict__, so
 *   functools.update_wrapper gives it fn's name, docstring and __wrapped__.
 *   What a Python wrapper costs on every call (a frame with *args/**kwargs
 *   and two bound-method calls) becomes one vectorcall. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "ucxpy_native.h"

#define WAKE_BIT (1LL << 62)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the frame header's tag is little-endian (wire.EAGER); send_tag copies it as is"
#endif

static PyObject *
recv_tag(PyObject *self, PyObject *args)
{
    unsigned long long ring, tag, mask;
    int am_id, spins;
    Py_buffer buf;
    uint64_t wake = 0, got = 0;
    int64_t n;

    if (!PyArg_ParseTuple(args, "KiKKw*i", &ring, &am_id, &tag, &mask, &buf, &spins))
        return NULL;
    if (!PyBuffer_IsContiguous(&buf, 'A')) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_BufferError, "recv_tag needs a contiguous buffer");
        return NULL;
    }
    n = ucxpy_ring_recv_tag((ucxpy_ring_t *)(uintptr_t)ring, (uint8_t)am_id, tag, mask,
                            buf.buf, (uint64_t)buf.len, spins, &wake, &got);
    PyBuffer_Release(&buf);
    if (n >= 0 && wake)
        n |= WAKE_BIT;
    return Py_BuildValue("(LK)", (long long)n, (unsigned long long)got);
}

static PyObject *
send_tag(PyObject *self, PyObject *args)
{
    unsigned long long ring, tag;
    long long max_payload;
    int am_id, rc;
    Py_buffer buf;
    uint64_t hdr;

    if (!PyArg_ParseTuple(args, "KiKy*L", &ring, &am_id, &tag, &buf, &max_payload))
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

/* the (mapped address, length, guard address, guard value) tuple of a key;
 * 0 with an exception set when it is not one */
static int
parse_map(PyObject *map, unsigned long long *base, unsigned long long *length,
          unsigned long long *guard, unsigned long long *guard_id)
{
    if (!PyTuple_Check(map) || PyTuple_GET_SIZE(map) != 4) {
        PyErr_SetString(PyExc_TypeError, "a mapping is (address, length, guard, guard value)");
        return 0;
    }
    *base = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(map, 0));
    *length = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(map, 1));
    *guard = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(map, 2));
    *guard_id = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(map, 3));
    return !PyErr_Occurred();
}

/* the region is still registered: its guard word holds the guard value */
static int
map_valid(unsigned long long guard, unsigned long long guard_id)
{
    return !guard || ucxpy_atomic_load64((void *)(uintptr_t)guard) == guard_id;
}

/* [offset, offset + n) lies within a region of ``length`` bytes */
static int
map_range(long long offset, unsigned long long n, unsigned long long length)
{
    return offset >= 0 && (unsigned long long)offset <= length
        && length - (unsigned long long)offset >= n;
}

static PyObject *
mapped_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long base, length, guard, guard_id;
    long long offset;
    int put, ok;
    Py_buffer view;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "mapped_copy(mapping, offset, buffer, put)");
        return NULL;
    }
    if (!parse_map(args[0], &base, &length, &guard, &guard_id))
        return NULL;
    put = PyObject_IsTrue(args[3]);
    if (put < 0)
        return NULL;
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();                 /* beyond 64 bits: out of range */
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[2], &view, put ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0) {
        PyErr_Clear();                 /* not contiguous / read-only / no buffer */
        Py_RETURN_FALSE;
    }
    ok = map_range(offset, (unsigned long long)view.len, length) && map_valid(guard, guard_id);
    if (ok && view.len) {
        char *peer = (char *)(uintptr_t)(base + (unsigned long long)offset);
        if (view.len >= (1 << 20)) {   /* long copies let other threads run */
            Py_BEGIN_ALLOW_THREADS
            memmove(put ? peer : view.buf, put ? view.buf : peer, (size_t)view.len);
            Py_END_ALLOW_THREADS
        } else {
            memmove(put ? peer : view.buf, put ? view.buf : peer, (size_t)view.len);
        }
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyObject *
mapped_atomic(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long base, length, guard, guard_id, value, compare, old;
    long long offset;
    long size, op;
    void *p;

    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "mapped_atomic(mapping, offset, size, op, value, compare)");
        return NULL;
    }
    if (!parse_map(args[0], &base, &length, &guard, &guard_id))
        return NULL;
    /* value and compare first: a wrong type there is a TypeError; then an
     * offset or size beyond the C types is out of range like any other
     * (None: the Python path says which) */
    value = PyLong_AsUnsignedLongLongMask(args[4]);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    compare = PyLong_AsUnsignedLongLongMask(args[5]);
    if (compare == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred())
        goto range;
    size = PyLong_AsLong(args[2]);
    if (size == -1 && PyErr_Occurred())
        goto range;
    op = PyLong_AsLong(args[3]);
    if (op == -1 && PyErr_Occurred())
        goto range;
    if ((size != 4 && size != 8) || op < 0 || op > 5
            || !map_range(offset, (unsigned long long)size, length)
            || (base + (unsigned long long)offset) % (unsigned long long)size)
        Py_RETURN_NONE;
    if (!map_valid(guard, guard_id))
        Py_RETURN_NONE;
    p = (void *)(uintptr_t)(base + (unsigned long long)offset);
    if (size == 8) {
        switch (op) {
        case 0: old = ucxpy_atomic_fetch_add64(p, value); break;
        case 1: old = ucxpy_atomic_fetch_and64(p, value); break;
        case 2: old = ucxpy_atomic_fetch_or64(p, value); break;
        case 3: old = ucxpy_atomic_fetch_xor64(p, value); break;
        case 4: old = ucxpy_atomic_swap64(p, value); break;
        default: old = ucxpy_atomic_cswap64(p, compare, value); break;
        }
    } else {
        uint32_t v = (uint32_t)value, c = (uint32_t)compare;
        switch (op) {
        case 0: old = ucxpy_atomic_fetch_add32(p, v); break;
        case 1: old = ucxpy_atomic_fetch_and32(p, v); break;
        case 2: old = ucxpy_atomic_fetch_or32(p, v); break;
        case 3: old = ucxpy_atomic_fetch_xor32(p, v); break;
        case 4: old = ucxpy_atomic_swap32(p, v); break;
        default: old = ucxpy_atomic_cswap32(p, c, v); break;
        }
    }
    return PyLong_FromUnsignedLongLong(old);

range:
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return NULL;
    PyErr_Clear();
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *fn, *acquire, *release, *dict;
    vectorcallfunc vectorcall;
} Serialized;

static PyObject *
serialized_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Serialized *s = (Serialized *)op;
    PyObject *r, *ok, *exc_type, *exc, *tb;

    ok = PyObject_CallNoArgs(s->acquire);
    if (ok == NULL)
        return NULL;
    Py_DECREF(ok);
    r = PyObject_Vectorcall(s->fn, args, nargsf, kwnames);
    if (r == NULL) {
        PyErr_Fetch(&exc_type, &exc, &tb);
        ok = PyObject_CallNoArgs(s->release);
        if (ok == NULL) {                  /* releasing failed: report the first error */
            PyErr_Clear();
        } else {
            Py_DECREF(ok);
        }
        PyErr_Restore(exc_type, exc, tb);
        return NULL;
    }
    ok = PyObject_CallNoArgs(s->release);
    if (ok == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    Py_DECREF(ok);
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
    Py_VISIT(s->dict);
    return 0;
}

static int
serialized_clear(Serialized *s)
{
    Py_CLEAR(s->fn);
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

static PyMethodDef methods[] = {
    {"send_tag", send_tag, METH_VARARGS, "push one eager frame into a ring"},
    {"recv_tag", recv_tag, METH_VARARGS, "the next eager frame of a ring, if it is the one"},
    {"mapped_copy", (PyCFunction)(void (*)(void))mapped_copy, METH_FASTCALL,
     "a put or get on mapped peer memory, or False"},
    {"mapped_atomic", (PyCFunction)(void (*)(void))mapped_atomic, METH_FASTCALL,
     "a fetching atomic on mapped peer memory, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ucxpy._fastpath", NULL, -1, methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    PyObject *m;

    if (PyType_Ready(&SerializedType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "WAKE_BIT", WAKE_BIT) < 0 ||
            PyModule_AddObjectRef(m, "serialized", (PyObject *)&SerializedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
