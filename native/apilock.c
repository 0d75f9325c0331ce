/* ucxpy._apilock: the API lock of a worker that serves threads
 * (THREAD_MULTIPLE), and the wrapper that takes it around a call.
 *
 * ApiLock() -> a re-entrant lock with threading.RLock's interface, taken
 *   and dropped by its owner without an OS call (see below).
 *
 * serialized(fn, lock) -> a callable that runs fn(*args, **kwargs) holding
 *   ``lock`` (acquire() before, release() after, also when fn raises), and
 *   binds like a function when stored on a class.  It shows fn's __name__,
 *   __qualname__, __module__, __doc__ and other attributes, and __wrapped__
 *   is fn, as functools.update_wrapper would make them, without copying
 *   (what is set on the wrapper stays its own).
 *   What a Python wrapper costs on every call (a frame with *args and **kwargs
 *   and two bound-method calls) becomes one vectorcall.
 *
 * (The rest of the core's first native fast path, native/fastpath.c, went to
 * the native data plane, native/dp; this is what was left.) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <string.h>
#include <time.h>

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
    .tp_name = "ucxpy._apilock.ApiLock",
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
        s->lock = (ApiLock *)lock;              /* (taken in C: no methods needed) */
    } else {
        s->acquire = PyObject_GetAttrString(lock, "acquire");
        s->release = s->acquire ? PyObject_GetAttrString(lock, "release") : NULL;
        if (s->release == NULL) {
            Py_DECREF(s);
            return NULL;
        }
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

/* fn's identity, as functools.update_wrapper would copy it, read from fn
 * unless set on the wrapper (then kept in its __dict__): the closure is the
 * attribute's name.  __wrapped__ is fn itself. */
static PyObject *
serialized_get_fn_attr(Serialized *s, void *closure)
{
    const char *name = closure;
    PyObject *v;

    if (s->dict != NULL && (v = PyDict_GetItemString(s->dict, name)) != NULL)
        return Py_NewRef(v);
    if (strcmp(name, "__wrapped__") == 0)
        return Py_NewRef(s->fn);
    return PyObject_GetAttrString(s->fn, name);
}

static int
serialized_set_fn_attr(Serialized *s, PyObject *value, void *closure)
{
    if (s->dict == NULL && (s->dict = PyDict_New()) == NULL)
        return -1;
    if (value == NULL) {
        if (PyDict_DelItemString(s->dict, (const char *)closure) < 0) {
            PyErr_SetString(PyExc_AttributeError, (const char *)closure);
            return -1;
        }
        return 0;
    }
    return PyDict_SetItemString(s->dict, (const char *)closure, value);
}

#define FN_ATTR(name)                                                                   \
    {name, (getter)serialized_get_fn_attr, (setter)serialized_set_fn_attr, NULL, name}

static PyGetSetDef serialized_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    FN_ATTR("__doc__"), FN_ATTR("__name__"), FN_ATTR("__qualname__"), FN_ATTR("__module__"),
    FN_ATTR("__wrapped__"),
    {NULL},
};

/* any other attribute the wrapper lacks is fn's (its __annotations__,
 * __defaults__, what a decorator stored on it), as update_wrapper's copy of
 * fn's __dict__ made it */
static PyObject *
serialized_getattro(PyObject *self, PyObject *name)
{
    PyObject *v = PyObject_GenericGetAttr(self, name);

    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        v = PyObject_GetAttr(((Serialized *)self)->fn, name);
    }
    return v;
}

static PyTypeObject SerializedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._apilock.serialized",
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
    .tp_getattro = serialized_getattro,
    .tp_dictoffset = offsetof(Serialized, dict),
    .tp_vectorcall_offset = offsetof(Serialized, vectorcall),
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "ucxpy._apilock", .m_size = -1,
};

PyMODINIT_FUNC
PyInit__apilock(void)
{
    PyObject *m;

    if (PyType_Ready(&SerializedType) < 0 || PyType_Ready(&ApiLockType) < 0)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "serialized", (PyObject *)&SerializedType) < 0 ||
            PyModule_AddObjectRef(m, "ApiLock", (PyObject *)&ApiLockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
