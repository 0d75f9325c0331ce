"""``MPI.Datatype``: predefined and derived datatypes.

A :class:`Datatype` is a handle (:mod:`.handle`) on a
:class:`~.typeimpl.TypeImpl`, which holds the true layout (a
:class:`~.typemap.Typemap`), the combiner and arguments it was made with
(``Get_envelope``/``Get_contents``/``decode``), name, commit state, cached
attributes and a reference count.  This module has the queries, life
cycle, packing and attribute calls and the predefined constants; the
constructors are in :mod:`.typecreate`, decoding/pickling/transport
descriptions in :mod:`.typedesc`.

Predefined types come from the table in :mod:`.predefined`; aliases
(``INT``/``SIGNED_INT``) are one object, unsupported types are null.
Packing (``Pack``/``Unpack``/external32) runs through :mod:`.msgspec`
messages, :mod:`.packing` and :mod:`.external32`.

For other modules: :func:`reduction_dtype` (the numpy dtype reductions work
on), :func:`describe`/:func:`from_description` (a compact, picklable form
of a datatype that another process can rebuild, e.g. for accumulates).
"""
from __future__ import annotations

import threading

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import constructors as C
from . import external32
from . import predefined as P
from . import typeattr
from .constructors import (COMBINER_CONTIGUOUS, COMBINER_DARRAY, COMBINER_DUP,  # noqa: F401
                           COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER, COMBINER_F90_REAL,
                           COMBINER_HINDEXED, COMBINER_HINDEXED_BLOCK, COMBINER_HVECTOR,
                           COMBINER_INDEXED, COMBINER_INDEXED_BLOCK, COMBINER_NAMED,
                           COMBINER_RESIZED, COMBINER_STRUCT, COMBINER_SUBARRAY,
                           COMBINER_VALUE_INDEX, COMBINER_VECTOR, DISTRIBUTE_BLOCK,
                           DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG, DISTRIBUTE_NONE, ORDER_C,
                           ORDER_FORTRAN)
from .exceptions import ERR_ARG, ERR_COMM, ERR_TRUNCATE, ERR_TYPE, Exception
from .handle import Handle, name_constants, register_family
from .typecreate import DatatypeConstructors, _as_datatype
from .typedesc import _datatype_create
from .typedesc import (_datatype_decode, _typealign, _typecode, describe,  # noqa: F401
                       from_description)
from .typeimpl import F90_COMBINERS as _F90
from .typeimpl import REGISTRY, TypeImpl
from .typemap import Typemap

UNDEFINED = -32766
ORDER_F = ORDER_FORTRAN
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4


class Datatype(DatatypeConstructors, Handle):
    """Datatype object."""

    __slots__ = ()

    @classmethod
    def _accepts(cls, impl) -> bool:
        return impl is None or isinstance(impl, TypeImpl)

    def __reduce__(self):
        impl = self._h
        if impl is None:
            return (_named, ("DATATYPE_NULL",)) if self._const else (type(self), ())
        if impl.constant is not None:
            if self._const:
                return (_named, (impl.constant,))
            return (type(self), (_named(impl.constant),))
        base, name, params = self.decode()
        return (_datatype_create, (base, name, params, True))

    def _impl(self) -> TypeImpl:
        impl = self._h
        if impl is None or impl.freed:
            raise Exception(ERR_TYPE, "invalid datatype")
        return impl

    def _new(self, typemap, combiner, params, children):
        return Datatype._wrap(TypeImpl(typemap, combiner, params, children))

    def _release(self) -> None:
        self._h.release(Datatype._wrap, self)

    # -- size and bounds ---------------------------------------------------------------
    def Get_size(self) -> int:
        """Return the number of bytes occupied by entries in the datatype.

        Raises MPI.Exception (ERR_TYPE) for a null or freed datatype.
        """
        return self._impl().typemap.size

    def Get_extent(self) -> tuple:
        """Return lower bound and extent of the datatype.

        Raises MPI.Exception (ERR_TYPE) for a null or freed datatype.
        """
        tm = self._impl().typemap
        return tm.lb, tm.extent

    def Get_true_extent(self) -> tuple:
        """Return the true lower bound and extent of the data in the datatype.

        The true extent spans the bytes the data occupies, ignoring resizing.
        """
        lo, hi = self._impl().typemap.true_bounds
        return lo, hi - lo

    @property
    def size(self) -> int:
        """Size (in bytes).

        Same as Get_size().
        """
        return self.Get_size()

    @property
    def extent(self) -> int:
        """Extent (in bytes).

        The distance between successive elements in a buffer.
        """
        return self._impl().typemap.extent

    @property
    def lb(self) -> int:
        """Lower bound (in bytes).

        The displacement where an element starts.
        """
        return self._impl().typemap.lb

    @property
    def ub(self) -> int:
        """Upper bound (in bytes).

        Lower bound plus extent.
        """
        return self._impl().typemap.ub

    @property
    def true_lb(self) -> int:
        """True lower bound (in bytes).

        The displacement of the first byte of data.
        """
        return self._impl().typemap.true_bounds[0]

    @property
    def true_ub(self) -> int:
        """True upper bound (in bytes).

        The displacement just past the last byte of data.
        """
        return self._impl().typemap.true_bounds[1]

    @property
    def true_extent(self) -> int:
        """True extent (in bytes).

        True upper bound minus true lower bound.
        """
        lo, hi = self._impl().typemap.true_bounds
        return hi - lo

    # -- names and codes ------------------------------------------------------------------
    def Get_name(self) -> str:
        """Get the print name for this datatype.

        A null handle is named "MPI_DATATYPE_NULL"; derived types start unnamed.
        """
        return "MPI_DATATYPE_NULL" if self._h is None else self._impl().name

    def Set_name(self, name: str) -> None:
        """Set the print name for this datatype.

        Raises MPI.Exception (ERR_TYPE) for a null datatype.
        """
        self._impl().name = str(name)

    @property
    def name(self) -> str:
        """Print name.

        Same as Get_name() and Set_name().
        """
        return self.Get_name()

    @name.setter
    def name(self, value: str) -> None:
        self.Set_name(value)

    @property
    def typechar(self) -> str:
        """Character code.

        Empty for a null datatype, "V" for derived types without a code.
        """
        return "" if self._h is None else self._h.codes()[1]

    @property
    def typestr(self) -> str:
        """Type string.

        A numpy-style type string, e.g. "i4" or "V16" for a pair type.
        """
        return "" if self._h is None else self._h.codes()[2]

    def tocode(self) -> str:
        """Get character code or type string from predefined MPI datatype.

        Raises ValueError when the datatype has no code (null, pair, derived).
        """
        code = self._h.codes()[0] if self._h is not None else None
        if code is None:
            raise ValueError("cannot map to character code or type string")
        return code

    @classmethod
    def fromcode(cls, code: str) -> "Datatype":
        """Get predefined MPI datatype from character code or type string.

        Raises ValueError for a code no datatype has.
        """
        name = P.CODES.get(code) if isinstance(code, str) else None
        if name is None:
            raise ValueError(f"cannot map code {code!r} to MPI datatype")
        return _NAMED[name]

    # -- kind and construction history -----------------------------------------------------
    @property
    def is_named(self) -> bool:
        """Is a named datatype.

        True for the predefined named types, False for derived and F90 types.
        """
        return self._impl().combiner == COMBINER_NAMED

    @property
    def is_predefined(self) -> bool:
        """Is a predefined datatype.

        True for named and F90 types and for the null handle.
        """
        return self._h is None or self._h.predefined

    def Get_envelope(self) -> tuple:
        """Return the number of input arguments used to create a datatype.

        Returns (integers, addresses, large counts, datatypes, combiner).
        """
        impl = self._impl()
        ints, aints, counts = C.contents(impl.combiner, impl.params)
        return len(ints), len(aints), len(counts), len(impl.children), impl.combiner

    @property
    def envelope(self) -> tuple:
        """Envelope information.

        Same as Get_envelope().
        """
        return self.Get_envelope()

    @property
    def combiner(self) -> int:
        """Combiner.

        The COMBINER_* constant of the constructor that made the type.
        """
        return self._impl().combiner

    def Get_contents(self) -> tuple:
        """Return the input arguments used to create a datatype.

        Raises MPI.Exception (ERR_TYPE) for a named datatype.

        The derived datatypes returned are new references the caller frees.
        """
        impl = self._impl()
        if impl.combiner == COMBINER_NAMED:
            raise Exception(ERR_TYPE, "a named datatype has no contents")
        ints, aints, counts = C.contents(impl.combiner, impl.params)
        return list(ints), list(aints), list(counts), [_reference(c) for c in impl.children]

    @property
    def contents(self) -> tuple:
        """Datatype contents.

        Same as Get_contents().
        """
        return self.Get_contents()

    def decode(self) -> tuple:
        """Convenience method for decoding a datatype.

        Returns (base datatype, combiner name, keyword arguments of the constructor).
        """
        impl = self._impl()
        combiner = impl.combiner
        if combiner == COMBINER_NAMED:
            return self, "NAMED", {}
        params = dict(impl.params)
        if combiner == COMBINER_STRUCT:
            params["datatypes"] = [_reference(c) for c in impl.children]
            base = Datatype._wrap(None)
        elif combiner in _F90:
            base = Datatype._wrap(None)
        else:
            base = _reference(impl.children[0])
        return base, C.NAMES[combiner], params

    # -- life cycle -------------------------------------------------------------------------
    def Commit(self) -> "Datatype":
        """Commit the datatype.

        Returns the datatype itself; raises MPI.Exception (ERR_TYPE) when null.
        """
        self._impl().committed = True
        return self

    def Free(self) -> None:
        """Free the datatype.

        Raises MPI.Exception (ERR_TYPE) for null and predefined datatypes.
        """
        impl = self._impl()
        if impl.predefined:
            raise Exception(ERR_TYPE, "cannot free a predefined datatype")
        self._h = None
        impl.release(Datatype._wrap)

    def Dup(self) -> "Datatype":
        """Duplicate a datatype.

        The duplicate keeps the layout, commit state and copied attributes.
        """
        impl = self._impl()
        new = TypeImpl(impl.typemap, COMBINER_DUP, {}, [impl])
        new.committed = impl.committed
        if not impl.attrs:
            return Datatype._wrap(new)
        try:
            new.attrs = typeattr.copy_attrs(self, impl.attrs)
        except BaseException:
            new.release(Datatype._wrap)
            raise
        return Datatype._wrap(new)

    Create_dup = Dup

    # -- packing --------------------------------------------------------------------------
    def Pack(self, inbuf, outbuf, position: int, comm) -> int:
        """Pack into contiguous memory according to datatype.

        Returns the new position; raises MPI.Exception (ERR_TRUNCATE) when the data does not fit.

        As many whole elements as ``inbuf`` holds are packed at ``outbuf[position:]``.
        """
        _check_comm(comm)
        data = _msgspec("pack_whole")(self, inbuf)
        return _store(outbuf, position, data)

    def Unpack(self, inbuf, position: int, outbuf, comm) -> int:
        """Unpack from contiguous memory according to datatype.

        Returns the new position in ``inbuf``.

        As many whole elements as ``outbuf`` holds are unpacked from ``inbuf[position:]``.
        """
        _check_comm(comm)
        return _msgspec("unpack_whole")(self, inbuf, position, outbuf, external=False)

    def Pack_size(self, count: int, comm) -> int:
        """Return the upper bound on the amount of space needed to pack a message.

        Raises MPI.Exception (ERR_COUNT) for a negative count.
        """
        _check_comm(comm)
        return C.count_arg(count) * _committed(self).typemap.size

    def Pack_external(self, datarep: str, inbuf, outbuf, position: int) -> int:
        """Pack into contiguous memory in a portable data representation.

        Only "external32" is supported (big-endian, MPI's sizes).
        """
        _check_datarep(datarep)
        impl = _committed(self)
        data = _msgspec("pack_whole")(self, inbuf)
        count = len(data) // impl.typemap.size if impl.typemap.size else 0
        return _store(outbuf, position, external32.encode(data, impl.typemap, count))

    def Unpack_external(self, datarep: str, inbuf, position: int, outbuf) -> int:
        """Unpack from contiguous memory in a portable data representation.

        Only "external32" is supported.
        """
        _check_datarep(datarep)
        return _msgspec("unpack_whole")(self, inbuf, position, outbuf, external=True)

    def Pack_external_size(self, datarep: str, count: int) -> int:
        """Return the space needed to pack a message in a portable data representation.

        Raises MPI.Exception (ERR_ARG) for a data representation other than "external32".
        """
        _check_datarep(datarep)
        return external32.size(_committed(self).typemap, C.count_arg(count))

    # -- attributes -------------------------------------------------------------------------
    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
        """Create a new attribute key for datatypes.

        The copy function runs on Dup, the delete function on Delete_attr and Free.
        """
        return typeattr.create_keyval(copy_fn, delete_fn, nopython)

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        """Free an attribute key for datatypes.

        Returns KEYVAL_INVALID.
        """
        return typeattr.free_keyval(keyval)

    def Set_attr(self, keyval: int, attrval) -> None:
        """Store attribute value associated with a key.

        A value already stored is deleted first (its delete callback runs).
        """
        typeattr.set_attr(self, self._impl().attrs, keyval, attrval)

    def Get_attr(self, keyval: int):
        """Retrieve attribute value by key.

        Returns None when nothing is stored; raises MPI.Exception (ERR_KEYVAL) for a bad key.
        """
        return typeattr.get_attr(self._impl().attrs, keyval)

    def Delete_attr(self, keyval: int) -> None:
        """Delete attribute value associated with a key.

        Runs the key's delete callback.
        """
        typeattr.delete_attr(self, self._impl().attrs, keyval)


# ``Datatype(x)`` accepts datatypes only.  The family is set on the constructor
# mixin rather than on Datatype itself, so that walking ``vars(MPI.Datatype)``
# (mpi4py's test_doc does) does not find the class inside itself.
register_family(Datatype)


# -- helpers ---------------------------------------------------------------------------------
def _reference(impl: TypeImpl) -> Datatype:
    """A handle on ``impl`` for the caller: the constant of a predefined type,
    else a new reference."""
    if impl.constant is not None and impl.combiner == COMBINER_NAMED:
        return _NAMED[impl.constant]
    if not impl.predefined:
        impl.refs += 1
    return Datatype._wrap(impl)


def _committed(datatype: Datatype) -> TypeImpl:
    """The implementation of a datatype usable for communication.

    Raises MPI.Exception (ERR_TYPE) when null, freed or not committed.
    """
    impl = _as_datatype(datatype)._impl()
    if not impl.committed:
        raise Exception(ERR_TYPE, "datatype has not been committed")
    return impl


def _check_comm(comm) -> None:
    if comm is None or not comm:
        raise Exception(ERR_COMM, "invalid communicator")


def _check_datarep(datarep) -> None:
    if datarep != "external32":
        raise Exception(ERR_ARG, f"unsupported data representation {datarep!r}")


def _msgspec(name: str):
    """The buffer side of Pack/Unpack, which .msgspec registers at its
    import (it imports this module; the MPI facade imports it)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise RuntimeError("mpi_shim.msgspec is not imported: use mpi_shim.MPI") from None


def _store(outbuf, position, data) -> int:
    out = _msgspec("acquire")(outbuf, writable=True)
    position = C.index(position)
    end = position + len(data)
    if position < 0:
        raise Exception(ERR_ARG, f"invalid position {position}")
    if end > out.nbytes:
        raise Exception(ERR_TRUNCATE, f"{len(data)} packed bytes do not fit at position "
                                      f"{position} of a buffer of {out.nbytes} bytes")
    out.view[position:end] = memoryview(data).cast("B")
    return end


def reduction_dtype(datatype: Datatype):
    """The numpy dtype of one packed reduction element, or None (mixed types)."""
    unit = datatype._impl().unit
    return unit.numpy if unit is not None else None




# -- predefined datatypes --------------------------------------------------------------------
def _named(name: str) -> Datatype:
    """The predefined datatype constant called ``name``."""
    return _NAMED[name]


def _build_predefined() -> dict:
    """The predefined constants, without their layouts: :func:`_realize`
    makes those (with numpy) when one is first used."""
    consts = {}
    for names, mpi_name, _dtype, code, char, tstr, align, _ext in P.NAMED:
        impl = TypeImpl(None, COMBINER_NAMED, name=mpi_name)
        impl.code, impl.typechar, impl.typestr, impl.align = code, char, tstr, align
        impl.unit, impl.constant = impl, names[0]
        const = Datatype._constant(impl)
        for n in names:
            consts[n] = const
    for names, mpi_name, _value, _index, _idisp, extent, align in P.PAIRS:
        impl = TypeImpl(None, COMBINER_NAMED, name=mpi_name)
        impl.typechar, impl.typestr, impl.align = "V", f"V{extent}", align
        impl.unit, impl.constant = impl, names[0]
        const = Datatype._constant(impl)
        for n in names:
            consts[n] = const
    for n in P.NULL:
        consts[n] = Datatype._constant(None)
    return consts


_REALIZED = threading.Lock()


def _realize() -> None:
    """Give every predefined type its type map and numpy dtype (once; a
    thread that comes while another does it waits for it)."""
    with _REALIZED:
        if TypeImpl.realize is not None:
            _realize_all()
            TypeImpl.realize = None


def _realize_all() -> None:
    codes = P.register_elements()
    for names, mpi_name, dtype, *_ in P.NAMED:
        impl = _NAMED[names[0]]._h
        impl.typemap, impl.numpy = Typemap.basic(codes[mpi_name]), np.dtype(dtype)
    for names, _mpi_name, value, index, idisp, extent, align in P.PAIRS:
        v, i = _NAMED[value]._h, _NAMED[index]._h
        impl = _NAMED[names[0]]._h
        impl.typemap = Typemap.from_parts([(0, v.typemap.codes[0]), (idisp, i.typemap.codes[0])],
                                          0, extent, align)
        impl.numpy = np.dtype([("v", v.numpy), ("i", i.numpy)])


_NAMED = _build_predefined()
TypeImpl.realize = _realize
REGISTRY.update(Datatype=Datatype, named=_NAMED)
DATATYPE_NULL = Datatype._constant(None)
_NAMED["DATATYPE_NULL"] = DATATYPE_NULL
globals().update({k: v for k, v in _NAMED.items() if k != "DATATYPE_NULL"})
#: the predefined datatype constants (``from .datatype import *``)
__all__ = sorted(_NAMED) + [n for n in dir() if n.startswith(("COMBINER_", "TYPECLASS_",
                                                                "DISTRIBUTE_", "ORDER_"))] + \
    ["UNDEFINED", "Datatype"]
name_constants(globals())
