"""Attribute caching: key values and their copy/delete callbacks.

One registry serves communicators, windows and datatypes (MPI keeps them
apart by object kind; a keyval created for one kind is rejected on the
others).  Callbacks follow mpi4py's conventions:

* ``copy_fn(oldobj, keyval, attrval)`` runs when the object is duplicated;
  its return value is cached on the new object, ``NotImplemented`` means
  "do not copy".  ``copy_fn=True`` copies the value as is, ``False`` or
  ``None`` never copies.
* ``delete_fn(obj, keyval, attrval)`` runs when the attribute is replaced
  or deleted and when the object is freed.

Errors raised by a callback propagate to the caller of the MPI call.
"""
from __future__ import annotations

import itertools

from .exceptions import ERR_ARG, ERR_KEYVAL, Exception, user_call
from .typeattr import KEYVAL_INVALID

# predefined attribute keys (answered by the objects themselves)
TAG_UB_KEY, HOST, IO, WTIME_IS_GLOBAL, UNIVERSE_SIZE, APPNUM, LASTUSEDCODE = range(1, 8)
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = range(10, 15)

_KEYVALS = {}                          # keyval -> Keyval
_next = itertools.count(1 << 16)


class Keyval:
    __slots__ = ("kind", "copy_fn", "delete_fn", "nopython", "freed", "refs")

    def __init__(self, kind, copy_fn, delete_fn, nopython):
        self.kind, self.copy_fn, self.delete_fn = kind, copy_fn, delete_fn
        self.nopython = nopython
        self.freed = False
        self.refs = 0                  # objects still caching a value under it


def create_keyval(kind: str, copy_fn=None, delete_fn=None, nopython=False) -> int:
    kv = next(_next)
    _KEYVALS[kv] = Keyval(kind, copy_fn, delete_fn, nopython)
    return kv


def free_keyval(kind: str, keyval: int) -> int:
    k = _lookup(kind, keyval)
    k.freed = True
    if not k.refs:
        del _KEYVALS[keyval]
    return KEYVAL_INVALID


def _lookup(kind, keyval) -> Keyval:
    k = _KEYVALS.get(keyval)
    if k is None or k.kind != kind or (k.freed and not k.refs):
        raise Exception(ERR_KEYVAL, f"invalid {kind} keyval {keyval}")
    return k


def set_attr(kind, obj, attrs: dict, keyval: int, value) -> None:
    k = _lookup(kind, keyval)
    if k.freed:
        raise Exception(ERR_KEYVAL, f"keyval {keyval} was freed")
    if keyval in attrs:
        _delete(k, obj, keyval, attrs)
    attrs[keyval] = value
    k.refs += 1


def get_attr(kind, attrs: dict, keyval: int):
    k = _KEYVALS.get(keyval)
    if k is None or k.kind != kind:
        raise Exception(ERR_KEYVAL, f"invalid {kind} keyval {keyval}")
    return attrs.get(keyval)


def delete_attr(kind, obj, attrs: dict, keyval: int) -> None:
    k = _lookup(kind, keyval)
    if keyval not in attrs:
        raise Exception(ERR_ARG, f"no attribute cached under keyval {keyval}")
    _delete(k, obj, keyval, attrs)


def _delete(k: Keyval, obj, keyval, attrs) -> None:
    value = attrs.pop(keyval)           # gone even if its callback fails
    _unref(k, keyval)
    fn = k.delete_fn
    if fn is not None:
        _callback(fn, obj, keyval, value)


def _callback(fn, *args):
    """Run a user attribute callback: what it raises is printed and becomes
    MPI.Exception (ERR_OTHER unless it was an MPI.Exception)."""
    return user_call(fn, *args)


def _unref(k: Keyval, keyval) -> None:
    k.refs -= 1
    if k.freed and not k.refs:
        _KEYVALS.pop(keyval, None)


def copy_attrs(oldobj, attrs: dict) -> dict:
    """Attributes for a duplicate of ``oldobj`` (runs the copy callbacks)."""
    out = {}
    for kv, value in list(attrs.items()):
        k = _KEYVALS.get(kv)
        if k is None:
            continue
        fn = k.copy_fn
        if fn is None or fn is False:
            continue
        new = value if fn is True else _callback(fn, oldobj, kv, value)
        if new is NotImplemented:
            continue
        out[kv] = new
        k.refs += 1
    return out


def delete_all(obj, attrs: dict) -> None:
    """Run every delete callback (freeing ``obj``); newest attribute first."""
    for kv in list(reversed(attrs)):
        k = _KEYVALS.get(kv)
        if k is None:
            attrs.pop(kv, None)
            continue
        _delete(k, obj, kv, attrs)
