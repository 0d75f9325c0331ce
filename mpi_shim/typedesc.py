"""Datatypes as data: decoding and re-creation, pickling, transport descriptions.

``_datatype_create``/``_datatype_decode`` are mpi4py's private helpers (a
derived type pickles as its base type, combiner name and ``decode()``
arguments).  :func:`describe` gives a compact, hashable and picklable
description (the constructor tree, not the flat layout) that another
process rebuilds with :func:`from_description` -- what one-sided
accumulates send to their target.
"""
from __future__ import annotations

from . import constructors as C
from .constructors import COMBINER_DUP, COMBINER_NAMED
from .typeimpl import F90_COMBINERS as _F90
from .typeimpl import REGISTRY


def _classes():
    return REGISTRY["Datatype"], REGISTRY["named"]


def _datatype_create(datatype, combiner, params, free=False):
    """Create a datatype from a base type, combiner name and ``decode()`` arguments."""
    Datatype, _ = _classes()
    params = dict(params)
    try:
        if combiner == "NAMED":
            return datatype
        if combiner == "DUP":
            return datatype.Dup()
        if combiner == "STRUCT":
            return Datatype.Create_struct(**params)
        if combiner.startswith("F90_"):
            return getattr(Datatype, "Create_" + combiner.lower())(**params)
        if combiner == "VALUE_INDEX":
            return Datatype.Get_value_index(**params)
        return getattr(datatype, "Create_" + combiner.lower())(**params)
    finally:
        if free:
            for t in [datatype, *params.get("datatypes", ())]:
                if t and not t.is_predefined:
                    t.Free()


def _datatype_decode(datatype, mark=False):
    """Return ``decode()`` of a datatype (``mark`` is accepted for mpi4py compatibility)."""
    return datatype.decode()


def _typecode(datatype):
    """The type code of a datatype, or None."""
    return datatype._h.codes()[0] if datatype._h is not None else None


def _typealign(datatype):
    """The alignment of a predefined datatype (or a duplicate of one), or None."""
    impl = datatype._h
    while impl is not None and impl.combiner == COMBINER_DUP:
        impl = impl.children[0]
    return impl.align if impl is not None else None


def describe(datatype):
    """A compact, hashable, picklable description another process can rebuild."""
    Datatype, _ = _classes()
    impl = datatype._impl()
    if impl.constant is not None and impl.combiner == COMBINER_NAMED:
        return ("NAMED", impl.constant)
    if impl.combiner in _F90:
        return (C.NAMES[impl.combiner], tuple(impl.params.items()))
    params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in impl.params.items())
    children = tuple(describe(Datatype._wrap(c)) for c in impl.children)
    return (C.NAMES[impl.combiner], params, children)


def from_description(desc):
    """Rebuild (and commit) a datatype from :func:`describe` output (cached)."""
    dt = _REBUILT.get(desc)
    if dt is None:
        dt = _rebuild(desc).Commit()
        _REBUILT[desc] = dt
    return dt


def _rebuild(desc):
    Datatype, _NAMED = _classes()
    name = desc[0]
    if name == "NAMED":
        return _NAMED[desc[1]]
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in desc[1]}
    if name.startswith("F90_"):
        return _datatype_create(Datatype(), name, params)
    children = [_rebuild(c) for c in desc[2]]
    if name == "STRUCT":
        params["datatypes"] = children
        return _datatype_create(Datatype(), name, params)
    return _datatype_create(children[0], name, params)


_REBUILT = {}
