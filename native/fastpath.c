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
 *   -2:     the next frame is another one (left in the ring, in order) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ucxpy_native.h"

#define WAKE_BIT (1LL << 62)

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

static PyMethodDef methods[] = {
    {"recv_tag", recv_tag, METH_VARARGS, "the next eager frame of a ring, if it is the one"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ucxpy._fastpath", NULL, -1, methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "WAKE_BIT", WAKE_BIT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
