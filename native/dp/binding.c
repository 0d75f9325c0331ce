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

#include <ctype.h>
#include <string.h>

#include "dp.h"
#include "match.h"

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

/* -- Worker ----------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    ucxdp_worker_t *w;
} WorkerObject;

static PyTypeObject WorkerType;

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

static PyMethodDef worker_methods[] = {
    {"counters", (PyCFunction)worker_counters, METH_NOARGS,
     "counters() -> dict: what this worker's data plane executed"},
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

static const ucxdp_api_t api = {
    .version = UCXDP_API_VERSION,
    .worker_of = api_worker_of,
    .rkey_of = api_rkey_of,
    .rkey_worker = api_rkey_worker,
    .put = ucxdp_put,
    .get = ucxdp_get,
    .atomic = ucxdp_atomic,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ucxpy._dp",
    .m_doc = "ucxpy's native data plane (native/dp): Worker, MappedKey, Symmetric.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__dp(void)
{
    PyObject *m, *capsule;

    if (PyType_Ready(&WorkerType) < 0 || PyType_Ready(&KeyType) < 0
            || PyType_Ready(&SymType) < 0 || PyType_Ready(&CallType) < 0
            || PyType_Ready(&MatcherType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    capsule = PyCapsule_New((void *)&api, UCXDP_CAPSULE, NULL);
    if (PyModule_AddObjectRef(m, "Worker", (PyObject *)&WorkerType) < 0
            || PyModule_AddObjectRef(m, "MappedKey", (PyObject *)&KeyType) < 0
            || PyModule_AddObjectRef(m, "Symmetric", (PyObject *)&SymType) < 0
            || PyModule_AddObjectRef(m, "SymmetricCall", (PyObject *)&CallType) < 0
            || PyModule_AddObjectRef(m, "Matcher", (PyObject *)&MatcherType) < 0
            || capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    for (int k = 0; k < SYM_COUNT; k++)
        if (PyModule_AddIntConstant(m, sym_names[k], k) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
