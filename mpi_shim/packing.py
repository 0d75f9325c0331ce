"""Gathering a datatype layout into packed bytes and scattering it back.

``count`` elements of a type map start at byte ``offset`` of a flat byte
array, element ``i`` an extent after element ``i - 1``.  Packing copies the
type map's byte runs in type-map order into one contiguous array; unpacking
is the inverse.  Both are numpy copies: one strided 2-D copy per byte run of
an element when an element has few runs, else one fancy-index gather per
run length over a sliding-window view (an index per run, not per byte).
Nothing outside the runs is touched, so a large contiguous block is copied
once and the holes of a sparse layout are never read.
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .typemap import Typemap

_FEW_RUNS = 16          # up to this many runs per element: one strided copy each


def span(offset: int, count: int, tm: Typemap):
    """``(first, end)`` byte range touched by ``count`` elements at ``offset``."""
    if count <= 0 or tm.size == 0:
        return offset, offset
    lo, hi = tm.true_bounds
    reach = (count - 1) * tm.extent
    return offset + lo + min(0, reach), offset + hi + max(0, reach)


def contiguous_range(offset: int, count: int, tm: Typemap):
    """``(start, stop)`` when the message is one contiguous byte range, else None."""
    run = tm.single_run()
    if count <= 0 or run == (0, 0):
        return offset, offset
    if run is None or (count > 1 and run[1] != tm.extent):
        return None
    start = offset + run[0]
    return start, start + count * run[1]


def _rows(flat, length):
    """View of every ``length``-byte window of ``flat`` (row ``k`` starts at ``k``)."""
    return np.lib.stride_tricks.as_strided(flat, shape=(flat.size - length + 1, length), strides=(1, 1))


def _strided(flat, start, count, stride, length):
    """``count`` rows of ``length`` bytes, row ``i`` at ``start + i * stride``."""
    return np.lib.stride_tricks.as_strided(flat[start:], shape=(count, length), strides=(stride, 1))


def pack(flat: np.ndarray, offset: int, count: int, tm: Typemap) -> np.ndarray:
    """The packed bytes of ``count`` elements at ``offset`` of uint8 array ``flat``."""
    size = tm.size
    out = np.empty(count * size, np.uint8)
    if count == 0 or size == 0:
        return out
    blocks = tm.byte_blocks()
    ext = tm.extent
    if len(blocks) <= _FEW_RUNS:
        out2 = out.reshape(count, size)
        for s, n, p in zip(blocks.starts.tolist(), blocks.lengths.tolist(),
                           blocks.positions.tolist()):
            out2[:, p:p + n] = _strided(flat, offset + s, count, ext, n)
        return out
    base = offset + ext * np.arange(count, dtype=np.int64)
    obase = size * np.arange(count, dtype=np.int64)
    for length, (starts, positions) in blocks.groups.items():
        src = (base[:, None] + starts[None, :]).reshape(-1)
        dst = (obase[:, None] + positions[None, :]).reshape(-1)
        _rows(out, length)[dst] = _rows(flat, length)[src]
    return out


def unpack(flat: np.ndarray, offset: int, count: int, tm: Typemap, data, nbytes=None):
    """Write packed ``data`` (its first ``nbytes``) into the layout in ``flat``."""
    size = tm.size
    src = np.frombuffer(data, np.uint8)
    total = count * size if nbytes is None else min(int(nbytes), count * size)
    if total <= 0 or size == 0:
        return
    full, rest = divmod(total, size)
    blocks = tm.byte_blocks()
    ext = tm.extent
    if full:
        if len(blocks) <= _FEW_RUNS:
            src2 = src[:full * size].reshape(full, size)
            for s, n, p in zip(blocks.starts.tolist(), blocks.lengths.tolist(),
                               blocks.positions.tolist()):
                _strided(flat, offset + s, full, ext, n)[:] = src2[:, p:p + n]
        else:
            base = offset + ext * np.arange(full, dtype=np.int64)
            ibase = size * np.arange(full, dtype=np.int64)
            for length, (starts, positions) in blocks.groups.items():
                dst = (base[:, None] + starts[None, :]).reshape(-1)
                frm = (ibase[:, None] + positions[None, :]).reshape(-1)
                _rows(flat, length)[dst] = _rows(src, length)[frm]
    if rest:
        # the last element arrived in part: its runs up to ``rest`` bytes
        origin = offset + full * ext
        done = full * size
        cut = int(np.searchsorted(blocks.positions, rest, side="left"))
        for s, n, p in zip(blocks.starts[:cut].tolist(), blocks.lengths[:cut].tolist(),
                           blocks.positions[:cut].tolist()):
            n = min(n, rest - p)
            flat[origin + s:origin + s + n] = src[done + p:done + p + n]
