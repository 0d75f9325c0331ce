/* The tcp fast path, compiled into ucxpy._fastpath (native/tcp_fast.c). */
#ifndef UCXPY_TCP_FAST_H
#define UCXPY_TCP_FAST_H

#include <Python.h>

PyObject *ucxpy_tcp_recv_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *ucxpy_tcp_send_tag(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
