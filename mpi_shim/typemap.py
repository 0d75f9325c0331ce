"""Type maps: the byte layout of one element of an MPI datatype.

A type map is MPI's sequence of (basic type, displacement) pairs, stored
compactly as *segments*: segment ``j`` is ``counts[j]`` consecutive basic
elements of kind ``codes[j]`` starting at byte ``disps[j]``.  Segments keep
MPI's type-map order (the order in which ``Pack`` visits the data); two
neighbours are merged when they are of the same kind and the second starts
where the first ends, so ``INT.Create_contiguous(10**9)`` is one segment.

Besides the segments a map has MPI's bounds ``lb``/``ub`` (with *sticky*
flags: bounds set by ``Create_resized`` survive later constructors and turn
off the alignment padding of ``Create_struct``) and the alignment used for
that padding.

Element kinds (``ELEMENTS``) are registered by :mod:`.predefined`; this
module knows only their sizes.  Packing plans (:class:`ByteBlocks`) and
element counting are derived from the segments and cached per map.
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

__all__ = ["Element", "ELEMENTS", "register_element", "Typemap", "ByteBlocks"]


class Element:
    """The storage of one basic datatype: numpy dtype and external32 form."""

    __slots__ = ("index", "name", "numpy", "size", "align", "ext32", "convert")

    def __init__(self, index, name, numpy_dtype, align, ext32, convert):
        self.index, self.name = index, name
        self.numpy = np.dtype(numpy_dtype)
        self.size = self.numpy.itemsize
        self.align = align
        self.ext32 = ext32            # numpy dtype of the big-endian external32 form
        self.convert = convert        # None (numpy astype) or "x87" (long double)

    def __repr__(self):
        return f"<Element {self.name} {self.numpy.str}>"


ELEMENTS: list = []
#: Typemap.replicate's results for a few blocks, by map and arguments (the
#: oldest dropped past _REPLICAS_KEPT)
_REPLICAS: dict = {}
_REPLICAS_KEPT = 1024
_REPLICA_BLOCKS = 16
_SIZES = None          # element sizes by code (numpy), from the first registration


def keep(cache: dict, limit: int, key, value):
    """``cache[key] = value``, dropping the oldest entry past ``limit``
    (type maps kept by their arguments: here and in .constructors); returns
    ``value``."""
    if len(cache) >= limit:
        try:
            cache.pop(next(iter(cache)), None)
        except (StopIteration, RuntimeError):       # (another thread's change)
            pass
    cache[key] = value
    return value


def register_element(name, numpy_dtype, align=None, ext32=None, convert=None) -> int:
    """Add a basic element kind; returns its code."""
    global _SIZES
    dt = np.dtype(numpy_dtype)
    ext = np.dtype(ext32) if ext32 is not None else dt.newbyteorder(">")
    e = Element(len(ELEMENTS), name, dt, align or dt.alignment, ext, convert)
    ELEMENTS.append(e)
    _SIZES = np.array([x.size for x in ELEMENTS], np.int64)
    return e.index


def _merge(disps, codes, counts):
    """Merge neighbouring segments that continue each other (same kind)."""
    if len(disps) > 1:
        ends = disps + counts * _SIZES[codes]
        joins = (codes[1:] == codes[:-1]) & (disps[1:] == ends[:-1])
        if joins.any():
            heads = np.concatenate(([True], ~joins))
            starts = np.flatnonzero(heads)
            return disps[starts], codes[starts], np.add.reduceat(counts, starts)
    return disps, codes, counts


class Typemap:
    """Segments plus bounds of one datatype element (see the module docstring).

    ``size`` (bytes of data), ``extent`` (``ub - lb``) and ``true_bounds``
    (the span the data occupies) are computed once.
    """

    __slots__ = ("disps", "codes", "counts", "lb", "ub", "extent", "size", "true_bounds",
                 "sticky_lb", "sticky_ub", "align", "_cache")

    def __init__(self, disps, codes, counts, lb, ub, sticky=(False, False), align=1,
                 merge=True):
        disps = np.asarray(disps, np.int64).reshape(-1)
        codes = np.asarray(codes, np.int16).reshape(-1)
        counts = np.asarray(counts, np.int64).reshape(-1)
        keep = counts > 0
        if not keep.all():
            disps, codes, counts = disps[keep], codes[keep], counts[keep]
        if merge:
            disps, codes, counts = _merge(disps, codes, counts)
        self.disps, self.codes, self.counts = disps, codes, counts
        self.lb, self.ub = int(lb), int(ub)
        self.extent = self.ub - self.lb
        seg_bytes = counts * _SIZES[codes]
        self.size = int(seg_bytes.sum())
        self.true_bounds = (int(disps.min()), int((disps + seg_bytes).max())) if len(disps) \
            else (0, 0)
        self.sticky_lb, self.sticky_ub = sticky
        self.align = align
        self._cache = {}

    # -- construction --------------------------------------------------------------
    @classmethod
    def basic(cls, code: int) -> "Typemap":
        """The map of one element of kind ``code``."""
        e = ELEMENTS[code]
        return cls([0], [code], [1], 0, e.size, align=e.align)

    @classmethod
    def from_parts(cls, parts, lb, ub, align=1) -> "Typemap":
        """The map of basic elements ``[(displacement, code), ...]`` (pair types)."""
        return cls([d for d, _ in parts], [c for _, c in parts], [1] * len(parts), lb, ub,
                   align=align)

    @property
    def nelements(self) -> int:
        """Basic elements in one element."""
        return int(self.counts.sum())

    def dense(self) -> bool:
        """Whether copies at multiples of the extent tile memory without holes."""
        return len(self.disps) == 1 and self.size == self.extent

    def replicate(self, starts, lengths, lb=None, ub=None, sticky=None, align=None):
        """The map of blocks of consecutive copies of this element.

        Block ``i`` holds ``lengths[i]`` copies, the first at byte ``starts[i]``
        and each next one an extent further.  Bounds are MPI's: the smallest
        ``lb`` and largest ``ub`` of the copies (or the given ones).  Maps are
        immutable: the same few blocks of the same map give the same object
        (``_REPLICAS``), as a program builds the same types again and again.
        """
        try:
            if len(starts) > _REPLICA_BLOCKS or len(lengths) > _REPLICA_BLOCKS:
                raise ValueError
            key = (self, tuple(map(int, starts)), tuple(map(int, lengths)), lb, ub, sticky,
                   align)
            hash(key)
        except (TypeError, ValueError):      # (many blocks, arrays of any shape, lists)
            key = None
        if key is not None:
            tm = _REPLICAS.get(key)
            if tm is None:
                tm = keep(_REPLICAS, _REPLICAS_KEPT, key,
                          self._replicate(starts, lengths, lb, ub, sticky, align))
            return tm
        return self._replicate(starts, lengths, lb, ub, sticky, align)

    def _replicate(self, starts, lengths, lb, ub, sticky, align):
        starts = np.asarray(starts, np.int64).reshape(-1)
        lengths = np.asarray(lengths, np.int64).reshape(-1)
        used = lengths > 0
        starts, lengths = starts[used], lengths[used]
        ext = self.extent
        if len(starts):
            last = starts + (lengths - 1) * ext
            lo = int(np.minimum(starts, last).min()) + self.lb
            hi = int(np.maximum(starts, last).max()) + self.ub
        else:
            lo = hi = 0
        lb = lo if lb is None else lb
        ub = hi if ub is None else ub
        sticky = (self.sticky_lb, self.sticky_ub) if sticky is None else sticky
        align = self.align if align is None else align
        if not len(starts) or not len(self.disps):
            return Typemap([], [], [], lb, ub, sticky, align)
        if self.dense():
            return Typemap(starts + self.disps[0], np.full(len(starts), self.codes[0]),
                           lengths * self.counts[0], lb, ub, sticky, align)
        total = int(lengths.sum())
        if total == len(starts):
            origins = starts
        else:
            block = np.repeat(np.arange(len(starts)), lengths)
            first = np.cumsum(lengths) - lengths
            origins = starts[block] + (np.arange(total) - first[block]) * ext
        disps = (origins[:, None] + self.disps[None, :]).reshape(-1)
        codes = np.broadcast_to(self.codes, (total, len(self.codes))).reshape(-1)
        counts = np.broadcast_to(self.counts, (total, len(self.counts))).reshape(-1)
        return Typemap(disps, codes, counts, lb, ub, sticky, align)

    @classmethod
    def concatenate(cls, maps, lb, ub, sticky, align) -> "Typemap":
        """Maps one after the other in type-map order (``Create_struct``)."""
        maps = [m for m in maps if len(m.disps)]
        if not maps:
            return cls([], [], [], lb, ub, sticky, align)
        return cls(np.concatenate([m.disps for m in maps]),
                   np.concatenate([m.codes for m in maps]),
                   np.concatenate([m.counts for m in maps]), lb, ub, sticky, align)

    def resized(self, lb: int, extent: int) -> "Typemap":
        """The same data with explicit (sticky) bounds: the segments, size,
        true bounds and the views derived from the segments (``_cache``,
        shared) are this map's, nothing is computed again."""
        tm = object.__new__(Typemap)
        tm.disps, tm.codes, tm.counts = self.disps, self.codes, self.counts
        tm.size, tm.true_bounds, tm.align = self.size, self.true_bounds, self.align
        tm.lb, tm.ub = int(lb), int(lb) + int(extent)
        tm.extent = tm.ub - tm.lb
        tm.sticky_lb = tm.sticky_ub = True
        tm._cache = self._cache
        return tm

    # -- derived views ---------------------------------------------------------------
    def byte_blocks(self) -> "ByteBlocks":
        """Contiguous byte runs of one element, merged regardless of kind."""
        v = self._cache.get("blocks")
        if v is None:
            v = self._cache["blocks"] = ByteBlocks(self.disps,
                                                   self.counts * _SIZES[self.codes])
        return v

    def single_run(self):
        """``(start, length)`` of the one byte run of an element, (0, 0) for no
        data, None for several runs."""
        v = self._cache.get("run", False)
        if v is False:
            blocks = self.byte_blocks()
            if len(blocks) == 0:
                v = (0, 0)
            elif len(blocks) == 1:
                v = (int(blocks.starts[0]), int(blocks.lengths[0]))
            else:
                v = None
            self._cache["run"] = v
        return v

    def kinds(self) -> set:
        """Element codes present in the map."""
        v = self._cache.get("kinds")
        if v is None:
            v = self._cache["kinds"] = set(int(c) for c in np.unique(self.codes))
        return v

    def element_positions(self, code: int):
        """Packed byte offsets of every basic element of kind ``code`` in one element."""
        key = ("pos", code)
        v = self._cache.get(key)
        if v is None:
            seg_bytes = self.counts * _SIZES[self.codes]
            packed = np.cumsum(seg_bytes) - seg_bytes
            sel = self.codes == code
            size = ELEMENTS[code].size
            n = self.counts[sel]
            first = np.repeat(packed[sel], n)
            within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
            v = self._cache[key] = first + within * size
        return v

    def ext32_layout(self):
        """``(ext32 bytes per element, {code: ext32 offsets of its elements})``."""
        v = self._cache.get("ext32")
        if v is None:
            ext_sizes = np.array([e.ext32.itemsize for e in ELEMENTS], np.int64)
            seg = self.counts * ext_sizes[self.codes]
            start = np.cumsum(seg) - seg
            offsets = {}
            for code in self.kinds():
                sel = self.codes == code
                n = self.counts[sel]
                first = np.repeat(start[sel], n)
                within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
                offsets[code] = first + within * ext_sizes[code]
            v = self._cache["ext32"] = (int(seg.sum()), offsets)
        return v

    def elements_in(self, nbytes: int):
        """Basic elements in the first ``nbytes`` packed bytes of one element, or
        None when the bytes end inside a basic element."""
        seg_bytes = self.counts * _SIZES[self.codes]
        ends = np.cumsum(seg_bytes)
        j = int(np.searchsorted(ends, nbytes, side="right"))
        before = int(ends[j - 1]) if j else 0
        done = int(self.counts[:j].sum())
        rest = nbytes - before
        if rest == 0:
            return done
        size = int(_SIZES[self.codes[j]])
        return done + rest // size if rest % size == 0 else None

    def bytes_of(self, nelements: int) -> int:
        """Packed bytes of the first ``nelements`` basic elements of one element."""
        ends = np.cumsum(self.counts)
        j = int(np.searchsorted(ends, nelements, side="right"))
        seg_bytes = self.counts[:j] * _SIZES[self.codes[:j]]
        rest = nelements - (int(ends[j - 1]) if j else 0)
        tail = rest * int(_SIZES[self.codes[j]]) if rest else 0
        return int(seg_bytes.sum()) + tail

    def describe(self):
        """A compact picklable form: ``(disps, codes, counts, lb, ub)`` as bytes."""
        return (self.disps.tobytes(), self.codes.tobytes(), self.counts.tobytes(),
                self.lb, self.ub)

    @classmethod
    def from_description(cls, desc) -> "Typemap":
        """Rebuild a map from :meth:`describe` output."""
        disps, codes, counts, lb, ub = desc
        return cls(np.frombuffer(disps, np.int64), np.frombuffer(codes, np.int16),
                   np.frombuffer(counts, np.int64), lb, ub, merge=False)


class ByteBlocks:
    """Byte runs ``(starts, lengths)`` of one element and where they go when packed.

    ``positions[j]`` is the offset of run ``j`` in the packed element.  The
    runs are grouped by length for vectorised gathers (one index per run,
    never one per byte).
    """

    __slots__ = ("starts", "lengths", "positions", "groups")

    def __init__(self, starts, lengths):
        if len(starts) > 1:
            ends = starts + lengths
            joins = starts[1:] == ends[:-1]
            if joins.any():
                heads = np.flatnonzero(np.concatenate(([True], ~joins)))
                starts, lengths = starts[heads], np.add.reduceat(lengths, heads)
        self.starts, self.lengths = starts, lengths
        self.positions = np.cumsum(lengths) - lengths
        self.groups = {}
        for length in np.unique(lengths):
            sel = lengths == length
            self.groups[int(length)] = (starts[sel], self.positions[sel])

    def __len__(self):
        return len(self.starts)
