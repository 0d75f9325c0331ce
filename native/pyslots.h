/* The object slots of Python classes with __slots__, read and filled from C
 * (native/mpi_accel.c): a slot's offset is looked up once
 * by name on its class (its member descriptor), then the object's field is
 * read or set in place, as the slot's descriptor would. */
#ifndef UCXPY_PYSLOTS_H
#define UCXPY_PYSLOTS_H

#include <Python.h>
#include <structmember.h>

/* the offset of object slot ``name`` of class ``type``, or -1 with TypeError
 * (AttributeError when there is no such attribute) */
static inline Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    Py_ssize_t off = -1;

    if (d == NULL)
        return -1;
    if (Py_TYPE(d) == &PyMemberDescr_Type
            && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s is not an object slot", name);
    Py_DECREF(d);
    return off;
}

/* the field of slot offset ``off`` of ``o`` (an lvalue; NULL when unset) */
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* one offset to look up: ``*off`` becomes that of slot ``name`` of ``*type`` */
typedef struct {
    PyTypeObject **type;
    Py_ssize_t *off;
    const char *name;
} slot_spec_t;

/* the offsets of ``specs`` (a NULL name ends them): 0, or -1 with the
 * error of the first slot_offset that failed */
static inline int
slot_offsets(const slot_spec_t *specs)
{
    for (; specs->name != NULL; specs++)
        if ((*specs->off = slot_offset(*specs->type, specs->name)) < 0)
            return -1;
    return 0;
}

#endif
