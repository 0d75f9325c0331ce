"""mpi_shim datatypes in-process (no MPI job): type maps, packing, external32,
message specs (including MPI.BOTTOM with absolute addresses), status counts.

Expected bytes are written out or computed with plain numpy, independently
of the packing code; the external32 long double bytes are what mpi4py on
MPICH produces.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from mpi_shim import datatype as D
from mpi_shim import msgspec as M
from mpi_shim.datatype import (BYTE, CHAR, DOUBLE, DOUBLE_INT, FLOAT, INT, LONG, LONG_DOUBLE,
                               SHORT, SHORT_INT, UNSIGNED_LONG, WCHAR, Datatype)
from mpi_shim.exceptions import ERR_TYPE, Exception as MPIException
from mpi_shim.status import Status

pytestmark = pytest.mark.timeout(60)


def packed(dtype, buf, count=None):
    spec = [buf, dtype] if count is None else [buf, count, dtype]
    return bytes(M.parse(spec).pack())


# -- type maps ------------------------------------------------------------------------------
def test_type_maps_stay_compact():
    huge = BYTE.Create_contiguous(2 ** 31 + 5)
    assert huge.size == 2 ** 31 + 5 and len(huge._h.typemap.disps) == 1
    v = INT.Create_vector(1000, 3, 4)
    assert len(v._h.typemap.disps) == 1000          # one segment per block, not per int
    dense = INT.Create_vector(10, 4, 4)
    assert len(dense._h.typemap.disps) == 1          # blocks that touch merge
    for t in (huge, v, dense):
        t.Free()


def test_bounds_and_padding_follow_mpich():
    s = Datatype.Create_struct([1, 1], [0, 8], [CHAR, DOUBLE])
    assert (s.size, s.lb, s.extent, s.true_lb, s.true_extent) == (9, 0, 16, 0, 16)
    r = Datatype.Create_struct([1], [0], [INT.Create_resized(0, 5)])
    assert r.extent == 5                             # an explicit upper bound is kept
    neg = INT.Create_vector(2, 1, -3)
    assert (neg.lb, neg.extent) == (-12, 16)
    sub = INT.Create_subarray([4, 5], [2, 3], [1, 1])
    assert (sub.size, sub.extent, sub.true_lb, sub.true_extent) == (24, 80, 24, 32)
    dar = INT.Create_darray(4, 1, [8, 8], [D.DISTRIBUTE_BLOCK] * 2,
                            [D.DISTRIBUTE_DFLT_DARG] * 2, [2, 2])
    assert (dar.size, dar.extent, dar.true_lb, dar.true_extent) == (64, 256, 16, 112)
    assert (SHORT_INT.size, SHORT_INT.extent, DOUBLE_INT.size, DOUBLE_INT.extent) == \
        (6, 8, 12, 16)


def test_envelope_contents_decode_and_pickle():
    v = INT.Create_hvector(2, 3, 20)
    assert v.Get_envelope() == (0, 0, 3, 1, D.COMBINER_HVECTOR)
    i, a, c, d = v.Get_contents()
    assert (i, a, c, d) == ([], [], [2, 3, 20], [INT])
    base, name, params = v.decode()
    assert base == INT and name == "HVECTOR" and params == \
        {"count": 2, "blocklength": 3, "stride": 20}
    back = pickle.loads(pickle.dumps(v))
    assert back != v and back.decode()[1:] == ("HVECTOR", params)
    assert pickle.loads(pickle.dumps(INT)) is INT
    f = Datatype.Create_f90_real(6, 30)
    assert f.Get_envelope() == (2, 0, 0, 0, D.COMBINER_F90_REAL) and f.is_predefined
    assert f.tocode() == "f4" and not f.is_named
    for t in (v, back):
        t.Free()


def test_free_and_references():
    t = INT.Dup()
    inner = t.Create_contiguous(2)
    t.Free()
    assert t == D.DATATYPE_NULL
    assert inner.Get_contents()[3][0].size == 4     # the component outlives its handle
    with pytest.raises(MPIException) as e:
        INT.Free()
    assert e.value.Get_error_class() == ERR_TYPE
    inner.Free()


# -- packing ---------------------------------------------------------------------------------
def test_pack_vector_indexed_struct_bytes():
    a = np.arange(12, dtype="i4")
    v = INT.Create_vector(3, 2, 4).Commit()          # ints 0 1, 4 5, 8 9
    assert packed(v, a, 1) == a[[0, 1, 4, 5, 8, 9]].tobytes()
    ix = INT.Create_indexed([1, 2], [5, 0]).Commit()  # type-map order: 5, then 0 1
    assert packed(ix, a, 1) == a[[5, 0, 1]].tobytes()
    neg = INT.Create_hvector(3, 1, -8).Commit()      # ints at 0, -2, -4 (bytes 0, -8, -16)
    m = M.Msg(memoryview(a).cast("B"), 1, neg, 16)
    assert bytes(m.pack()) == a[[4, 2, 0]].tobytes()
    rec = np.zeros(2, dtype=np.dtype({"names": ["c", "d"], "formats": ["S1", "f8"],
                                      "offsets": [0, 8], "itemsize": 16}))
    rec["c"], rec["d"] = [b"x", b"y"], [1.5, -2.0]
    s = Datatype.Create_struct([1, 1], [0, 8], [CHAR, DOUBLE]).Commit()
    assert packed(s, rec) == b"x" + np.float64(1.5).tobytes() + b"y" + \
        np.float64(-2.0).tobytes()


def test_unpack_many_runs_and_partial():
    a = np.arange(4000, dtype="i4")
    v = INT.Create_vector(1000, 1, 2).Commit()       # many runs: the grouped gather path
    assert v.extent == 1999 * 4                     # element 1 starts at int 1999
    picked = np.concatenate([np.arange(0, 2000, 2), np.arange(1999, 3999, 2)])
    data = packed(v, a, 2)
    assert data == a[picked].tobytes()
    out = np.full(4000, -1, "i4")
    M.parse([out, 2, v], writable=True).unpack(data)
    assert (out[picked] == a[picked]).all()
    assert (np.delete(out, picked) == -1).all()
    out[:] = -1
    M.parse([out, 2, v], writable=True).unpack(data, 4 * 1001 + 2)   # ends mid-int
    assert (out[picked[:1001]] == a[picked[:1001]]).all()
    assert out[2001] != a[2001] and (out[picked[1002:]] == -1).all()


def test_contiguous_messages_are_not_copied():
    a = np.zeros(1 << 20, "u1")
    m = M.parse([a, DOUBLE])
    view = m.pack()
    assert isinstance(view, memoryview) and np.shares_memory(np.asarray(view), a)


def test_datatype_pack_unpack_positions():
    a = np.arange(6, dtype="i4")
    out = bytearray(40)
    pos = INT.Pack(a, out, 4, _SelfComm())
    assert pos == 28 and bytes(out[4:28]) == a.tobytes()
    back = np.zeros(6, "i4")
    assert INT.Unpack(out, 4, back, _SelfComm()) == 28 and (back == a).all()
    with pytest.raises(MPIException):
        INT.Pack(a, bytearray(10), 0, _SelfComm())   # does not fit: ERR_TRUNCATE


class _SelfComm:
    """Stands in for a valid communicator (Pack only checks that it is not null)."""

    def __bool__(self):
        return True


# -- external32 ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,values,np_type,hexbytes", [
    (SHORT, [1, -2], "i2", "0001fffe"),
    (INT, [1, -2], "i4", "00000001fffffffe"),
    (LONG, [1, -2, 2 ** 40], "i8", "00000001fffffffe00000000"),
    (UNSIGNED_LONG, [1, 2 ** 33], "u8", "0000000100000000"),
    (FLOAT, [1.5, -2], "f4", "3fc00000c0000000"),
    (DOUBLE, [1.5], "f8", "3ff8000000000000"),
    (LONG_DOUBLE, [1.5, -3.25], "g",
     "3fff8000000000000000000000000000c000a000000000000000000000000000"),
    (D.C_LONG_DOUBLE_COMPLEX, [1 + 2j], "G",
     "3fff000000000000000000000000000040000000000000000000000000000000"),
    (D.C_FLOAT_COMPLEX, [1 + 2j], "c8", "3f80000040000000"),
    (D.C_BOOL, [True, False], "?", "0100"),
    (WCHAR, ["a", "\u20ac"], "U1", "006120ac"),
    (D.AINT, [-5], "i8", "fffffffffffffffb"),
])
def test_external32_bytes(dtype, values, np_type, hexbytes):
    a = np.array(values, dtype=np_type)
    n = dtype.Pack_external_size("external32", len(a))
    out = bytearray(n)
    assert dtype.Pack_external("external32", a, out, 0) == n == len(hexbytes) // 2
    assert out.hex() == hexbytes
    back = np.zeros_like(a)
    assert dtype.Unpack_external("external32", out, 0, back) == n
    expect = a.astype(np.int32).astype(np_type) if dtype in (LONG, UNSIGNED_LONG) else a
    assert (back == expect).all()


def test_external32_mixed_struct_and_pairs():
    s = Datatype.Create_struct([1, 1, 2], [0, 8, 16], [CHAR, DOUBLE, SHORT]).Commit()
    assert s.extent == 24
    rec = np.zeros(2, dtype=np.dtype({"names": ["c", "d", "s"],
                                      "formats": ["S1", "f8", ("i2", 2)],
                                      "offsets": [0, 8, 16], "itemsize": s.extent}))
    rec["c"], rec["d"], rec["s"] = [b"x", b"y"], [2.5, -1.0], [[1, 2], [3, -4]]
    n = s.Pack_external_size("external32", 2)
    assert n == 2 * (1 + 8 + 4)
    out = bytearray(n)
    s.Pack_external("external32", rec.view(np.uint8), out, 0)   # numpy exports no format
    assert out.hex() == ("78" "4004000000000000" "0001" "0002"
                         "79" "bff0000000000000" "0003" "fffc")
    back = np.zeros_like(rec)
    s.Unpack_external("external32", out, 0, back.view(np.uint8))
    assert (back["c"] == rec["c"]).all() and (back["d"] == rec["d"]).all()
    assert (back["s"] == rec["s"]).all()
    pair = np.zeros(1, np.dtype([("v", "f8"), ("i", "i4")], align=True))
    pair["v"], pair["i"] = 1.5, 3
    out = bytearray(DOUBLE_INT.Pack_external_size("external32", 1))
    DOUBLE_INT.Pack_external("external32", pair, out, 0)
    assert out.hex() == "3ff8000000000000" "00000003"
    with pytest.raises(MPIException):
        INT.Pack_external_size("native", 1)


# -- message specs ---------------------------------------------------------------------------
def test_bottom_with_absolute_addresses():
    x = np.arange(4, dtype="i4")
    y = np.arange(10, 13, dtype="f8")
    t = Datatype.Create_struct([4, 3], [M.address_of(x), M.address_of(y)],
                               [INT, DOUBLE]).Commit()
    m = M.parse([M.BOTTOM, 1, t])
    assert bytes(m.pack()) == x.tobytes() + y.tobytes()
    x2, y2 = np.zeros(4, "i4"), np.zeros(3, "f8")
    t2 = Datatype.Create_struct([4, 3], [M.address_of(x2), M.address_of(y2)],
                                [INT, DOUBLE]).Commit()
    M.parse([M.BOTTOM, 1, t2], writable=True).unpack(m.pack())
    assert (x2 == x).all() and (y2 == y).all()
    parts = M.parse_w([M.BOTTOM, [1], [0], [t2]], 1, writable=True)
    assert parts[0].nbytes == t2.size
    assert M.parse([M.BOTTOM, t]).count == 0
    with pytest.raises(ValueError):
        M.parse([M.BOTTOM, 1, INT]).pack()           # not an absolute address


def test_spec_forms_and_errors():
    b = bytearray(range(8))
    assert bytes(M.parse([b, (1, 1), "h"]).pack()) == b"\x02\x03"
    assert bytes(M.parse([b, None, 3, "h"]).pack()) == b"\x06\x07"
    assert M.parse(None).count == 0 and M.parse([None, (0, None), INT]).count == 0
    with pytest.raises(ValueError):
        M.parse([b, 0, 0, "i", None])
    with pytest.raises(KeyError):
        M.parse([b, 0, "\0"])
    with pytest.raises(ValueError):
        M.parse([b, 3, "i"])                          # reaches past the buffer
    with pytest.raises(ValueError):
        M.parse([bytearray(5), "i"])
    with pytest.raises(TypeError):
        M.parse([[1, 2], 4, 0, "i"])
    with pytest.raises(BufferError):
        M.parse(b"abcd", writable=True)
    with pytest.raises(BufferError):
        M.parse(np.arange(3, dtype=">i4"))
    with pytest.raises(MPIException):
        M.parse([b, 1, BYTE.Create_vector(2, 1, 2)])  # not committed


def test_vector_block_and_alltoallw_specs():
    b = bytearray(16)
    m, counts, displs = M.parse_v([b, [2, 3], [1, 7], "B"], 2)
    assert (counts, displs) == ([2, 3], [1, 7]) and m.count == 0
    assert M.parse_v([b, 3], 2)[1:] == ([3, 3], [0, 3])
    assert M.parse_v([b, (3, 5)], 2)[1:] == ([3, 3], [0, 5])
    with pytest.raises(ValueError):
        M.parse_v([b, [2]], 2)
    with pytest.raises(MPIException):
        M.parse_v([b, [-1, 2]], 2)
    with pytest.raises(ValueError):
        M.parse_block([bytearray(4), None, "i"], 2)
    assert M.parse_block([b, "i"], 2)[1:] == ([2, 2], [0, 2])
    parts = M.parse_w([b, ([2, 3], [0, 8]), [BYTE, BYTE]], 2)
    assert [(p.count, p.offset) for p in parts] == [(2, 0), (3, 8)]
    with pytest.raises(TypeError):
        M.parse_w([b, [2, 2], [0, 8], ["B", "B"]], 2)
    assert M.parse_target((4, 2), 1, INT)[:2] == (4, 2)


# -- status ----------------------------------------------------------------------------------
def test_status_elements_of_derived_types():
    st = Datatype.Create_struct([1, 2], [0, 4], [SHORT, INT]).Commit()   # size 10
    s = Status()
    for n, count, elements in [(10, 1, 3), (12, D.UNDEFINED, 4), (8, D.UNDEFINED, D.UNDEFINED),
                               (26, D.UNDEFINED, 8), (0, 0, 0)]:
        s.Set_elements(BYTE, n)
        assert (s.Get_count(st), s.Get_elements(st)) == (count, elements), n
    s.Set_elements(st, 4)
    assert s.Get_count(BYTE) == 12


def test_describe_rebuilds_the_same_layout():
    t = Datatype.Create_struct([2, 1], [0, 16], [INT.Create_resized(0, 8), DOUBLE])
    desc = D.describe(t)
    pickle.loads(pickle.dumps(desc))
    r = D.from_description(desc)
    a, b = t._h.typemap, r._h.typemap
    assert (a.disps.tolist(), a.codes.tolist(), a.counts.tolist(), a.lb, a.ub) == \
        (b.disps.tolist(), b.codes.tolist(), b.counts.tolist(), b.lb, b.ub)
    assert D.reduction_dtype(INT.Create_vector(2, 1, 3)) == np.dtype("i4")
    assert D.reduction_dtype(t) is None
