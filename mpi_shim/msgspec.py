"""Buffer messages: mpi4py's ``[buf, count, displ, datatype]`` forms, parsed.

``buf`` is anything holding memory: an object with the buffer protocol
(bytes, bytearray, memoryview, array.array, numpy, ``MPI.buffer``), a DLPack
or ``__cuda_array_interface__`` exporter (read in place, see
:mod:`.interchange`), ``None`` (no memory) or ``MPI.BOTTOM`` (address zero:
the datatype's displacements are absolute addresses from
``MPI.Get_address``).  The forms, as mpi4py takes them::

    buf                      [buf, datatype]           [buf, count]
    [buf, (count, displ)]    [buf, count, datatype]    [buf, (count, displ), datatype]
    [buf, count, displ, datatype]

A datatype may be given as a type code string (``"i"``, ``"f8"``); a missing
one comes from the buffer's format, a missing count from the buffer's size.
A bare ``None`` is an empty message (what PROC_NULL peers and in-place
collectives are given).
Vector (``parse_v``) and Alltoallw (``parse_w``) specs take per-process
counts and displacements.  Everything is checked before any data moves, so
a bad spec raises at once: ``TypeError`` (not a buffer, bad argument
types), ``ValueError`` (bad counts, displacements, sizes; a layout reaching
outside its buffer), ``KeyError`` (unknown type code), ``BufferError``
(read-only receive buffer, non-contiguous or non-native-order memory) and
``MPI.Exception`` (null or uncommitted datatype, negative vector counts).
"""
from __future__ import annotations

import ctypes
import operator
import sys

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from ucxpy.buffers import BufferExporter

from . import external32, packing
from .datatype import Datatype, _NAMED, _committed, reduction_dtype
from .exceptions import ERR_ARG, ERR_BUFFER, ERR_COUNT, ERR_DISP, ERR_TYPE, Exception
from .interchange import from_cai, from_dlpack
from .predefined import CODES
from .typeimpl import REGISTRY


# -- the buffer constants ------------------------------------------------------------------
class _BufferConstant(BufferExporter):
    __slots__ = ()
    _value = 0
    _instance = None

    def _buffer_target(self):
        return None             # memoryview(MPI.BOTTOM): no bytes, no owner

    def __new__(cls):
        if cls._instance is None:
            cls._instance = BufferExporter.__new__(cls)
        return cls._instance

    def __eq__(self, other):
        if isinstance(other, _BufferConstant):
            return self is other
        if isinstance(other, int) and not isinstance(other, bool):
            return other == self._value
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self._value)

    def __bool__(self):
        return bool(self._value)

    def __int__(self):
        return self._value

    def __repr__(self):
        return self._name

    def __reduce__(self):
        return self._name


class BottomType(_BufferConstant):
    """Type of MPI.BOTTOM.

    The zero address: displacements of the datatype are absolute addresses."""

    __slots__ = ()
    _value, _name, _instance = 0, "BOTTOM", None

    def __index__(self):
        return 0


class InPlaceType(_BufferConstant):
    """Type of MPI.IN_PLACE.

    Marks a collective's send buffer as taken from its receive buffer."""

    __slots__ = ()
    _value, _name, _instance = -1, "IN_PLACE", None


class BufferAutomaticType(_BufferConstant):
    """Type of MPI.BUFFER_AUTOMATIC.

    Asks for automatic buffering of buffered-mode sends."""

    __slots__ = ()
    _value, _name, _instance = -2, "BUFFER_AUTOMATIC", None


BOTTOM = BottomType()
IN_PLACE = InPlaceType()
BUFFER_AUTOMATIC = BufferAutomaticType()


# -- acquiring memory ----------------------------------------------------------------------
class Buffer:
    """Memory of a message buffer: flat byte ``view``, ``address``, format."""

    __slots__ = ("view", "_address", "nbytes", "readonly", "format", "itemsize", "device",
                 "absolute", "keep")

    def __init__(self, view, address, readonly, fmt, itemsize, device=False, absolute=False,
                 keep=None):
        self.view, self._address, self.nbytes = view, address, view.nbytes
        self.readonly, self.format, self.itemsize = readonly, fmt, itemsize
        self.device, self.absolute, self.keep = device, absolute, keep

    @property
    def address(self) -> int:
        """Address of the first byte (computed on first use)."""
        if self._address is None:
            self._address = _address(self.view)
        return self._address


def _empty(address, fmt, absolute=False) -> Buffer:
    return Buffer(memoryview(bytearray(0)), address, False, fmt, 1, absolute=absolute)


def _address(view: memoryview) -> int:
    if view.nbytes == 0:
        return 0
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0]


def acquire(obj, writable=False) -> Buffer:
    """The memory of a message buffer object.

    Raises TypeError for an object that exposes no memory and BufferError for
    memory that is read-only (when ``writable``), not contiguous, or unusable.
    """
    if obj is None:
        return _empty(0, "B")
    if isinstance(obj, _BufferConstant):
        if obj is BOTTOM:
            return _empty(0, None, absolute=True)
        return _empty(int(obj), "B")
    mem = sys.modules.get("mpi_shim.memory")     # (no MPI.buffer exists before it is imported)
    if mem is not None and isinstance(obj, mem.buffer):
        if writable and obj.readonly:
            raise BufferError("Object is not writable.")
        view = memoryview(obj.view(np.ndarray)[:obj.nbytes])
        return Buffer(view, obj.address, obj.readonly, "B", 1, obj._device, keep=obj)
    try:
        mv = memoryview(obj)
    except (TypeError, ValueError) as e:
        # keep the message only: a saved exception would hold this frame in a cycle
        mv, refused = None, (str(e) if isinstance(e, ValueError) else None)
    if mv is not None:
        if writable and mv.readonly:
            raise BufferError("Object is not writable.")
        if mv.nbytes == 0:
            flat = memoryview(bytearray(0)) if not mv.readonly else memoryview(b"")
        elif mv.c_contiguous:
            flat = mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B")
        elif mv.f_contiguous:
            flat = memoryview(np.asarray(mv).ravel(order="K").view(np.uint8))
        else:
            raise BufferError("memoryview: underlying buffer is not contiguous")
        return Buffer(flat, None, mv.readonly, mv.format, mv.itemsize, keep=obj)
    if hasattr(obj, "__dlpack__"):
        mem = from_dlpack(obj)
    elif hasattr(obj, "__cuda_array_interface__"):
        mem = from_cai(obj)
    elif refused is not None:
        raise BufferError(refused) from None
    else:
        raise TypeError(f"a bytes-like object is required, not '{type(obj).__name__}'")
    if writable and mem.readonly:
        raise BufferError("Object is not writable.")
    return Buffer(mem.view(), mem.address, mem.readonly, mem.format, mem.itemsize,
                  mem.device, keep=mem.keep)


def address_of(obj) -> int:
    """``MPI.Get_address``: the address of a buffer's memory."""
    if isinstance(obj, _BufferConstant):
        return int(obj)
    return acquire(obj).address


def byte_view(obj, writable=False):
    """``(flat byte memoryview, format, itemsize)`` of a buffer object."""
    b = acquire(obj, writable)
    return b.view, b.format or "B", b.itemsize


def _raw(address: int, nbytes: int) -> memoryview:
    """Memory at absolute ``address`` (``MPI.BOTTOM`` messages)."""
    if address < 4096:
        raise ValueError(f"message: MPI.BOTTOM with address {address:#x}: the datatype "
                         f"must hold absolute addresses (MPI.Get_address)")
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


# -- datatypes of messages -------------------------------------------------------------------
def _type_of_format(fmt) -> Datatype:
    """The datatype of a buffer format (``KeyError``/``BufferError`` when none fits)."""
    if fmt is None:
        raise KeyError("cannot map None to MPI datatype")
    code = fmt
    if code[:1] in "@=":
        code = code[1:]
    elif code[:1] in "<>!":
        native = "<" if sys.byteorder == "little" else ">"
        if code[0] != native:
            raise BufferError(f"format string {fmt!r} with non-native byte order")
        code = code[1:]
    if len(code) > 1 and code[0] == "1" and code[1].isalpha():
        code = code[1:]
    name = CODES.get(code)
    if name is None:
        raise KeyError(f"cannot map {code!r} to MPI datatype")
    return _NAMED[name]


def _as_type(spec) -> Datatype:
    """A datatype from a spec item: Datatype, type code, or None (KeyError otherwise)."""
    if isinstance(spec, Datatype):
        return spec
    name = CODES.get(spec) if isinstance(spec, str) else None
    if name is None:
        raise KeyError(f"cannot map {spec!r} to MPI datatype")
    return _NAMED[name]


def _index(value):
    return None if value is None else operator.index(value)


# -- messages -----------------------------------------------------------------------------------
class Msg:
    """``count`` elements of ``dtype`` at byte ``offset`` of flat byte ``view``.

    ``obj`` is the user's buffer object (kept alive with the message).
    """

    __slots__ = ("view", "count", "dtype", "offset", "obj", "whole")

    def __init__(self, view, count, dtype, offset=0, obj=None, whole=False):
        self.view, self.count, self.dtype, self.offset, self.obj = view, count, dtype, offset, obj
        #: the message is exactly all of ``view`` (set by the parser's plain path)
        self.whole = whole

    @property
    def nbytes(self) -> int:
        """Bytes of data in the message (holes excluded)."""
        return self.count * self.dtype._h.typemap.size if self.dtype._h is not None else 0

    def _layout(self):
        """The type map, after checking the layout lies inside ``view``.

        Raises ValueError otherwise: a Msg built by hand with a bad offset or
        count never reads or writes outside its memory.
        """
        tm = self.dtype._impl().typemap
        lo, hi = packing.span(self.offset, self.count, tm)
        if hi > lo and (lo < 0 or hi > self.view.nbytes):
            raise ValueError(f"message: bytes [{lo}, {hi}) of the layout lie outside a "
                             f"buffer of {self.view.nbytes} bytes")
        return tm

    def contig(self):
        """The message's bytes as a memoryview slice when they are contiguous, else None."""
        if self.whole:
            return self.view
        if self.dtype._h is None:
            return self.view[0:0]
        r = packing.contiguous_range(self.offset, self.count, self._layout())
        return None if r is None else self.view[r[0]:r[1]]

    def pack(self):
        """The message's packed bytes (the buffer itself when contiguous)."""
        c = self.contig()
        if c is not None:
            return c
        flat = np.frombuffer(self.view, np.uint8)
        return memoryview(packing.pack(flat, self.offset, self.count, self._layout()))

    def unpack(self, data, nbytes=None) -> None:
        """Write packed ``data`` (its first ``nbytes`` bytes) into the message's layout."""
        if self.view.readonly:
            raise BufferError("message: the buffer is read-only")
        flat = np.frombuffer(self.view, np.uint8)
        packing.unpack(flat, self.offset, self.count, self._layout(), data, nbytes)

    def array(self):
        """A numpy array of the packed elements (the reduction element type)."""
        nd = reduction_dtype(self.dtype)
        data = self.pack()
        return np.frombuffer(data, nd) if len(data) else np.zeros(0, nd)


def _message(buf: Buffer, obj, count, offset, dtype, writable=False) -> Msg:
    """A Msg over ``buf`` after checking the layout stays inside it."""
    tm = dtype._h.typemap
    lo, hi = packing.span(offset, count, tm)
    if buf.absolute:
        if hi <= lo or tm.size == 0:
            return Msg(buf.view, count, dtype, 0, obj)
        return Msg(_raw(lo, hi - lo), count, dtype, offset - lo, obj)
    if hi > lo and tm.size and (lo < 0 or hi > buf.nbytes):
        raise ValueError(f"message: {count} entries of the datatype at byte {offset} reach "
                         f"bytes [{lo}, {hi}) outside a buffer of {buf.nbytes} bytes")
    return Msg(buf.view, count, dtype, offset, obj)


def _split(msg):
    """``(buffer object, count or (counts, displs) ..., displ, datatype)`` of a spec."""
    if isinstance(msg, (list, tuple)):
        n = len(msg)
        if not 2 <= n <= 4:
            raise ValueError("message: expecting 2 to 4 items")
        if n == 4:
            return msg[0], msg[1], msg[2], msg[3], False
        if n == 3:
            return msg[0], msg[1], None, msg[2], True
        x = msg[1]
        if x is None or isinstance(x, (Datatype, str)):
            return msg[0], None, None, x, False
        return msg[0], x, None, None, True
    if isinstance(msg, (str, int, float, complex, type)):
        raise TypeError("message: expecting buffer or list/tuple")
    return msg, None, None, None, False


def _simple(msg, writable, blocks=1):
    """``(Buffer, object, count per block, displacement, datatype)`` of a simple spec.

    With ``blocks`` > 1 (Scatter/Gather/Alltoall) an inferred count is the
    buffer's entries divided among the blocks, which must divide evenly.
    """
    obj, count, displ, tspec, pair = _split(msg)
    buf = acquire(obj, writable)
    dtype = _type_of_format(buf.format) if tspec is None else _as_type(tspec)
    if pair and isinstance(count, (tuple, list)):
        count, displ = count
    count, displ = _index(count), _index(displ)
    if count is not None and count < 0:
        raise ValueError(f"message: negative count {count}")
    if displ is not None and displ < 0:
        raise ValueError(f"message: negative displacement {displ}")
    displ = displ or 0
    impl = dtype._h
    if impl is None:
        if count is None:
            raise ValueError("message: cannot infer count, datatype is null")
        if displ:
            raise ValueError("message: cannot handle displacement, datatype is null")
        raise Exception(ERR_TYPE, "invalid datatype (DATATYPE_NULL)")
    tm = impl.typemap
    extent = tm.extent
    if count is None or displ:
        if (count is None and (buf.nbytes or displ)) or displ:
            if extent <= 0:
                what = "infer count" if count is None else "handle displacement"
                raise ValueError(f"message: cannot {what}, datatype extent {extent} "
                                 f"(lb:{tm.lb}, ub:{tm.ub})")
            if count is None and buf.nbytes % extent:
                raise ValueError(f"message: cannot infer count, buffer length {buf.nbytes} "
                                 f"is not a multiple of datatype extent {extent}")
            entries = buf.nbytes // extent
            if displ > entries:
                raise ValueError(f"message: displacement {displ} out of bounds, number of "
                                 f"datatype entries {entries}")
        else:
            entries = 0
        if count is None:
            total = entries - displ
            if total % blocks:
                raise ValueError(f"message: cannot infer count, number of entries {total} is "
                                 f"not a multiple of required number of blocks {blocks}")
            count = total // blocks
    if obj is None and count > 0:
        raise ValueError(f"message: buffer is None but count is {count}")
    _committed(dtype)
    return buf, obj, count, displ, dtype


#: buffer format -> its predefined datatype when one element is one
#: contiguous run of exactly the item size (None: use the full parser)
_PLAIN_FORMATS = {}
#: the exact types whose objects take the plain path; numpy's array joins
#: once numpy is imported (:func:`_note_numpy`: no array exists before)
_PLAIN_TYPES = [bytearray, bytes]


def _note_numpy() -> None:
    """Add numpy's array to :data:`_PLAIN_TYPES` once numpy is imported."""
    if len(_PLAIN_TYPES) == 2 and "numpy" in sys.modules:
        _PLAIN_TYPES.insert(0, sys.modules["numpy"].ndarray)


def _plain_type(fmt, itemsize):
    try:
        return _PLAIN_FORMATS[fmt]
    except KeyError:
        pass
    dt = None
    try:
        cand = _type_of_format(fmt)
        tm = cand._h.typemap
        if cand._h.committed and tm.extent == itemsize and tm.single_run() == (0, itemsize):
            dt = cand
    except Exception:            # no plain type: the general parser reports it
        dt = None
    _PLAIN_FORMATS[fmt] = dt
    return dt


def parse(msg, writable=False) -> Msg:
    """Parse a buffer message for point-to-point and rooted collectives (see the module)."""
    if isinstance(msg, Msg):
        return msg
    if len(_PLAIN_TYPES) == 2:
        _note_numpy()
    if type(msg) in _PLAIN_TYPES:
        # the common case, without the general parser: a whole contiguous
        # numpy array or bytes object of a predefined element type
        mv = memoryview(msg)
        if mv.nbytes and mv.c_contiguous and not (writable and mv.readonly):
            dt = _plain_type(mv.format, mv.itemsize)
            if dt is not None:
                flat = mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B")
                return Msg(flat, mv.nbytes // mv.itemsize, dt, 0, msg, True)
    buf, obj, count, displ, dtype = _simple(msg, writable)
    return _message(buf, obj, count, displ * dtype._h.typemap.extent, dtype, writable)


def parse_block(msg, size, writable=False):
    """Parse a message of ``size`` equal blocks (Scatter/Gather/Allgather/Alltoall).

    ``[buf, count, ...]`` gives the count per block; returns ``(Msg over the
    buffer, counts, displs)`` as :func:`parse_v` does.
    """
    buf, obj, count, displ, dtype = _simple(msg, writable, max(size, 1))
    extent = dtype._h.typemap.extent
    whole = _message(buf, obj, count * size, displ * extent, dtype, writable)
    return (Msg(whole.view, 0, dtype, whole.offset, obj), [count] * size,
            [i * count for i in range(size)])


def sub(m: Msg, count, displ) -> Msg:
    """The part of vector message ``m`` at element ``displ`` (``count`` elements)."""
    return Msg(m.view, count, m.dtype, m.offset + displ * m.dtype._h.typemap.extent, m.obj)


def parse_target(target, count: int, datatype: Datatype):
    """``(displacement, count, datatype)`` of a one-sided target spec.

    ``target`` is None, a displacement, or ``[displ[, count[, datatype]]]``;
    what is missing comes from the origin message (``count``, ``datatype``).
    Raises ValueError for other forms, MPI.Exception for a negative
    displacement (ERR_DISP) or count (ERR_COUNT) or an unusable datatype.
    """
    displ = 0
    if target is None:
        pass
    elif isinstance(target, (list, tuple)):
        if len(target) > 3:
            raise ValueError("target: expecting 3 items at most")
        if len(target) > 0:
            displ = operator.index(target[0])
        if len(target) > 1:
            count = operator.index(target[1])
        if len(target) > 2:
            datatype = _as_type(target[2])
    elif hasattr(target, "__index__") and not isinstance(target, (str, bytes)):
        displ = operator.index(target)
    else:
        raise ValueError("target: expecting integral or list/tuple")
    if displ < 0:
        raise Exception(ERR_DISP, f"invalid target displacement {displ}")
    if count < 0:
        raise Exception(ERR_COUNT, f"invalid target count {count}")
    if datatype._h is None:
        raise Exception(ERR_TYPE, "invalid datatype (DATATYPE_NULL)")
    _committed(datatype)
    return displ, count, datatype


# -- vector messages --------------------------------------------------------------------------
def _per_process(values, size, what):
    """Per-process ints from an int (same for all) or a sequence of ``size``."""
    try:
        v = operator.index(values)
    except TypeError:
        out = [operator.index(x) for x in values] if len(values) == size else None
        if out is None:
            raise ValueError(f"expecting {size} items, got {len(values)}") from None
        return out
    return [v] * size if what == "counts" else [i * v for i in range(size)]


def parse_v(msg, size, writable=False, counts_needed=True):
    """Parse a vector message (``Scatterv``/``Gatherv``/``Alltoallv``).

    Returns ``(Msg over the buffer, counts, displs)``, displacements in
    extents of the datatype (cumulative when not given).
    """
    if isinstance(msg, (list, tuple)):
        n = len(msg)
        if not 2 <= n <= 4:
            raise ValueError("message: expecting 2 to 4 items")
        if n == 4:
            obj, counts, displs, tspec = msg
        else:
            obj, x = msg[0], msg[1]
            tspec = msg[2] if n == 3 else None
            if n == 2 and (x is None or isinstance(x, (Datatype, str))):
                x, tspec = None, x
            counts, displs = x if isinstance(x, tuple) else (x, None)
    elif isinstance(msg, (str, int, float, complex, type)):
        raise TypeError("message: expecting buffer or list/tuple")
    else:
        obj, counts, displs, tspec = msg, None, None, None
    buf = acquire(obj, writable)
    dtype = _type_of_format(buf.format) if tspec is None else _as_type(tspec)
    impl = dtype._h
    if counts is None:
        if impl is None:
            raise ValueError("message: cannot infer count, datatype is null")
        extent = impl.typemap.extent
        if buf.nbytes and extent <= 0:
            raise ValueError(f"message: cannot infer count, datatype extent {extent} "
                             f"(lb:{impl.typemap.lb}, ub:{impl.typemap.ub})")
        if buf.nbytes and buf.nbytes % extent:
            raise ValueError(f"message: cannot infer count, buffer length {buf.nbytes} is "
                             f"not a multiple of datatype extent {extent}")
        entries = buf.nbytes // extent if buf.nbytes else 0
        counts = [entries // size] * size if size else []
    else:
        counts = _per_process(counts, size, "counts")
    if displs is None:
        displs = list(np.cumsum([0] + counts[:-1], dtype=np.int64).tolist()) if size else []
    else:
        displs = _per_process(displs, size, "displs")
    if impl is None:
        raise Exception(ERR_TYPE, "invalid datatype (DATATYPE_NULL)")
    if any(c < 0 for c in counts):
        raise Exception(ERR_COUNT, f"invalid count in {counts}")
    if obj is None and any(counts):
        raise Exception(ERR_BUFFER, "buffer is None but counts are not zero")
    _committed(dtype)
    tm = impl.typemap
    extent = tm.extent
    spans = [packing.span(d * extent, c, tm) for c, d in zip(counts, displs) if c > 0]
    spans = [(lo, hi) for lo, hi in spans if hi > lo]
    if buf.absolute:
        if not spans or tm.size == 0:
            return Msg(buf.view, 0, dtype, 0, obj), counts, displs
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        return Msg(_raw(lo, hi - lo), 0, dtype, -lo, obj), counts, displs
    for (lo, hi) in spans:
        if tm.size and (lo < 0 or hi > buf.nbytes):
            raise ValueError(f"message: counts {counts} at displacements {displs} reach bytes "
                             f"[{lo}, {hi}) outside a buffer of {buf.nbytes} bytes")
    return Msg(buf.view, 0, dtype, 0, obj), counts, displs


def parse_w(msg, size, writable=False) -> list:
    """Parse an ``Alltoallw`` message: ``[buf, counts, displs, datatypes]`` or
    ``[buf, (counts, displs), datatypes]`` or ``[buf, datatypes]``.

    Displacements are in bytes; returns one Msg per process.
    """
    if not isinstance(msg, (list, tuple)) or not 2 <= len(msg) <= 4:
        raise ValueError("message: expecting 2 to 4 items")
    obj, types = msg[0], msg[-1]
    counts = displs = None
    if len(msg) == 4:
        counts, displs = msg[1], msg[2]
    elif len(msg) == 3:
        counts, displs = msg[1]
    ntypes = len(types)
    if ntypes != size:
        raise ValueError(f"expecting {size} items, got {ntypes}")
    for t in types:
        if not isinstance(t, Datatype):
            raise TypeError(f"Cannot convert {type(t).__name__} to Datatype")
    buf = acquire(obj, writable)
    if counts is None and displs is None:
        if buf.absolute:
            raise ValueError("message: MPI.BOTTOM needs explicit counts and displacements")
        counts, displs = [1] * size, [0] * size
    elif buf.absolute and (counts is None or displs is None):
        raise ValueError("message: MPI.BOTTOM needs explicit counts and displacements")
    nc, nd = len(counts), len(displs)
    if nc != size or nd != size:
        raise ValueError(f"expecting {size} items, got {nc if nc != size else nd}")
    counts = [operator.index(c) for c in counts]
    displs = [operator.index(d) for d in displs]
    if any(c < 0 for c in counts):
        raise Exception(ERR_COUNT, f"invalid count in {counts}")
    parts = []
    for c, d, t in zip(counts, displs, types):
        if t._h is None:
            raise Exception(ERR_TYPE, "invalid datatype (DATATYPE_NULL)")
        _committed(t)
        if obj is None and c:
            raise Exception(ERR_BUFFER, "buffer is None but counts are not zero")
        parts.append(_message(buf, obj, c, d, t, writable))
    return parts


# -- whole-buffer packing (Datatype.Pack / Unpack) ------------------------------------------------
def pack_whole(datatype: Datatype, inbuf) -> np.ndarray:
    """Packed bytes of as many whole elements of ``datatype`` as ``inbuf`` holds."""
    impl = _committed(datatype)
    buf = acquire(inbuf)
    extent = impl.typemap.extent
    count = buf.nbytes // extent if extent > 0 else 0
    m = _message(buf, inbuf, count, 0, datatype)
    return np.frombuffer(m.pack(), np.uint8)


def unpack_whole(datatype: Datatype, inbuf, position, outbuf, external=False) -> int:
    """Unpack ``inbuf[position:]`` into as many whole elements as ``outbuf`` holds."""
    impl = _committed(datatype)
    src = acquire(inbuf)
    out = acquire(outbuf, writable=True)
    position = operator.index(position)
    if position < 0 or position > src.nbytes:
        raise Exception(ERR_ARG, f"invalid position {position}")
    tm = impl.typemap
    count = out.nbytes // tm.extent if tm.extent > 0 else 0
    m = _message(out, outbuf, count, 0, datatype, writable=True)
    avail = np.frombuffer(src.view, np.uint8)[position:]
    if external:
        per = external32.size(tm, 1)
        n = min(count, len(avail) // per) if per else 0
        native = external32.decode(avail[:n * per], tm, n)
        m.unpack(native, len(native))
        return position + n * per
    used = min(len(avail), count * tm.size)
    m.unpack(avail[:used], used)
    return position + used


# the buffer side of Datatype.Pack/Unpack (datatype does not import this module)
REGISTRY.update(pack_whole=pack_whole, unpack_whole=unpack_whole, acquire=acquire)
