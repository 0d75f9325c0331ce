"""The symmetric heap's bookkeeping: offsets, and this PE's address translation.

The part of :mod:`shmem.heap` (which re-exports these names) that needs no
job, so it can be tested (and mutation-tested) in one process:
:class:`Allocator` hands out *offsets* into a heap of a given size,
:func:`check_align` normalises the ``align=`` argument of the allocation
routines, and :class:`SymmetricHeap` turns an array on this PE's heap into
its offset (and back into a view).  Because every PE runs the same sequence
of allocation calls with the same arguments, every PE computes the same
offsets; that is what makes an offset name the same object on every PE.
The collective routines themselves (barriers, a running runtime) stay in
:mod:`shmem.heap`.
"""
from __future__ import annotations

import bisect

import numpy as np

from .errors import InvalidFree, NotSymmetric, SymmetricHeapExhausted
from ucxpy.atomics import ffi

#: every block starts at a multiple of this (long double / complex alignment)
MIN_ALIGN = 16
#: largest ``align=`` honoured: heaps are page aligned on every PE, so offsets
#: aligned to at most a page give the same absolute alignment everywhere
MAX_ALIGN = 4096


class Allocator:
    """First-fit over a sorted free list of ``(offset, length)`` with
    coalescing.  A pure function of the call sequence: no addresses, no
    randomness, so every PE computes the same offsets.

    ``starts``/``lengths`` are the free blocks (parallel lists sorted by
    offset, never two adjacent blocks: freeing coalesces them); ``live``
    maps each allocation's user offset to ``(block offset, block length,
    requested bytes)``.  A block is the requested size rounded up to
    ``MIN_ALIGN`` (at least ``MIN_ALIGN`` bytes, also for 0) plus the gap
    in front of the user offset that the alignment needed.
    """

    def __init__(self, start: int, end: int):
        self.starts = [start]          # free blocks, sorted by offset
        self.lengths = [end - start]
        self.live = {}                 # user offset -> (block offset, block length, nbytes)
        self.end = end

    def allocate(self, nbytes: int, align: int = MIN_ALIGN) -> int:
        """Offset of a new block of ``nbytes`` aligned to ``align`` (a power
        of two, see :func:`check_align`): the lowest free block it fits in.
        Raises SymmetricHeapExhausted when none does."""
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
        """Free the block at ``user``; returns its size in bytes (as requested).
        Raises InvalidFree for an offset that is not live (double free)."""
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
        """Bytes in free blocks (alignment gaps of live blocks are not free)."""
        return sum(self.lengths)


def check_align(align) -> int:
    """The alignment an allocation gets for ``align=``: ``MIN_ALIGN`` for
    None or 0, else ``align`` (at least ``MIN_ALIGN``).  Raises ValueError
    unless it is a power of two of at most ``MAX_ALIGN``."""
    if align is None or align == 0:
        return MIN_ALIGN
    align = int(align)
    if align < 0 or align & (align - 1):
        raise ValueError(f"align must be a power of two, got {align}")
    if align > MAX_ALIGN:
        raise ValueError(f"align above {MAX_ALIGN} bytes is not supported")
    return max(align, MIN_ALIGN)


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

    def raw_offset(self, obj) -> int:
        """``obj``'s offset from the heap base (an allocation this heap
        handed out is found without asking for its buffer); not range
        checked.  TypeError/ValueError/BufferError if ``obj`` has no buffer."""
        hit = self.known.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        return self.address_of(obj) - self.base

    def offset_of(self, arr, nbytes: int) -> int:
        """Heap offset of ``arr`` whose first ``nbytes`` must lie in the heap."""
        try:
            off = self.raw_offset(arr)
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
