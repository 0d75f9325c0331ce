"""The remote-key format and the RMA access checks (``ucxpy.rkey``), byte for
byte and at every boundary: packing against hand-written bytes, round
trips, every truncation of a packed key, malformed names and slots, the
initiator's range/alignment/staleness check and the AM target's status.
In-process and fast (no workers); it is the mutation suite of
ucxpy/rkey.py (setup.cfg [mutmut]).  The put/get paths that use these
checks are exercised per transport in test_rma.py and test_fuzz_wire.py."""
from __future__ import annotations

import os
import types

import pytest

from ucxpy import rkey, rma
from ucxpy.errors import RemoteAccessError
from ucxpy.rkey import ALIGN, OK, RANGE, STALE, RegionKey, resolve

UUID = 0x0123456789ABCDEF
TABLE = b"ucxpy-rt-4242-abcdef0123"
SEG = b"ucxpy-rm-4242-abcdef0123-7"
HOST = b"host-\x00\xff-id"


def le(value: int, n: int) -> bytes:
    return value.to_bytes(n, "little")


def by_hand(uuid=UUID, mem_id=7, base=0x7F00_0000_1000, length=4000, pid=4242, slot=3,
            table=TABLE, seg=SEG, host=HOST, tl=b"\x00") -> bytes:
    """The packed layout spelled out field by field (not through rkey.HEADER)."""
    return (b"URK1" + le(uuid, 8) + le(mem_id, 8) + le(base, 8) + le(length, 8) + le(pid, 4)
            + le(slot, 4) + bytes([len(table), len(seg)]) + le(len(host), 2)
            + table + seg + host + tl)


def packed(**kw) -> bytes:
    args = dict(uuid=UUID, mem_id=7, address=0x7F00_0000_1000, length=4000, pid=4242,
                slot=3, table=TABLE, segment=SEG, host_id=HOST, transport_keys=b"\x00")
    args.update(kw)
    return rkey.pack(**args)


def raises(msg, fn, *args):
    with pytest.raises(RemoteAccessError) as ei:
        fn(*args)
    assert str(ei.value) == msg
    assert ei.value.__suppress_context__ or ei.value.__context__ is None
    return ei.value


# ------------------------------------------------------------------ format


def test_constants_are_pinned():
    assert (OK, STALE, RANGE, ALIGN, rkey.BADOP) == (0, 1, 2, 3, 4)
    assert rkey.MAGIC == b"URK1" and rkey.TABLE_SLOTS == 4096
    assert rkey.HEADER.format == "<4sQQQQIIBBH" and rkey.HEADER.size == 48


def test_rma_reexports_the_rkey_names():
    assert issubclass(rma.RemoteKey, RegionKey)
    assert rma._RKEY is rkey.HEADER and rma.TABLE_SLOTS == rkey.TABLE_SLOTS
    assert (rma.OK, rma.STALE, rma.RANGE, rma.ALIGN, rma.BADOP) == (0, 1, 2, 3, 4)
    assert rma._unpack_transport_keys is rkey.unpack_transport_keys


def test_pack_is_the_documented_layout():
    assert packed() == by_hand()
    assert len(packed()) == 48 + len(TABLE) + len(SEG) + len(HOST) + 1


@pytest.mark.parametrize("slot,packs_as", [(-1, 0), (-5, 0), (0, 0), (1, 1), (4095, 4095)])
def test_pack_slot_without_table_is_zero(slot, packs_as):
    assert packed(slot=slot) == by_hand(slot=packs_as)


def test_pack_empty_names_and_extreme_fields():
    big = (1 << 64) - 1
    p = packed(uuid=big, mem_id=big, address=big, length=big, pid=(1 << 32) - 1, slot=0,
               table=b"", segment=b"", host_id=b"", transport_keys=b"\x00")
    assert p == by_hand(uuid=big, mem_id=big, base=big, length=big, pid=(1 << 32) - 1,
                        slot=0, table=b"", seg=b"", host=b"")
    k = RegionKey(p)
    assert (k.uuid, k.mem_id, k.base, k.length, k.pid) == (big, big, big, big, (1 << 32) - 1)
    assert (k.table, k.segment, k.host_id, k.tl_keys) == ("", "", b"", {})


def test_pack_transport_keys_layout():
    assert rkey.pack_transport_keys([]) == b"\x00"
    assert rkey.pack_transport_keys([(b"ofi", b"\x01\x02")]) == b"\x01\x03ofi\x02\x00\x01\x02"
    long_key = bytes(range(256)) + b"xyz"                   # 259 bytes: length 0x0103
    assert rkey.pack_transport_keys(iter([(b"ofi", b""), (b"verbs", long_key)])) == (
        b"\x02" + b"\x03ofi\x00\x00" + b"\x05verbs\x03\x01" + long_key)


TL = [(b"ofi", b"\x01\x02\x03"), (b"verbs", b""), (b"x" * 255, bytes(300))]


def test_transport_keys_round_trip():
    blob = rkey.pack_transport_keys(TL)
    prefix = b"\xaa" * 5
    assert rkey.unpack_transport_keys(prefix + blob, 5) == {n.decode(): k for n, k in TL}
    assert rkey.unpack_transport_keys(b"\x00", 0) == {}
    got = rkey.unpack_transport_keys(blob, 0)
    assert list(got) == ["ofi", "verbs", "x" * 255]         # in packed order
    assert all(type(k) is bytes for k in got.values())


def test_transport_keys_every_truncation_is_refused():
    blob = rkey.pack_transport_keys(TL)
    for cut in range(len(blob)):
        raises("malformed remote key (transport keys)",
               rkey.unpack_transport_keys, blob[:cut], 0)


def test_transport_key_with_zero_length_cut_in_its_length_field():
    for blob in (b"\x01\x03ofi", b"\x01\x03ofi\x00"):       # key length 0, field cut
        raises("malformed remote key (transport keys)", rkey.unpack_transport_keys, blob, 0)
    assert rkey.unpack_transport_keys(b"\x01\x03ofi\x00\x00", 0) == {"ofi": b""}


def test_transport_keys_trailing_bytes_are_refused():
    blob = rkey.pack_transport_keys(TL)
    raises("malformed remote key (trailing bytes)", rkey.unpack_transport_keys, blob + b"\x00", 0)
    raises("malformed remote key (trailing bytes)", rkey.unpack_transport_keys, b"\x00\x00", 0)


def test_transport_key_name_must_be_ascii():
    raises("malformed remote key (transport keys)",
           rkey.unpack_transport_keys, b"\x01\x03of\xe9\x00\x00", 0)
    assert rkey.unpack_transport_keys(b"\x01\x03OFI\x00\x00", 0) == {"OFI": b""}


def test_transport_keys_count_past_the_end():
    raises("malformed remote key (transport keys)",
           rkey.unpack_transport_keys, b"\x02\x03ofi\x00\x00", 0)
    raises("malformed remote key (transport keys)", rkey.unpack_transport_keys, b"", 0)


# ------------------------------------------------------------------ unpack


def test_unpack_fields_and_round_trip_byte_for_byte():
    tl = rkey.pack_transport_keys(TL)
    p = packed(transport_keys=tl)
    k = RegionKey(p)
    assert (k.uuid, k.mem_id, k.base, k.length, k.pid, k.slot) == (
        UUID, 7, 0x7F00_0000_1000, 4000, 4242, 3)
    assert (k.table, k.segment) == (TABLE.decode(), SEG.decode())
    assert k.host_id == HOST and type(k.host_id) is bytes
    assert k.tl_keys == {n.decode(): v for n, v in TL}
    assert k._table_addr == 0
    again = rkey.pack(k.uuid, k.mem_id, k.base, k.length, k.pid, k.slot, k.table.encode(),
                      k.segment.encode(), k.host_id, rkey.pack_transport_keys(
                          (n.encode(), v) for n, v in k.tl_keys.items()))
    assert again == p


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_unpack_accepts_any_buffer(wrap):
    k = RegionKey(wrap(packed()))
    assert k.table == TABLE.decode() and k.host_id == HOST and type(k.host_id) is bytes


def test_every_truncated_header_is_too_short():
    p = packed()
    for cut in range(48):
        raises("malformed remote key (too short)", RegionKey, p[:cut])


def test_every_truncation_after_the_header_is_refused():
    p = packed(transport_keys=rkey.pack_transport_keys(TL))
    names = 48 + len(TABLE) + len(SEG) + len(HOST)
    for cut in range(48, names + 1):                        # up to the transport-key count
        raises("malformed remote key", RegionKey, p[:cut])
    for cut in range(names + 1, len(p)):
        raises("malformed remote key (transport keys)", RegionKey, p[:cut])
    raises("malformed remote key (trailing bytes)", RegionKey, p + b"\x00")


def test_shortest_valid_key():
    p = by_hand(table=b"", seg=b"", host=b"", tl=b"\x00")
    assert len(p) == 49
    k = RegionKey(p)
    assert (k.table, k.segment, k.host_id, k.tl_keys) == ("", "", b"", {})
    raises("malformed remote key", RegionKey, p[:48])


def test_bad_magic():
    p = packed()
    for magic in (b"URK0", b"urk1", b"\x00" * 4, b"SHMK"):
        raises("malformed remote key", RegionKey, magic + p[4:])


@pytest.mark.parametrize("table", [b"ucxpy-rt-1-0", b"ucxpy-rt-99-deadbeef", TABLE])
@pytest.mark.parametrize("seg", [b"", b"ucxpy-rm-1-0-0", b"ucxpy-rm-12-ab-345", SEG])
def test_valid_names(table, seg):
    k = RegionKey(by_hand(table=table, seg=seg))
    assert (k.table, k.segment) == (table.decode(), seg.decode())


@pytest.mark.parametrize("table,seg", [
    (b"../../etc/passwd", SEG), (TABLE, b"../../tmp/x"), (TABLE, b"ucxpy-rm-1-/x"),
    (b"ucxpy-rt-1-AB", SEG), (b"ucxpy-rt-1-ab\n", SEG), (b"xucxpy-rt-1-ab", SEG),
    (b"ucxpy-rt--ab", SEG), (b"ucxpy-rt-1-", SEG), (TABLE, b"ucxpy-rm-1-ab-"),
    (TABLE, b"ucxpy-rt-1-ab"), (b"ucxpy-rm-1-ab-2", SEG), (b"ucxpy-rt-1-\xe9", SEG),
    (TABLE, b"ucxpy-rm-1-ab-\xff"), (b"ucxpy-rt-\xd9\xa1-ab", SEG)])
def test_bad_names_are_refused(table, seg):
    raises("malformed remote key (segment name or slot)", RegionKey, by_hand(table=table, seg=seg))


def test_non_ascii_names_decode_with_replacement_before_the_check():
    # (checked after decoding: a replaced byte never matches the pattern)
    raises("malformed remote key (segment name or slot)", RegionKey,
           by_hand(table=b"\xff", seg=b""))
    raises("malformed remote key (segment name or slot)", RegionKey,
           by_hand(table=b"", seg=b"\xff"))


def test_segment_without_table():
    k = RegionKey(by_hand(table=b"", seg=SEG, slot=0))
    assert (k.table, k.segment, k.slot) == ("", SEG.decode(), 0)


@pytest.mark.parametrize("slot,ok", [(0, True), (4095, True), (4096, False), (4097, False),
                                     ((1 << 32) - 1, False)])
def test_slot_must_index_the_table(slot, ok):
    p = by_hand(slot=slot)
    if ok:
        assert RegionKey(p).slot == slot
    else:
        raises("malformed remote key (segment name or slot)", RegionKey, p)


def test_names_are_checked_after_the_transport_keys():
    # a key that is malformed twice reports the framing error first
    raises("malformed remote key (trailing bytes)", RegionKey,
           by_hand(table=b"../x", tl=b"\x00\x00"))


# ------------------------------------------------------------------ initiator check

BASE, LEN = 0x7F00_0000_1000, 64


@pytest.fixture
def key():
    return RegionKey(packed(address=BASE, length=LEN))


class FakeTable:
    """Stands in for the native atomic load of a registration-table slot:
    ``words`` maps an address to the memory id stored there."""

    def __init__(self, words):
        self.words = words
        self.loads = []

    def cast(self, ctype, address):
        assert ctype == "void *"
        return ("ptr", address)

    def ucxpy_atomic_load64(self, ptr):
        self.loads.append(ptr)
        return self.words[ptr[1]]


@pytest.fixture
def table(monkeypatch):
    fake = FakeTable({0x5000: 7, 0x5008: 8})
    monkeypatch.setattr(rkey, "ffi", fake)
    monkeypatch.setattr(rkey, "lib", fake)
    return fake


@pytest.mark.parametrize("offset,length", [(0, 0), (0, 1), (0, LEN), (LEN - 1, 1), (LEN, 0),
                                           (17, 23), (LEN - 8, 8)])
def test_check_inside(key, table, offset, length):
    assert key.check(BASE + offset, length) == offset
    assert table.loads == []                                # no table mapped: no load


@pytest.mark.parametrize("offset,length", [(-1, 0), (-1, 1), (-1, 2), (0, LEN + 1), (LEN, 1),
                                           (LEN + 1, 0), (1, LEN), (-LEN, LEN), (0, -1),
                                           (LEN, -1), (4, -5)])
def test_check_outside(key, table, offset, length):
    address = BASE + offset
    raises(f"remote access [{address:#x}, +{length}) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, address, length)


def test_check_message_example(key):
    raises("remote access [0x7f0000001040, +1) outside registered region "
           "[0x7f0000001000, +64)", key.check, BASE + 64, 1)


@pytest.mark.parametrize("offset,align,ok", [(0, 8, True), (8, 8, True), (56, 8, True),
                                             (4, 8, False), (1, 8, False), (7, 8, False),
                                             (4, 4, True), (2, 4, False), (60, 4, True),
                                             (3, 1, True), (6, 2, True), (5, 2, False)])
def test_check_alignment(key, table, offset, align, ok):
    address = BASE + offset
    if ok:
        assert key.check(address, min(align, LEN - offset), align) == offset
    else:
        raises(f"misaligned {align}-byte atomic at {address:#x}", key.check, address, 1, align)


def test_alignment_is_of_the_address_not_the_offset(table):
    k = RegionKey(packed(address=BASE + 4, length=LEN))
    assert k.check(BASE + 8, 8, 8) == 4
    raises(f"misaligned 8-byte atomic at {BASE + 4:#x}", k.check, BASE + 4, 8, 8)


def test_range_is_checked_before_alignment(key, table):
    raises(f"remote access [{BASE + 60:#x}, +8) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, BASE + 60, 8, 8)


def test_check_reads_the_table_slot_when_mapped(key, table):
    key._table_addr = 0x5000                                 # holds 7: our mem id
    assert key.check(BASE + 8, 8, 8) == 8
    assert table.loads == [("ptr", 0x5000)]
    key._table_addr = 0x5008                                 # holds 8: slot reused
    raises("stale remote key: memory 7 was unmapped", key.check, BASE, 1)
    table.words[0x5000] = 0                                  # unmapped
    key._table_addr = 0x5000
    raises("stale remote key: memory 7 was unmapped", key.check, BASE, 1)


def test_range_error_wins_over_staleness(key, table):
    key._table_addr = 0x5008
    raises(f"remote access [{BASE + LEN:#x}, +1) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, BASE + LEN, 1)
    raises(f"misaligned 8-byte atomic at {BASE + 4:#x}", key.check, BASE + 4, 8, 8)
    assert table.loads == []


def test_check_with_the_native_atomic_load(key):
    if rkey.lib is None:
        pytest.skip("ucxpy._native is not built")
    word = rkey.ffi.new("uint64_t[1]", [7])
    key._table_addr = int(rkey.ffi.cast("uintptr_t", word))
    assert key.check(BASE, LEN) == 0
    word[0] = 0
    raises("stale remote key: memory 7 was unmapped", key.check, BASE, LEN)


# ------------------------------------------------------------------ target check


@pytest.fixture
def registry():
    mh = types.SimpleNamespace(address=0x2000, length=64)
    return {7: mh, 9: types.SimpleNamespace(address=0x9000, length=0)}


def test_resolve_unknown_memory_is_stale(registry):
    assert resolve(registry, 8, 0x2000, 1) == (STALE, None, 0)
    assert resolve({}, 0, 0, 0) == (STALE, None, 0)


@pytest.mark.parametrize("address,length,off", [(0x2000, 0, 0), (0x2000, 64, 0), (0x203F, 1, 63),
                                                (0x2040, 0, 64), (0x2010, 16, 16)])
def test_resolve_inside(registry, address, length, off):
    status, mh, got = resolve(registry, 7, address, length)
    assert (status, got) == (OK, off) and mh is registry[7]


@pytest.mark.parametrize("address,length", [(0x1FFF, 0), (0x1FFF, 1), (0x2000, 65), (0x2040, 1),
                                            (0x2041, 0), (0x2001, 64), (0, 8)])
def test_resolve_outside(registry, address, length):
    assert resolve(registry, 7, address, length) == (RANGE, None, 0)


def test_resolve_empty_region(registry):
    status, mh, off = resolve(registry, 9, 0x9000, 0)
    assert (status, off) == (OK, 0) and mh is registry[9]
    assert resolve(registry, 9, 0x9000, 1) == (RANGE, None, 0)


@pytest.mark.parametrize("address,align,status", [(0x2008, 8, OK), (0x2004, 8, ALIGN),
                                                  (0x2004, 4, OK), (0x2002, 4, ALIGN),
                                                  (0x2001, 1, OK)])
def test_resolve_alignment(registry, address, align, status):
    got = resolve(registry, 7, address, align, align)
    if status == OK:
        assert got[0] == OK and got[1] is registry[7] and got[2] == address - 0x2000
    else:
        assert got == (ALIGN, None, 0)


def test_resolve_default_alignment_is_one(registry):
    status, mh, off = resolve(registry, 7, 0x2003, 4)
    assert (status, off) == (OK, 3) and mh is registry[7]


def test_resolve_range_before_alignment(registry):
    assert resolve(registry, 7, 0x203C, 8, 8) == (RANGE, None, 0)


# ------------------------------------------------------------------ through rma


class FakeIface:
    def __init__(self, name, caps, key):
        self.name = name
        self.attrs = types.SimpleNamespace(caps=caps)
        self.key = key
        self.views = []

    def pack_local_key(self, view):
        self.views.append(view)
        return 0, self.key


def fake_engine(ifaces, table=TABLE.decode()):
    worker = types.SimpleNamespace(uuid=UUID, ifaces=ifaces,
                                   address=types.SimpleNamespace(host_id=HOST))
    return types.SimpleNamespace(worker=worker,
                                 table=types.SimpleNamespace(name=table) if table else None)


def test_mem_handle_packs_the_documented_layout():
    rdma = FakeIface("ofi", rma.REG_CAPS, bytearray(b"\x10\x20"))
    other = FakeIface("tcp", 0, b"never")
    eng = fake_engine([other, rdma])
    buf = bytearray(100)
    mh = rma.MemHandle(eng, 7, memoryview(buf), 0x1234_5000)
    mh.slot = 5
    tl = b"\x01\x03ofi\x02\x00\x10\x20"
    want = by_hand(mem_id=7, base=0x1234_5000, length=100, pid=os.getpid(), slot=5,
                   seg=b"", tl=tl)
    assert mh.pack_rkey() == want
    assert mh.pack_rkey() == want and len(rdma.views) == 1    # registered once
    assert other.views == []
    k = RegionKey(want)
    assert k.tl_keys == {"ofi": b"\x10\x20"} and k.base == 0x1234_5000 and k.length == 100


def test_mem_handle_without_table_or_rdma():
    mh = rma.MemHandle(fake_engine([], table=None), 3, memoryview(bytearray(16)), 0x4000)
    assert mh.slot == -1
    assert mh.pack_rkey() == by_hand(mem_id=3, base=0x4000, length=16, pid=os.getpid(),
                                     slot=0, table=b"", seg=b"")
    mh.mapped = False
    with pytest.raises(RemoteAccessError, match="unmapped"):
        mh.pack_rkey()


def test_remote_key_checks_the_worker_uuid():
    modes = []
    rma_eng = types.SimpleNamespace(access_mode=lambda ep, k: modes.append(k) or rma.AM)
    ep = types.SimpleNamespace(remote=types.SimpleNamespace(uuid=UUID),
                               worker=types.SimpleNamespace(rma=rma_eng))
    k = rma.RemoteKey(ep, packed(address=BASE, length=LEN))
    assert k.mode == rma.AM and modes == [k] and k.ep is ep and k.mapped_address == 0
    assert k.check(BASE + LEN, 0) == LEN
    ep.remote.uuid = UUID + 1
    with pytest.raises(RemoteAccessError, match="another worker"):
        rma.RemoteKey(ep, packed())
    with pytest.raises(RemoteAccessError, match=r"\Amalformed remote key \(too short\)\Z"):
        rma.RemoteKey(ep, b"URK1")
