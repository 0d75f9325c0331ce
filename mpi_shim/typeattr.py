"""Attribute caching on datatypes: key values with copy and delete callbacks.

mpi4py's conventions: ``copy_fn(oldtype, keyval, value)`` runs when a type
is duplicated and its result is cached on the duplicate (``NotImplemented``:
not copied; ``copy_fn=True`` copies the value as is; ``None``/``False``
never copies).  ``delete_fn(datatype, keyval, value)`` runs when the value is
replaced or deleted and when the type is freed.  A callback that raises
makes the MPI call fail with ``MPI.Exception`` (``ERR_OTHER``) after its
traceback is printed, as mpi4py does.

(A communicator/window version of this registry lives with those objects;
the two may share one module later.)
"""
from __future__ import annotations

import itertools
import sys

from .exceptions import ERR_ARG, ERR_KEYVAL, ERR_OTHER, Exception

#: the keyval Free returns (MPI_KEYVAL_INVALID); MPI's other attribute keys are in .attr
KEYVAL_INVALID = 603979776

_keyvals = {}                               # keyval -> _Keyval
_next = itertools.count(0x2C000000)


class _Keyval:
    __slots__ = ("copy_fn", "delete_fn", "nopython", "freed", "refs")

    def __init__(self, copy_fn, delete_fn, nopython):
        self.copy_fn, self.delete_fn, self.nopython = copy_fn, delete_fn, nopython
        self.freed = False
        self.refs = 0


def create_keyval(copy_fn=None, delete_fn=None, nopython=False) -> int:
    """A new datatype key value."""
    kv = next(_next)
    _keyvals[kv] = _Keyval(copy_fn, delete_fn, nopython)
    return kv


def free_keyval(keyval: int) -> int:
    """Free ``keyval`` (values still cached keep it alive); returns KEYVAL_INVALID."""
    k = _lookup(keyval)
    k.freed = True
    if not k.refs:
        del _keyvals[keyval]
    return KEYVAL_INVALID


def _lookup(keyval) -> _Keyval:
    k = _keyvals.get(keyval)
    if k is None:
        raise Exception(ERR_KEYVAL, f"invalid datatype keyval {keyval}")
    return k


def _call(fn, *args):
    """Run a user callback; its exception becomes MPI.Exception(ERR_OTHER)."""
    try:
        return fn(*args)
    except BaseException:
        import traceback                    # (deferred on purpose: only a failing callback)
        traceback.print_exc(file=sys.stderr)
        raise Exception(ERR_OTHER, "attribute callback raised") from None


def set_attr(handle, attrs: dict, keyval: int, value) -> None:
    """Cache ``value`` under ``keyval`` (deleting the previous value first)."""
    k = _lookup(keyval)
    if k.freed:
        raise Exception(ERR_KEYVAL, f"datatype keyval {keyval} was freed")
    if keyval in attrs:
        _delete(k, handle, keyval, attrs)
    attrs[keyval] = value
    k.refs += 1


def get_attr(attrs: dict, keyval: int):
    """The value cached under ``keyval``, or None."""
    _lookup(keyval)
    return attrs.get(keyval)


def delete_attr(handle, attrs: dict, keyval: int) -> None:
    """Delete the value cached under ``keyval`` (runs its delete callback)."""
    k = _lookup(keyval)
    if keyval not in attrs:
        raise Exception(ERR_ARG, f"no attribute cached under keyval {keyval}")
    _delete(k, handle, keyval, attrs)


def _delete(k: _Keyval, handle, keyval, attrs) -> None:
    value = attrs.pop(keyval)
    k.refs -= 1
    if k.freed and not k.refs:
        _keyvals.pop(keyval, None)
    if k.delete_fn is not None:
        _call(k.delete_fn, handle, keyval, value)


def copy_attrs(handle, attrs: dict) -> dict:
    """The attributes a duplicate of ``handle`` gets (runs the copy callbacks)."""
    out = {}
    for kv, value in list(attrs.items()):
        k = _keyvals.get(kv)
        if k is None or k.copy_fn is None or k.copy_fn is False:
            continue
        new = value if k.copy_fn is True else _call(k.copy_fn, handle, kv, value)
        if new is NotImplemented:
            continue
        out[kv] = new
        k.refs += 1
    return out


def delete_all(handle, attrs: dict) -> None:
    """Delete every cached value, newest first (the type is being freed)."""
    for kv in list(reversed(attrs)):
        k = _keyvals.get(kv)
        if k is None:
            attrs.pop(kv, None)
        else:
            _delete(k, handle, kv, attrs)
