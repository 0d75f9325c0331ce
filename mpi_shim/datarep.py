"""Data representations of MPI-IO file views (MPI 4.1, section 14.5).

A representation says how the data of a memory message looks in the file:

* ``"native"`` (and ``"internal"``, our own choice of format, the same):
  the bytes as they are in memory.
* ``"external32"``: MPI's portable form (big-endian, MPI's sizes; see
  :mod:`.external32`).
* a name given to ``MPI.Register_datarep``: the user's ``write_fn`` turns
  memory data into file bytes and ``read_fn`` turns them back (``None``:
  the bytes are copied as they are); ``extent_fn(datatype)`` says how many
  file bytes one basic datatype takes.

Supported layouts.  The file layout of a view's etype and filetype is
their memory layout, so a non-native representation is accepted for a
view only when every basic type in the etype and filetype takes as many
file bytes as it takes in memory (``INT``, ``DOUBLE``, ``FLOAT_INT`` ... in
external32, but not ``LONG``, 4 bytes in external32); ``Set_view`` raises
``ERR_UNSUPPORTED_DATAREP`` otherwise.  Memory messages convert whatever
their types.

A representation converts *streams*: the data of ``count`` consecutive
memory elements, in type-map order (what ``Pack`` produces), to file bytes
and back.  Streams are converted in pieces of whole elements, so the I/O
layer never holds more than one piece of a message at a time.
"""
from __future__ import annotations

import builtins

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import external32
from .datatype import _NAMED
from .exceptions import ERR_ARG, ERR_CONVERSION, ERR_DUP_DATAREP, ERR_UNSUPPORTED_DATAREP, \
    Exception
from .msgspec import Msg
from .typemap import ELEMENTS

MAX_DATAREP_STRING = 128


def _mpi_buffer():
    """MPI.buffer, whose module (numpy) is imported on first use (ucxpy.lazy)."""
    from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
    return buffer

PREDEFINED_DATAREPS = ("native", "internal", "external32")
_registered = {}                 # name -> UserRepresentation


def _part(msg: Msg, first: int, count: int) -> Msg:
    """Elements ``[first, first + count)`` of ``msg`` as a message of their own."""
    return Msg(msg.view, count, msg.dtype, msg.offset + first * msg.dtype._h.typemap.extent,
               msg.obj)


class NativeRepresentation:
    """File bytes are memory bytes."""

    native = True

    def __init__(self, name="native"):
        self.name = name

    def check_view(self, *datatypes) -> None:
        """Accept any etype and filetype."""

    def file_extent(self, datatype) -> int:
        """File bytes between one element of ``datatype`` and the next."""
        return datatype._impl().typemap.extent

    def stream_size(self, msg: Msg) -> int:
        """File bytes of the message's data."""
        return msg.nbytes

    def element_size(self, msg: Msg) -> int:
        """File bytes of one element of the message."""
        return msg.dtype._h.typemap.size

    def encode(self, msg: Msg, first: int, count: int):
        """File bytes of elements ``[first, first + count)`` of ``msg``."""
        return _part(msg, first, count).pack()

    def decode(self, msg: Msg, first: int, count: int, data, nbytes: int) -> int:
        """Store the first ``nbytes`` file bytes ``data`` of elements
        ``[first, first + count)`` into ``msg``; returns the memory bytes stored."""
        _part(msg, first, count).unpack(data, nbytes)
        return nbytes


class External32Representation(NativeRepresentation):
    """MPI's portable representation (big-endian, MPI's sizes)."""

    native = False

    def __init__(self):
        super().__init__("external32")

    def check_view(self, *datatypes) -> None:
        """Raise ERR_UNSUPPORTED_DATAREP when a basic type's external32 size is not
        its memory size (see the module docstring)."""
        for dt in datatypes:
            for code in dt._impl().typemap.kinds():
                e = ELEMENTS[code]
                if e.ext32.itemsize != e.size:
                    raise Exception(ERR_UNSUPPORTED_DATAREP,
                                    f"external32 file views of {e.name} are not supported: it "
                                    f"takes {e.ext32.itemsize} bytes in external32 and "
                                    f"{e.size} in memory")

    def file_extent(self, datatype) -> int:
        """External32 extent of ``datatype``; raises ERR_UNSUPPORTED_DATAREP for a
        derived type whose basic types change size in external32."""
        impl = datatype._impl()
        tm = impl.typemap
        if all(ELEMENTS[c].ext32.itemsize == ELEMENTS[c].size for c in tm.kinds()):
            return tm.extent
        if impl.predefined:
            return tm.ext32_layout()[0]
        raise Exception(ERR_UNSUPPORTED_DATAREP, "the external32 extent of a derived type "
                        "whose basic types change size in external32 is not supported")

    def stream_size(self, msg: Msg) -> int:
        """File bytes of the message's data."""
        return msg.count * self.element_size(msg)

    def element_size(self, msg: Msg) -> int:
        """File bytes of one element of the message."""
        return msg.dtype._h.typemap.ext32_layout()[0]

    def encode(self, msg: Msg, first: int, count: int):
        """File bytes of elements ``[first, first + count)`` of ``msg``."""
        packed = np.frombuffer(_part(msg, first, count).pack(), np.uint8)
        return external32.encode(packed, msg.dtype._h.typemap, count)

    def decode(self, msg: Msg, first: int, count: int, data, nbytes: int) -> int:
        """Store file bytes of elements of ``msg``; returns the memory bytes stored."""
        tm = msg.dtype._h.typemap
        per = self.element_size(msg)
        whole, rest = divmod(nbytes, per)
        stored = 0
        if whole:
            ext = np.frombuffer(data, np.uint8, whole * per)
            _part(msg, first, whole).unpack(external32.decode(ext, tm, whole))
            stored = whole * tm.size
        if rest and whole < count:
            # the end of the file cut an element: its whole basic elements
            part = np.zeros(per, np.uint8)
            part[:rest] = np.frombuffer(data, np.uint8, rest, whole * per)
            keep = tm.bytes_of(_ext32_elements_in(tm, rest))
            _part(msg, first + whole, 1).unpack(external32.decode(part, tm, 1), keep)
            stored += keep
        return stored


def _ext32_elements_in(tm, nbytes: int) -> int:
    """Basic elements wholly inside the first ``nbytes`` external32 bytes of one element."""
    sizes = np.array([ELEMENTS[c].ext32.itemsize for c in tm.codes.tolist()], np.int64)
    ends = np.cumsum(tm.counts * sizes)
    j = int(np.searchsorted(ends, nbytes, side="right"))
    done = int(tm.counts[:j].sum())
    if j < len(sizes):
        done += (nbytes - (int(ends[j - 1]) if j else 0)) // int(sizes[j])
    return done


class UserRepresentation(NativeRepresentation):
    """A representation registered with ``MPI.Register_datarep``."""

    def __init__(self, name, read_fn, write_fn, extent_fn):
        super().__init__(name)
        self.read_fn, self.write_fn, self.extent_fn = read_fn, write_fn, extent_fn
        self.native = read_fn is None and write_fn is None
        self._extents = {}            # element code -> file bytes

    def _element_extent(self, code: int) -> int:
        ext = self._extents.get(code)
        if ext is None:
            dt = _basic_datatypes().get(code)
            if dt is None:
                raise Exception(ERR_UNSUPPORTED_DATAREP, f"no basic datatype for element "
                                f"{ELEMENTS[code].name}")
            try:
                ext = int(self.extent_fn(dt))
            except Exception:
                raise
            except builtins.Exception as e:
                raise Exception(ERR_CONVERSION, f"extent_fn of data representation "
                                f"{self.name!r} failed: {e!r}") from None
            self._extents[code] = ext
        return ext

    def check_view(self, *datatypes) -> None:
        """Raise ERR_UNSUPPORTED_DATAREP when ``extent_fn`` gives a basic type other
        than its memory size (see the module docstring)."""
        for dt in datatypes:
            for code in dt._impl().typemap.kinds():
                ext = self._element_extent(code)
                if ext != ELEMENTS[code].size:
                    raise Exception(ERR_UNSUPPORTED_DATAREP,
                                    f"data representation {self.name!r} gives "
                                    f"{ELEMENTS[code].name} {ext} file bytes, its memory size "
                                    f"is {ELEMENTS[code].size}: such file views are not "
                                    f"supported")

    def file_extent(self, datatype) -> int:
        """File bytes between one element of ``datatype`` and the next."""
        impl = datatype._impl()
        tm = impl.typemap
        if all(self._element_extent(c) == ELEMENTS[c].size for c in tm.kinds()):
            return tm.extent
        if impl.predefined and len(tm.kinds()) == 1:
            return self._element_extent(next(iter(tm.kinds())))
        raise Exception(ERR_UNSUPPORTED_DATAREP, f"the {self.name!r} extent of a derived type "
                        f"whose basic types change size is not supported")

    def stream_size(self, msg: Msg) -> int:
        """File bytes of the message's data."""
        return msg.count * self.element_size(msg)

    def element_size(self, msg: Msg) -> int:
        """File bytes of one element of the message."""
        tm = msg.dtype._h.typemap
        return int(sum(int(n) * self._element_extent(int(c))
                       for c, n in zip(tm.codes, tm.counts)))

    def _userbuf(self, msg: Msg, readonly: bool):
        return _mpi_buffer().frombuffer(msg.view[msg.offset:], readonly=readonly)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            raise
        except builtins.Exception as e:
            raise Exception(ERR_CONVERSION, f"conversion function of data representation "
                            f"{self.name!r} failed: {e!r}") from None

    def encode(self, msg: Msg, first: int, count: int):
        """File bytes of elements ``[first, first + count)`` of ``msg``."""
        if self.write_fn is None:
            return super().encode(msg, first, count)
        filebuf = bytearray(count * self.element_size(msg))
        self._call(self.write_fn, self._userbuf(msg, True), msg.dtype, count,
                   _mpi_buffer().frombuffer(filebuf), first)
        return memoryview(filebuf)

    def decode(self, msg: Msg, first: int, count: int, data, nbytes: int) -> int:
        """Store file bytes of elements of ``msg``; returns the memory bytes stored."""
        if self.read_fn is None:
            return super().decode(msg, first, count, data, nbytes)
        per = self.element_size(msg)
        whole = nbytes // per if per else 0
        if whole:
            filebuf = _mpi_buffer().frombuffer(memoryview(data)[:whole * per], readonly=True)
            self._call(self.read_fn, self._userbuf(msg, False), msg.dtype, whole, filebuf,
                       first)
        return whole * msg.dtype._h.typemap.size


_NATIVE = NativeRepresentation()
_INTERNAL = NativeRepresentation("internal")
_EXTERNAL32 = External32Representation()


def representation(name):
    """The representation called ``name``; raises ERR_UNSUPPORTED_DATAREP for
    an unknown name."""
    if isinstance(name, bytes):
        name = name.decode()
    if not isinstance(name, str):
        raise TypeError(f"expected a str data representation, got {type(name).__name__}")
    rep = {"native": _NATIVE, "internal": _INTERNAL, "external32": _EXTERNAL32}.get(name) or \
        _registered.get(name)
    if rep is None:
        raise Exception(ERR_UNSUPPORTED_DATAREP, f"unknown data representation {name!r} "
                        f"(known: {', '.join(PREDEFINED_DATAREPS + tuple(_registered))})")
    return rep


def register(name, read_fn, write_fn, extent_fn) -> None:
    """Register a user data representation (``MPI.Register_datarep``)."""
    if isinstance(name, bytes):
        name = name.decode()
    if not isinstance(name, str):
        raise TypeError(f"expected a str data representation, got {type(name).__name__}")
    if not name or len(name) > MAX_DATAREP_STRING:
        raise Exception(ERR_ARG, f"data representation names have 1 to {MAX_DATAREP_STRING} "
                        f"characters")
    for fn, what in ((read_fn, "read_fn"), (write_fn, "write_fn")):
        if fn is not None and not callable(fn):
            raise TypeError(f"{what} must be callable or None")
    if not callable(extent_fn):
        raise TypeError("extent_fn must be callable")
    if name in PREDEFINED_DATAREPS or name in _registered:
        raise Exception(ERR_DUP_DATAREP, f"data representation {name!r} already exists")
    _registered[name] = UserRepresentation(name, read_fn, write_fn, extent_fn)


_BASIC = {}


def _basic_datatypes() -> dict:
    """Element code -> the predefined datatype made of one such element."""
    if not _BASIC:
        for const in _NAMED.values():
            impl = const._h
            if impl is None:
                continue
            tm = impl.typemap
            if len(tm.codes) == 1 and int(tm.counts[0]) == 1:
                _BASIC.setdefault(int(tm.codes[0]), const)
    return _BASIC
