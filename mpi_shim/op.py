"""Reduction operations: the standard ``MPI.Op`` set and user ``Op.Create``.

``op(x, y)`` combines two Python objects (lowercase API); ``op.combine(left,
right)`` combines two numpy arrays; both compute ``left op right`` with the
left operand from the lower rank (MPI's canonical order).
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .datatype import Datatype, reduction_dtype
from .exceptions import ERR_OP, Exception
from .handle import Handle, register_family
from .msgspec import parse


def _loc(better):
    def obj(x, y):
        if better(x[0], y[0]):
            return x
        if better(y[0], x[0]):
            return y
        return x if not (y[1] < x[1]) else y

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

#: name -> (combine two objects, make the array combiner): the array side
#: is made on first use, so that the table does not import numpy (ucxpy.lazy)
_TABLE = {
    "SUM": (lambda x, y: x + y, lambda: np.add),
    "PROD": (lambda x, y: x * y, lambda: np.multiply),
    "MAX": (lambda x, y: y if y > x else x, lambda: np.maximum),
    "MIN": (lambda x, y: y if y < x else x, lambda: np.minimum),
    "LAND": (lambda x, y: x and y, lambda: _logical(np.logical_and)),
    "LOR": (lambda x, y: x or y, lambda: _logical(np.logical_or)),
    "LXOR": (lambda x, y: bool(x) != bool(y), lambda: _logical(np.logical_xor)),
    "BAND": (lambda x, y: x & y, lambda: np.bitwise_and),
    "BOR": (lambda x, y: x | y, lambda: np.bitwise_or),
    "BXOR": (lambda x, y: x ^ y, lambda: np.bitwise_xor),
    "MAXLOC": (_maxloc[0], lambda: _maxloc[1]),
    "MINLOC": (_minloc[0], lambda: _minloc[1]),
    "REPLACE": (lambda x, y: y, lambda: lambda a, b: b.copy()),
    "NO_OP": (lambda x, y: x, lambda: lambda a, b: a.copy()),
}


MAX_USER_OPS = 32        # live user-defined operations, like mpi4py's callback table
_user_ops = [0]


class OpImpl:
    __slots__ = ("name", "obj", "arr", "user", "commute", "predefined", "freed", "ufunc",
                 "make_arr", "_hid", "__weakref__")

    def __init__(self, name, obj=None, arr=None, user=None, commute=True, predefined=False,
                 make_arr=None):
        self.name, self.obj, self.user = name, obj, user
        self.commute, self.predefined, self.freed = commute, predefined, False
        self.make_arr = make_arr
        if make_arr is None:
            self.arr = arr
            #: arr is a numpy ufunc that combine_to calls as it is
            self.ufunc = user is None and isinstance(arr, np.ufunc)

    def __getattr__(self, name):
        # only an unset slot gets here: a predefined op's array side, made now
        if name in ("arr", "ufunc") and self.make_arr is not None:
            self.arr = arr = self.make_arr()
            self.ufunc = isinstance(arr, np.ufunc)
            return getattr(self, name)
        raise AttributeError(name)


class Op(Handle):
    """Reduction operation."""

    __slots__ = ("_fn",)

    def __new__(cls, op=None):
        self = super().__new__(cls, op)
        self._fn = getattr(op, "_fn", None) if op is not None else None
        return self

    @classmethod
    def _wrap(cls, impl):
        obj = super()._wrap(impl)
        obj._fn = None
        return obj

    @classmethod
    def _predef(cls, name):
        obj, make_arr = _TABLE[name]
        return cls._constant(OpImpl(name, obj, predefined=True, make_arr=make_arr))

    @classmethod
    def Create(cls, function, commute: bool = False) -> "Op":
        """Create a user-defined reduction operation ``function(inbuf, inoutbuf, datatype)``."""
        if not callable(function):
            raise TypeError("the operation must be callable")
        if _user_ops[0] >= MAX_USER_OPS:
            raise RuntimeError(f"cannot create more than {MAX_USER_OPS} user-defined operations")
        _user_ops[0] += 1
        op = cls._wrap(OpImpl("user", user=function, commute=bool(commute)))
        op._fn = function
        return op

    @property
    def name(self) -> str:
        return "OP_NULL" if self._h is None else self._h.name

    @property
    def commute(self) -> bool:
        return True if self._h is None else self._h.commute

    def __repr__(self):
        return f"<Op {self.name}>"

    def __reduce__(self):
        h = self._h
        if h is not None and h.user is not None:
            if self._fn is None:
                raise ValueError("cannot serialize this user-defined operation")
            return (_recreate, (type(self), self._fn, h.commute))
        return super().__reduce__()

    def _check(self):
        if self._h is None:
            raise Exception(ERR_OP, "invalid operation (OP_NULL)")

    def Free(self) -> None:
        """Free a user-defined reduction operation."""
        h = self._h
        if h is None:
            raise Exception(ERR_OP, "invalid operation (OP_NULL)")
        if h.predefined:
            raise Exception(ERR_OP, "cannot free a predefined operation")
        if not h.freed:
            h.freed = True
            _user_ops[0] -= 1
        self._h = None

    def _release(self) -> None:
        h = self._h
        if not h.freed:
            h.freed = True
            _user_ops[0] -= 1

    def Is_commutative(self) -> bool:
        """Query reduction operations for their commutativity."""
        self._check()
        return self._h.commute

    is_commutative = property(Is_commutative, doc="Is a commutative operation.")

    @property
    def commutative(self) -> bool:
        """Whether ucxpy's collective engine may combine in any order
        (REPLACE and NO_OP keep rank order)."""
        return self.Is_commutative() and self.name not in ("REPLACE", "NO_OP")
    is_predefined = property(lambda self: self._h is None or self._h.predefined,
                             doc="Is a predefined operation.")

    # -- application ---------------------------------------------------------
    def __call__(self, x, y):
        """Apply the operation to two Python objects (``x`` from the lower rank)."""
        h = self._h
        if h is None:
            raise ValueError("cannot apply OP_NULL")
        if h.user is not None:
            if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
                return self.combine(x, y, None)
            return h.user(x, y, None) if _nargs(h.user) == 3 else h.user(x, y)
        return h.obj(x, y)

    def combine(self, left, right, datatype):
        """Combine two numpy arrays as ``left op right`` (new array or ``right`` updated)."""
        h = self._h
        if h is None:
            raise Exception(ERR_OP, "invalid operation (OP_NULL)")
        if h.user is not None:
            out = np.array(right, copy=True)
            dt = datatype
            if dt is None:
                try:
                    dt = Datatype.fromcode(out.dtype.char)
                except (ValueError, KeyError):
                    dt = None
            h.user(_typed_view(left), _typed_view(out), dt)
            return out
        try:
            return h.arr(left, right)
        except TypeError:
            raise Exception(ERR_OP, f"{h.name} is not defined for {left.dtype}") from None

    def combine_to(self, left, right, out) -> None:
        """Combine two numpy arrays as ``out = left op right``.

        The output may be ``right`` itself.  A predefined ufunc op writes there
        directly, with no temporary (for a large array a fresh one costs a
        page fault per 4 KiB on first touch); the others combine, then copy.
        """
        h = self._h
        if h is not None and h.user is None and isinstance(h.arr, np.ufunc):
            try:
                h.arr(left, right, out=out)
            except TypeError:
                raise Exception(ERR_OP, f"{h.name} is not defined for {left.dtype}") from None
            return
        out[...] = self.combine(left, right, None)

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """Apply a reduction operation to local data."""
        mi, mo = parse(inbuf), parse(inoutbuf, writable=True)
        if mi.count != mo.count:
            raise ValueError(f"mismatch in inbuf count {mi.count} and inoutbuf count {mo.count}")
        if mi.dtype != mo.dtype:
            raise ValueError("mismatch in inbuf and inoutbuf MPI datatypes")
        reduce_into(self, mi, mo)


def _typed_view(arr):
    """A memoryview of ``arr`` with its element format (user ops index elements)."""
    arr = np.ascontiguousarray(arr)
    try:
        return memoryview(arr)
    except (ValueError, TypeError):
        return memoryview(arr.view(np.uint8))


def _recreate(cls, fn, commute):
    return cls.Create(fn, commute)


def _nargs(fn):
    try:
        import inspect      # deferred: inspect (with ast, dis, tokenize) only for a user op
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 2


def typed(msg, dtype=None):
    """Numpy array view of a buffer message's packed data."""
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
    """Write ``arr`` (packed) into the message's layout (or into a plain
    contiguous numpy array of the same element type, see ``cco._operand``;
    callers skip it when the result was built there)."""
    if type(msg) is np.ndarray:
        msg.reshape(-1)[:] = arr
        return
    c = msg.contig()
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    if c is not None:
        if len(raw):
            np.frombuffer(c, np.uint8)[:] = raw
    else:
        msg.unpack(raw.tobytes(), len(raw))


def _by_name(name):
    return globals()[name]


OP_NULL = Op._constant(None)
OP_NULL._fn = None
SUM, PROD, MAX, MIN = (Op._predef(n) for n in ("SUM", "PROD", "MAX", "MIN"))
LAND, LOR, LXOR = (Op._predef(n) for n in ("LAND", "LOR", "LXOR"))
BAND, BOR, BXOR = (Op._predef(n) for n in ("BAND", "BOR", "BXOR"))
MAXLOC, MINLOC, REPLACE, NO_OP = (Op._predef(n) for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP"))
register_family(Op)
