"""The implementation object behind an ``MPI.Datatype`` handle.

A :class:`TypeImpl` holds the true layout (a :class:`~.typemap.Typemap`),
the combiner and arguments it was made with, its name, commit state,
cached attributes and a reference count: a derived type keeps its
components alive, ``Get_contents`` hands out new references and ``Free``
drops one; attribute delete callbacks run when the last one goes.
Predefined types also carry their type code, typechar/typestr, alignment
and numpy dtype (``unit`` is the predefined type reductions work on).
"""
from __future__ import annotations

from . import typeattr
from .constructors import (COMBINER_DUP, COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER,
                           COMBINER_F90_REAL, COMBINER_NAMED)

F90_COMBINERS = (COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_F90_COMPLEX)

#: what the modules below ``datatype`` (typecreate, typedesc) and the
#: packing it leaves to ``msgspec`` need of the layers that import them,
#: registered by those layers at their import (no import points back up):
#: ``Datatype`` and ``named`` (the predefined constants by name) by
#: datatype; ``pack_whole``, ``unpack_whole`` and ``acquire`` by msgspec
REGISTRY: dict = {}


class TypeImpl:
    """The object a Datatype handle refers to (see the module docstring)."""

    __slots__ = ("typemap", "name", "combiner", "params", "children", "predefined",
                 "committed", "refs", "freed", "attrs", "code", "typechar", "typestr",
                 "align", "numpy", "unit", "constant", "_hid", "__weakref__")

    #: builds every predefined type's ``typemap`` and ``numpy`` (set by
    #: .datatype): a predefined type gets them on first use, so that a
    #: program that moves no typed data never imports numpy (ucxpy.lazy)
    realize = None

    def __init__(self, typemap, combiner, params=None, children=(), name=""):
        if typemap is not None:             # (None: predefined, see realize)
            self.typemap = typemap
        self.combiner, self.name = combiner, name
        self.params = params or {}
        self.children = list(children)
        self.predefined = combiner == COMBINER_NAMED or combiner in F90_COMBINERS
        self.committed = self.predefined
        self.refs, self.freed, self.attrs = 1, False, {}
        self.code = self.typechar = self.typestr = self.align = None
        if typemap is not None:
            self.numpy = None
        self.constant = None                 # module name of a predefined type
        unit = None                # the one unit of every component, if one
        for i, child in enumerate(self.children):
            child.refs += 1
            if i == 0:
                unit = child.unit
            elif child.unit is not unit:
                unit = None
        self.unit = unit

    def __getattr__(self, name):
        # only an unset slot gets here: a predefined type's layout, built now
        realize = TypeImpl.realize
        if name in ("typemap", "numpy") and realize is not None:
            realize()
            return object.__getattribute__(self, name)
        raise AttributeError(name)

    def release(self, wrap, handle=None) -> None:
        """Drop one reference; the last one deletes attributes (their delete
        callbacks get ``handle``, else a new handle ``wrap(self)``) and
        releases the components."""
        if self.predefined or self.freed:
            return
        self.refs -= 1
        if self.refs > 0:
            return
        self.freed = True
        try:
            if self.attrs:
                typeattr.delete_all(wrap(self) if handle is None else handle, self.attrs)
        finally:
            for child in self.children:
                child.release(wrap)

    def codes(self):
        """``(type code or None, typechar, typestr)`` (duplicates follow their base)."""
        impl = self
        while impl.combiner == COMBINER_DUP:
            impl = impl.children[0]
        if impl.typechar is not None:
            return impl.code, impl.typechar, impl.typestr
        return None, "V", f"V{impl.typemap.extent}"
