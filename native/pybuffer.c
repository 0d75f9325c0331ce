/* ucxpy._pybuffer: a base type that lets Python classes export the buffer
 * protocol (what PEP 688's __buffer__ gives Python 3.12+).
 *
 * mpi4py's MPI.Win and MPI.buffer objects support memoryview(obj); pure
 * Python classes on 3.9-3.11 cannot.  A class deriving from BufferExporter
 * defines _buffer_target(self) returning any object that exports a buffer
 * (a memoryview of the window memory, say); memoryview(obj) then views that
 * memory directly, no copy.  The view's .obj is the target object, which
 * keeps the memory alive for as long as the view exists.  A target of None
 * exports an empty buffer owned by nobody (view.obj is None). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int
exporter_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *target = PyObject_CallMethod(self, "_buffer_target", NULL);
    if (target == NULL)
        return -1;
    if (target == Py_None) {            /* no memory at all (MPI.BOTTOM ...) */
        Py_DECREF(target);
        static char empty[1];
        return PyBuffer_FillInfo(view, NULL, empty, 0, 0, flags);
    }
    int rc = PyObject_GetBuffer(target, view, flags);
    Py_DECREF(target);
    return rc;
}

static PyBufferProcs exporter_as_buffer = {
    exporter_getbuffer,     /* bf_getbuffer */
    NULL,                   /* bf_releasebuffer: the target releases its own */
};

static PyTypeObject ExporterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ucxpy._pybuffer.BufferExporter",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Base class exporting the buffer of self._buffer_target().",
    .tp_as_buffer = &exporter_as_buffer,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef pybuffer_module = {
    PyModuleDef_HEAD_INIT, .m_name = "_pybuffer",
    .m_doc = "Buffer-protocol base class for Python handle objects.", .m_size = -1,
};

PyMODINIT_FUNC
PyInit__pybuffer(void)
{
    if (PyType_Ready(&ExporterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&pybuffer_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ExporterType);
    if (PyModule_AddObject(m, "BufferExporter", (PyObject *)&ExporterType) < 0) {
        Py_DECREF(&ExporterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
