"""``MPI.Datatype``: predefined and derived datatypes.

A :class:`Datatype` is a handle (:mod:`.handle`) on a :class:`TypeImpl`,
which holds the true layout (a :class:`~.typemap.Typemap`), the combiner and
arguments it was made with (``Get_envelope``/``Get_contents``/``decode``),
its name, commit state, cached attributes and a reference count: derived
types keep their component types alive, ``Get_contents`` hands out new
references, and ``Free`` drops one; attribute delete callbacks run when the
last reference goes.

Predefined types come from the table in :mod:`.predefined`; aliases
(``INT``/``SIGNED_INT``) are one object, unsupported types are null.
Packing (``Pack``/``Unpack``/external32) runs through :mod:`.msgspec`
messages, :mod:`.packing` and :mod:`.external32`.

For other modules: :func:`reduction_dtype` (the numpy dtype reductions work
on), :func:`describe`/:func:`from_description` (a compact, picklable form
of a datatype that another process can rebuild, e.g. for accumulates).
"""
from __future__ import annotations

import numpy as np

from . import constructors as C
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
from .handle import Handle, name_constants
from .typemap import Typemap

UNDEFINED = -32766
ORDER_F = ORDER_FORTRAN
TYPECLASS_REAL, TYPECLASS_INTEGER, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4
_TYPECLASS = {1: "REAL", 2: "INTEGER", 3: "COMPLEX", 4: "LOGICAL"}
_F90 = (COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_F90_COMPLEX)


class TypeImpl:
    """The object a Datatype handle refers to (see the module docstring)."""

    __slots__ = ("typemap", "name", "combiner", "params", "children", "predefined",
                 "committed", "refs", "freed", "attrs", "code", "typechar", "typestr",
                 "align", "numpy", "unit", "constant", "_hid", "__weakref__")

    def __init__(self, typemap, combiner, params=None, children=(), name=""):
        self.typemap, self.combiner, self.name = typemap, combiner, name
        self.params = params or {}
        self.children = list(children)
        self.predefined = combiner == COMBINER_NAMED or combiner in _F90
        self.committed = self.predefined
        self.refs, self.freed, self.attrs = 1, False, {}
        self.code = self.typechar = self.typestr = self.align = self.numpy = None
        self.constant = None                 # module name of a predefined type
        units = {c.unit for c in self.children}
        self.unit = units.pop() if len(units) == 1 else None
        for child in self.children:
            child.refs += 1

    def release(self, handle) -> None:
        """Drop one reference; the last one deletes attributes and components."""
        if self.predefined or self.freed:
            return
        self.refs -= 1
        if self.refs > 0:
            return
        self.freed = True
        try:
            typeattr.delete_all(handle, self.attrs)
        finally:
            for child in self.children:
                child.release(Datatype._wrap(child))

    def codes(self):
        """``(type code or None, typechar, typestr)`` (duplicates follow their base)."""
        impl = self
        while impl.combiner == COMBINER_DUP:
            impl = impl.children[0]
        if impl.typechar is not None:
            return impl.code, impl.typechar, impl.typestr
        return None, "V", f"V{impl.typemap.extent}"


class Datatype(Handle):
    """Datatype object."""

    __slots__ = ()

    def __init__(self, datatype=None):
        if datatype is not None and not isinstance(datatype, Datatype):
            raise TypeError(f"expected a Datatype, not {type(datatype).__name__}")
        super().__init__(datatype)

    @classmethod
    def _accepts(cls, impl) -> bool:
        return impl is None or isinstance(impl, TypeImpl)

    def __reduce__(self):
        impl = self._h
        if impl is None:
            return (_named, ("DATATYPE_NULL",)) if self._const else (Datatype, ())
        if impl.constant is not None:
            if self._const:
                return (_named, (impl.constant,))
            return (Datatype, (_named(impl.constant),))
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
        self._h.release(self)

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

        Raises MPI.Exception (ERR_TYPE) for a named datatype; the returned
        derived datatypes are new references the caller should free.
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
        if impl.combiner == COMBINER_NAMED:
            return self, "NAMED", {}
        params = dict(impl.params)
        if impl.combiner == COMBINER_STRUCT:
            params["datatypes"] = [_reference(c) for c in impl.children]
            base = Datatype()
        elif impl.combiner in _F90:
            base = Datatype()
        else:
            base = _reference(impl.children[0])
        return base, C.NAMES[impl.combiner], params

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
        impl.release(Datatype._wrap(impl))

    def Dup(self) -> "Datatype":
        """Duplicate a datatype.

        The duplicate keeps the layout, commit state and copied attributes.
        """
        impl = self._impl()
        new = TypeImpl(impl.typemap, COMBINER_DUP, {}, [impl])
        new.committed = impl.committed
        try:
            new.attrs = typeattr.copy_attrs(self, impl.attrs)
        except BaseException:
            new.release(Datatype._wrap(new))
            raise
        return Datatype._wrap(new)

    Create_dup = Dup

    # -- derived datatype constructors --------------------------------------------------------
    def Create_contiguous(self, count: int) -> "Datatype":
        """Create a contiguous datatype.

        Raises MPI.Exception (ERR_COUNT) for a negative count.
        """
        impl = self._impl()
        count = C.count_arg(count)
        return self._new(C.contiguous(impl.typemap, count), COMBINER_CONTIGUOUS,
                         {"count": count}, [impl])

    def Create_vector(self, count: int, blocklength: int, stride: int) -> "Datatype":
        """Create a vector (strided) datatype.

        The stride is in extents of the old type.
        """
        impl = self._impl()
        count, bl = C.count_arg(count), C.lengths_arg([blocklength])[0]
        stride = C.index(stride)
        tm = C.vector(impl.typemap, count, bl, stride * impl.typemap.extent)
        return self._new(tm, COMBINER_VECTOR,
                         {"count": count, "blocklength": bl, "stride": stride}, [impl])

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> "Datatype":
        """Create a vector (strided) datatype with stride in bytes.

        Raises MPI.Exception (ERR_COUNT) for a negative count.
        """
        impl = self._impl()
        count, bl = C.count_arg(count), C.lengths_arg([blocklength])[0]
        stride = C.index(stride)
        return self._new(C.vector(impl.typemap, count, bl, stride), COMBINER_HVECTOR,
                         {"count": count, "blocklength": bl, "stride": stride}, [impl])

    def Create_indexed(self, blocklengths, displacements) -> "Datatype":
        """Create an indexed datatype.

        Displacements are in extents of the old type.
        """
        impl = self._impl()
        disps = C.ints(displacements)
        bls = C.lengths_arg(blocklengths, len(disps))
        tm = C.indexed(impl.typemap, bls, np.asarray(disps, np.int64) * impl.typemap.extent)
        return self._new(tm, COMBINER_INDEXED,
                         {"blocklengths": bls, "displacements": disps}, [impl])

    def Create_hindexed(self, blocklengths, displacements) -> "Datatype":
        """Create an indexed datatype with displacements in bytes.

        Raises ValueError when the two sequences differ in length.
        """
        impl = self._impl()
        disps = C.ints(displacements)
        bls = C.lengths_arg(blocklengths, len(disps))
        return self._new(C.indexed(impl.typemap, bls, disps), COMBINER_HINDEXED,
                         {"blocklengths": bls, "displacements": disps}, [impl])

    def Create_indexed_block(self, blocklength: int, displacements) -> "Datatype":
        """Create an indexed datatype with constant-sized blocks.

        Displacements are in extents of the old type.
        """
        impl = self._impl()
        bl, disps = C.lengths_arg([blocklength])[0], C.ints(displacements)
        tm = C.indexed(impl.typemap, [bl] * len(disps),
                       np.asarray(disps, np.int64) * impl.typemap.extent)
        return self._new(tm, COMBINER_INDEXED_BLOCK,
                         {"blocklength": bl, "displacements": disps}, [impl])

    def Create_hindexed_block(self, blocklength: int, displacements) -> "Datatype":
        """Create an indexed datatype with constant-sized blocks.

        Displacements are in bytes.
        """
        impl = self._impl()
        bl, disps = C.lengths_arg([blocklength])[0], C.ints(displacements)
        return self._new(C.indexed(impl.typemap, [bl] * len(disps), disps),
                         COMBINER_HINDEXED_BLOCK,
                         {"blocklength": bl, "displacements": disps}, [impl])

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes) -> "Datatype":
        """Create a general composite (struct) datatype.

        Displacements are in bytes; the extent is padded to the alignment of
        the components unless an explicit upper bound applies.
        """
        disps = C.ints(displacements)
        bls = C.lengths_arg(blocklengths, len(disps))
        types = list(datatypes)
        if len(types) != len(disps):
            raise ValueError(f"expecting {len(disps)} items, got {len(types)}")
        impls = [_as_datatype(t)._impl() for t in types]
        aligns = [_alignment(i) for i in impls]
        tm = C.struct([i.typemap for i in impls], bls, disps, aligns)
        return Datatype._wrap(TypeImpl(tm, COMBINER_STRUCT,
                                       {"blocklengths": bls, "displacements": disps}, impls))

    def Create_subarray(self, sizes, subsizes, starts, order: int = ORDER_C) -> "Datatype":
        """Create a datatype for a subarray of a multidimensional array.

        Raises MPI.Exception (ERR_ARG) for a section outside the array.
        """
        impl = self._impl()
        sizes = C.ints(sizes)
        subsizes, starts = C.ints(subsizes, len(sizes)), C.ints(starts, len(sizes))
        order = C.check_order(order)
        if not sizes:
            raise Exception(ERR_ARG, "a subarray needs at least one dimension")
        tm = C.subarray(impl.typemap, sizes, subsizes, starts, order)
        return self._new(tm, COMBINER_SUBARRAY, {"sizes": sizes, "subsizes": subsizes,
                                                 "starts": starts, "order": order}, [impl])

    def Create_darray(self, size: int, rank: int, gsizes, distribs, dargs, psizes,
                      order: int = ORDER_C) -> "Datatype":
        """Create a datatype for a distributed array on Cartesian process grids.

        Raises MPI.Exception (ERR_ARG) for an inconsistent distribution.
        """
        impl = self._impl()
        size, rank = C.index(size), C.index(rank)
        gsizes = C.ints(gsizes)
        n = len(gsizes)
        distribs, dargs, psizes = C.ints(distribs, n), C.ints(dargs, n), C.ints(psizes, n)
        order = C.check_order(order)
        tm = C.darray(impl.typemap, size, rank, gsizes, distribs, dargs, psizes, order)
        return self._new(tm, COMBINER_DARRAY,
                         {"size": size, "rank": rank, "gsizes": gsizes, "distribs": distribs,
                          "dargs": dargs, "psizes": psizes, "order": order}, [impl])

    def Create_resized(self, lb: int, extent: int) -> "Datatype":
        """Create a datatype with a new lower bound and extent.

        The data layout is unchanged.
        """
        impl = self._impl()
        lb, extent = C.index(lb), C.index(extent)
        return self._new(impl.typemap.resized(lb, extent), COMBINER_RESIZED,
                         {"lb": lb, "extent": extent}, [impl])

    Resized = Create_resized

    @classmethod
    def Get_value_index(cls, value: "Datatype", index: "Datatype") -> "Datatype":
        """Return a datatype for a value-index pair.

        The predefined pair types for (SHORT, INT, LONG, FLOAT, DOUBLE,
        LONG_DOUBLE) with INT; DATATYPE_NULL for other pairs, as MPICH.
        """
        v, i = _as_datatype(value)._impl(), _as_datatype(index)._impl()
        pair = P.VALUE_INDEX.get(v.constant) if i is _NAMED["INT"]._h else None
        return Datatype._wrap(_NAMED[pair]._h) if pair else Datatype()

    @classmethod
    def Create_f90_integer(cls, r: int) -> "Datatype":
        """Return a bounded integer datatype of at least ``r`` decimal digits.

        Raises MPI.Exception (ERR_ARG) when no integer type is that large.
        """
        r = C.index(r)
        for digits, name in P.F90_INTEGER:
            if r <= digits:
                return _f90(COMBINER_F90_INTEGER, {"r": r}, name)
        raise Exception(ERR_ARG, f"no integer type with {r} decimal digits")

    @classmethod
    def Create_f90_real(cls, p: int, r: int) -> "Datatype":
        """Return a bounded real datatype of precision ``p`` and exponent range ``r``.

        UNDEFINED for either argument means no requirement.
        """
        return _f90_float(COMBINER_F90_REAL, P.F90_REAL, C.index(p), C.index(r))

    @classmethod
    def Create_f90_complex(cls, p: int, r: int) -> "Datatype":
        """Return a bounded complex datatype of precision ``p`` and exponent range ``r``.

        UNDEFINED for either argument means no requirement.
        """
        return _f90_float(COMBINER_F90_COMPLEX, P.F90_COMPLEX, C.index(p), C.index(r))

    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> "Datatype":
        """Find a datatype matching a specified size in bytes.

        Raises MPI.Exception (ERR_ARG) when no Fortran type of that class has that size.
        """
        key = (_TYPECLASS.get(C.index(typeclass)), C.index(size))
        name = P.MATCH_SIZE.get(key)
        if name is None:
            raise Exception(ERR_ARG, f"no datatype of class {typeclass} with size {size}")
        return Datatype._wrap(_NAMED[name]._h)

    # -- packing --------------------------------------------------------------------------
    def Pack(self, inbuf, outbuf, position: int, comm) -> int:
        """Pack into contiguous memory according to datatype.

        Packs as many whole elements as ``inbuf`` holds at ``outbuf[position:]``
        and returns the new position; raises MPI.Exception (ERR_TRUNCATE)
        when they do not fit.
        """
        from .msgspec import pack_whole
        _check_comm(comm)
        data = pack_whole(self, inbuf)
        return _store(outbuf, position, data)

    def Unpack(self, inbuf, position: int, outbuf, comm) -> int:
        """Unpack from contiguous memory according to datatype.

        Fills ``outbuf`` (as many whole elements as it holds) from
        ``inbuf[position:]`` and returns the new position.
        """
        from .msgspec import unpack_whole
        _check_comm(comm)
        return unpack_whole(self, inbuf, position, outbuf, external=False)

    def Pack_size(self, count: int, comm) -> int:
        """Return the upper bound on the amount of space needed to pack a message.

        Raises MPI.Exception (ERR_COUNT) for a negative count.
        """
        _check_comm(comm)
        return C.count_arg(count) * _committed(self).typemap.size

    def Pack_external(self, datarep: str, inbuf, outbuf, position: int) -> int:
        """Pack into contiguous memory according to datatype, using a portable data representation.

        Only "external32" is supported (big-endian, MPI's sizes).
        """
        from .msgspec import pack_whole
        from .external32 import encode
        _check_datarep(datarep)
        impl = _committed(self)
        data = pack_whole(self, inbuf)
        count = len(data) // impl.typemap.size if impl.typemap.size else 0
        return _store(outbuf, position, encode(data, impl.typemap, count))

    def Unpack_external(self, datarep: str, inbuf, position: int, outbuf) -> int:
        """Unpack from contiguous memory according to datatype, using a portable data representation.

        Only "external32" is supported.
        """
        from .msgspec import unpack_whole
        _check_datarep(datarep)
        return unpack_whole(self, inbuf, position, outbuf, external=True)

    def Pack_external_size(self, datarep: str, count: int) -> int:
        """Return the upper bound on the amount of space needed to pack a message, using a portable data representation.

        Raises MPI.Exception (ERR_ARG) for a data representation other than "external32".
        """
        from .external32 import size
        _check_datarep(datarep)
        return size(_committed(self).typemap, C.count_arg(count))

    # -- attributes -------------------------------------------------------------------------
    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
        """Create a new attribute key for datatypes.

        ``copy_fn(datatype, keyval, value)`` runs on Dup, ``delete_fn`` on delete and Free.
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


# -- helpers ---------------------------------------------------------------------------------
def _as_datatype(obj) -> Datatype:
    if not isinstance(obj, Datatype):
        raise TypeError(f"expected a Datatype, not {type(obj).__name__}")
    return obj


def _reference(impl: TypeImpl) -> Datatype:
    """A handle on ``impl`` for the caller: the constant of a predefined type,
    else a new reference."""
    if impl.constant is not None and impl.combiner == COMBINER_NAMED:
        return _NAMED[impl.constant]
    if not impl.predefined:
        impl.refs += 1
    return Datatype._wrap(impl)


def _alignment(impl: TypeImpl) -> int:
    while impl.combiner == COMBINER_DUP:
        impl = impl.children[0]
    return impl.align or impl.typemap.align


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


def _store(outbuf, position, data) -> int:
    from .msgspec import acquire
    out = acquire(outbuf, writable=True)
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


def _f90(combiner, params, storage) -> Datatype:
    key = (combiner, tuple(params.items()))
    impl = _F90_CACHE.get(key)
    if impl is None:
        base = _NAMED[storage]._h
        impl = TypeImpl(base.typemap, combiner, params)
        impl.code = impl.typestr = base.typestr
        impl.typechar, impl.align, impl.numpy = base.typechar, base.align, base.numpy
        impl.unit = base
        _F90_CACHE[key] = impl
    return Datatype._wrap(impl)


def _f90_float(combiner, table, p, r) -> Datatype:
    for digits, exp, name in table:
        if (p == UNDEFINED or p <= digits) and (r == UNDEFINED or r <= exp):
            return _f90(combiner, {"p": p, "r": r}, name)
    raise Exception(ERR_ARG, f"no floating point type with precision {p} and range {r}")


def _datatype_create(datatype, combiner, params, free=False) -> Datatype:
    """Create a datatype from a base type, combiner name and ``decode()`` arguments."""
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
    """``decode()`` of a datatype (``mark`` is accepted for mpi4py compatibility)."""
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


def describe(datatype: Datatype):
    """A compact, hashable, picklable description another process can rebuild."""
    impl = datatype._impl()
    if impl.constant is not None and impl.combiner == COMBINER_NAMED:
        return ("NAMED", impl.constant)
    if impl.combiner in _F90:
        return (C.NAMES[impl.combiner], tuple(impl.params.items()))
    params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in impl.params.items())
    children = tuple(describe(Datatype._wrap(c)) for c in impl.children)
    return (C.NAMES[impl.combiner], params, children)


def from_description(desc) -> Datatype:
    """Rebuild (and commit) a datatype from :func:`describe` output (cached)."""
    dt = _REBUILT.get(desc)
    if dt is None:
        dt = _rebuild(desc).Commit()
        _REBUILT[desc] = dt
    return dt


def _rebuild(desc) -> Datatype:
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


_F90_CACHE = {}
_REBUILT = {}


# -- predefined datatypes --------------------------------------------------------------------
def _named(name: str) -> Datatype:
    """The predefined datatype constant called ``name``."""
    return _NAMED[name]


def _build_predefined() -> dict:
    consts = {}
    codes = P.register_elements()
    for names, mpi_name, dtype, code, char, tstr, align, _ext in P.NAMED:
        impl = TypeImpl(Typemap.basic(codes[mpi_name]), COMBINER_NAMED, name=mpi_name)
        impl.code, impl.typechar, impl.typestr, impl.align = code, char, tstr, align
        impl.numpy, impl.unit, impl.constant = np.dtype(dtype), impl, names[0]
        const = Datatype._constant(impl)
        for n in names:
            consts[n] = const
    for names, mpi_name, value, index, idisp, extent, align in P.PAIRS:
        v, i = consts[value]._h, consts[index]._h
        tm = Typemap.from_parts([(0, v.typemap.codes[0]), (idisp, i.typemap.codes[0])],
                                0, extent, align)
        impl = TypeImpl(tm, COMBINER_NAMED, name=mpi_name)
        impl.typechar, impl.typestr, impl.align = "V", f"V{extent}", align
        impl.numpy = np.dtype([("v", v.numpy), ("i", i.numpy)])
        impl.unit, impl.constant = impl, names[0]
        const = Datatype._constant(impl)
        for n in names:
            consts[n] = const
    for n in P.NULL:
        consts[n] = Datatype._constant(None)
    return consts


_NAMED = _build_predefined()
DATATYPE_NULL = Datatype._constant(None)
_NAMED["DATATYPE_NULL"] = DATATYPE_NULL
globals().update({k: v for k, v in _NAMED.items() if k != "DATATYPE_NULL"})
#: the predefined datatype constants (``from .datatype import *``)
__all__ = sorted(_NAMED) + [n for n in dir() if n.startswith(("COMBINER_", "TYPECLASS_",
                                                                "DISTRIBUTE_", "ORDER_"))] + \
    ["UNDEFINED", "Datatype"]
name_constants(globals())

_MSGSPEC_NAMES = {"BOTTOM", "BUFFER_AUTOMATIC", "IN_PLACE", "Msg", "byte_view", "parse",
                  "parse_block", "parse_v", "parse_w", "sub"}


def __getattr__(name):
    """Message-spec names used to live here: ``from .datatype import parse`` still works."""
    if name in _MSGSPEC_NAMES:
        from . import msgspec
        return getattr(msgspec, name)
    if name == "buffer":
        from .memory import buffer
        return buffer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
