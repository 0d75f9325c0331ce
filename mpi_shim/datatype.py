"""Datatypes and buffer-message parsing (``[buf, count, MPI.INT]`` ...).

A datatype is a byte layout: ``blocks`` (byte offset, length) of one
element, its ``extent`` and ``lb``, and for reductions the numpy dtype of its
homogeneous base (``np_dtype``).  Predefined types are one contiguous block.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .exceptions import ERR_ARG, ERR_BUFFER, ERR_COUNT, ERR_TYPE, Exception

UNDEFINED = -32766


class Datatype:
    """An MPI datatype (predefined or derived)."""

    __slots__ = ("name", "size", "extent", "lb", "blocks", "np_dtype", "code",
                 "predefined", "committed", "freed", "contiguous", "__weakref__")

    def __init__(self, datatype=None):
        if datatype is None:
            self._set("MPI_DATATYPE_NULL", 0, 0, 0, (), None, None, True)
        elif isinstance(datatype, Datatype):
            for k in Datatype.__slots__[:-1]:
                object.__setattr__(self, k, getattr(datatype, k))
        else:
            raise TypeError("expected a Datatype")

    def _set(self, name, size, extent, lb, blocks, np_dtype, code, predefined):
        self.name, self.size, self.extent, self.lb = name, size, extent, lb
        self.blocks, self.np_dtype, self.code = blocks, np_dtype, code
        self.predefined, self.committed, self.freed = predefined, predefined, False
        self.contiguous = len(blocks) <= 1 and (not blocks or (blocks[0][0] == 0 and
                                                                blocks[0][1] == extent))
        return self

    def __eq__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        if self.is_null or other.is_null:
            return self.is_null and other.is_null
        return self is other or (self.predefined and other.predefined and self.name == other.name)

    def __hash__(self):
        return hash(self.name)

    def __bool__(self):
        return not self.is_null

    def __repr__(self):
        return f"<Datatype {self.name}>"

    def __reduce__(self):
        if self.predefined:
            return (_predefined_by_name, (self.name,))
        raise TypeError("cannot pickle a derived datatype")

    @property
    def is_null(self):
        return self.name == "MPI_DATATYPE_NULL" and self.predefined

    def _check(self):
        if self.is_null or self.freed:
            raise Exception(ERR_TYPE, "invalid datatype")

    # -- queries --------------------------------------------------------------
    def Get_size(self) -> int:
        self._check()
        return self.size

    def Get_extent(self):
        self._check()
        return self.lb, self.extent

    def Get_true_extent(self):
        self._check()
        if not self.blocks:
            return 0, 0
        lo = min(o for o, _ in self.blocks)
        hi = max(o + n for o, n in self.blocks)
        return lo, hi - lo

    def Get_name(self) -> str:
        return self.name

    def Set_name(self, name: str) -> None:
        self.name = name

    def Get_envelope(self):
        return (0, 0, 0, 0, "named") if self.predefined else (0, 0, 0, 0, "derived")

    size_ = property(Get_size)
    true_lb = property(lambda self: self.Get_true_extent()[0])
    true_extent = property(lambda self: self.Get_true_extent()[1])
    ub = property(lambda self: self.lb + self.extent)
    is_named = property(lambda self: self.predefined)
    is_predefined = property(lambda self: self.predefined)
    typechar = property(lambda self: self.code or "")

    def tocode(self) -> str:
        if self.code is None:
            raise ValueError(f"{self.name} has no type code")
        return self.code

    @staticmethod
    def fromcode(code: str) -> "Datatype":
        try:
            return _BY_CODE[code]
        except KeyError:
            raise ValueError(f"cannot map code {code!r} to a datatype") from None

    # -- lifecycle -------------------------------------------------------------
    def Commit(self):
        self._check()
        self.committed = True
        return self

    def Free(self) -> None:
        if self.predefined:
            raise Exception(ERR_TYPE, "cannot free a predefined datatype")
        self.freed = True
        object.__setattr__(self, "name", "MPI_DATATYPE_NULL")
        self.predefined = True

    def Dup(self) -> "Datatype":
        self._check()
        return _derived(f"dup({self.name})", self.size, self.extent, self.lb, self.blocks,
                        self.np_dtype, self.committed)

    # -- constructors -------------------------------------------------------------
    def _elem_blocks(self, disp_bytes):
        return tuple((disp_bytes + o, n) for o, n in self.blocks)

    def _build(self, name, disps, lb=None, ub=None):
        """New type made of one copy of self per byte displacement in ``disps``."""
        self._check()
        blocks = []
        for d in disps:
            blocks.extend(self._elem_blocks(d))
        blocks = _merge(blocks)
        lo = min([d + self.lb for d in disps], default=0) if lb is None else lb
        hi = max([d + self.lb + self.extent for d in disps], default=0) if ub is None else ub
        return _derived(name, self.size * len(disps), hi - lo, lo, tuple(blocks), self.np_dtype)

    def Create_contiguous(self, count: int):
        return self._build("contiguous", [i * self.extent for i in range(count)])

    def Create_vector(self, count, blocklength, stride):
        return self._build("vector", [(i * stride + j) * self.extent for i in range(count)
                                      for j in range(blocklength)])

    def Create_hvector(self, count, blocklength, stride):
        return self._build("hvector", [i * stride + j * self.extent for i in range(count)
                                       for j in range(blocklength)])

    def Create_indexed(self, blocklengths, displacements):
        return self._build("indexed", [(d + j) * self.extent for b, d in
                                       zip(blocklengths, displacements) for j in range(b)])

    def Create_hindexed(self, blocklengths, displacements):
        return self._build("hindexed", [d + j * self.extent for b, d in
                                        zip(blocklengths, displacements) for j in range(b)])

    def Create_indexed_block(self, blocklength, displacements):
        return self.Create_indexed([blocklength] * len(displacements), displacements)

    def Create_hindexed_block(self, blocklength, displacements):
        return self.Create_hindexed([blocklength] * len(displacements), displacements)

    def Create_resized(self, lb, extent):
        self._check()
        return _derived("resized", self.size, extent, lb, self.blocks, self.np_dtype)

    @staticmethod
    def Create_struct(blocklengths, displacements, datatypes):
        blocks, size, lo, hi = [], 0, None, 0
        dts = {t.np_dtype for t in datatypes}
        for b, d, t in zip(blocklengths, displacements, datatypes):
            for j in range(b):
                blocks.extend(t._elem_blocks(d + j * t.extent))
                size += t.size
            lo = d + t.lb if lo is None else min(lo, d + t.lb)
            hi = max(hi, d + t.lb + b * t.extent)
        return _derived("struct", size, hi - (lo or 0), lo or 0, tuple(_merge(blocks)),
                        dts.pop() if len(dts) == 1 else None)

    Create_dup = Dup


def _merge(blocks):
    out = []
    for o, n in blocks:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((o, n))
    return out


def _derived(name, size, extent, lb, blocks, np_dtype, committed=False):
    t = Datatype.__new__(Datatype)
    t._set(name, size, extent, lb, tuple(blocks), np_dtype, None, False)
    t.committed = committed
    return t


_BY_NAME, _BY_CODE = {}, {}


def _predefined_by_name(name):
    return _BY_NAME.get(name, DATATYPE_NULL)


def _mk(name, np_type, code=None, size=None):
    dt = np.dtype(np_type) if np_type is not None else None
    n = dt.itemsize if dt is not None else size
    t = Datatype.__new__(Datatype)
    t._set("MPI_" + name, n, n, 0, ((0, n),) if n else (), dt, code, True)
    _BY_NAME[t.name] = t
    if code and code not in _BY_CODE:
        _BY_CODE[code] = t
    return t


def _pair(cval, name):
    return np.dtype([("v", cval), ("i", "i4")], align=True)


DATATYPE_NULL = Datatype()
BYTE = _mk("BYTE", "u1", "B")
PACKED = _mk("PACKED", "u1")
CHAR = _mk("CHAR", "S1", "c")
WCHAR = _mk("WCHAR", "U1", "U")
SIGNED_CHAR = _mk("SIGNED_CHAR", "i1", "b")
UNSIGNED_CHAR = _mk("UNSIGNED_CHAR", "u1")
SHORT = _mk("SHORT", "i2", "h")
UNSIGNED_SHORT = _mk("UNSIGNED_SHORT", "u2", "H")
INT = _mk("INT", "i4", "i")
UNSIGNED = _mk("UNSIGNED", "u4", "I")
LONG = _mk("LONG", "l", "l")
UNSIGNED_LONG = _mk("UNSIGNED_LONG", "L", "L")
LONG_LONG = _mk("LONG_LONG", "q", "q")
UNSIGNED_LONG_LONG = _mk("UNSIGNED_LONG_LONG", "Q", "Q")
FLOAT = _mk("FLOAT", "f4", "f")
DOUBLE = _mk("DOUBLE", "f8", "d")
LONG_DOUBLE = _mk("LONG_DOUBLE", "g", "g")
C_BOOL = _mk("C_BOOL", "?", "?")
INT8_T = _mk("INT8_T", "i1", "i1")
INT16_T = _mk("INT16_T", "i2", "i2")
INT32_T = _mk("INT32_T", "i4", "i4")
INT64_T = _mk("INT64_T", "i8", "i8")
UINT8_T = _mk("UINT8_T", "u1", "u1")
UINT16_T = _mk("UINT16_T", "u2", "u2")
UINT32_T = _mk("UINT32_T", "u4", "u4")
UINT64_T = _mk("UINT64_T", "u8", "u8")
C_FLOAT_COMPLEX = _mk("C_FLOAT_COMPLEX", "c8", "F")
C_DOUBLE_COMPLEX = _mk("C_DOUBLE_COMPLEX", "c16", "D")
C_LONG_DOUBLE_COMPLEX = _mk("C_LONG_DOUBLE_COMPLEX", "G", "G")
C_COMPLEX = C_FLOAT_COMPLEX
FLOAT16 = _mk("FLOAT16", "f2", "e")
AINT = _mk("AINT", "i8", "p")
OFFSET = _mk("OFFSET", "i8")
COUNT = _mk("COUNT", "i8")
CXX_BOOL = _mk("CXX_BOOL", "?")
CXX_FLOAT_COMPLEX = _mk("CXX_FLOAT_COMPLEX", "c8")
CXX_DOUBLE_COMPLEX = _mk("CXX_DOUBLE_COMPLEX", "c16")
CXX_LONG_DOUBLE_COMPLEX = _mk("CXX_LONG_DOUBLE_COMPLEX", "G")
SHORT_INT = _mk("SHORT_INT", _pair("i2", "SHORT_INT"))
TWOINT = _mk("2INT", _pair("i4", "2INT"))
INT_INT = TWOINT
LONG_INT = _mk("LONG_INT", _pair("l", "LONG_INT"))
FLOAT_INT = _mk("FLOAT_INT", _pair("f4", "FLOAT_INT"))
DOUBLE_INT = _mk("DOUBLE_INT", _pair("f8", "DOUBLE_INT"))
LONG_DOUBLE_INT = _mk("LONG_DOUBLE_INT", _pair("g", "LONG_DOUBLE_INT"))
CHARACTER = _mk("CHARACTER", "S1")
LOGICAL = _mk("LOGICAL", "i4")
INTEGER = _mk("INTEGER", "i4")
REAL = _mk("REAL", "f4")
DOUBLE_PRECISION = _mk("DOUBLE_PRECISION", "f8")
COMPLEX = _mk("COMPLEX", "c8")
DOUBLE_COMPLEX = _mk("DOUBLE_COMPLEX", "c16")
LOGICAL1, LOGICAL2, LOGICAL4, LOGICAL8 = (_mk(f"LOGICAL{n}", f"i{n}") for n in (1, 2, 4, 8))
INTEGER1, INTEGER2, INTEGER4, INTEGER8 = (_mk(f"INTEGER{n}", f"i{n}") for n in (1, 2, 4, 8))
INTEGER16 = REAL2 = COMPLEX4 = LOGICAL16 = REAL16 = COMPLEX32 = BFLOAT16_T = DATATYPE_NULL
REAL4, REAL8 = _mk("REAL4", "f4"), _mk("REAL8", "f8")
COMPLEX8, COMPLEX16 = _mk("COMPLEX8", "c8"), _mk("COMPLEX16", "c16")
TWOFLOAT = _mk("2REAL", np.dtype([("v", "f4"), ("i", "f4")]))
TWODOUBLE = _mk("2DOUBLE_PRECISION", np.dtype([("v", "f8"), ("i", "f8")]))
TWOINTEGER = _mk("2INTEGER", np.dtype([("v", "i4"), ("i", "i4")]))
TWOREAL, TWODOUBLE_PRECISION = TWOFLOAT, TWODOUBLE
SIGNED_SHORT, SIGNED_INT, SIGNED_LONG, SIGNED_LONG_LONG = SHORT, INT, LONG, LONG_LONG
UNSIGNED_INT, LONG_LONG_INT, UNSIGNED_LONG_LONG_INT = UNSIGNED, LONG_LONG, UNSIGNED_LONG_LONG
BOOL, INT8, INT16, INT32, INT64 = C_BOOL, INT8_T, INT16_T, INT32_T, INT64_T
UINT8, UINT16, UINT32, UINT64 = UINT8_T, UINT16_T, UINT32_T, UINT64_T
F_BOOL, F_INT, F_FLOAT, F_DOUBLE = LOGICAL, INTEGER, REAL, DOUBLE_PRECISION
F_COMPLEX, F_FLOAT_COMPLEX, F_DOUBLE_COMPLEX = COMPLEX, COMPLEX, DOUBLE_COMPLEX
DOUBLE_COMPLEX_ = DOUBLE_COMPLEX
LB = UB = DATATYPE_NULL
for _c, _t in (("c", CHAR), ("b", SIGNED_CHAR), ("h", SHORT), ("i", INT), ("l", LONG),
               ("q", LONG_LONG), ("B", BYTE), ("H", UNSIGNED_SHORT), ("I", UNSIGNED),
               ("L", UNSIGNED_LONG), ("Q", UNSIGNED_LONG_LONG), ("f", FLOAT), ("d", DOUBLE),
               ("g", LONG_DOUBLE), ("F", C_FLOAT_COMPLEX), ("D", C_DOUBLE_COMPLEX),
               ("G", C_LONG_DOUBLE_COMPLEX), ("?", C_BOOL), ("e", FLOAT16),
               ("i1", INT8_T), ("i2", INT16_T), ("i4", INT32_T), ("i8", INT64_T),
               ("u1", UINT8_T), ("u2", UINT16_T), ("u4", UINT32_T), ("u8", UINT64_T),
               ("f4", FLOAT), ("f8", DOUBLE), ("c8", C_FLOAT_COMPLEX), ("c16", C_DOUBLE_COMPLEX),
               ("p", AINT), ("P", UNSIGNED_LONG), ("n", LONG), ("N", UNSIGNED_LONG)):
    _BY_CODE[_c] = _t
_BY_CODE["B"] = UNSIGNED_CHAR
#: struct format -> default datatype of a buffer (mpi4py maps "B" to BYTE)
_FORMAT = dict(_BY_CODE)
_FORMAT["B"] = BYTE
_FORMAT["c"] = CHAR


# -- buffers ------------------------------------------------------------------
class _Bottom:
    """``MPI.BOTTOM``: the zero address."""
    __slots__ = ()

    def __repr__(self):
        return "BOTTOM"

    def __int__(self):
        return 0


class _InPlace:
    """``MPI.IN_PLACE``."""
    __slots__ = ()

    def __repr__(self):
        return "IN_PLACE"

    def __int__(self):
        return -1


BOTTOM = _Bottom()
IN_PLACE = _InPlace()
_EMPTY = memoryview(bytearray(0))


def byte_view(obj, writable=False):
    """``(flat byte memoryview, format, itemsize)`` of any buffer-like object."""
    if obj is None or obj is BOTTOM:
        return _EMPTY, "B", 1
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        addr, ro = cai["data"]
        dt = np.dtype(cai["typestr"])
        n = int(np.prod(cai.get("shape", ()) or (1,))) * dt.itemsize if cai.get("shape") != () \
            else dt.itemsize
        if writable and ro:
            raise Exception(ERR_BUFFER, "read-only buffer")
        if n == 0 or addr == 0:
            return _EMPTY, dt.char, dt.itemsize
        mv = memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
        return mv, dt.char, dt.itemsize
    try:
        mv = obj if type(obj) is memoryview else memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            from .memory import dlpack_view
            return dlpack_view(obj)
        if isinstance(obj, str):
            raise TypeError("a str is not a buffer") from None
        raise TypeError(f"expected a buffer object, not {type(obj).__name__}") from None
    if writable and mv.readonly:
        raise Exception(ERR_BUFFER, "read-only buffer")
    fmt = mv.format.lstrip("@=<>!") or "B"
    isz = mv.itemsize
    if not mv.c_contiguous:
        if not mv.contiguous:
            raise Exception(ERR_BUFFER, "buffer is not contiguous")
        mv = memoryview(np.asarray(mv).reshape(-1, order="A").view(np.uint8))
    elif mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B") if mv.nbytes else _EMPTY
    return mv, fmt, isz


class Msg:
    """A parsed buffer message: ``view`` holds the bytes the datatype layout
    names (``count`` elements of ``dtype`` starting at ``offset``)."""

    __slots__ = ("view", "count", "dtype", "offset", "obj")

    def __init__(self, view, count, dtype, offset=0, obj=None):
        self.view, self.count, self.dtype, self.offset, self.obj = view, count, dtype, offset, obj

    @property
    def nbytes(self):
        return self.count * self.dtype.size

    def contig(self):
        """The bytes of the message when the layout is contiguous, else None."""
        d = self.dtype
        if d.contiguous:
            start = self.offset + d.lb
            return self.view[start:start + self.count * d.extent]
        return None

    def pack(self):
        """Contiguous bytes of the message (zero-copy when possible)."""
        c = self.contig()
        if c is not None:
            return c
        return bytes(np.asarray(self.view)[self._index()])

    def unpack(self, data, nbytes=None):
        """Write packed ``data`` into the layout (for non-contiguous types)."""
        idx = self._index()
        n = len(idx) if nbytes is None else nbytes
        np.asarray(self.view)[idx[:n]] = np.frombuffer(data, np.uint8, n)

    def _index(self):
        d = self.dtype
        one = np.concatenate([np.arange(o, o + n) for o, n in d.blocks]) if d.blocks \
            else np.zeros(0, np.intp)
        if self.count == 0:
            return one[:0]
        base = self.offset + np.arange(self.count) * d.extent
        return (base[:, None] + one[None, :]).ravel()

    def array(self, count=None):
        """A numpy array over the message (contiguous predefined types)."""
        c = self.contig()
        return np.frombuffer(c, self.dtype.np_dtype) if len(c) else \
            np.zeros(0, self.dtype.np_dtype)


def _count_of(view, dtype, displ=0):
    ext = dtype.extent
    if ext <= 0:
        return 0
    n = len(view) - displ * ext
    if n % ext and dtype.size == ext:
        raise Exception(ERR_COUNT, "buffer size is not a multiple of the datatype extent")
    return max(n // ext, 0)


def _default_type(fmt):
    try:
        return _FORMAT[fmt]
    except KeyError:
        try:
            return _BY_CODE[np.dtype(fmt).char]
        except (TypeError, KeyError):
            raise Exception(ERR_TYPE, f"no datatype for buffer format {fmt!r}") from None


def _as_type(t):
    if isinstance(t, str):
        try:
            return _BY_CODE[t] if t in _BY_CODE else _BY_CODE[np.dtype(t).char]
        except (TypeError, KeyError):
            pass
    raise TypeError(f"expected a Datatype, not {t!r}")


def parse(msg, writable=False) -> Msg:
    """Parse a buffer message for point-to-point and rooted collectives."""
    if isinstance(msg, Msg):
        return msg
    dtype = count = None
    displ = 0
    if isinstance(msg, (list, tuple)):
        n = len(msg)
        if n == 0 or n > 4:
            raise TypeError(f"message: expected a list of 2 to 4 items, got {n}")
        buf = msg[0]
        rest = msg[1:]
        if n == 1:
            pass
        elif n == 2:
            if isinstance(rest[0], (Datatype, str)):
                dtype = rest[0]
            elif isinstance(rest[0], (tuple, list)):
                count, displ = rest[0]
            else:
                count = rest[0]
        elif n == 3:
            a, dtype = rest
            if isinstance(a, (tuple, list)):
                count, displ = a
            else:
                count = a
        else:
            count, displ, dtype = rest
    elif isinstance(msg, (str, int, float)):
        raise TypeError(f"message: expected a buffer or a list, not {type(msg).__name__}")
    else:
        buf = msg
    if buf is IN_PLACE:
        raise Exception(ERR_BUFFER, "MPI.IN_PLACE is not valid here")
    view, fmt, isz = byte_view(buf, writable)
    if dtype is None:
        dtype = _default_type(fmt)
        if fmt != "B" and dtype.size != isz and count is None:
            raise Exception(ERR_TYPE, "buffer format and datatype size differ")
    elif not isinstance(dtype, Datatype):
        dtype = _as_type(dtype)
    dtype._check()
    if displ is None:
        displ = 0
    if count is None:
        if buf is None or buf is BOTTOM:
            count = 0
        else:
            count = _count_of(view, dtype, displ)
    if count < 0:
        raise Exception(ERR_COUNT, f"negative count {count}")
    offset = displ * dtype.extent
    if buf is not None and buf is not BOTTOM and dtype.contiguous and \
            offset + dtype.lb + count * dtype.extent > len(view):
        raise ValueError(f"message: {count} x {dtype.name} does not fit in a buffer of "
                         f"{len(view)} bytes")
    return Msg(view, count, dtype, offset, buf)


def parse_v(msg, size, writable=False, counts_needed=True):
    """Parse a vector message ``[buf, counts, displs, type]`` (and shorter
    forms); returns ``(Msg over the whole buffer, counts, displs)`` where
    displs are in elements of the datatype."""
    dtype = counts = displs = None
    if isinstance(msg, (list, tuple)):
        buf, rest = msg[0], list(msg[1:])
        if rest and isinstance(rest[-1], (Datatype, str)):
            dtype = rest.pop()
        if len(rest) == 1:
            if isinstance(rest[0], tuple) and len(rest[0]) == 2 and \
                    not isinstance(rest[0][0], int):
                counts, displs = rest[0]
            else:
                counts = rest[0]
        elif len(rest) == 2:
            counts, displs = rest
    else:
        buf = msg
    view, fmt, isz = byte_view(buf, writable)
    if dtype is None:
        dtype = _default_type(fmt)
    elif not isinstance(dtype, Datatype):
        dtype = _as_type(dtype)
    dtype._check()
    if counts is None:
        total = _count_of(view, dtype) if buf is not None else 0
        counts = [total // size] * size if size else []
    elif isinstance(counts, int):
        counts = [counts] * size
    counts = [int(c) for c in counts]
    if displs is None:
        displs, acc = [], 0
        for c in counts:
            displs.append(acc)
            acc += c
    elif isinstance(displs, int):
        displs = [displs + i * counts[0] for i in range(size)]
    displs = [int(d) for d in displs]
    if len(counts) < size or len(displs) < size:
        raise Exception(ERR_ARG, "counts/displacements shorter than the group")
    return Msg(view, 0, dtype, 0, buf), counts, displs


def sub(m: Msg, count, displ) -> Msg:
    """The part of vector message ``m`` at element ``displ``."""
    return Msg(m.view, count, m.dtype, displ * m.dtype.extent, m.obj)


from .memory import buffer  # noqa: E402,F401 - MPI.buffer


def parse_w(spec, size, writable=False):
    """Per-peer messages of an Alltoallw spec ``[buf, (counts, displs), types]``
    or ``[buf, counts, displs, types]`` (byte displacements)."""
    if len(spec) == 4:
        buf, counts, displs, types = spec
    else:
        buf, (counts, displs), types = spec
    view = byte_view(buf, writable)[0]
    if isinstance(types, Datatype):
        types = [types] * size
    return [Msg(view, counts[i], types[i], displs[i]) for i in range(size)]


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and not isinstance(v, type(np)) and n not in
           ("annotations", "Msg", "parse", "parse_v", "parse_w", "sub", "byte_view")]
