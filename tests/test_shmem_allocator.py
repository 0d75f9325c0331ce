"""The symmetric heap's bookkeeping (``shmem.allocator``), exactly: the
allocator's offsets, block sizes, the free list after every step,
coalescing on each side, alignment normalisation and error messages; and
SymmetricHeap's address -> offset translation at the heap's edges (over a
plain buffer standing in for the registered heap).  In-process and fast (no
job); it is the mutation suite of shmem/allocator.py (setup.cfg [mutmut]).

The randomized checks replay call sequences against a model that keeps no
free list at all: it derives the free gaps from the live blocks, so a
mistake in the allocator's bookkeeping (split, coalescing, ordering) shows
up as a different offset or a different free list."""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("shmem")
from shmem import InvalidFree, NotSymmetric, SymmetricHeapExhausted  # noqa: E402
from shmem import heap  # noqa: E402
from shmem.allocator import (MAX_ALIGN, MIN_ALIGN, Allocator, SymmetricHeap,  # noqa: E402
                             check_align)


def free_list(a):
    return list(zip(a.starts, a.lengths))


# ------------------------------------------------------------------ constants


def test_constants_and_reexports():
    assert (MIN_ALIGN, MAX_ALIGN) == (16, 4096)
    assert heap.Allocator is Allocator and heap._check_align is check_align
    assert heap.SymmetricHeap is SymmetricHeap
    assert (heap.MIN_ALIGN, heap.MAX_ALIGN) == (16, 4096)


def test_new_allocator_is_one_free_block():
    a = Allocator(1024, 65536)
    assert free_list(a) == [(1024, 64512)]
    assert a.live == {} and a.end == 65536
    assert a.free_bytes() == 64512


# ------------------------------------------------------------------ allocate


@pytest.mark.parametrize("nbytes,block", [(0, 16), (1, 16), (15, 16), (16, 16), (17, 32),
                                          (31, 32), (32, 32), (33, 48), (4096, 4096)])
def test_block_is_size_rounded_up_to_min_align(nbytes, block):
    a = Allocator(0, 1 << 16)
    assert a.allocate(nbytes) == 0
    assert a.live == {0: (0, block, nbytes)}
    assert free_list(a) == [(block, (1 << 16) - block)]
    assert a.allocate(1) == block                     # the next one starts right after


def test_default_alignment_is_min_align():
    a = Allocator(8, 1000)                            # a start that is not 16-aligned
    assert a.allocate(1) == 16
    assert a.live[16] == (8, 24, 1)                   # the gap in front belongs to the block
    assert free_list(a) == [(32, 968)]


def test_aligned_allocation_keeps_the_gap_in_the_block():
    a = Allocator(16, 1 << 16)
    assert a.allocate(100, 256) == 256
    assert a.live[256] == (16, 352, 100)              # 240 gap + 112 rounded size
    assert free_list(a) == [(368, (1 << 16) - 368)]
    assert a.free_bytes() == (1 << 16) - 368
    assert a.allocate(1, 64) == 384                   # ceil(368 / 64) * 64
    assert a.live[384] == (368, 32, 1)


def test_aligned_start_has_no_gap():
    a = Allocator(4096, 8192)
    assert a.allocate(5, 4096) == 4096
    assert a.live[4096] == (4096, 16, 5)
    assert free_list(a) == [(4112, 4080)]


def test_exact_fit_removes_the_free_block():
    a = Allocator(0, 64)
    assert a.allocate(64) == 0
    assert free_list(a) == [] and a.free_bytes() == 0
    with pytest.raises(SymmetricHeapExhausted):
        a.allocate(0)


def test_exact_fit_with_alignment_gap():
    a = Allocator(16, 64)
    assert a.allocate(32, 32) == 32                   # block [16, 64): the whole heap
    assert a.live[32] == (16, 48, 32)
    assert free_list(a) == []


def test_one_byte_too_many_does_not_fit():
    a = Allocator(0, 64)
    with pytest.raises(SymmetricHeapExhausted) as ei:
        a.allocate(65)
    assert str(ei.value) == ("symmetric heap exhausted: no free block of 65 bytes "
                             "(64 bytes free in 1 blocks); raise UCXPY_SHMEM_HEAP_SIZE")
    assert isinstance(ei.value, MemoryError)
    assert free_list(a) == [(0, 64)] and a.live == {}            # unchanged
    a2 = Allocator(16, 64)
    with pytest.raises(SymmetricHeapExhausted):
        a2.allocate(33, 32)                           # 32 + 48 > 64: the gap counts


def test_first_fit_takes_the_lowest_block_that_fits():
    a = Allocator(0, 1024)
    offs = [a.allocate(64) for _ in range(6)]         # 0, 64, ..., 320
    assert offs == [0, 64, 128, 192, 256, 320]
    a.release(64)                                     # hole of 64 at 64
    a.release(192)
    a.release(256)                                    # hole of 128 at 192
    assert free_list(a) == [(64, 64), (192, 128), (384, 640)]
    assert a.allocate(100) == 192                     # too big for the first hole
    assert free_list(a) == [(64, 64), (304, 16), (384, 640)]
    assert a.allocate(64) == 64                       # the first hole, exactly
    assert free_list(a) == [(304, 16), (384, 640)]
    assert a.allocate(16) == 304
    assert free_list(a) == [(384, 640)]
    assert a.allocate(1, 512) == 512                  # the gap [384, 512) goes with it
    assert free_list(a) == [(528, 496)]
    with pytest.raises(SymmetricHeapExhausted) as ei:
        a.allocate(1000)
    assert str(ei.value) == ("symmetric heap exhausted: no free block of 1000 bytes "
                             "(496 bytes free in 1 blocks); raise UCXPY_SHMEM_HEAP_SIZE")


def test_alignment_skips_a_block_the_gap_makes_too_small():
    a = Allocator(0, 1024)
    a.allocate(16)
    first = a.allocate(16)
    a.allocate(480)
    a.release(first)                                  # free: [16, 32) and [512, 1024)
    assert free_list(a) == [(16, 16), (512, 512)]
    assert a.allocate(16, 32) == 512                  # 32 + 16 > 32: not in the first
    assert free_list(a) == [(16, 16), (528, 496)]


# ------------------------------------------------------------------ release


def _three():
    a = Allocator(0, 256)
    return a, [a.allocate(16), a.allocate(16), a.allocate(16)]   # 0, 16, 32; free [48, 256)


def test_release_returns_requested_bytes():
    a = Allocator(0, 256)
    off = a.allocate(7)
    assert a.release(off) == 7
    assert a.live == {} and free_list(a) == [(0, 256)]


def test_release_isolated_block_inserts_it_in_order():
    a, (x, y, z) = _three()
    assert a.release(y) == 16
    assert free_list(a) == [(16, 16), (48, 208)]
    a.allocate(208)                       # exactly [48, 256)
    assert free_list(a) == [(16, 16)]
    assert a.release(z) == 16                         # merges with its left neighbour only
    assert free_list(a) == [(16, 32)]


def test_release_merges_with_following_block():
    a, (x, y, z) = _three()
    a.release(z)                                      # [32, 256)
    assert free_list(a) == [(32, 224)]
    a.release(x)                                      # nothing to merge: in front
    assert free_list(a) == [(0, 16), (32, 224)]
    a.release(y)                                      # both sides at once
    assert free_list(a) == [(0, 256)]
    assert a.free_bytes() == 256


def test_release_merges_with_preceding_block():
    a, (x, y, z) = _three()
    a.release(x)
    a.release(y)
    assert free_list(a) == [(0, 32), (48, 208)]


def test_release_first_block_next_to_following_free_block():
    a = Allocator(0, 64)
    x = a.allocate(16)
    assert a.release(x) == 16
    assert free_list(a) == [(0, 64)]


def test_release_last_block_when_heap_was_full():
    a = Allocator(0, 32)
    x, y = a.allocate(16), a.allocate(16)
    assert free_list(a) == []
    a.release(y)
    assert free_list(a) == [(16, 16)]
    a.release(x)
    assert free_list(a) == [(0, 32)]


def test_release_block_with_alignment_gap_frees_the_gap_too():
    a = Allocator(16, 512)
    off = a.allocate(1, 256)
    assert off == 256 and free_list(a) == [(272, 240)]
    assert a.release(off) == 1
    assert free_list(a) == [(16, 496)]


def test_double_free_and_unknown_offset():
    a = Allocator(0, 256)
    off = a.allocate(16)
    a.release(off)
    for bad in (off, 8, 12345):
        with pytest.raises(InvalidFree) as ei:
            a.release(bad)
        assert str(ei.value) == (f"offset {bad} is not a live symmetric allocation "
                                 "(double free, or not returned by an allocation routine)")
        assert isinstance(ei.value, KeyError)
        assert ei.value.__suppress_context__
    assert free_list(a) == [(0, 256)]


# ------------------------------------------------------------------ model check


def model_allocate(start, end, blocks, nbytes, align):
    """First fit computed from the live blocks alone: the free gaps are the
    complement of their union."""
    need = max((nbytes + 15) // 16 * 16, 16)
    for lo, hi in gaps(start, end, blocks):
        user = (lo + align - 1) // align * align
        if user + need <= hi:
            return user, (lo, user + need - lo)
    return None


def gaps(start, end, blocks):
    out, at = [], start
    for lo, n in sorted(blocks.values()):
        if lo > at:
            out.append((at, lo))
        at = lo + n
    if at < end:
        out.append((at, end))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_matches_model(seed):
    rng = random.Random(seed)
    start, end = rng.choice([(0, 1 << 14), (1024, 1 << 15), (48, 5000)])
    a = Allocator(start, end)
    blocks = {}                                       # user offset -> (block start, block len)
    for _ in range(300):
        if blocks and rng.random() < 0.45:
            user = rng.choice(sorted(blocks))
            nbytes = a.live[user][2]
            assert a.release(user) == nbytes
            del blocks[user]
        else:
            nbytes = rng.choice([0, 1, 15, 16, 17, 100, 255, 1000, 3000])
            align = rng.choice([16, 32, 64, 256, 1024, 4096])
            want = model_allocate(start, end, blocks, nbytes, align)
            if want is None:
                with pytest.raises(SymmetricHeapExhausted):
                    a.allocate(nbytes, align)
            else:
                user, block = want
                assert a.allocate(nbytes, align) == user
                blocks[user] = block
                assert a.live[user] == (*block, nbytes)
        assert free_list(a) == [(lo, hi - lo) for lo, hi in gaps(start, end, blocks)]
        assert a.free_bytes() == (end - start) - sum(n for _, n in blocks.values())
        assert set(a.live) == set(blocks)


# ------------------------------------------------------------------ check_align


@pytest.mark.parametrize("align,want", [(None, 16), (0, 16), (0.0, 16), ("0", 16), (1, 16),
                                        (2, 16), (8, 16), (16, 16), (32, 32), (64.0, 64),
                                        ("128", 128), (2048, 2048), (4096, 4096)])
def test_check_align_accepts(align, want):
    assert check_align(align) == want


@pytest.mark.parametrize("align", [3, 6, 24, 100, 4095, -1, -2, -16, "-16", -4096])
def test_check_align_rejects_non_powers_of_two(align):
    with pytest.raises(ValueError) as ei:
        check_align(align)
    assert str(ei.value) == f"align must be a power of two, got {int(align)}"


@pytest.mark.parametrize("align", [8192, 1 << 20, 16384])
def test_check_align_rejects_above_max(align):
    with pytest.raises(ValueError) as ei:
        check_align(align)
    assert str(ei.value) == "align above 4096 bytes is not supported"


# ------------------------------------------------------------------ SymmetricHeap

SIZE, RESERVED, BEFORE = 4096, 256, 1024


def address(buf) -> int:
    from ucxpy._native import ffi
    with ffi.from_buffer(buf) as p:
        return int(ffi.cast("uintptr_t", p))


@pytest.fixture
def mem():
    """(heap, the larger buffer it is carved from): BEFORE bytes in front of
    the heap and as many behind it, so arrays just outside are real memory."""
    pytest.importorskip("ucxpy._native")
    big = bytearray(BEFORE + SIZE + BEFORE)
    buf = memoryview(big)[BEFORE:BEFORE + SIZE]
    mh = type("MH", (), {})()
    mh.address, mh.length, mh.buf = address(buf), SIZE, buf
    return SymmetricHeap(mh, RESERVED), memoryview(big)


def test_heap_fields(mem):
    h, big = mem
    assert h.base == address(big) + BEFORE and h.size == SIZE and h.end == h.base + SIZE
    assert h.u8.dtype == np.uint8 and h.u8.shape == (SIZE,)
    h.u8[5] = 77                                      # a view of the heap memory
    assert big[BEFORE + 5] == 77
    assert free_list(h.allocator) == [(RESERVED, SIZE - RESERVED)]
    assert h.allocator.end == SIZE
    assert h.known == {} and h._known_at == {}


def test_view(mem):
    h, big = mem
    v = h.view(16, 8)
    assert isinstance(v, memoryview) and v.nbytes == 8
    v[:] = b"abcdefgh"
    assert bytes(big[BEFORE + 16:BEFORE + 24]) == b"abcdefgh"
    assert h.view(SIZE - 4, 100).nbytes == 4


def test_remember_and_forget(mem):
    h, _ = mem
    a, b, c = object(), object(), object()
    h.remember(a, 32)
    h.remember(b, 32)
    h.remember(c, 64)
    assert h.known == {id(a): (a, 32), id(b): (b, 32), id(c): (c, 64)}
    assert h._known_at == {32: [id(a), id(b)], 64: [id(c)]}
    h.forget(32)
    assert h.known == {id(c): (c, 64)} and h._known_at == {64: [id(c)]}
    h.forget(32)                                      # nothing left there: no error
    h.forget(12345)
    h.known.pop(id(c))                                # already gone from known: tolerated
    h.forget(64)
    assert h.known == {} and h._known_at == {}


def test_address_of(mem):
    h, big = mem
    assert h.address_of(big[BEFORE + 8:]) == h.base + 8
    arr = np.frombuffer(big, np.uint8)
    assert h.address_of(arr[BEFORE + 3:]) == h.base + 3
    strided = np.frombuffer(big, np.uint8)[BEFORE + 10::2]    # not a contiguous buffer
    assert h.address_of(strided) == h.base + 10
    for bad in (5, "text", strided.data):
        with pytest.raises((TypeError, ValueError, BufferError)):
            h.address_of(bad)


@pytest.mark.parametrize("offset,nbytes", [(0, 0), (0, SIZE), (8, SIZE - 8), (SIZE - 1, 1),
                                           (SIZE, 0), (100, 7)])
def test_offset_of_inside(mem, offset, nbytes):
    h, big = mem
    assert h.offset_of(big[BEFORE + offset:], nbytes) == offset
    assert h.offset_of(np.frombuffer(big, np.uint8)[BEFORE + offset:], nbytes) == offset


OUTSIDE = "array is not on the symmetric heap (allocate it with " \
          "shmem.array/zeros/empty/full/new_array/alloc)"


@pytest.mark.parametrize("offset,nbytes", [(-1, 0), (-1, 1), (-BEFORE, 8), (0, SIZE + 1),
                                           (SIZE - 1, 2), (SIZE, 1), (SIZE + 1, 0)])
def test_offset_of_outside(mem, offset, nbytes):
    h, big = mem
    with pytest.raises(NotSymmetric) as ei:
        h.offset_of(big[BEFORE + offset:], nbytes)
    assert str(ei.value) == OUTSIDE


def test_offset_of_not_a_buffer(mem):
    h, _ = mem
    for bad, name in ((5, "int"), ([1, 2], "list")):
        with pytest.raises(NotSymmetric) as ei:
            h.offset_of(bad, 0)
        assert str(ei.value) == f"{name} is not an array on the symmetric heap"
        assert ei.value.__suppress_context__


def test_offset_of_uses_remembered_offsets(mem):
    h, big = mem
    arr = np.frombuffer(big, np.uint8)[BEFORE + 48:BEFORE + 64]
    h.remember(arr, 32)                               # the fast path trusts the table
    assert h.offset_of(arr, 16) == 32
    with pytest.raises(NotSymmetric) as ei:
        h.offset_of(arr, SIZE - 31)                   # and still checks the range
    assert str(ei.value) == OUTSIDE
    other = np.frombuffer(big, np.uint8)[BEFORE + 80:]
    h.known[id(other)] = (arr, 32)                    # an id reused by another object
    assert h.offset_of(other, 0) == 80
    foreign = bytearray(8)                            # not heap memory, but remembered
    h.remember(foreign, 8)
    assert h.offset_of(foreign, 8) == 8


@pytest.mark.parametrize("offset,inside", [(-1, False), (0, True), (SIZE - 1, True),
                                           (SIZE, False), (-BEFORE, False)])
def test_contains(mem, offset, inside):
    h, big = mem
    assert h.contains(big[BEFORE + offset:]) is inside


def test_contains_not_a_buffer(mem):
    h, _ = mem
    assert h.contains(5) is False and h.contains("x") is False
