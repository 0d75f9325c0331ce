"""mpi_shim type maps and packing in-process (the mutation suite of
mpi_shim/typemap.py and mpi_shim/packing.py).

Type maps are checked against values written out by hand (segments,
bounds, byte runs, element positions).  Packing is checked against a
reference model that knows nothing of the packing plans: it expands the
type map into one ``(displacement, size)`` pair per basic element and
copies byte by byte, element after element, ``extent`` apart.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpi_shim import constructors as C
from mpi_shim import packing
from mpi_shim import typemap as T
from mpi_shim.datatype import BYTE, CHAR, DOUBLE, INT, LONG, SHORT, WCHAR
from mpi_shim.packing import contiguous_range, pack, span, unpack
from mpi_shim.typemap import ELEMENTS, ByteBlocks, Typemap

pytestmark = pytest.mark.timeout(60)

B, CH, S, I, D, L, W = (int(t._h.typemap.codes[0]) for t in (BYTE, CHAR, SHORT, INT, DOUBLE, LONG,
                                                        WCHAR))


def tm_of(t):
    return t._h.typemap


def segs(tm):
    """The segments as plain tuples ``(disp, code, count)``."""
    return list(zip(tm.disps.tolist(), tm.codes.tolist(), tm.counts.tolist()))


# -- the reference model -------------------------------------------------------------------
def expand(tm):
    """``(displacement, size)`` of every basic element, in type-map order."""
    out = []
    for d, c, n in segs(tm):
        size = ELEMENTS[c].size
        out += [(d + k * size, size) for k in range(n)]
    return out


def ref_pack(flat, offset, count, tm):
    out = bytearray()
    for i in range(count):
        for d, n in expand(tm):
            at = offset + i * tm.extent + d
            out += bytes(flat[at:at + n])
    return bytes(out)


def ref_unpack(flat, offset, count, tm, data, nbytes=None):
    total = count * tm.size if nbytes is None else max(0, min(nbytes, count * tm.size))
    k = 0
    for i in range(count):
        for d, n in expand(tm):
            for b in range(n):
                if k == total:
                    return
                flat[offset + i * tm.extent + d + b] = data[k]
                k += 1


def buffer(n, seed=1):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# -- type maps ------------------------------------------------------------------------------
def test_basic_and_pair_maps():
    t = Typemap.basic(D)
    assert segs(t) == [(0, D, 1)]
    assert (t.lb, t.ub, t.extent, t.size, t.true_bounds, t.align) == (0, 8, 8, 8, (0, 8), 8)
    assert (t.sticky_lb, t.sticky_ub) == (False, False)
    p = Typemap.from_parts([(0, D), (8, I)], 0, 16, align=8)
    assert segs(p) == [(0, D, 1), (8, I, 1)]
    assert (p.lb, p.ub, p.size, p.true_bounds, p.align, p.nelements) == (0, 16, 12, (0, 12), 8, 2)
    assert Typemap.from_parts([(0, I)], 0, 4).align == 1


def test_segments_merge_only_when_they_continue_each_other():
    t = Typemap([0, 4, 8, 20, 24, 26], [I, I, I, I, S, S], [1, 1, 1, 1, 1, 1], 0, 32)
    assert segs(t) == [(0, I, 3), (20, I, 1), (24, S, 2)]
    assert (t.size, t.nelements, t.true_bounds) == (20, 6, (0, 28))
    # same kind but not adjacent, adjacent but another kind, overlapping: kept apart
    assert segs(Typemap([0, 8], [I, I], [1, 1], 0, 12)) == [(0, I, 1), (8, I, 1)]
    assert segs(Typemap([0, 4], [I, S], [1, 1], 0, 8)) == [(0, I, 1), (4, S, 1)]
    assert segs(Typemap([0, 2], [I, I], [1, 1], 0, 8)) == [(0, I, 1), (2, I, 1)]
    # a run of counts merges into one segment whose count is the sum
    assert segs(Typemap([0, 8, 24], [I, I, I], [2, 4, 1], 0, 28)) == [(0, I, 7)]
    assert segs(Typemap([0, 4], [I, I], [1, 1], 0, 8, merge=False)) == [(0, I, 1), (4, I, 1)]
    single = Typemap([4], [I], [3], 0, 16)
    assert segs(single) == [(4, I, 3)] and single.true_bounds == (4, 16)


def test_empty_counts_are_dropped():
    t = Typemap([0, 4, 8], [I, D, I], [1, 0, 1], -2, 14)
    assert segs(t) == [(0, I, 1), (8, I, 1)]
    assert (t.lb, t.ub, t.extent, t.size) == (-2, 14, 16, 8)
    e = Typemap([0], [I], [0], 0, 0)
    assert (segs(e), e.size, e.true_bounds, e.nelements) == ([], 0, (0, 0), 0)
    n = Typemap([], [], [], 3, 7)
    assert (n.lb, n.ub, n.extent, n.size, n.true_bounds) == (3, 7, 4, 0, (0, 0))


def test_true_bounds_take_the_extremes_not_the_ends():
    t = Typemap([16, -8, 0], [D, I, S], [1, 1, 3], 0, 0)
    assert t.true_bounds == (-8, 24) and t.size == 18 and t.extent == 0


def test_dense():
    assert Typemap.basic(I).dense()
    assert Typemap([0], [I], [4], 0, 16).dense()
    assert not Typemap([0], [I], [4], 0, 20).dense()                     # padded
    assert not Typemap([0, 4], [I, S], [1, 1], 0, 6).dense()             # two segments
    assert not Typemap([], [], [], 0, 4).dense()


def test_replicate_contiguous_and_vector():
    i = Typemap.basic(I)
    c = C.contiguous(i, 5)
    assert segs(c) == [(0, I, 5)] and (c.lb, c.ub, c.size) == (0, 20, 20)
    v = C.vector(i, 3, 2, 12)
    assert segs(v) == [(0, I, 2), (12, I, 2), (24, I, 2)]
    assert (v.lb, v.ub, v.extent, v.true_bounds) == (0, 32, 32, (0, 32))
    neg = C.vector(i, 2, 1, -12)
    assert segs(neg) == [(0, I, 1), (-12, I, 1)] and (neg.lb, neg.ub) == (-12, 4)
    assert neg.true_bounds == (-12, 4)
    # a non-dense element: one copy per element of each block, an extent apart
    pair = Typemap([0, 8], [D, I], [1, 1], 0, 16, align=8)
    v2 = pair.replicate([0, 100], [2, 1])
    assert segs(v2) == [(0, D, 1), (8, I, 1), (16, D, 1), (24, I, 1), (100, D, 1),
                        (108, I, 1)]
    assert (v2.lb, v2.ub, v2.size, v2.align) == (0, 116, 36, 8)
    one = pair.replicate([40, 8], [1, 1])              # one copy per block: origins = starts
    assert segs(one) == [(40, D, 1), (48, I, 1), (8, D, 1), (16, I, 1)]
    assert (one.lb, one.ub) == (8, 56)


def test_replicate_bounds_with_negative_extent_and_lb():
    r = Typemap.basic(I).resized(-4, -8)               # lb -4, ub -12, extent -8
    assert (r.lb, r.ub, r.extent, r.sticky_lb, r.sticky_ub) == (-4, -12, -8, True, True)
    v = r.replicate([0, 40], [3, 1])
    # copies at 0, -8, -16 and 40: lb = min(start, last) + lb, ub = max(...) + ub
    assert (v.lb, v.ub) == (-16 - 4, 40 - 12)
    assert segs(v) == [(0, I, 1), (-8, I, 1), (-16, I, 1), (40, I, 1)]
    assert (v.sticky_lb, v.sticky_ub) == (True, True)


def test_replicate_given_bounds_sticky_and_align():
    d = Typemap.basic(D)
    t = d.replicate([8], [2], lb=-4, ub=40, sticky=(True, False), align=2)
    assert segs(t) == [(8, D, 2)]
    assert (t.lb, t.ub, t.sticky_lb, t.sticky_ub, t.align) == (-4, 40, True, False, 2)
    t2 = d.replicate([8], [2], lb=0)
    assert (t2.lb, t2.ub, t2.align, t2.sticky_lb, t2.sticky_ub) == (0, 24, 8, False, False)
    t3 = d.replicate([8], [2], ub=0)
    assert (t3.lb, t3.ub) == (8, 0)


def test_replicate_nothing():
    d = Typemap.basic(D)
    for t in (d.replicate([], []), d.replicate([0, 8], [0, 0])):
        assert segs(t) == [] and (t.lb, t.ub, t.size) == (0, 0, 0)
    t = d.replicate([16], [0], lb=2, ub=10, sticky=(True, True), align=4)
    assert segs(t) == [] and (t.lb, t.ub, t.sticky_lb, t.sticky_ub, t.align) == \
        (2, 10, True, True, 4)
    # copies of a map without data: no segments, but the bounds of the copies
    e = Typemap([], [], [], 0, 4, sticky=(True, False), align=2)
    t = e.replicate([0], [3])
    assert segs(t) == [] and (t.lb, t.ub, t.sticky_lb, t.sticky_ub, t.align) == \
        (0, 12, True, False, 2)
    # zero-length blocks are dropped before the bounds are taken
    t = d.replicate([-100, 0, 200], [0, 1, 0])
    assert segs(t) == [(0, D, 1)] and (t.lb, t.ub) == (0, 8)


def test_replicate_keeps_sticky_and_align_of_the_element():
    r = Typemap.basic(S).resized(0, 4)
    v = r.replicate([0], [3])
    assert segs(v) == [(0, S, 1), (4, S, 1), (8, S, 1)]
    assert (v.lb, v.ub, v.sticky_lb, v.sticky_ub, v.align) == (0, 12, True, True, 2)


def test_struct_and_concatenate():
    s = C.struct([Typemap.basic(CH), Typemap.basic(D)], [1, 1], [0, 8], [1, 8])
    assert segs(s) == [(0, CH, 1), (8, D, 1)]
    assert (s.lb, s.ub, s.extent, s.size, s.align) == (0, 16, 16, 9, 8)
    cat = Typemap.concatenate([Typemap.basic(I), Typemap([], [], [], 0, 0),
                               Typemap([4], [I], [2], 0, 12)], -1, 20, (True, False), 4)
    assert segs(cat) == [(0, I, 3)]           # neighbours of two maps merge too
    assert (cat.lb, cat.ub, cat.sticky_lb, cat.sticky_ub, cat.align) == (-1, 20, True, False, 4)
    none = Typemap.concatenate([Typemap([], [], [], 0, 0)], 2, 6, (False, True), 2)
    assert segs(none) == [] and (none.lb, none.ub, none.sticky_lb, none.sticky_ub,
                                 none.align) == (2, 6, False, True, 2)


def test_resized_keeps_segments_unmerged():
    t = Typemap([0, 4], [I, I], [1, 1], 0, 8, merge=False, align=4)
    r = t.resized(-2, 10)
    assert segs(r) == [(0, I, 1), (4, I, 1)]
    assert (r.lb, r.ub, r.extent, r.sticky_lb, r.sticky_ub, r.align) == (-2, 8, 10, True,
                                                                          True, 4)


def test_byte_blocks_merge_across_kinds():
    t = Typemap([0, 4, 6, 16, 24], [I, S, S, D, CH], [1, 1, 1, 1, 2], 0, 32)
    bb = t.byte_blocks()
    assert bb is t.byte_blocks()                           # cached
    assert (bb.starts.tolist(), bb.lengths.tolist(), bb.positions.tolist()) == \
        ([0, 16], [8, 10], [0, 8])
    assert len(bb) == 2
    assert {k: (v[0].tolist(), v[1].tolist()) for k, v in bb.groups.items()} == \
        {10: ([16], [8]), 8: ([0], [0])}
    lone = ByteBlocks(np.array([5], np.int64), np.array([3], np.int64))
    assert (lone.starts.tolist(), lone.lengths.tolist(), lone.positions.tolist(), len(lone)) == \
        ([5], [3], [0], 1)
    gaps = ByteBlocks(np.array([0, 10, 30, 33], np.int64), np.array([2, 2, 3, 1], np.int64))
    assert (gaps.starts.tolist(), gaps.lengths.tolist(), gaps.positions.tolist()) == \
        ([0, 10, 30], [2, 2, 4], [0, 2, 4])
    assert {k: (v[0].tolist(), v[1].tolist()) for k, v in gaps.groups.items()} == \
        {2: ([0, 10], [0, 2]), 4: ([30], [4])}
    apart = ByteBlocks(np.array([0, 8], np.int64), np.array([4, 4], np.int64))
    assert (apart.starts.tolist(), apart.lengths.tolist()) == ([0, 8], [4, 4])


def test_single_run():
    assert Typemap([4], [I], [3], 0, 16).single_run() == (4, 12)
    two = Typemap([0, 4], [I, S], [1, 1], 0, 8)
    assert two.single_run() == (0, 6)                       # kinds differ, bytes touch
    gap = Typemap([0, 8], [I, I], [1, 1], 0, 12)
    assert gap.single_run() is None and gap.single_run() is None
    empty = Typemap([], [], [], 0, 4)
    assert empty.single_run() == (0, 0) and empty.single_run() == (0, 0)
    assert isinstance(Typemap.basic(D).single_run()[0], int)


def test_kinds_and_element_positions():
    t = Typemap([0, 4, 12, 20], [I, D, I, S], [1, 1, 2, 1], 0, 24, merge=False)
    assert t.kinds() == {I, D, S} and t.kinds() is t.kinds()
    # packed: I at 0, D at 4..12, I I at 12, 16, S at 20
    assert t.element_positions(I).tolist() == [0, 12, 16]
    assert t.element_positions(D).tolist() == [4]
    assert t.element_positions(S).tolist() == [20]
    assert t.element_positions(I) is t.element_positions(I)
    assert t.element_positions(CH).tolist() == []
    u = Typemap([0, 100], [S, S], [3, 2], 0, 104)
    assert u.element_positions(S).tolist() == [0, 2, 4, 6, 8]


def test_ext32_layout():
    # LONG is 8 bytes here and 4 in external32, WCHAR 4 and 2
    t = Typemap([0, 8, 24, 32], [L, I, L, W], [1, 2, 1, 3], 0, 48, merge=False)
    size, offsets = t.ext32_layout()
    assert size == 4 + 8 + 4 + 6
    assert {k: v.tolist() for k, v in offsets.items()} == \
        {L: [0, 12], I: [4, 8], W: [16, 18, 20]}
    assert t.ext32_layout() is t.ext32_layout()
    assert Typemap([], [], [], 0, 0).ext32_layout() == (0, {})


def test_elements_in_and_bytes_of():
    t = Typemap([0, 8, 16], [I, D, S], [2, 1, 3], 0, 24)   # packed: 4 4 | 8 | 2 2 2
    expect = {0: 0, 4: 1, 8: 2, 16: 3, 18: 4, 20: 5, 22: 6}
    for nbytes in range(23):
        assert t.elements_in(nbytes) == expect.get(nbytes), nbytes
    sizes = [0, 4, 8, 16, 18, 20, 22]
    for n, b in enumerate(sizes):
        assert t.bytes_of(n) == b, n
    assert isinstance(t.bytes_of(2), int) and isinstance(t.elements_in(8), int)


def test_describe_roundtrip_keeps_segments_as_they_are():
    t = Typemap([0, 4, 16], [I, I, D], [1, 1, 2], -8, 40, merge=False)
    back = Typemap.from_description(t.describe())
    assert segs(back) == [(0, I, 1), (4, I, 1), (16, D, 2)]
    assert (back.lb, back.ub, back.size) == (-8, 40, 24)
    d = t.describe()
    assert d[3:] == (-8, 40) and np.frombuffer(d[0], np.int64).tolist() == [0, 4, 16]


def test_register_element():
    before = len(ELEMENTS)
    code = T.register_element("TEST_U2", "u2")
    e = ELEMENTS[code]
    assert code == before and len(ELEMENTS) == before + 1 and e.index == code
    assert (e.name, e.numpy, e.size, e.align, e.ext32, e.convert) == \
        ("TEST_U2", np.dtype("u2"), 2, 2, np.dtype(">u2"), None)
    assert repr(e) == "<Element TEST_U2 <u2>"
    assert Typemap([0], [code], [3], 0, 6).size == 6           # sizes table extended
    c2 = T.register_element("TEST_WIDE", "i8", align=4, ext32=">i4", convert="x87")
    e2 = ELEMENTS[c2]
    assert (c2, e2.align, e2.ext32, e2.convert, e2.size) == (code + 1, 4, np.dtype(">i4"),
                                                             "x87", 8)
    assert Typemap([0, 8], [code, c2], [1, 1], 0, 16).size == 10


# -- packing ----------------------------------------------------------------------------
def layouts():
    """Type maps of the usual constructors: name -> map."""
    i, d = Typemap.basic(I), Typemap.basic(D)
    out = {
        "int": i,
        "contiguous": C.contiguous(i, 7),
        "vector": C.vector(i, 5, 2, 12),
        "vector_neg": C.vector(d, 4, 1, -24),
        "indexed": C.indexed(i, [2, 1, 3, 0, 1], [40, 0, 12, 80, -16]),
        "struct": C.struct([Typemap.basic(CH), d, Typemap.basic(S)], [3, 2, 1], [0, 8, 30],
                           [1, 8, 2]),
        "resized_small": C.vector(i, 2, 1, 8).resized(0, 6),
        "resized_lb": C.vector(i, 3, 1, 8).resized(-8, 40),
        "subarray": tm_of(INT.Create_subarray([4, 6], [2, 3], [1, 2])),
        "subarray_f": tm_of(SHORT.Create_subarray([3, 4, 5], [2, 2, 3], [1, 0, 2],
                                                  order=C.ORDER_FORTRAN)),
        # more runs than _FEW_RUNS, of three lengths
        "many_runs": C.indexed(Typemap.basic(B), [1, 2, 3] * 10,
                               [7 * k for k in range(30)]),
        "many_neg": C.indexed(Typemap.basic(S), [1, 2] * 12, [-6 * k for k in range(24)]),
        "sixteen": C.vector(Typemap.basic(CH), 16, 1, 2),
        "seventeen": C.vector(Typemap.basic(CH), 17, 1, 2),
    }
    return out


LAYOUTS = layouts()


def room(tm, count):
    """A buffer size and an offset such that ``count`` elements fit."""
    lo, hi = tm.true_bounds
    ext = tm.extent
    reach = (count - 1) * ext if count else 0
    first = lo + min(0, reach)
    offset = 5 - first
    return offset + hi + max(0, reach) + 5, offset


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_pack_matches_the_model(name, count):
    tm = LAYOUTS[name]
    n, offset = room(tm, count)
    flat = buffer(n, seed=count)
    got = pack(flat, offset, count, tm)
    assert got.dtype == np.uint8 and got.size == count * tm.size
    assert bytes(got) == ref_pack(flat, offset, count, tm)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("count", [0, 1, 3])
def test_unpack_matches_the_model(name, count):
    tm = LAYOUTS[name]
    if name == "resized_small":
        return                                # copies overlap: order-dependent, see below
    n, offset = room(tm, count)
    data = bytes(buffer(count * tm.size, seed=7))
    full = count * tm.size
    for nbytes in sorted({None, 0, 1, full, full + 9, full - 1, full // 2,
                          tm.size, tm.size + 3, -4}, key=lambda x: -1 if x is None else x):
        if nbytes is not None and nbytes > full + 9:
            continue
        flat = buffer(n, seed=3)
        want = flat.copy()
        unpack(flat, offset, count, tm, data, nbytes)
        ref_unpack(want, offset, count, tm, data, nbytes)
        assert bytes(flat) == bytes(want), nbytes


def test_unpack_each_truncation_point():
    for name in ("struct", "indexed", "many_runs", "subarray_f"):
        tm = LAYOUTS[name]
        count = 2
        n, offset = room(tm, count)
        data = bytes(buffer(count * tm.size, seed=11))
        for nbytes in range(count * tm.size + 1):
            flat = np.zeros(n, np.uint8)
            want = flat.copy()
            unpack(flat, offset, count, tm, data, nbytes)
            ref_unpack(want, offset, count, tm, data, nbytes)
            assert bytes(flat) == bytes(want), (name, nbytes)


def test_unpack_accepts_any_buffer_and_ignores_extra_data():
    tm = LAYOUTS["vector"]
    n, offset = room(tm, 2)
    data = bytes(range(2 * tm.size)) + b"\xff" * 7
    for src in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        flat = np.zeros(n, np.uint8)
        unpack(flat, offset, 2, tm, src)
        want = np.zeros(n, np.uint8)
        ref_unpack(want, offset, 2, tm, data)
        assert bytes(flat) == bytes(want)
    flat = np.zeros(n, np.uint8)
    unpack(flat, offset, 2, tm, data, np.int64(5))
    assert int(flat.astype(np.int64).sum()) == sum(range(5))


def test_overlapping_copies_pack_and_unpack_in_order():
    tm = LAYOUTS["resized_small"]          # ints at 0 and 8, extent 6: copies overlap
    flat = np.arange(40, dtype=np.uint8)
    assert bytes(pack(flat, 2, 3, tm)) == ref_pack(flat, 2, 3, tm)
    out = np.zeros(40, np.uint8)
    unpack(out, 2, 1, tm, bytes(range(100, 108)))
    assert out[2:6].tolist() == [100, 101, 102, 103] and out[10:14].tolist() == \
        [104, 105, 106, 107]


def test_pack_and_unpack_without_data():
    e = Typemap([], [], [], 0, 8)
    flat = buffer(32)
    assert pack(flat, 0, 3, e).size == 0 and pack(flat, 0, 0, LAYOUTS["vector"]).size == 0
    keep = flat.copy()
    unpack(flat, 0, 3, e, b"")
    unpack(flat, 0, 0, LAYOUTS["vector"], b"abc")
    unpack(flat, 0, 2, LAYOUTS["vector"], b"", 0)
    assert bytes(flat) == bytes(keep)


def test_pack_leaves_holes_unread_and_unpack_leaves_them_untouched():
    tm = LAYOUTS["vector"]
    n, offset = room(tm, 3)
    flat = np.zeros(n, np.uint8)
    unpack(flat, offset, 3, tm, b"\x01" * (3 * tm.size))
    written = np.flatnonzero(flat).tolist()
    want = sorted({offset + i * tm.extent + d + b for i in range(3) for d, m in expand(tm)
                   for b in range(m)})
    assert written == want


def test_span():
    v = LAYOUTS["vector"]                     # true bounds (0, 56), extent 56
    assert span(10, 1, v) == (10, 66)
    assert span(10, 3, v) == (10, 10 + 56 + 2 * v.extent)
    assert span(10, 0, v) == (10, 10) and span(10, -1, v) == (10, 10)
    assert span(7, 4, Typemap([], [], [], 0, 8)) == (7, 7)
    r = Typemap([4], [I], [1], 0, 8).resized(-2, -12)    # negative extent
    assert span(100, 1, r) == (104, 108)
    assert span(100, 3, r) == (104 - 24, 108)
    neg = LAYOUTS["vector_neg"]
    lo, hi = neg.true_bounds
    assert (lo, hi) == (-72, 8) and span(200, 2, neg) == (200 - 72, 200 + 8 + neg.extent)


def test_contiguous_range():
    i = Typemap.basic(I)
    assert contiguous_range(8, 5, i) == (8, 28)
    assert contiguous_range(8, 1, i) == (8, 12)
    assert contiguous_range(8, 0, i) == (8, 8)
    assert contiguous_range(8, -2, i) == (8, 8)
    shifted = Typemap([4], [I], [2], 0, 12)           # one run of 8 bytes at 4, extent 12
    assert contiguous_range(8, 1, shifted) == (12, 20)
    assert contiguous_range(8, 2, shifted) is None      # copies leave holes
    assert contiguous_range(8, 0, shifted) == (8, 8)
    tight = Typemap([4], [I], [2], 4, 12)             # extent 8 = run: copies touch
    assert contiguous_range(8, 3, tight) == (12, 36)
    gap = LAYOUTS["vector"]
    assert contiguous_range(0, 1, gap) is None and contiguous_range(0, 0, gap) == (0, 0)
    assert contiguous_range(3, 4, Typemap([], [], [], 0, 8)) == (3, 3)


def test_packing_helpers():
    flat = np.arange(10, dtype=np.uint8)
    assert packing._rows(flat, 3).tolist() == [[k, k + 1, k + 2] for k in range(8)]
    assert packing._strided(flat, 1, 2, 4, 2).tolist() == [[1, 2], [5, 6]]
    assert packing._strided(flat, 0, 3, 3, 1).tolist() == [[0], [3], [6]]


def test_construction_takes_any_integer_arrays_and_flattens_them():
    t = Typemap(np.array([[0, 8]], np.int32), np.array([[I, D]], np.int64),
                np.array([[1, 2]], np.uint8), 0, 24)
    assert (t.disps.dtype, t.codes.dtype, t.counts.dtype) == (np.int64, np.int16, np.int64)
    assert (t.disps.shape, t.codes.shape, t.counts.shape) == ((2,), (2,), (2,))
    assert segs(t) == [(0, I, 1), (8, D, 2)] and t.align == 1
    assert t.describe()[0] == np.array([0, 8], np.int64).tobytes()
    assert t.describe()[2] == np.array([1, 2], np.int64).tobytes()
    i = Typemap.basic(I)
    v = i.replicate(np.array([[0, 16]], np.int32), np.array([[2, 1]], np.int32))
    assert segs(v) == [(0, I, 2), (16, I, 1)]
    # int32 block starts and lengths must not overflow: bounds are computed in 64 bits
    big = i.replicate(np.array([2 ** 31 - 4], np.int32), np.array([3], np.int32))
    assert (big.lb, big.ub) == (2 ** 31 - 4, 2 ** 31 + 8)
    long = i.replicate(np.array([0], np.int32), np.array([2 ** 29 + 1], np.int32))
    assert (long.lb, long.ub, long.size) == (0, 2 ** 31 + 4, 2 ** 31 + 4)
    pair = Typemap([0, 8], [D, I], [1, 1], 0, 16)
    p2 = pair.replicate(np.array([[0, 64]], np.int32), np.array([[1, 2]], np.int32))
    assert segs(p2) == [(0, D, 1), (8, I, 1), (64, D, 1), (72, I, 1), (80, D, 1), (88, I, 1)]
    assert p2.disps.shape == (6,)


def test_replicate_dense_element_with_offset_and_count():
    shifted = Typemap([4], [I], [1], 4, 8)            # dense: one int, extent 4, at 4
    assert shifted.dense()
    r = shifted.replicate([0, 20], [2, 1])
    assert segs(r) == [(4, I, 2), (24, I, 1)] and (r.lb, r.ub) == (4, 28)
    triple = Typemap([0], [I], [3], 0, 12)
    r = triple.replicate([0, 100], [2, 1])
    assert segs(r) == [(0, I, 6), (100, I, 3)] and r.counts.dtype == np.int64


def test_cached_views_are_computed_once():
    t = Typemap([4], [I], [3], 0, 16)
    assert t.single_run() is t.single_run()
    assert t.byte_blocks() is t.byte_blocks()


def test_partial_element_counts_are_ints():
    t = Typemap([0, 8, 16], [I, D, S], [2, 1, 3], 0, 24)
    assert type(t.elements_in(4)) is int and type(t.elements_in(20)) is int
    assert type(t.bytes_of(1)) is int and type(t.bytes_of(0)) is int


def test_pack_and_unpack_one_byte_elements():
    b = Typemap.basic(B)
    flat = buffer(64, seed=5)
    got = pack(flat, 3, 40, b)
    assert bytes(got) == bytes(flat[3:43])
    out = np.zeros(64, np.uint8)
    unpack(out, 3, 40, b, bytes(got))
    assert bytes(out[3:43]) == bytes(flat[3:43]) and not out[:3].any() and not out[43:].any()


def test_replicate_converts_unsigned_starts_before_mixing_them_in():
    # uint64 mixed with int64 would become float64 and lose the low bits
    big = 2 ** 60 + 1
    for tm in (Typemap.basic(I), Typemap([0, 8], [D, I], [1, 1], 0, 16)):
        r = tm.replicate(np.array([big], np.uint64), np.array([1], np.uint64))
        assert r.disps.tolist()[0] == big and r.lb == big
