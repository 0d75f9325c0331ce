"""The derived-datatype constructors of ``MPI.Datatype`` (a mixin of the class).

Each method checks its arguments (:mod:`.constructors` says what each
combiner takes and how its layout is built) and wraps a new
:class:`~.typeimpl.TypeImpl`.  Fortran 90 parameterized types are
predefined and cached, one per set of arguments, as MPI requires.
"""
from __future__ import annotations


from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import constructors as C
from . import predefined as P
from .constructors import (COMBINER_CONTIGUOUS, COMBINER_DARRAY, COMBINER_F90_COMPLEX,
                           COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_HINDEXED,
                           COMBINER_HINDEXED_BLOCK, COMBINER_HVECTOR, COMBINER_INDEXED,
                           COMBINER_INDEXED_BLOCK, COMBINER_RESIZED, COMBINER_STRUCT,
                           COMBINER_SUBARRAY, COMBINER_VECTOR, COMBINER_DUP, ORDER_C)
from .exceptions import ERR_ARG, Exception
from .typeimpl import REGISTRY, TypeImpl

UNDEFINED = -32766
_TYPECLASS = {1: "REAL", 2: "INTEGER", 3: "COMPLEX", 4: "LOGICAL"}


class DatatypeConstructors:
    """Constructors of derived datatypes (mixed into MPI.Datatype)."""

    __slots__ = ()

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

        Displacements are in bytes.

        The extent is padded to the alignment of the components unless an
        explicit upper bound applies.
        """
        disps = C.ints(displacements)
        bls = C.lengths_arg(blocklengths, len(disps))
        types = list(datatypes)
        if len(types) != len(disps):
            raise ValueError(f"expecting {len(disps)} items, got {len(types)}")
        impls = [_as_datatype(t)._impl() for t in types]
        aligns = [_alignment(i) for i in impls]
        tm = C.struct([i.typemap for i in impls], bls, disps, aligns)
        return cls._wrap(TypeImpl(tm, COMBINER_STRUCT,
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

        Pairs of SHORT, INT, LONG, FLOAT, DOUBLE or LONG_DOUBLE with INT only.

        Those are the predefined pair types; other pairs give DATATYPE_NULL, as MPICH.
        """
        v, i = _as_datatype(value)._impl(), _as_datatype(index)._impl()
        pair = P.VALUE_INDEX.get(v.constant) if i is _named("INT")._h else None
        return cls._wrap(_named(pair)._h) if pair else cls()

    @classmethod
    def Create_f90_integer(cls, r: int) -> "Datatype":
        """Return a bounded integer datatype of at least ``r`` decimal digits.

        Raises MPI.Exception (ERR_ARG) when no integer type is that large.
        """
        r = C.index(r)
        for digits, name in P.F90_INTEGER:
            if r <= digits:
                return _f90(cls, COMBINER_F90_INTEGER, {"r": r}, name)
        raise Exception(ERR_ARG, f"no integer type with {r} decimal digits")

    @classmethod
    def Create_f90_real(cls, p: int, r: int) -> "Datatype":
        """Return a bounded real datatype of precision ``p`` and exponent range ``r``.

        UNDEFINED for either argument means no requirement.
        """
        return _f90_float(cls, COMBINER_F90_REAL, P.F90_REAL, C.index(p), C.index(r))

    @classmethod
    def Create_f90_complex(cls, p: int, r: int) -> "Datatype":
        """Return a bounded complex datatype of precision ``p`` and exponent range ``r``.

        UNDEFINED for either argument means no requirement.
        """
        return _f90_float(cls, COMBINER_F90_COMPLEX, P.F90_COMPLEX, C.index(p), C.index(r))

    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> "Datatype":
        """Find a datatype matching a specified size in bytes.

        Raises MPI.Exception (ERR_ARG) when no Fortran type of that class has that size.
        """
        key = (_TYPECLASS.get(C.index(typeclass)), C.index(size))
        name = P.MATCH_SIZE.get(key)
        if name is None:
            raise Exception(ERR_ARG, f"no datatype of class {typeclass} with size {size}")
        return cls._wrap(_named(name)._h)


def _named(name: str):
    return REGISTRY["named"][name]


def _as_datatype(obj):
    if not isinstance(obj, REGISTRY["Datatype"]):
        raise TypeError(f"expected a Datatype, not {type(obj).__name__}")
    return obj


def _alignment(impl: TypeImpl) -> int:
    while impl.combiner == COMBINER_DUP:
        impl = impl.children[0]
    return impl.align or impl.typemap.align


def _f90(cls, combiner, params, storage):
    key = (combiner, tuple(params.items()))
    impl = _F90_CACHE.get(key)
    if impl is None:
        base = _named(storage)._h
        impl = TypeImpl(base.typemap, combiner, params)
        impl.code = impl.typestr = base.typestr
        impl.typechar, impl.align, impl.numpy = base.typechar, base.align, base.numpy
        impl.unit = base
        _F90_CACHE[key] = impl
    return cls._wrap(impl)


def _f90_float(cls, combiner, table, p, r):
    for digits, exp, name in table:
        if (p == UNDEFINED or p <= digits) and (r == UNDEFINED or r <= exp):
            return _f90(cls, combiner, {"p": p, "r": r}, name)
    raise Exception(ERR_ARG, f"no floating point type with precision {p} and range {r}")


_F90_CACHE = {}
