/* Arguments of METH_FASTCALL functions (native/fastpath.c, native/tcp_fast.c),
 * converted as PyArg_ParseTuple's format units do, without the argument
 * tuple a METH_VARARGS call builds or a format string parsed per call: the
 * hottest calls (a frame pushed or taken per message) pay about 0.1 us for
 * those.  Each returns 1, or 0 with the error PyArg_ParseTuple would raise
 * (TypeError, OverflowError, BufferError). */
#ifndef UCXPY_PYFASTCALL_H
#define UCXPY_PYFASTCALL_H

#include <Python.h>
#include <limits.h>

/* exactly ``want`` arguments */
static inline int
fc_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name, want,
                 nargs);
    return 0;
}

/* "K": an int as unsigned long long, without overflow checking */
static inline int
fc_ull(PyObject *o, unsigned long long *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "an int is required, not %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    *out = PyLong_AsUnsignedLongLongMask(o);
    return !(*out == (unsigned long long)-1 && PyErr_Occurred());
}

/* "L": an int as long long */
static inline int
fc_ll(PyObject *o, long long *out)
{
    *out = PyLong_AsLongLong(o);
    return !(*out == -1 && PyErr_Occurred());
}

/* "i": an int as int */
static inline int
fc_int(PyObject *o, int *out)
{
    long v = PyLong_AsLong(o);

    if (v == -1 && PyErr_Occurred())
        return 0;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "signed integer is out of range for int");
        return 0;
    }
    *out = (int)v;
    return 1;
}

/* "w*" (``writable``) or "y*": a contiguous buffer, released by the caller */
static inline int
fc_buffer(PyObject *o, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(o, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return 0;
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_BufferError, "a contiguous buffer is required");
        return 0;
    }
    return 1;
}

#endif
