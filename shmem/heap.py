"""The symmetric heap: a deterministic allocator and numpy arrays on it.

Every PE maps a heap of the same size at ``init()``.  Allocation routines are
collective and every PE calls them in the same order with the same sizes, so
the deterministic first-fit allocator of :mod:`shmem.allocator` returns the
same *offset* on every PE: a symmetric object is named by its offset, and a
remote PE's copy lives at that PE's heap base + offset.  Allocation and free
end/start with a barrier over all PEs (OpenSHMEM's ``shmem_malloc``/
``shmem_free`` rules), so no PE writes into an object a peer has not
allocated or cleared yet.
"""
from __future__ import annotations

import enum
import math
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

import numpy as np

from . import runtime
from .allocator import MAX_ALIGN, MIN_ALIGN, Allocator, SymmetricHeap  # noqa: F401 (re-exported)
from .allocator import check_align as _check_align
from .errors import InvalidArray, InvalidFree


class MALLOC(enum.IntFlag):
    """Allocation hints (accepted, and currently without effect)."""
    ATOMICS_REMOTE = 1
    SIGNAL_REMOTE = 2


MALLOC_ATOMICS_REMOTE = MALLOC.ATOMICS_REMOTE
MALLOC_SIGNAL_REMOTE = MALLOC.SIGNAL_REMOTE


def _sync_world(rt) -> None:
    rt.teams.world.sync()


def _allocate(nbytes: int, align=None, clear: bool = True) -> int:
    rt = runtime.get()
    if nbytes < 0:
        raise ValueError(f"cannot allocate {nbytes} bytes")
    off = rt.heap.allocator.allocate(int(nbytes), _check_align(align))
    if clear and nbytes:
        rt.heap.u8[off:off + nbytes] = 0
    _sync_world(rt)
    return off


def alloc(count: int, size: int = 1, align: Optional[int] = None,
          hints: Optional[int] = None, clear: bool = True) -> memoryview:
    """Collectively allocate ``count * size`` bytes of symmetric memory and
    return them as a writable byte ``memoryview`` (``shmem_malloc`` /
    ``shmem_calloc`` / ``shmem_align`` / ``shmem_malloc_with_hints``).
    Every PE must call it with the same arguments.  Raises
    SymmetricHeapExhausted when the heap is full."""
    nbytes = int(count) * int(size)
    off = _allocate(nbytes, align, clear)
    mv = runtime.get().heap.view(off, nbytes)
    runtime.get().heap.remember(mv, off)
    return mv


def free(mem) -> None:
    """Collectively free an allocation (array or memoryview returned by an
    allocation routine).  Raises InvalidFree for anything else, including a
    second free of the same memory."""
    rt = runtime.get()
    heap = rt.heap
    try:
        off = heap.raw_offset(mem)
    except (TypeError, ValueError, BufferError):
        raise InvalidFree(f"cannot free a {type(mem).__name__}: not symmetric memory") from None
    if off not in heap.allocator.live:
        raise InvalidFree(f"memory at heap offset {off} is not a live symmetric allocation "
                          "(double free, or not returned by an allocation routine)")
    _sync_world(rt)
    heap.allocator.release(off)
    heap.forget(off)


def fromalloc(mem, shape=None, dtype=None, order="C") -> np.ndarray:
    """View memory returned by :func:`alloc` as an array (no copy)."""
    dtype = np.dtype(dtype)
    if not isinstance(mem, memoryview):
        raise InvalidArray("fromalloc expects the memoryview returned by shmem.alloc")
    if shape is None:
        shape = mem.nbytes // dtype.itemsize
    a = np.ndarray(shape, dtype, buffer=mem, order=order)
    rt = runtime.get()
    off = rt.heap.offset_of(mem, 0)
    rt.heap.remember(a, off)
    return a


def new_array(shape, dtype=float, order="C", *, align=None, hints=None,
              clear: bool = True) -> np.ndarray:
    """Collectively allocate a numpy array on the symmetric heap."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    off = _allocate(nbytes, align, clear)
    rt = runtime.get()
    a = np.ndarray(shape, dtype, buffer=rt.heap.u8, offset=off, order=order)
    rt.heap.remember(a, off)
    return a


def del_array(a: np.ndarray) -> None:
    """Collectively free an array from :func:`new_array` and friends."""
    if not isinstance(a, np.ndarray):
        raise InvalidArray(f"del_array expects a numpy array, not {type(a).__name__}")
    free(a)


def array(obj, dtype=None, *, order="K", align=None, hints=None) -> np.ndarray:
    """Symmetric copy of ``obj`` (like ``numpy.array``); collective."""
    tmp = np.array(obj, dtype, order=order)
    if not (tmp.flags.c_contiguous or tmp.flags.f_contiguous):
        tmp = np.ascontiguousarray(tmp)
    forder = "F" if tmp.flags.f_contiguous and not tmp.flags.c_contiguous else "C"
    a = new_array(tmp.shape, tmp.dtype, forder, align=align, clear=False)
    np.copyto(a, tmp, casting="no")
    _sync_world(runtime.get())
    return a


def empty(shape, dtype=float, order="C", *, align=None, hints=None) -> np.ndarray:
    """Uninitialised symmetric array; collective."""
    return new_array(shape, dtype, order, align=align, clear=False)


def zeros(shape, dtype=float, order="C", *, align=None, hints=None) -> np.ndarray:
    """Zero-filled symmetric array; collective."""
    return new_array(shape, dtype, order, align=align, clear=True)


def ones(shape, dtype=float, order="C", *, align=None, hints=None) -> np.ndarray:
    """One-filled symmetric array; collective."""
    return full(shape, 1, dtype, order, align=align)


def full(shape, fill_value, dtype=None, order="C", *, align=None, hints=None) -> np.ndarray:
    """Symmetric array filled with ``fill_value``; collective."""
    if dtype is None:
        dtype = np.array(fill_value).dtype
    a = new_array(shape, dtype, order, align=align, clear=False)
    # C-style conversion (-1 -> 255 for uint8), as NumPy 1.x's unsafe copyto did
    np.copyto(a, np.asarray(fill_value).astype(a.dtype), casting="unsafe")
    _sync_world(runtime.get())
    return a


def addr_accessible(addr, pe: int) -> bool:
    """True when ``addr`` is symmetric (on the heap) and ``pe`` a valid PE."""
    rt = runtime.get()
    return 0 <= pe < rt.size and rt.heap.contains(addr)
