"""The symmetric heap: a deterministic allocator and numpy arrays on it.

Every PE maps a heap of the same size at ``init()``.  Allocation routines are
collective and every PE calls them in the same order with the same sizes, so
the deterministic first-fit allocator below returns the same *offset* on
every PE: a symmetric object is named by its offset, and a remote PE's copy
lives at that PE's heap base + offset.  Allocation and free end/start with a
barrier over all PEs (OpenSHMEM's ``shmem_malloc``/``shmem_free`` rules), so
no PE writes into an object a peer has not allocated or cleared yet.
"""
from __future__ import annotations

import bisect
import enum
import math
from typing import Optional

import numpy as np

from . import runtime
from .errors import InvalidArray, InvalidFree, NotSymmetric, SymmetricHeapExhausted
from .runtime import ffi

#: every block starts at a multiple of this (long double / complex alignment)
MIN_ALIGN = 16
#: largest ``align=`` honoured: heaps are page aligned on every PE, so offsets
#: aligned to at most a page give the same absolute alignment everywhere
MAX_ALIGN = 4096


class MALLOC(enum.IntFlag):
    """Allocation hints (accepted, and currently without effect)."""
    ATOMICS_REMOTE = 1
    SIGNAL_REMOTE = 2


MALLOC_ATOMICS_REMOTE = MALLOC.ATOMICS_REMOTE
MALLOC_SIGNAL_REMOTE = MALLOC.SIGNAL_REMOTE


class Allocator:
    """First-fit over a sorted free list of ``(offset, length)`` with
    coalescing.  A pure function of the call sequence: no addresses, no
    randomness, so every PE computes the same offsets."""

    def __init__(self, start: int, end: int):
        self.starts = [start]          # free blocks, sorted by offset
        self.lengths = [end - start]
        self.live = {}                 # user offset -> (block offset, block length, nbytes)
        self.end = end

    def allocate(self, nbytes: int, align: int = MIN_ALIGN) -> int:
        need = max(-(-nbytes // MIN_ALIGN) * MIN_ALIGN, MIN_ALIGN)
        for i, (start, length) in enumerate(zip(self.starts, self.lengths)):
            user = -(-start // align) * align
            if user + need <= start + length:
                block_len = user + need - start
                if block_len == length:
                    del self.starts[i], self.lengths[i]
                else:
                    self.starts[i] = start + block_len
                    self.lengths[i] = length - block_len
                self.live[user] = (start, block_len, nbytes)
                return user
        raise SymmetricHeapExhausted(
            f"symmetric heap exhausted: no free block of {nbytes} bytes "
            f"({self.free_bytes()} bytes free in {len(self.starts)} blocks); "
            "raise UCXPY_SHMEM_HEAP_SIZE")

    def release(self, user: int) -> int:
        """Free the block at ``user``; returns its size in bytes."""
        try:
            start, length, nbytes = self.live.pop(user)
        except KeyError:
            raise InvalidFree(f"offset {user} is not a live symmetric allocation "
                              "(double free, or not returned by an allocation routine)") from None
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and start + length == self.starts[i]:
            length += self.lengths[i]
            del self.starts[i], self.lengths[i]
        if i > 0 and self.starts[i - 1] + self.lengths[i - 1] == start:
            self.lengths[i - 1] += length
        else:
            self.starts.insert(i, start)
            self.lengths.insert(i, length)
        return nbytes

    def free_bytes(self) -> int:
        return sum(self.lengths)


class SymmetricHeap:
    """This PE's heap: its memory handle, a byte array over it, the allocator,
    and the address -> offset translation every RMA call starts with."""

    def __init__(self, mh, reserved: int):
        self.mh = mh
        self.base = mh.address
        self.size = mh.length
        self.end = self.base + self.size
        self.u8 = np.frombuffer(mh.buf, np.uint8)
        self.allocator = Allocator(reserved, self.size)
        # id(array) -> (array, offset) for arrays this module returned: the
        # fast path of offset_of (an address query costs microseconds)
        self.known = {}
        self._known_at = {}            # offset -> [ids] (forgotten on free)

    def remember(self, obj, offset: int) -> None:
        self.known[id(obj)] = (obj, offset)
        self._known_at.setdefault(offset, []).append(id(obj))

    def forget(self, offset: int) -> None:
        for key in self._known_at.pop(offset, ()):
            self.known.pop(key, None)

    def address_of(self, obj) -> int:
        try:
            with ffi.from_buffer(obj) as p:
                return int(ffi.cast("uintptr_t", p))
        except (TypeError, ValueError, BufferError):
            if isinstance(obj, np.ndarray):
                return obj.__array_interface__["data"][0]
            raise

    def offset_of(self, arr, nbytes: int) -> int:
        """Heap offset of ``arr`` whose first ``nbytes`` must lie in the heap."""
        hit = self.known.get(id(arr))
        if hit is not None and hit[0] is arr:
            off = hit[1]
        else:
            try:
                off = self.address_of(arr) - self.base
            except (TypeError, ValueError, BufferError):
                raise NotSymmetric(f"{type(arr).__name__} is not an array on the "
                                   "symmetric heap") from None
        if off < 0 or off + nbytes > self.size:
            raise NotSymmetric("array is not on the symmetric heap (allocate it with "
                               "shmem.array/zeros/empty/full/new_array/alloc)")
        return off

    def contains(self, arr) -> bool:
        try:
            off = self.address_of(arr) - self.base
        except (TypeError, ValueError, BufferError):
            return False
        return 0 <= off < self.size

    def view(self, offset: int, nbytes: int) -> memoryview:
        return self.mh.buf[offset:offset + nbytes]


def _sync_world(rt) -> None:
    rt.teams.world.sync()


def _check_align(align) -> int:
    if align is None or align == 0:
        return MIN_ALIGN
    align = int(align)
    if align < 0 or align & (align - 1):
        raise ValueError(f"align must be a power of two, got {align}")
    if align > MAX_ALIGN:
        raise ValueError(f"align above {MAX_ALIGN} bytes is not supported")
    return max(align, MIN_ALIGN)


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
    hit = heap.known.get(id(mem))
    if hit is not None and hit[0] is mem:
        off = hit[1]
    else:
        try:
            off = heap.address_of(mem) - heap.base
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
