"""What each type constructor takes, builds and reports.

For every combiner: argument checking (``TypeError``/``ValueError`` for
malformed Python arguments, ``MPI.Exception`` for values MPI rejects), the
:class:`~.typemap.Typemap` of the new type, and the ``Get_contents`` lists
in MPICH's large-count form (every count and displacement in the third
list, only ``order``, ``ndims``, process-grid and distribution arguments
among the integers).
"""
from __future__ import annotations

import operator

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .exceptions import ERR_ARG, ERR_COUNT, Exception
from .typemap import Typemap, keep

COMBINER_NAMED, COMBINER_DUP, COMBINER_CONTIGUOUS = 1, 2, 3
COMBINER_VECTOR, COMBINER_HVECTOR, COMBINER_INDEXED, COMBINER_HINDEXED = 4, 6, 7, 9
COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK = 10, 19
COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_DARRAY = 12, 13, 14
COMBINER_F90_REAL, COMBINER_F90_COMPLEX, COMBINER_F90_INTEGER = 15, 16, 17
COMBINER_RESIZED, COMBINER_VALUE_INDEX = 18, 20

#: combiner -> name used by ``decode()`` and ``_datatype_create``
NAMES = {COMBINER_NAMED: "NAMED", COMBINER_DUP: "DUP", COMBINER_CONTIGUOUS: "CONTIGUOUS",
         COMBINER_VECTOR: "VECTOR", COMBINER_HVECTOR: "HVECTOR",
         COMBINER_INDEXED: "INDEXED", COMBINER_HINDEXED: "HINDEXED",
         COMBINER_INDEXED_BLOCK: "INDEXED_BLOCK", COMBINER_HINDEXED_BLOCK: "HINDEXED_BLOCK",
         COMBINER_STRUCT: "STRUCT", COMBINER_SUBARRAY: "SUBARRAY", COMBINER_DARRAY: "DARRAY",
         COMBINER_F90_REAL: "F90_REAL", COMBINER_F90_COMPLEX: "F90_COMPLEX",
         COMBINER_F90_INTEGER: "F90_INTEGER", COMBINER_RESIZED: "RESIZED",
         COMBINER_VALUE_INDEX: "VALUE_INDEX"}
BY_NAME = {v: k for k, v in NAMES.items()}

ORDER_C, ORDER_FORTRAN = 56, 57
DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE = 121, 122, 123
DISTRIBUTE_DFLT_DARG = -49767


# -- argument checking ---------------------------------------------------------------
def index(value) -> int:
    """``value`` as an int (``TypeError`` for floats and the like)."""
    return operator.index(value)


def ints(values, n=None) -> list:
    """A sequence of ints, of length ``n`` when given (``ValueError`` otherwise)."""
    out = [operator.index(v) for v in values]
    if n is not None and len(out) != n:
        raise ValueError(f"expecting {n} items, got {len(out)}")
    return out


def count_arg(value, what="count") -> int:
    """A non-negative count (``MPI.Exception(ERR_COUNT)`` when negative)."""
    v = index(value)
    if v < 0:
        raise Exception(ERR_COUNT, f"invalid {what} {v}")
    return v


def lengths_arg(values, n=None) -> list:
    """Non-negative block lengths."""
    out = ints(values, n)
    for v in out:
        if v < 0:
            raise Exception(ERR_ARG, f"invalid block length {v}")
    return out


# -- layouts --------------------------------------------------------------------------
def contiguous(tm: Typemap, count: int) -> Typemap:
    """``count`` copies one extent apart."""
    return tm.replicate([0], [count])


def vector(tm: Typemap, count, blocklength, stride_bytes) -> Typemap:
    """``count`` blocks of ``blocklength`` copies, ``stride_bytes`` apart."""
    starts = stride_bytes * np.arange(count, dtype=np.int64)
    return tm.replicate(starts, np.full(count, blocklength, np.int64))


def indexed(tm: Typemap, blocklengths, disps_bytes) -> Typemap:
    """Blocks of copies at the given byte displacements."""
    return tm.replicate(np.asarray(disps_bytes, np.int64), np.asarray(blocklengths, np.int64))


#: Create_struct's type maps by their arguments (the component maps, which
#: are immutable, held here with them): a program converts the same
#: structured types again and again (mpi4py.util.dtlib: one numpy dtype
#: becomes a struct per conversion, the same maps each time)
_STRUCTS: dict = {}
_STRUCTS_KEPT = 512


def struct(maps, blocklengths, disps, aligns) -> Typemap:
    """Blocks of copies of several types, with MPI's alignment padding of the extent."""
    try:
        key = (tuple(maps), tuple(map(int, blocklengths)), tuple(map(int, disps)),
               tuple(map(int, aligns)))
    except (TypeError, ValueError):         # (arguments of another shape: not kept)
        return _struct(maps, blocklengths, disps, aligns)
    tm = _STRUCTS.get(key)
    if tm is None:
        tm = keep(_STRUCTS, _STRUCTS_KEPT, key, _struct(maps, blocklengths, disps, aligns))
    return tm


def _struct(maps, blocklengths, disps, aligns) -> Typemap:
    parts = [tm.replicate([d], [b]) for tm, b, d in zip(maps, blocklengths, disps) if b > 0]
    if not parts:
        return Typemap([], [], [], 0, 0)
    lb = min(p.lb for p in parts)
    ub = max(p.ub for p in parts)
    sticky_lb = any(p.sticky_lb and p.lb == lb for p in parts)
    sticky_ub = any(p.sticky_ub and p.ub == ub for p in parts)
    align = max(a for a, b in zip(aligns, blocklengths) if b > 0)
    if not sticky_ub and align > 1:
        ub = lb + -(-(ub - lb) // align) * align
    return Typemap.concatenate(parts, lb, ub, (sticky_lb, sticky_ub), align)


def _grid_blocks(indices, strides, order):
    """Byte-offset starts and lengths of the runs of consecutive elements of an
    array section (``indices[d]``: the owned indices of dimension ``d``)."""
    dims = list(range(len(indices))) if order == ORDER_C else list(range(len(indices)))[::-1]
    fast = dims[-1]
    offsets = np.zeros(1, np.int64)
    for d in dims[:-1]:
        offsets = np.add.outer(offsets, indices[d] * strides[d]).reshape(-1)
    idx = indices[fast]
    if len(idx) == 0 or len(offsets) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    run_starts = idx[np.concatenate(([0], breaks))]
    run_lengths = np.diff(np.concatenate(([0], breaks, [len(idx)])))
    starts = np.add.outer(offsets, run_starts * strides[fast]).reshape(-1)
    lengths = np.broadcast_to(run_lengths, (len(offsets), len(run_lengths))).reshape(-1)
    return starts, lengths


def _element_strides(sizes, order):
    strides = [1] * len(sizes)
    dims = range(len(sizes) - 2, -1, -1) if order == ORDER_C else range(1, len(sizes))
    for d in dims:
        strides[d] = strides[d + 1] * sizes[d + 1] if order == ORDER_C else \
            strides[d - 1] * sizes[d - 1]
    return strides


def _section(tm: Typemap, sizes, indices, order) -> Typemap:
    """The type of an array section; bounds are those of the whole array."""
    ext = tm.extent
    strides = _element_strides(sizes, order)
    starts, lengths = _grid_blocks([np.asarray(i, np.int64) for i in indices], strides, order)
    total = int(np.prod(sizes, dtype=np.int64))
    return tm.replicate(starts * ext, lengths, lb=tm.lb, ub=tm.lb + total * ext,
                        sticky=(True, True))


def check_order(order) -> int:
    """``ORDER_C`` or ``ORDER_FORTRAN``."""
    order = index(order)
    if order not in (ORDER_C, ORDER_FORTRAN):
        raise Exception(ERR_ARG, f"invalid array order {order}")
    return order


def subarray(tm: Typemap, sizes, subsizes, starts, order) -> Typemap:
    """A subarray of an array of ``sizes`` elements."""
    for n, s, b in zip(sizes, subsizes, starts):
        if n < 1 or s < 1 or s > n or b < 0 or b > n - s:
            raise Exception(ERR_ARG, f"invalid subarray: sizes {sizes}, subsizes "
                                     f"{subsizes}, starts {starts}")
    return _section(tm, sizes, [range(b, b + s) for s, b in zip(subsizes, starts)], order)


def darray(tm: Typemap, size, rank, gsizes, distribs, dargs, psizes, order) -> Typemap:
    """This process's part of a block/cyclic distributed array (MPI 4.1, 5.1.4)."""
    if size < 1 or not 0 <= rank < size:
        raise Exception(ERR_ARG, f"invalid darray size {size} / rank {rank}")
    if int(np.prod(psizes, dtype=np.int64)) != size:
        raise Exception(ERR_ARG, f"process grid {psizes} does not hold {size} processes")
    coords, rest = [], rank
    for p in reversed(psizes):                    # the process grid is row-major
        coords.append(rest % p)
        rest //= p
    coords.reverse()
    indices = []
    for g, dist, darg, p, c in zip(gsizes, distribs, dargs, psizes, coords):
        if g < 1 or p < 1:
            raise Exception(ERR_ARG, f"invalid darray dimension {g} over {p} processes")
        if dist == DISTRIBUTE_NONE:
            if p != 1:
                raise Exception(ERR_ARG, "DISTRIBUTE_NONE needs one process in its dimension")
            indices.append(np.arange(g))
        elif dist == DISTRIBUTE_BLOCK:
            b = -(-g // p) if darg == DISTRIBUTE_DFLT_DARG else darg
            if b < 1 or b * p < g:
                raise Exception(ERR_ARG, f"invalid block size {darg} for {g} over {p}")
            indices.append(np.arange(c * b, min((c + 1) * b, g)))
        elif dist == DISTRIBUTE_CYCLIC:
            k = 1 if darg == DISTRIBUTE_DFLT_DARG else darg
            if k < 1:
                raise Exception(ERR_ARG, f"invalid cyclic block size {darg}")
            own = [np.arange(s, min(s + k, g)) for s in range(c * k, g, p * k)]
            indices.append(np.concatenate(own) if own else np.zeros(0, np.int64))
        else:
            raise Exception(ERR_ARG, f"invalid distribution {dist}")
    return _section(tm, gsizes, indices, order)


# -- contents (MPICH's large-count Get_contents) --------------------------------------
def contents(combiner: int, p: dict):
    """``(integers, addresses, large counts)`` of a type made by ``combiner``."""
    if combiner == COMBINER_DUP:
        return [], [], []
    if combiner == COMBINER_CONTIGUOUS:
        return [], [], [p["count"]]
    if combiner in (COMBINER_VECTOR, COMBINER_HVECTOR):
        return [], [], [p["count"], p["blocklength"], p["stride"]]
    if combiner in (COMBINER_INDEXED, COMBINER_HINDEXED):
        n = len(p["blocklengths"])
        return [], [], [n, *p["blocklengths"], *p["displacements"]]
    if combiner in (COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK):
        return [], [], [len(p["displacements"]), p["blocklength"], *p["displacements"]]
    if combiner == COMBINER_STRUCT:
        n = len(p["blocklengths"])
        return [], [], [n, *p["blocklengths"], *p["displacements"]]
    if combiner == COMBINER_SUBARRAY:
        return [len(p["sizes"]), p["order"]], [], [*p["sizes"], *p["subsizes"], *p["starts"]]
    if combiner == COMBINER_DARRAY:
        return ([p["size"], p["rank"], len(p["gsizes"]), *p["distribs"], *p["dargs"],
                 *p["psizes"], p["order"]], [], list(p["gsizes"]))
    if combiner == COMBINER_RESIZED:
        return [], [], [p["lb"], p["extent"]]
    if combiner == COMBINER_F90_INTEGER:
        return [p["r"]], [], []
    if combiner in (COMBINER_F90_REAL, COMBINER_F90_COMPLEX):
        return [p["p"], p["r"]], [], []
    return [], [], []
