"""File views: which bytes of a file a process sees (MPI 4.1, section 14.3).

A view is a displacement ``disp`` (bytes from the start of the file), an
*etype* (the unit of offsets) and a *filetype*, tiled over the file from
``disp`` on: copy ``t`` of the filetype starts at ``disp + t * extent``, and
the data bytes of the copies, in order, form the view's *stream*.  Offsets
given to the data access calls count etypes of the stream: offset ``k`` is
stream byte ``k * etype.size``.

:class:`FileView` maps stream byte ranges to the file byte runs holding
them (:meth:`FileView.runs`), in stream order and in bounded batches, so an
access of any size over any filetype is computed without holding all of
its runs.  A filetype's runs must be in increasing file order and must not
overlap, within a copy and from one copy to the next (what MPI asks of a
filetype: non-negative, monotonically non-decreasing displacements); a
filetype that breaks this raises ``ERR_ARG`` when the view is set.
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .exceptions import ERR_ARG, Exception

#: most file runs computed at once for one access
RUN_BATCH = 1 << 16


def merge_runs(offsets: np.ndarray, lengths: np.ndarray):
    """Join runs of which each starts where the previous one ends."""
    if len(offsets) > 1:
        joins = offsets[1:] == offsets[:-1] + lengths[:-1]
        if joins.any():
            heads = np.flatnonzero(np.concatenate(([True], ~joins)))
            return offsets[heads], np.add.reduceat(lengths, heads)
    return offsets, lengths


class FileView:
    """The geometry of one view (see the module docstring).

    ``etype``/``filetype`` are the Datatype handles the view holds
    references to; ``rep`` is the data representation.
    """

    def __init__(self, disp: int, etype, filetype, rep):
        self.disp, self.etype, self.filetype, self.rep = disp, etype, filetype, rep
        self.esize = etype._h.typemap.size
        tm = filetype._h.typemap
        blocks = tm.byte_blocks()
        self.starts = blocks.starts.astype(np.int64)
        self.lengths = blocks.lengths.astype(np.int64)
        self.positions = blocks.positions.astype(np.int64)
        self.tile_size, self.tile_extent = tm.size, tm.extent
        self._check(tm)
        # one run of the whole extent: the stream is the file from ``base`` on
        self.contiguous = len(self.starts) == 1 and self.lengths[0] == self.tile_extent
        self.base = disp + int(self.starts[0])

    def _check(self, tm) -> None:
        if self.esize <= 0:
            raise Exception(ERR_ARG, "the etype of a file view must hold data")
        if self.tile_size <= 0:
            raise Exception(ERR_ARG, "the filetype of a file view must hold data")
        if self.tile_size % self.esize:
            raise Exception(ERR_ARG, f"the filetype ({self.tile_size} bytes of data) is not "
                                     f"made of whole etypes ({self.esize} bytes)")
        if self.tile_extent <= 0:
            raise Exception(ERR_ARG, f"the filetype's extent ({self.tile_extent}) must be "
                                     f"positive to tile the file")
        s, n = self.starts, self.lengths
        if s[0] < 0:
            raise Exception(ERR_ARG, "the filetype has data at a negative displacement")
        if len(s) > 1 and (s[1:] < s[:-1] + n[:-1]).any():
            raise Exception(ERR_ARG, "the filetype's data is not in increasing, "
                                     "non-overlapping file order")
        if s[-1] + n[-1] > s[0] + self.tile_extent:
            raise Exception(ERR_ARG, "the filetype's data reaches into the next copy of the "
                                     "filetype (its extent is too small)")

    # -- stream positions -> file bytes ----------------------------------------------------
    def file_byte(self, stream: int) -> int:
        """The file byte holding stream byte ``stream``."""
        if self.contiguous:
            return self.base + stream
        tile, within = divmod(stream, self.tile_size)
        j = int(np.searchsorted(self.positions, within, side="right")) - 1
        return (self.disp + tile * self.tile_extent + int(self.starts[j]) +
                within - int(self.positions[j]))

    def byte_offset(self, offset: int) -> int:
        """The file byte where etype ``offset`` of the view starts (Get_byte_offset)."""
        return self.file_byte(offset * self.esize)

    def span(self, start: int, nbytes: int):
        """The ``(first, end)`` file bytes of stream bytes ``[start, start + nbytes)``."""
        return self.file_byte(start), self.file_byte(start + nbytes - 1) + 1

    def runs(self, start: int, nbytes: int):
        """File runs ``(offsets, lengths)`` of stream bytes ``[start, start + nbytes)``.

        Yields int64 arrays in stream order, at most about RUN_BATCH runs at a
        time; neighbouring runs that continue each other are joined.
        """
        if nbytes <= 0:
            return
        end = start + nbytes
        if self.contiguous:
            yield np.array([self.base + start], np.int64), np.array([nbytes], np.int64)
            return
        size = self.tile_size
        first, last = start // size, (end - 1) // size
        if first == last:
            # inside one copy: only the blocks the range touches
            w0, w1 = start - first * size, end - first * size
            j0 = int(np.searchsorted(self.positions, w0, side="right")) - 1
            j1 = int(np.searchsorted(self.positions, w1, side="left"))
            yield self._clip(np.array([first], np.int64), self.starts[j0:j1],
                             self.lengths[j0:j1], self.positions[j0:j1], start, end)
            return
        per = max(1, RUN_BATCH // len(self.starts))
        tile = first
        while tile <= last:
            tiles = np.arange(tile, min(last, tile + per - 1) + 1, dtype=np.int64)
            yield self._clip(tiles, self.starts, self.lengths, self.positions, start, end)
            tile = int(tiles[-1]) + 1

    def _clip(self, tiles, starts, lengths, positions, start, end):
        offsets = (self.disp + tiles[:, None] * self.tile_extent + starts[None, :]).ravel()
        stream = (tiles[:, None] * self.tile_size + positions[None, :]).ravel()
        lens = np.broadcast_to(lengths, (len(tiles), len(lengths))).ravel()
        lo = np.maximum(stream, start)
        hi = np.minimum(stream + lens, end)
        keep = hi > lo
        return merge_runs(offsets[keep] + (lo - stream)[keep], (hi - lo)[keep])

    # -- the end of the file -----------------------------------------------------------------
    def stream_bytes_before(self, file_size: int) -> int:
        """Stream bytes lying before file byte ``file_size``."""
        reach = file_size - self.disp
        if reach <= 0:
            return 0
        if self.contiguous:
            return max(0, file_size - self.base)
        extent, s, n = self.tile_extent, self.starts, self.lengths
        tile_end = int(s[-1] + n[-1])
        full = (reach - tile_end) // extent + 1 if reach >= tile_end else 0
        data = full * self.tile_size
        tile = full
        while tile * extent + int(s[0]) < reach:
            data += int(np.clip(reach - tile * extent - s, 0, n).sum())
            tile += 1
        return data

    def end_offset(self, file_size: int) -> int:
        """The etype offset just past the last data before ``file_size`` (rounded up:
        an etype the end of the file cuts counts), what SEEK_END seeks from."""
        return -(-self.stream_bytes_before(file_size) // self.esize)
