"""Reduction operations: the standard ``MPI.Op`` set and user ``Op.Create``.

``op(x, y)`` combines two Python objects (lowercase API); ``op.combine(left,
right)`` combines two numpy arrays; both compute ``left op right`` with the
left operand from the lower rank (MPI's canonical order).
"""
from __future__ import annotations

import numpy as np

from .exceptions import ERR_OP, Exception


def _loc(better):
    def obj(x, y):
        if better(x[0], y[0]):
            return x
        if better(y[0], x[0]):
            return y
        return (x[0], min(x[1], y[1]))

    def arr(a, b):
        out = b.copy()
        av, bv = a["v"], b["v"]
        take_a = better(av, bv) | ((av == bv) & (a["i"] < b["i"]))
        out[take_a] = a[take_a]
        return out
    return obj, arr


def _logical(fn):
    def arr(a, b):
        return fn(a != 0, b != 0).astype(a.dtype)
    return arr


_maxloc = _loc(lambda x, y: x > y)
_minloc = _loc(lambda x, y: x < y)

_TABLE = {
    "SUM": (lambda x, y: x + y, np.add),
    "PROD": (lambda x, y: x * y, np.multiply),
    "MAX": (lambda x, y: y if y > x else x, np.maximum),
    "MIN": (lambda x, y: y if y < x else x, np.minimum),
    "LAND": (lambda x, y: x and y, _logical(np.logical_and)),
    "LOR": (lambda x, y: x or y, _logical(np.logical_or)),
    "LXOR": (lambda x, y: bool(x) != bool(y), _logical(np.logical_xor)),
    "BAND": (lambda x, y: x & y, np.bitwise_and),
    "BOR": (lambda x, y: x | y, np.bitwise_or),
    "BXOR": (lambda x, y: x ^ y, np.bitwise_xor),
    "MAXLOC": _maxloc,
    "MINLOC": _minloc,
    "REPLACE": (lambda x, y: y, lambda a, b: b.copy()),
    "NO_OP": (lambda x, y: x, lambda a, b: a.copy()),
}


class Op:
    """An MPI reduction operation."""

    __slots__ = ("name", "_obj", "_arr", "_user", "commute", "__weakref__")

    def __init__(self, op=None):
        if op is None:
            self.name, self._obj, self._arr, self._user, self.commute = "OP_NULL", None, None, None, True
        elif isinstance(op, Op):
            self.name, self._obj, self._arr = op.name, op._obj, op._arr
            self._user, self.commute = op._user, op.commute
        else:
            raise TypeError("expected an Op")

    @classmethod
    def _predef(cls, name):
        op = cls()
        op.name = name
        op._obj, op._arr = _TABLE[name]
        return op

    @classmethod
    def Create(cls, function, commute=False):
        """User operation ``function(inbuf, inoutbuf, datatype)``."""
        op = cls()
        op.name, op._user, op.commute = "user", function, bool(commute)
        return op

    def __eq__(self, other):
        if not isinstance(other, Op):
            return NotImplemented
        return self is other or (self._user is None and other._user is None and
                                 self.name == other.name)

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return hash(self.name)

    def __bool__(self):
        return self.name != "OP_NULL"

    def __repr__(self):
        return f"<Op {self.name}>"

    def __reduce__(self):
        if self._user is None:
            return (_by_name, (self.name,))
        raise TypeError("cannot pickle a user-defined Op")

    def _check(self):
        if self.name == "OP_NULL":
            raise Exception(ERR_OP, "invalid operation (OP_NULL)")

    def Free(self):
        if self._user is None and self.name != "OP_NULL":
            raise Exception(ERR_OP, "cannot free a predefined operation")
        self.name, self._user = "OP_NULL", None

    def Is_commutative(self) -> bool:
        return self.commute if self._user is not None else True

    is_commutative = property(Is_commutative)
    is_predefined = property(lambda self: self._user is None)

    # -- application ---------------------------------------------------------
    def __call__(self, x, y):
        """``x op y`` for Python objects (x from the lower rank)."""
        self._check()
        if self._user is not None:
            if isinstance(x, np.ndarray):
                return self.combine(x, y, None)
            return self._user(x, y, None) if _nargs(self._user) == 3 else self._user(x, y)
        return self._obj(x, y)

    def combine(self, left, right, datatype):
        """``left op right`` for numpy arrays (new array or ``right`` updated)."""
        self._check()
        if self._user is not None:
            out = np.array(right, copy=True)
            self._user(memoryview(np.ascontiguousarray(left)).cast("B"),
                       memoryview(out).cast("B"), datatype)
            return out
        try:
            return self._arr(left, right)
        except TypeError:
            raise Exception(ERR_OP, f"{self.name} is not defined for {left.dtype}") from None

    def Reduce_local(self, inbuf, inoutbuf):
        from .datatype import parse
        mi, mo = parse(inbuf), parse(inoutbuf, writable=True)
        if mi.count != mo.count:
            raise ValueError(f"mismatch in send count {mi.count} and receive count {mo.count}")
        if mi.dtype != mo.dtype:
            raise ValueError(f"mismatch in send and receive MPI datatypes")
        reduce_into(self, mi, mo)


def _nargs(fn):
    try:
        import inspect
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 2


def typed(msg, dtype=None):
    """Numpy array view of a buffer message's packed data."""
    from .datatype import reduction_dtype
    d = msg.dtype
    nd = reduction_dtype(d)
    if nd is None:
        raise Exception(ERR_OP, f"reduction on datatype {d.name!r} is not supported")
    data = msg.pack()
    return np.frombuffer(data, nd) if len(data) else np.zeros(0, nd)


def reduce_into(op, left_msg, inout_msg):
    """``inout = left op inout`` on two buffer messages."""
    a = typed(left_msg)
    b = typed(inout_msg)
    store(inout_msg, op.combine(a, b, inout_msg.dtype))


def store(msg, arr):
    """Write ``arr`` (packed) into the message's layout."""
    c = msg.contig()
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    if c is not None:
        if len(raw):
            np.frombuffer(c, np.uint8)[:] = raw
    else:
        msg.unpack(raw.tobytes(), len(raw))


def _by_name(name):
    return globals()[name]


OP_NULL = Op()
SUM, PROD, MAX, MIN = (Op._predef(n) for n in ("SUM", "PROD", "MAX", "MIN"))
LAND, LOR, LXOR = (Op._predef(n) for n in ("LAND", "LOR", "LXOR"))
BAND, BOR, BXOR = (Op._predef(n) for n in ("BAND", "BOR", "BXOR"))
MAXLOC, MINLOC, REPLACE, NO_OP = (Op._predef(n) for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP"))
