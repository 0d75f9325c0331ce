"""``MPI.Info``: ordered string-to-string hints, with Python mapping methods."""
from __future__ import annotations

import os
import sys

from ucxpy.config import setting

from .exceptions import ERR_ARG, ERR_INFO_KEY, ERR_INFO_NOKEY, ERR_INFO_VALUE, Exception
from .handle import Handle, register_family

MAX_INFO_KEY = 255
MAX_INFO_VAL = 1024


class InfoImpl:
    __slots__ = ("d", "predefined", "_hid", "__weakref__")

    def __init__(self, d=None, predefined=False):
        self.d = dict(d or {})
        self.predefined = predefined


def _key(key) -> str:
    if isinstance(key, bytes):
        key = key.decode()
    if not isinstance(key, str):
        raise TypeError(f"expected a str key, got {type(key).__name__}")
    if len(key) > MAX_INFO_KEY or not key:
        raise Exception(ERR_INFO_KEY, f"invalid info key {key[:40]!r} (empty or too long)")
    return key


def _value(value) -> str:
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str):
        raise TypeError(f"expected a str value, got {type(value).__name__}")
    if len(value) > MAX_INFO_VAL:
        raise Exception(ERR_INFO_VALUE, "info value too long")
    return value


class Info(Handle):
    """Info object."""

    __slots__ = ()

    @classmethod
    def Create(cls, items=None) -> "Info":
        """Create a new info object (optionally from a mapping or ``(key, value)`` pairs)."""
        info = cls._wrap(InfoImpl())
        if items is not None:
            if isinstance(items, dict):
                items = items.items()
            try:
                pairs = list(items)
            except TypeError:
                raise TypeError("info items must be a mapping or an iterable of pairs") from None
            for k, v in pairs:
                info.Set(k, v)
        return info

    @classmethod
    def Create_env(cls, args=None) -> "Info":
        """Create an info object holding the execution environment."""
        info = cls._wrap(InfoImpl(_environment(args)))
        return info

    def _d(self) -> dict:
        if self._h is None:
            raise Exception(ERR_ARG, "invalid info (INFO_NULL)")
        return self._h.d

    def __repr__(self):
        return "<Info INFO_NULL>" if self._h is None else f"<Info {self._h.d}>"

    def __reduce__(self):
        if self._const or self._h is None or self._h.predefined:
            return super().__reduce__()
        return (_from_items, (type(self), list(self._h.d.items())))

    def Free(self) -> None:
        """Free the info object."""
        self._d()
        self._h = None

    def Dup(self) -> "Info":
        """Duplicate the info object."""
        return type(self)._wrap(InfoImpl(self._d()))

    def Set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``."""
        self._d()[_key(key)] = _value(value)

    def Get(self, key: str, maxlen: int = -1):
        """Return the value stored under ``key`` (None when absent)."""
        v = self._d().get(_key(key))
        if v is not None and maxlen is not None and maxlen >= 0:
            v = v[:maxlen]
        return v

    def Delete(self, key: str) -> None:
        """Remove ``key``."""
        d = self._d()
        key = _key(key)
        if key not in d:
            raise Exception(ERR_INFO_NOKEY, f"info key {key!r} is not defined")
        del d[key]

    def Get_nkeys(self) -> int:
        """Return the number of keys."""
        return len(self._d())

    def Get_nthkey(self, n: int) -> str:
        """Return the ``n``-th key."""
        d = self._d()
        if not (0 <= n < len(d)):
            raise Exception(ERR_ARG, f"requested key {n} but the info has {len(d)} keys")
        return list(d)[n]

    # -- Python mapping protocol ---------------------------------------------------
    def __len__(self):
        return 0 if self._h is None else len(self._h.d)

    def __contains__(self, key):
        return self._h is not None and key in self._h.d

    def __iter__(self):
        return iter(() if self._h is None else list(self._h.d))

    def __getitem__(self, key):
        if self._h is None or key not in self._h.d:
            raise KeyError(key)
        return self._h.d[key]

    def __setitem__(self, key, value):
        if self._h is None:
            raise KeyError(key)
        self.Set(key, value)

    def __delitem__(self, key):
        if self._h is None or key not in self._h.d:
            raise KeyError(key)
        del self._h.d[key]

    def get(self, key, default=None):
        """Return the value under ``key``, or ``default``."""
        return default if self._h is None else self._h.d.get(key, default)

    def keys(self):
        """Return the list of keys."""
        return list(self)

    def values(self):
        """Return the list of values."""
        return [self._h.d[k] for k in self]

    def items(self):
        """Return the list of ``(key, value)`` pairs."""
        return [(k, self._h.d[k]) for k in self]

    def update(self, other=(), **kwds):
        """Update from a mapping or pairs, then from keyword arguments."""
        if self._h is None:
            raise KeyError("cannot update INFO_NULL")
        if hasattr(other, "keys"):
            other = [(k, other[k]) for k in other.keys()]
        for k, v in other:
            self.Set(k, v)
        for k, v in kwds.items():
            self.Set(k, v)

    def pop(self, key, *default):
        """Remove ``key`` and return its value (or ``default``)."""
        if self._h is not None and key in self._h.d:
            return self._h.d.pop(key)
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self):
        """Remove and return the last ``(key, value)`` pair."""
        if self._h is None or not self._h.d:
            raise KeyError("popitem(): info is empty")
        return self._h.d.popitem()

    def copy(self):
        """Return a duplicate (INFO_NULL for INFO_NULL)."""
        return self if self._h is None else self.Dup()

    def clear(self):
        """Remove every key."""
        if self._h is not None:
            self._h.d.clear()


def _from_items(cls, items):
    info = cls._wrap(InfoImpl())
    info._h.d.update(items)
    return info


def _environment(args=None) -> dict:
    env = {"command": sys.executable, "argv": " ".join(sys.argv[1:]),
           "maxprocs": str(setting("UCXPY_SIZE") or 1), "soft": "", "host": os.uname().nodename,
           "arch": os.uname().machine, "wdir": os.getcwd(), "file": "",
           "thread_level": "MPI_THREAD_MULTIPLE"}
    if args is not None:
        if isinstance(args, str):
            args = [args]
        args = list(args)
        if args:
            env["command"] = args[0]
            env["argv"] = " ".join(args[1:])
    return {k: v for k, v in env.items() if v}


INFO_NULL = Info._constant(None)
INFO_ENV = Info._constant(InfoImpl(_environment(), predefined=True))
register_family(Info)

# re-exports kept for the modules that took them from here
from .errhandler import (ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL,  # noqa: E402,F401
                         ERRORS_RETURN, Errhandler)
from .attr import (KEYVAL_INVALID, WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT,  # noqa: E402,F401
                   WIN_MODEL, WIN_SIZE)
