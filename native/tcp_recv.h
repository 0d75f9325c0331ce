/* The tcp receive fast path, compiled into ucxpy._fastpath (native/tcp_recv.c). */
#ifndef UCXPY_TCP_RECV_H
#define UCXPY_TCP_RECV_H

#include <Python.h>

PyObject *ucxpy_tcp_recv_tag(PyObject *self, PyObject *args);

#endif
