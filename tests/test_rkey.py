"""The remote-key format and the RMA access checks (``ucxpy.rkey``), byte for
byte and at every boundary: packing against hand-written bytes, round
trips, every truncation of a packed key, the initiator's
range/alignment/staleness check (staleness is the lane's memory-domain key,
``md_key.valid()``) and the AM target's status; then MemHandle / RemoteKey
of ucxpy.rma with fake interfaces and memory domains.  In-process and fast
(no workers); it is the mutation suite of ucxpy/rkey.py (setup.cfg
[mutmut]).  The shm memory domain's own key is tested in test_shm_md.py;
the put/get paths that use these checks are exercised per transport in
test_rma.py and test_fuzz_wire.py."""
from __future__ import annotations

import types

import pytest

from conftest import raises_remote_access

from ucxpy import _dp, rkey, rma
from ucxpy.config import Config
from ucxpy.errors import RemoteAccessError
from ucxpy.rkey import ALIGN, OK, RANGE, STALE, RegionKey, resolve
from ucxpy.transports.base import MdCaps, MdRemoteKey, MemoryDomain, RegistrationDomain
from ucxpy.transports.loopback import SelfMemoryDomain

UUID = 0x0123456789ABCDEF


def le(value: int, n: int) -> bytes:
    return value.to_bytes(n, "little")


def by_hand(uuid=UUID, mem_id=7, base=0x7F00_0000_1000, length=4000, mk=b"\x00") -> bytes:
    """The packed layout spelled out field by field (not through rkey.HEADER)."""
    return b"URK2" + le(uuid, 8) + le(mem_id, 8) + le(base, 8) + le(length, 8) + mk


def packed(**kw) -> bytes:
    args = dict(uuid=UUID, mem_id=7, address=0x7F00_0000_1000, length=4000, md_keys=b"\x00")
    args.update(kw)
    return rkey.pack(**args)


raises = raises_remote_access


# ------------------------------------------------------------------ format


def test_constants_are_pinned():
    assert (OK, STALE, RANGE, ALIGN, rkey.BADOP) == (0, 1, 2, 3, 4)
    assert rkey.MAGIC == b"URK2"
    assert rkey.HEADER.format == "<4sQQQQ" and rkey.HEADER.size == 36


def test_the_shm_fields_moved_out_of_the_core_key():
    for name in ("TABLE_SLOTS", "TABLE_NAME", "SEG_NAME", "pack_transport_keys",
                 "unpack_transport_keys", "lib", "ffi"):
        assert not hasattr(rkey, name), name
    assert RegionKey.__slots__ == ("uuid", "mem_id", "base", "length", "md_keys", "md_key")


def test_rma_uses_the_rkey_names():
    assert issubclass(rma.RemoteKey, RegionKey)
    assert rma.RemoteKey.__slots__ == ("ep", "mode", "native")
    assert rma._pack_rkey is rkey.pack and rma._pack_md_keys is rkey.pack_md_keys
    assert rma.resolve is rkey.resolve and rma.RegionKey is RegionKey
    assert (rma.OK, rma.STALE, rma.RANGE, rma.ALIGN, rma.BADOP) == (0, 1, 2, 3, 4)
    assert (rma.MAPPED, rma.CMA, rma.RDMA, rma.AM) == ("mapped", "cma", "rdma", "am")
    assert rma.ONE_SIDED == MdCaps.PUT | MdCaps.GET


def test_pack_is_the_documented_layout():
    assert packed() == by_hand()
    assert len(packed()) == 36 + 1
    mk = rkey.pack_md_keys([(b"ofi", b"\x01\x02")])
    assert packed(md_keys=mk) == by_hand(mk=b"\x01\x03ofi\x02\x00\x01\x02")


def test_pack_extreme_fields():
    big = (1 << 64) - 1
    p = packed(uuid=big, mem_id=big, address=big, length=big)
    assert p == by_hand(uuid=big, mem_id=big, base=big, length=big)
    k = RegionKey(p)
    assert (k.uuid, k.mem_id, k.base, k.length, k.md_keys) == (big, big, big, big, {})
    z = RegionKey(packed(uuid=0, mem_id=0, address=0, length=0))
    assert (z.uuid, z.mem_id, z.base, z.length, z.md_keys) == (0, 0, 0, 0, {})


def test_pack_md_keys_layout():
    assert rkey.pack_md_keys([]) == b"\x00"
    assert rkey.pack_md_keys(iter([])) == b"\x00"
    assert rkey.pack_md_keys([(b"ofi", b"\x01\x02")]) == b"\x01\x03ofi\x02\x00\x01\x02"
    long_key = bytes(range(256)) + b"xyz"                   # 259 bytes: length 0x0103
    assert rkey.pack_md_keys(iter([(b"ofi", b""), (b"verbs", long_key)])) == (
        b"\x02" + b"\x03ofi\x00\x00" + b"\x05verbs\x03\x01" + long_key)
    assert rkey.pack_md_keys([(b"", b"")]) == b"\x01\x00\x00\x00"


MK = [(b"ofi", b"\x01\x02\x03"), (b"verbs", b""), (b"x" * 255, bytes(300))]


def test_md_keys_round_trip():
    blob = rkey.pack_md_keys(MK)
    prefix = b"\xaa" * 5
    assert rkey.unpack_md_keys(prefix + blob, 5) == {n.decode(): k for n, k in MK}
    assert rkey.unpack_md_keys(b"\x00", 0) == {}
    assert rkey.unpack_md_keys(b"\xff\x00", 1) == {}
    got = rkey.unpack_md_keys(blob, 0)
    assert list(got) == ["ofi", "verbs", "x" * 255]         # in packed order
    assert all(type(k) is bytes for k in got.values())
    assert rkey.unpack_md_keys(b"\x01\x00\x00\x00", 0) == {"": b""}


def test_md_key_ending_the_packed_key_exactly():
    # the key's last byte is the last byte of the blob (no off-by-one at the end)
    assert rkey.unpack_md_keys(b"\x01\x01a\x02\x00xy", 0) == {"a": b"xy"}
    assert rkey.unpack_md_keys(b"\x01\x01a\x01\x00x", 0) == {"a": b"x"}


def test_md_keys_every_truncation_is_refused():
    blob = rkey.pack_md_keys(MK)
    for cut in range(len(blob)):
        raises("malformed remote key (md keys)", rkey.unpack_md_keys, blob[:cut], 0)
    for cut in range(5, 5 + len(blob)):                     # also from an offset
        raises("malformed remote key (md keys)", rkey.unpack_md_keys,
               (b"\xaa" * 5 + blob)[:cut], 5)


def test_md_key_with_zero_length_cut_in_its_length_field():
    for blob in (b"\x01\x03ofi", b"\x01\x03ofi\x00"):       # key length 0, field cut
        raises("malformed remote key (md keys)", rkey.unpack_md_keys, blob, 0)
    assert rkey.unpack_md_keys(b"\x01\x03ofi\x00\x00", 0) == {"ofi": b""}


def test_md_key_one_byte_short():
    raises("malformed remote key (md keys)", rkey.unpack_md_keys, b"\x01\x01a\x02\x00x", 0)
    raises("malformed remote key (md keys)", rkey.unpack_md_keys, b"\x01\x02a", 0)


def test_md_keys_trailing_bytes_are_refused():
    blob = rkey.pack_md_keys(MK)
    raises("malformed remote key (trailing bytes)", rkey.unpack_md_keys, blob + b"\x00", 0)
    raises("malformed remote key (trailing bytes)", rkey.unpack_md_keys, b"\x00\x00", 0)
    raises("malformed remote key (trailing bytes)", rkey.unpack_md_keys,
           b"\x01\x01a\x01\x00xy", 0)


def test_md_key_name_must_be_ascii():
    raises("malformed remote key (md keys)",
           rkey.unpack_md_keys, b"\x01\x03of\xe9\x00\x00", 0)
    assert rkey.unpack_md_keys(b"\x01\x03OFI\x00\x00", 0) == {"OFI": b""}


def test_md_keys_count_past_the_end():
    raises("malformed remote key (md keys)", rkey.unpack_md_keys, b"\x02\x03ofi\x00\x00", 0)
    raises("malformed remote key (md keys)", rkey.unpack_md_keys, b"", 0)
    raises("malformed remote key (md keys)", rkey.unpack_md_keys, b"\x00", 1)


def test_md_keys_later_duplicate_wins():
    assert rkey.unpack_md_keys(b"\x02\x01a\x01\x001\x01a\x01\x002", 0) == {"a": b"2"}


# ------------------------------------------------------------------ unpack


def test_unpack_fields_and_round_trip_byte_for_byte():
    mk = rkey.pack_md_keys(MK)
    p = packed(md_keys=mk)
    k = RegionKey(p)
    assert (k.uuid, k.mem_id, k.base, k.length) == (UUID, 7, 0x7F00_0000_1000, 4000)
    assert k.md_keys == {n.decode(): v for n, v in MK}
    assert k.md_key is None
    again = rkey.pack(k.uuid, k.mem_id, k.base, k.length, rkey.pack_md_keys(
        (n.encode(), v) for n, v in k.md_keys.items()))
    assert again == p


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_unpack_accepts_any_buffer(wrap):
    k = RegionKey(wrap(packed(md_keys=rkey.pack_md_keys(MK))))
    assert k.uuid == UUID and k.md_keys["ofi"] == b"\x01\x02\x03"
    assert all(type(v) is bytes for v in k.md_keys.values())


def test_every_truncated_header_is_too_short():
    p = packed()
    for cut in range(36):
        raises("malformed remote key (too short)", RegionKey, p[:cut])


def test_every_truncation_after_the_header_is_refused():
    p = packed(md_keys=rkey.pack_md_keys(MK))
    for cut in range(36, len(p)):                           # from the md-key count on
        raises("malformed remote key (md keys)", RegionKey, p[:cut])
    raises("malformed remote key (trailing bytes)", RegionKey, p + b"\x00")


def test_shortest_valid_key():
    p = by_hand(mk=b"\x00")
    assert len(p) == 37
    k = RegionKey(p)
    assert k.md_keys == {} and k.md_key is None
    raises("malformed remote key (md keys)", RegionKey, p[:36])
    raises("malformed remote key (trailing bytes)", RegionKey, p + b"\x00")


def test_bad_magic():
    p = packed()
    for magic in (b"URK1", b"URK0", b"urk2", b"\x00" * 4, b"SHMD"):
        raises("malformed remote key", RegionKey, magic + p[4:])


def test_magic_is_checked_before_the_md_keys():
    raises("malformed remote key", RegionKey, b"URK1" + packed()[4:] + b"\x00")
    raises("malformed remote key", RegionKey, b"URK1" + packed()[4:36])


# ------------------------------------------------------------------ initiator check

BASE, LEN = 0x7F00_0000_1000, 64


@pytest.fixture
def key():
    return RegionKey(packed(address=BASE, length=LEN))


class Validity:
    """An md_key: ``valid()`` answers ``ok`` and counts its calls."""

    def __init__(self, ok):
        self.ok = ok
        self.calls = 0

    def valid(self):
        self.calls += 1
        return self.ok


@pytest.mark.parametrize("offset,length", [(0, 0), (0, 1), (0, LEN), (LEN - 1, 1), (LEN, 0),
                                           (17, 23), (LEN - 8, 8)])
def test_check_inside(key, offset, length):
    assert key.md_key is None                               # no validity check
    assert key.check(BASE + offset, length) == offset


@pytest.mark.parametrize("offset,length", [(-1, 0), (-1, 1), (-1, 2), (0, LEN + 1), (LEN, 1),
                                           (LEN + 1, 0), (1, LEN), (-LEN, LEN), (0, -1),
                                           (LEN, -1), (4, -5)])
def test_check_outside(key, offset, length):
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
def test_check_alignment(key, offset, align, ok):
    address = BASE + offset
    if ok:
        assert key.check(address, min(align, LEN - offset), align) == offset
    else:
        raises(f"misaligned {align}-byte atomic at {address:#x}", key.check, address, 1, align)


def test_check_default_alignment_is_one(key):
    assert key.check(BASE + 3, 1) == 3
    assert key.check(BASE + 63, 1) == 63


def test_alignment_is_of_the_address_not_the_offset():
    k = RegionKey(packed(address=BASE + 4, length=LEN))
    assert k.check(BASE + 8, 8, 8) == 4
    raises(f"misaligned 8-byte atomic at {BASE + 4:#x}", k.check, BASE + 4, 8, 8)


def test_range_is_checked_before_alignment(key):
    raises(f"remote access [{BASE + 60:#x}, +8) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, BASE + 60, 8, 8)


def test_check_consults_md_key_valid(key):
    key.md_key = live = Validity(True)
    assert key.check(BASE + 8, 8, 8) == 8
    assert key.check(BASE, 0) == 0
    assert live.calls == 2                                   # once per check
    live.ok = False                                          # the owner unregistered
    raises("stale remote key: memory 7 was unmapped", key.check, BASE, 1)
    assert live.calls == 3
    live.ok = True                                           # (as the md tells)
    assert key.check(BASE + LEN, 0) == LEN


@pytest.mark.parametrize("answer", [False, 0, None])
def test_a_falsy_valid_is_stale(key, answer):
    key.md_key = Validity(answer)
    raises("stale remote key: memory 7 was unmapped", key.check, BASE + 8, 8, 8)


def test_stale_message_names_the_memory_id():
    k = RegionKey(packed(mem_id=12345, address=BASE, length=LEN))
    k.md_key = Validity(False)
    raises("stale remote key: memory 12345 was unmapped", k.check, BASE, LEN)


def test_range_and_alignment_errors_win_over_staleness(key):
    key.md_key = stale = Validity(False)
    raises(f"remote access [{BASE + LEN:#x}, +1) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, BASE + LEN, 1)
    raises(f"remote access [{BASE - 1:#x}, +1) outside registered region "
           f"[{BASE:#x}, +{LEN})", key.check, BASE - 1, 1)
    raises(f"misaligned 8-byte atomic at {BASE + 4:#x}", key.check, BASE + 4, 8, 8)
    assert stale.calls == 0


def test_check_with_a_real_md_remote_key(key):
    key.md_key = MdRemoteKey(address=0x1000)                 # base class: always valid
    assert key.check(BASE, LEN) == 0


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


class FakeMd(MemoryDomain):
    """A memory domain that records what the core asks of it."""

    def __init__(self, name, caps=MdCaps.REG, key=b"", unpacked=None, access="rdma"):
        self.name = name
        self.caps = caps
        self.key = key
        self.unpacked = unpacked
        self.access = access
        self.regs, self.deregs, self.unpacks, self.freed = [], [], [], []

    def mem_reg(self, view, alloc=None):
        self.regs.append((view, alloc))
        return ["memh", self.name]

    def mem_dereg(self, memh):
        self.deregs.append(memh)

    def mem_free(self, alloc):
        self.freed.append(alloc)

    def rkey_pack(self, memh):
        assert memh == ["memh", self.name]
        return bytearray(self.key)                 # the core packs it as bytes

    def rkey_unpack(self, packed, base, length):
        self.unpacks.append((packed, base, length))
        return self.unpacked


class FakeDevice:
    """An interface whose RegistrationDomain registers through pack_local_key."""

    def __init__(self, name, key):
        self.name = name
        self.key = key
        self.views = []
        self.md = RegistrationDomain(self)

    def pack_local_key(self, view):
        self.views.append(view)
        return 0x1234, self.key


def iface(name, md):
    return types.SimpleNamespace(name=name, md=md)


def engine(ifaces, host_md=None):
    worker = types.SimpleNamespace(uuid=UUID, ifaces=ifaces, lock=None, tr=None,
                                   config=Config.from_env({}), dp=_dp.Worker(),
                                   context=types.SimpleNamespace(
                                       host_memory_domain=lambda: host_md))
    worker.rma = rma.RmaEngine(worker)
    return worker.rma


def endpoint(eng, md, uuid=UUID):
    calls = []
    ep = types.SimpleNamespace(remote=types.SimpleNamespace(uuid=uuid), worker=eng.worker,
                               lane=types.SimpleNamespace(md=md, name="lane"),
                               transport_endpoint=lambda: calls.append("tep"), calls=calls)
    return ep


def test_mem_handle_packs_header_and_each_domains_key():
    ofi = FakeDevice("ofi", bytearray(b"\x10\x20"))
    own = FakeMd("self", caps=MdCaps.REG | MdCaps.RKEY_PTR, key=b"\x01" * 8)
    no_reg = FakeMd("am", caps=MdCaps.PUT | MdCaps.GET, key=b"never")
    eng = engine([iface("tcp", None), iface("am", no_reg), ofi, iface("self", own)])
    assert eng.domains() == [no_reg, ofi.md, own]
    buf = bytearray(100)
    mh = rma.MemHandle(eng, 7, memoryview(buf), 0x1234_5000)
    want = by_hand(mem_id=7, base=0x1234_5000, length=100,
                   mk=b"\x02" + b"\x03ofi\x02\x00\x10\x20" + b"\x04self\x08\x00" + b"\x01" * 8)
    assert want == rkey.pack(UUID, 7, 0x1234_5000, 100, rkey.pack_md_keys(
        [(b"ofi", b"\x10\x20"), (b"self", b"\x01" * 8)]))
    got = mh.pack_rkey()
    assert got == want and type(got) is bytes
    assert mh.pack_rkey() is got                              # registered once
    assert len(ofi.views) == 1 and len(own.regs) == 1 and no_reg.regs == []
    assert bytes(ofi.views[0]) == bytes(buf) and ofi.views[0].obj is buf
    assert own.regs[0][0].obj is buf and own.regs[0][1] is None
    k = RegionKey(want)
    assert k.md_keys == {"ofi": b"\x10\x20", "self": b"\x01" * 8}
    assert (k.uuid, k.mem_id, k.base, k.length) == (UUID, 7, 0x1234_5000, 100)


def test_unmap_deregisters_from_every_domain():
    ofi = FakeDevice("ofi", b"\x10")
    own = FakeMd("self")
    eng = engine([ofi, iface("self", own)])
    mh = eng.mem_map(buf=bytearray(32))
    assert eng.registry == {1: mh}
    mh.pack_rkey()
    mh.unmap()
    assert own.deregs == [["memh", "self"]] and eng.registry == {}
    assert own.freed == []                                  # user memory: nothing to free
    mh.unmap()                                              # idempotent
    assert own.deregs == [["memh", "self"]]
    raises("memory handle is unmapped", mh.pack_rkey)


def test_allocated_memory_registers_with_its_domain_as_alloc():
    alloc = types.SimpleNamespace(view=memoryview(bytearray(64)), address=0x5000)
    shm = FakeMd("shm", caps=MdCaps.ALLOC | MdCaps.REG | MdCaps.RKEY_PTR, key=b"S")
    ofi = FakeMd("ofi", key=b"O")
    eng = engine([iface("shm", shm), iface("ofi", ofi)])
    mh = rma.MemHandle(eng, 4, alloc.view, alloc.address, alloc, shm)
    assert mh.pack_rkey() == by_hand(mem_id=4, base=0x5000, length=64,
                                     mk=b"\x02\x03shm\x01\x00S\x03ofi\x01\x00O")
    assert shm.regs[0][1] is alloc and ofi.regs[0][1] is None
    mh.unmap()
    assert shm.freed == [alloc] and ofi.freed == []
    assert shm.deregs == [["memh", "shm"]] and ofi.deregs == [["memh", "ofi"]]


def test_zero_length_region_packs_no_md_keys():
    own = FakeMd("self", key=b"x")
    eng = engine([iface("self", own)])
    mh = rma.MemHandle(eng, 3, memoryview(bytearray(0)), 0x4000)
    p = mh.pack_rkey()
    assert p == by_hand(mem_id=3, base=0x4000, length=0, mk=b"\x00")
    assert own.regs == []
    k = rma.RemoteKey(endpoint(eng, own), p)
    assert k.mode == rma.AM and k.md_key is None and own.unpacks == []
    assert k.check(0x4000, 0) == 0
    raises("remote access [0x4000, +1) outside registered region [0x4000, +0)",
           k.check, 0x4000, 1)


def test_unmapped_handle_packs_nothing():
    mh = rma.MemHandle(engine([]), 3, memoryview(bytearray(16)), 0x4000)
    assert mh.pack_rkey() == by_hand(mem_id=3, base=0x4000, length=16, mk=b"\x00")
    mh.mapped = False
    raises("memory handle is unmapped", mh.pack_rkey)


def test_host_memory_domain_is_the_last_domain_once_opened():
    host = FakeMd("shm", caps=MdCaps.ALLOC | MdCaps.REG | MdCaps.RKEY_PTR, key=b"H")
    own = FakeMd("self", key=b"s")
    eng = engine([iface("self", own)], host_md=host)
    assert eng.domains() == [own]
    assert eng._alloc_domain(host=False) is None and eng.domains() == [own]
    assert eng._alloc_domain() is host
    assert eng.domains() == [own, host]
    mh = eng.mem_map(buf=bytearray(8))
    assert RegionKey(mh.pack_rkey()).md_keys == {"self": b"s", "shm": b"H"}


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
    assert len(modes) == 1                                  # refused before the lane
    with pytest.raises(RemoteAccessError, match=r"\Amalformed remote key \(too short\)\Z"):
        rma.RemoteKey(ep, b"URK2")
    with pytest.raises(RemoteAccessError, match=r"\Amalformed remote key\Z"):
        rma.RemoteKey(ep, b"URK1" + by_hand()[4:])


MD_KEYS = rkey.pack_md_keys([(b"lane", b"\xab\xcd"), (b"other", b"\x01")])


@pytest.mark.parametrize("unpacked,caps,mode", [
    (None, MdCaps.REG | MdCaps.PUT | MdCaps.GET, rma.AM),
    (MdRemoteKey(address=0x9000), MdCaps.REG | MdCaps.RKEY_PTR, rma.MAPPED),
    (MdRemoteKey(address=0x9000, transport_key=b"t"), MdCaps.PUT | MdCaps.GET, rma.MAPPED),
    (MdRemoteKey(transport_key=b"t"), MdCaps.REG | MdCaps.PUT | MdCaps.GET, "xfer"),
    (MdRemoteKey(transport_key=b""), MdCaps.PUT | MdCaps.GET, "xfer"),
    (MdRemoteKey(transport_key=b"t"), MdCaps.REG | MdCaps.PUT, rma.AM),
    (MdRemoteKey(transport_key=b"t"), MdCaps.REG | MdCaps.GET, rma.AM),
    (MdRemoteKey(), MdCaps.REG | MdCaps.PUT | MdCaps.GET, rma.AM)])
def test_access_mode_asks_the_lanes_memory_domain(unpacked, caps, mode):
    md = FakeMd("lane", caps=caps, unpacked=unpacked, access="xfer")
    eng = engine([iface("lane", md)])
    ep = endpoint(eng, md)
    k = rma.RemoteKey(ep, packed(address=BASE, length=LEN, md_keys=MD_KEYS))
    assert k.mode == mode and ep.calls == ["tep"]           # the lane is wired up first
    assert md.unpacks == [(b"\xab\xcd", BASE, LEN)]
    assert type(md.unpacks[0][0]) is bytes
    assert k.md_key is unpacked                             # kept even when AM
    assert k.mapped_address == (0x9000 if mode == rma.MAPPED else 0)
    # a mapped key hands the native calls its mapping (a plain MdRemoteKey
    # is always valid: no guard word); put/get and atomics alike here (cpu)
    if mode == rma.MAPPED:
        n = k.native
        assert (n.mapped, n.base, n.length, n.atomics) == (0x9000, BASE, LEN, True)
    else:
        assert k.native is None


def test_access_mode_default_access_name_is_rdma():
    md = RegistrationDomain(types.SimpleNamespace(name="lane"))
    eng = engine([iface("lane", md)])
    k = rma.RemoteKey(endpoint(eng, md), packed(address=BASE, length=LEN, md_keys=MD_KEYS))
    assert k.mode == rma.RDMA == md.access
    assert k.md_key.transport_key == b"\xab\xcd" and k.md_key.address == 0


def test_access_mode_am_without_md_or_without_its_key():
    eng = engine([])
    k = rma.RemoteKey(endpoint(eng, None), packed(md_keys=MD_KEYS))
    assert k.mode == rma.AM and k.md_key is None
    md = FakeMd("elsewhere", caps=MdCaps.REG | MdCaps.RKEY_PTR,
                unpacked=MdRemoteKey(address=0x9000))
    k = rma.RemoteKey(endpoint(eng, md), packed(md_keys=MD_KEYS))
    assert k.mode == rma.AM and k.md_key is None and md.unpacks == []
    k = rma.RemoteKey(endpoint(eng, md), packed())          # a key without md keys
    assert k.mode == rma.AM and md.unpacks == []


def test_access_mode_unpack_error_propagates():
    class Gone(FakeMd):
        def rkey_unpack(self, packed, base, length):
            raise RemoteAccessError("stale remote key: segment x is gone")
    md = Gone("lane")
    with pytest.raises(RemoteAccessError, match="segment x is gone"):
        rma.RemoteKey(endpoint(engine([iface("lane", md)]), md), packed(md_keys=MD_KEYS))


def test_remote_key_check_consults_the_unpacked_md_key():
    class Mapped(MdRemoteKey):
        __slots__ = ("ok",)

        def valid(self):
            return self.ok
    mk = Mapped(address=0x9000)
    mk.ok = True
    md = FakeMd("lane", caps=MdCaps.REG | MdCaps.RKEY_PTR, unpacked=mk)
    k = rma.RemoteKey(endpoint(engine([iface("lane", md)]), md),
                      packed(address=BASE, length=LEN, md_keys=MD_KEYS))
    assert k.mode == rma.MAPPED and k.check(BASE + 8, 8, 8) == 8
    mk.ok = False
    raises("stale remote key: memory 7 was unmapped", k.check, BASE + 8, 8, 8)


def test_self_memory_domain_end_to_end():
    md = SelfMemoryDomain("self")
    eng = engine([iface("self", md)])
    mh = eng.mem_map(buf=bytearray(64))
    p = mh.pack_rkey()
    assert p == by_hand(mem_id=1, base=mh.address, length=64,
                        mk=b"\x01\x04self\x08\x00" + le(1, 8))
    k = rma.RemoteKey(endpoint(eng, md), p)
    assert k.mode == rma.MAPPED and k.mapped_address == mh.address
    assert k.check(mh.address + 56, 8, 8) == 56
    mh.unmap()
    raises("stale remote key: memory 1 was unmapped", k.check, mh.address, 1)
    raises("stale remote key: the memory was unmapped", rma.RemoteKey, endpoint(eng, md), p)
