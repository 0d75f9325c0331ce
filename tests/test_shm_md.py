"""The shm transport's memory domain (``ucxpy.transports.shm_md``): its
packed key byte for byte and every way ``parse_key`` refuses one (they name
files opened under /dev/shm), ``ShmRemoteKey.valid`` against a real
registration-table word, and a real ShmMemoryDomain in this process:
segments, the registration table, what ``rkey_unpack`` / ``rkey_map`` give
for each kind of key, and that nothing is left under /dev/shm.  The core's
remote key around it is tested in test_rkey.py; puts and gets through the
shm lane in test_rma.py."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from conftest import raises_remote_access

from ucxpy import shmfile
from ucxpy._native import ffi
from ucxpy.errors import RemoteAccessError
from ucxpy.netaddr import host_id as local_host_id
from ucxpy.transports import shm_md
from ucxpy.transports.base import MdCaps, MdRemoteKey, MemoryDomain
from ucxpy.transports.shm_md import (KEY, KEY_MAGIC, RKEY, RKEY_MAGIC, SEG_NAME, STALE_NAMES,
                                     TABLE_NAME, TABLE_SLOTS, ShmMemoryDomain, ShmRemoteKey,
                                     parse_key)

TABLE = b"ucxpy-rt-4242-abcdef0123"
SEG = b"ucxpy-rm-4242-abcdef0123-7"
HOST = b"host-\x00\xff-id"


def le(value: int, n: int) -> bytes:
    return value.to_bytes(n, "little")


def by_hand(pid=4242, slot=3, reg_id=9, table=TABLE, seg=SEG, host=HOST) -> bytes:
    """The packed layout spelled out field by field (not through shm_md.KEY)."""
    return (b"SHMD" + le(pid, 4) + le(slot, 4) + le(reg_id, 8)
            + bytes([len(table), len(seg), len(host)]) + table + seg + host)


raises = raises_remote_access


def address_of(view) -> int:
    with ffi.from_buffer(view) as p:
        return int(ffi.cast("uintptr_t", p))


# ------------------------------------------------------------------ format


def test_constants_are_pinned():
    assert KEY.format == "<4sIIQBBB" and KEY.size == 23 and KEY_MAGIC == b"SHMD"
    assert RKEY.format == "<4sIQQ" and RKEY.size == 24 and RKEY_MAGIC == b"SHMK"
    assert TABLE_SLOTS == 4096
    assert TABLE_NAME.pattern == r"\Aucxpy-rt-[0-9]+-[0-9a-f]+\Z"
    assert SEG_NAME.pattern == r"\Aucxpy-rm-[0-9]+-[0-9a-f]+-[0-9]+\Z"
    assert STALE_NAMES.pattern == r"\Aucxpy-r[tm]-([0-9]+)-"


def test_key_struct_is_the_documented_layout():
    assert KEY.pack(KEY_MAGIC, 4242, 3, 9, len(TABLE), len(SEG), len(HOST)) \
        + TABLE + SEG + HOST == by_hand()
    assert len(by_hand()) == 23 + len(TABLE) + len(SEG) + len(HOST)
    assert RKEY.pack(RKEY_MAGIC, 4242, 0x7F00_0000_1000, 4000) == (
        b"SHMK" + le(4242, 4) + le(0x7F00_0000_1000, 8) + le(4000, 8))


def test_parse_key_fields():
    got = parse_key(by_hand())
    assert got == (4242, 3, 9, TABLE.decode(), SEG.decode(), HOST)
    assert [type(v) for v in got] == [int, int, int, str, str, bytes]


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_parse_key_accepts_any_buffer(wrap):
    assert parse_key(wrap(by_hand())) == (4242, 3, 9, TABLE.decode(), SEG.decode(), HOST)


def test_parse_key_extreme_fields():
    big32, big64 = (1 << 32) - 1, (1 << 64) - 1
    assert parse_key(by_hand(pid=big32, slot=TABLE_SLOTS - 1, reg_id=big64, seg=b"",
                             host=b"")) == (big32, TABLE_SLOTS - 1, big64, TABLE.decode(), "", b"")
    assert parse_key(by_hand(pid=0, slot=0, reg_id=0, host=bytes(255)))[1:3] == (0, 0)


def test_every_truncated_fixed_part_is_too_short():
    p = by_hand()
    for cut in range(KEY.size):
        raises("malformed shm memory key (too short)", parse_key, p[:cut])


def test_every_truncation_of_the_names_is_refused():
    p = by_hand()
    for cut in range(KEY.size, len(p)):
        raises("malformed shm memory key", parse_key, p[:cut])


def test_trailing_bytes_are_refused():
    raises("malformed shm memory key", parse_key, by_hand() + b"\x00")
    raises("malformed shm memory key", parse_key, by_hand(seg=b"", host=b"") + b"x")


@pytest.mark.parametrize("field,delta", [(20, 1), (20, -1), (21, 1), (21, -1), (22, 1),
                                         (22, -1)])
def test_wrong_name_lengths_are_refused(field, delta):
    p = bytearray(by_hand())
    p[field] += delta
    with pytest.raises(RemoteAccessError, match=r"\Amalformed shm memory key"):
        parse_key(bytes(p))


def test_bad_magic():
    p = by_hand()
    for magic in (b"SHMK", b"shmd", b"URK2", b"\x00" * 4):
        raises("malformed shm memory key", parse_key, magic + p[4:])


VALID_TABLES = [b"ucxpy-rt-1-0", b"ucxpy-rt-99-deadbeef", TABLE]
VALID_SEGS = [b"", b"ucxpy-rm-1-0-0", b"ucxpy-rm-12-ab-345", SEG]


@pytest.mark.parametrize("table", VALID_TABLES)
@pytest.mark.parametrize("seg", VALID_SEGS)
def test_valid_names(table, seg):
    got = parse_key(by_hand(table=table, seg=seg))
    assert got[3:5] == (table.decode(), seg.decode())


@pytest.mark.parametrize("table,seg", [
    (b"../../etc/passwd", SEG), (TABLE, b"../../tmp/x"), (TABLE, b"ucxpy-rm-1-/x"),
    (b"ucxpy-rt-1-AB", SEG), (b"ucxpy-rt-1-ab\n", SEG), (b"xucxpy-rt-1-ab", SEG),
    (b"ucxpy-rt--ab", SEG), (b"ucxpy-rt-1-", SEG), (TABLE, b"ucxpy-rm-1-ab-"),
    (TABLE, b"ucxpy-rt-1-ab"), (b"ucxpy-rm-1-ab-2", SEG), (b"ucxpy-rt-1-\xe9", SEG),
    (TABLE, b"ucxpy-rm-1-ab-\xff"), (b"ucxpy-rt-\xd9\xa1-ab", SEG),
    (b"", SEG), (b"", b""), (TABLE, b"ucxpy-rm-1-ab-2\n"), (TABLE, b"ucxpy-rm-1-ab-2/.."),
    (b"ucxpy-rt-1-ab/../x", SEG), (b"\xff", b""), (TABLE, b"\xff")])
def test_bad_names_are_refused(table, seg):
    raises("malformed shm memory key (segment name or slot)", parse_key,
           by_hand(table=table, seg=seg))


@pytest.mark.parametrize("slot,ok", [(0, True), (1, True), (TABLE_SLOTS - 1, True),
                                     (TABLE_SLOTS, False), (TABLE_SLOTS + 1, False),
                                     ((1 << 32) - 1, False)])
def test_slot_must_index_the_table(slot, ok):
    p = by_hand(slot=slot)
    if ok:
        assert parse_key(p)[1] == slot
    else:
        raises("malformed shm memory key (segment name or slot)", parse_key, p)


def test_framing_is_checked_before_the_names():
    raises("malformed shm memory key", parse_key, by_hand(table=b"../x") + b"\x00")
    raises("malformed shm memory key", parse_key, b"SHMK" + by_hand(slot=1 << 20)[4:])


# ------------------------------------------------------------------ validity


def test_shm_remote_key_valid_reads_the_table_word():
    word = ffi.new("uint64_t *", 7)
    k = ShmRemoteKey(0x5000, None, word, int(ffi.cast("uintptr_t", word)), 7)
    assert isinstance(k, MdRemoteKey)
    assert (k.address, k.transport_key, k.keep, k.reg_id) == (0x5000, None, word, 7)
    assert k.valid() is True
    word[0] = 8                                              # the slot was reused
    assert k.valid() is False
    word[0] = 0                                              # unregistered
    assert k.valid() is False
    word[0] = 7
    assert k.valid() is True
    k.release()
    assert k.keep is None and k.address == 0


def test_shm_remote_key_compares_all_64_bits():
    big = (1 << 64) - 1
    word = ffi.new("uint64_t *", big)
    k = ShmRemoteKey(0, b"t", word, int(ffi.cast("uintptr_t", word)), big)
    assert k.valid()
    word[0] = big ^ (1 << 63)
    assert not k.valid()
    word[0] = 1 << 32 | 7
    assert not ShmRemoteKey(0, b"t", word, int(ffi.cast("uintptr_t", word)), 7).valid()


def test_shm_remote_key_without_table_word_is_always_valid():
    for reg_id in (0, 1, 7):
        assert ShmRemoteKey(0x5000, None, None, 0, reg_id).valid() is True


# ------------------------------------------------------------------ a real domain

needs_shm = pytest.mark.skipif(not os.access(shmfile.SHM_DIR, os.W_OK),
                               reason=f"{shmfile.SHM_DIR} is not writable")


def ours():
    """Our process's table and segment names under /dev/shm."""
    prefix = (f"ucxpy-rt-{os.getpid()}-", f"ucxpy-rm-{os.getpid()}-")
    return {n for n in os.listdir(shmfile.SHM_DIR) if n.startswith(prefix)}


def path(name) -> str:
    return os.path.join(shmfile.SHM_DIR, name)


def table_word(table: str, slot: int) -> int:
    with open(path(table), "rb") as f:
        f.seek(slot * 8)
        return int.from_bytes(f.read(8), "little")


@pytest.fixture
def domains():
    """``make(cma=...)``: ShmMemoryDomains closed (and checked gone) at the end."""
    made = []
    before = ours()

    def make(cma=True):
        md = ShmMemoryDomain("shm", cma=cma)
        made.append(md)
        return md
    yield make
    for md in made:
        md.close()
    assert ours() == before


@pytest.fixture
def md(domains):
    return domains(cma=True)


def with_pid(key: bytes, pid: int) -> bytes:
    return key[:4] + le(pid, 4) + key[8:]


def with_host(key: bytes, host: bytes) -> bytes:
    _pid, _slot, _id, table, seg, old = parse_key(key)
    return key[:22] + bytes([len(host)]) + table.encode() + seg.encode() + host


@needs_shm
def test_caps_and_names(domains):
    before = ours()
    cma, plain = domains(cma=True), domains(cma=False)
    assert isinstance(cma, MemoryDomain) and cma.name == plain.name == "shm"
    assert cma.caps == MdCaps.ALLOC | MdCaps.REG | MdCaps.RKEY_PTR | MdCaps.PUT | MdCaps.GET
    assert plain.caps == MdCaps.ALLOC | MdCaps.REG | MdCaps.RKEY_PTR
    assert cma.access == plain.access == "cma"
    assert ours() == before                                  # nothing made until used


@needs_shm
def test_mem_alloc_makes_a_private_segment(md):
    a, b = md.mem_alloc(4096), md.mem_alloc(100)
    for seg, length in ((a, 4096), (b, 100)):
        assert SEG_NAME.match(seg.name) and seg.name.startswith(f"ucxpy-rm-{os.getpid()}-")
        st = os.stat(path(seg.name))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == length and seg.length == length
        assert seg.view.nbytes == length and not seg.view.readonly
        assert seg.address == address_of(seg.view) != 0
        assert seg.path == path(seg.name)
    assert a.name.rsplit("-", 1)[1] == "1" and b.name.rsplit("-", 1)[1] == "2"
    assert a.name.rsplit("-", 1)[0] == b.name.rsplit("-", 1)[0]
    a.view[:5] = b"hello"
    with open(path(a.name), "rb") as f:
        assert f.read(5) == b"hello"
    md.mem_free(a)
    assert not os.path.exists(path(a.name)) and os.path.exists(path(b.name))
    md.mem_free(a)                                           # idempotent


@needs_shm
def test_mem_free_of_memory_not_ours_keeps_it(domains):
    owner, other = domains(), domains()
    seg = owner.mem_alloc(64)
    other.mem_free(seg)
    assert os.path.exists(path(seg.name))


@needs_shm
def test_segment_key_layout_and_registration_table(md):
    seg = md.mem_alloc(4096)
    reg = md.mem_reg(seg.view, seg)
    key = md.rkey_pack(reg)
    pid, slot, reg_id, table, seg_name, host = parse_key(key)
    assert (pid, slot, reg_id, seg_name, host) == (os.getpid(), 1, 1, seg.name, local_host_id())
    assert TABLE_NAME.match(table) and table.startswith(f"ucxpy-rt-{os.getpid()}-")
    assert table.split("-")[3] == seg.name.split("-")[3]     # one token per domain
    assert key == by_hand(os.getpid(), 1, 1, table.encode(), seg.name.encode(), local_host_id())
    st = os.stat(path(table))
    assert st.st_size == TABLE_SLOTS * 8 and stat.S_IMODE(st.st_mode) == 0o600
    assert table_word(table, 1) == 1 and table_word(table, 0) == 0

    user = bytearray(64)
    reg2 = md.mem_reg(memoryview(user))
    assert md.rkey_pack(reg2) == by_hand(os.getpid(), 2, 2, table.encode(), b"",
                                         local_host_id())
    assert table_word(table, 2) == 2
    md.mem_dereg(reg)
    assert table_word(table, 1) == 0 and table_word(table, 2) == 2
    md.mem_dereg(reg)                                        # idempotent
    reg3 = md.mem_reg(memoryview(user))                      # slot 1 again, a new id
    assert parse_key(md.rkey_pack(reg3))[1:3] == (1, 3) and table_word(table, 1) == 3


@needs_shm
def test_memory_of_another_domain_is_registered_as_user_memory(domains):
    owner, md = domains(), domains()
    seg = owner.mem_alloc(64)
    reg = md.mem_reg(seg.view, seg)
    assert parse_key(md.rkey_pack(reg))[4] == ""


@needs_shm
def test_own_segment_key_maps_here_until_deregistered(md):
    seg = md.mem_alloc(4096)
    reg = md.mem_reg(seg.view, seg)
    key = md.rkey_pack(reg)
    mk = md.rkey_unpack(key, seg.address, 4096)
    assert isinstance(mk, ShmRemoteKey)
    assert mk.address == seg.address != 0 and mk.transport_key is None
    assert mk.reg_id == 1 and mk.table_word != 0 and mk.valid()
    md.mem_dereg(reg)
    assert not mk.valid()
    reg2 = md.mem_reg(seg.view, seg)                         # slot 1 reused by id 2
    assert parse_key(md.rkey_pack(reg2))[1] == 1
    assert not mk.valid() and md.rkey_unpack(md.rkey_pack(reg2), seg.address, 4096).valid()


@needs_shm
def test_peer_domain_maps_the_segment(domains):
    owner, peer = domains(), domains(cma=False)
    seg = owner.mem_alloc(4096)
    reg = owner.mem_reg(seg.view, seg)
    key = owner.rkey_pack(reg)
    mk = peer.rkey_unpack(key, seg.address, 4096)
    assert mk.address != 0 and mk.address != seg.address     # its own mapping
    assert mk.transport_key is None and mk.valid()
    ffi.memmove(ffi.cast("char *", mk.address + 100), b"hello", 5)
    assert bytes(seg.view[100:105]) == b"hello"
    seg.view[0:3] = b"abc"
    assert ffi.buffer(ffi.cast("char *", mk.address), 3)[:] == b"abc"
    again = peer.rkey_unpack(key, seg.address, 4096)
    assert again.address == mk.address                       # mapped once
    owner.mem_dereg(reg)
    assert not mk.valid() and not again.valid()


@needs_shm
def test_user_memory_key_of_this_process_is_not_reachable(domains):
    owner, peer = domains(), domains()
    buf = bytearray(64)
    key = owner.rkey_pack(owner.mem_reg(memoryview(buf)))
    assert parse_key(key)[4] == ""
    assert owner.rkey_unpack(key, address_of(buf), 64) is None
    assert peer.rkey_unpack(key, address_of(buf), 64) is None
    assert owner.rkey_map(key, 64) is None


@needs_shm
def test_user_memory_of_another_process_gives_a_cma_key(domains):
    owner, plain = domains(), domains(cma=False)
    reg = owner.mem_reg(memoryview(bytearray(64)))
    other = os.getpid() + 1
    key = with_pid(owner.rkey_pack(reg), other)
    mk = owner.rkey_unpack(key, 0x7F00_0000_1000, 64)
    assert mk.address == 0
    assert mk.transport_key == b"SHMK" + le(other, 4) + le(0x7F00_0000_1000, 8) + le(64, 8)
    assert mk.transport_key == RKEY.pack(RKEY_MAGIC, other, 0x7F00_0000_1000, 64)
    assert mk.valid()
    owner.mem_dereg(reg)
    assert not mk.valid()
    assert plain.rkey_unpack(key, 0x7F00_0000_1000, 64) is None   # no CMA


@needs_shm
def test_key_from_another_host_is_not_reachable(domains):
    owner, peer = domains(), domains()
    seg = owner.mem_alloc(64)
    key = owner.rkey_pack(owner.mem_reg(seg.view, seg))
    user = owner.rkey_pack(owner.mem_reg(memoryview(bytearray(8))))
    for k in (with_host(key, b"elsewhere"), with_host(key, b""),
              with_host(key, local_host_id() + b"x"), with_pid(with_host(user, b"x"), 1)):
        assert owner.rkey_unpack(k, seg.address, 64) is None
        assert peer.rkey_unpack(k, seg.address, 64) is None
        assert peer.rkey_map(k, 64) is None
    assert with_host(key, local_host_id()) == key


@needs_shm
def test_table_that_cannot_be_mapped_is_not_reachable(md):
    host = local_host_id()
    missing = f"ucxpy-rt-{os.getpid()}-feedface0000".encode()
    assert md.rkey_unpack(by_hand(1, 1, 1, missing, b"", host), 0, 64) is None
    assert md.rkey_unpack(by_hand(1, 1, 1, missing, SEG, host), 0, 64) is None
    small = f"ucxpy-rt-{os.getpid()}-feedface0001"
    shmfile.create(small, 8).close()                         # shorter than a table
    try:
        assert md.rkey_unpack(by_hand(1, 1, 1, small.encode(), b"", host), 0, 64) is None
    finally:
        shmfile.unlink_quiet(path(small))


@needs_shm
def test_missing_or_short_segment_is_stale(domains):
    owner, peer = domains(), domains()
    seg = owner.mem_alloc(4096)
    key = owner.rkey_pack(owner.mem_reg(seg.view, seg))
    _pid, slot, reg_id, table, _seg, host = parse_key(key)
    gone = seg.name.rsplit("-", 1)[0] + "-999"
    raises(f"stale remote key: segment {gone} is gone", peer.rkey_unpack,
           by_hand(os.getpid(), slot, reg_id, table.encode(), gone.encode(), host), 0, 64)
    raises(f"shared segment {seg.name} is smaller than its key says", peer.rkey_unpack,
           key, seg.address, 8192)
    owner.mem_free(seg)
    with pytest.raises(RemoteAccessError, match=r"\Astale remote key: segment .* is gone\Z"):
        domains().rkey_unpack(key, seg.address, 4096)


@needs_shm
def test_full_table_gives_slot_zero_keys_that_are_never_stale(md):
    regs = [md.mem_reg(memoryview(bytearray(1))) for _ in range(TABLE_SLOTS - 1)]
    assert sorted(r.slot for r in regs) == list(range(1, TABLE_SLOTS))
    full = md.mem_reg(memoryview(bytearray(1)))
    key = md.rkey_pack(full)
    assert parse_key(key)[1:3] == (0, TABLE_SLOTS)
    mk = md.rkey_unpack(with_pid(key, os.getpid() + 1), 0, 1)
    assert mk.table_word == 0 and mk.valid()
    md.mem_dereg(full)
    assert mk.valid()                                        # cannot tell: not checked
    md.mem_dereg(regs[41])                                   # frees slot 42
    assert md.mem_reg(memoryview(bytearray(1))).slot == 42


@needs_shm
def test_rkey_map(domains):
    owner, peer = domains(), domains(cma=False)
    seg = owner.mem_alloc(4096)
    key = owner.rkey_pack(owner.mem_reg(seg.view, seg))
    view = peer.rkey_map(key, 4096)
    assert view.nbytes == 4096 and not view.readonly
    view[10:13] = b"xyz"
    assert bytes(seg.view[10:13]) == b"xyz"
    assert len(peer.rkey_map(key, 16)) == 16
    assert peer.rkey_map(key, 8192) is None                  # past the segment
    assert peer.rkey_map(b"junk", 16) is None
    assert peer.rkey_map(by_hand(host=local_host_id()), 16) is None   # no such segment
    owner.mem_free(seg)
    assert peer.rkey_map(key, 16) is None


@needs_shm
def test_close_unlinks_the_table_and_own_segments():
    before = ours()
    md = ShmMemoryDomain("shm", cma=True)
    seg = md.mem_alloc(64)
    table = parse_key(md.rkey_pack(md.mem_reg(seg.view, seg)))[3]
    assert ours() == before | {seg.name, table}
    md.close()
    assert not os.path.exists(path(table)) and not os.path.exists(path(seg.name))
    assert ours() == before
    md.close()                                               # idempotent


@needs_shm
def test_a_new_table_reaps_names_of_dead_processes(md):
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = int(child.stdout)
    names = [f"ucxpy-rt-{dead}-ab", f"ucxpy-rm-{dead}-ab-1", f"ucxpy-shm-{dead}-ab"]
    for n in names:
        shmfile.create(n, 8).close()
    try:
        md.mem_reg(memoryview(bytearray(1)))
        assert [os.path.exists(path(n)) for n in names] == [False, False, True]
    finally:
        for n in names:
            shmfile.unlink_quiet(path(n))


def test_stale_names_pattern():
    assert STALE_NAMES.match("ucxpy-rt-12-ab").group(1) == "12"
    assert STALE_NAMES.match("ucxpy-rm-345-ab-1").group(1) == "345"
    for name in ("ucxpy-shm-12-ab", "ucxpy-rx-12-ab", "xucxpy-rt-12-ab", "ucxpy-rt--ab"):
        assert STALE_NAMES.match(name) is None
    assert shm_md.TABLE_NAME is TABLE_NAME


@needs_shm
@pytest.mark.parametrize("kind", ["segment", "cma"])
def test_a_key_outlives_its_domain_closing(domains, kind):
    """Regression: a segment key kept only the segment mapped; once the
    domain closed (its peer cache cleared) and the table mapping was
    collected, valid() read unmapped memory and the process died.  A CMA
    key must keep the owner's table mapped the same way."""
    import gc
    owner, peer = domains(), domains(cma=kind == "cma")
    if kind == "segment":
        seg = owner.mem_alloc(4096)
        reg = owner.mem_reg(seg.view, seg)
        mk = peer.rkey_unpack(owner.rkey_pack(reg), seg.address, 4096)
    else:
        reg = owner.mem_reg(memoryview(bytearray(64)))
        mk = peer.rkey_unpack(with_pid(owner.rkey_pack(reg), os.getpid() + 1), 0x1000, 64)
        assert mk.transport_key is not None
    peer.close()
    gc.collect()
    assert mk.valid()
    owner.mem_dereg(reg)
    assert not mk.valid()


@needs_shm
def test_a_cached_mapping_is_checked_against_every_keys_length(domains):
    """Regression: the length was checked only when a segment was first
    mapped; a later key claiming more got the small mapping."""
    owner, peer = domains(), domains(cma=False)
    seg = owner.mem_alloc(4096)
    key = owner.rkey_pack(owner.mem_reg(seg.view, seg))
    assert peer.rkey_unpack(key, seg.address, 4096).address
    for md in (peer, owner):
        with pytest.raises(RemoteAccessError, match="smaller than its key says"):
            md.rkey_unpack(key, seg.address, 8192)


@needs_shm
def test_no_registration_after_close():
    md = ShmMemoryDomain("shm", cma=True)
    md.close()
    with pytest.raises(RemoteAccessError, match=r"\Athe shm memory domain is closed\Z"):
        md.mem_reg(memoryview(bytearray(8)))


@needs_shm
def test_names_carry_the_pid_and_a_16_digit_token(domains):
    import re
    md = domains()
    seg = md.mem_alloc(64)
    table = parse_key(md.rkey_pack(md.mem_reg(seg.view, seg)))[3]
    token = re.fullmatch(rf"ucxpy-rt-{os.getpid()}-([0-9a-f]{{16}})", table).group(1)
    assert seg.name == f"ucxpy-rm-{os.getpid()}-{token}-1"


@needs_shm
def test_a_peer_with_a_table_of_its_own_checks_the_owners(domains):
    """A domain that has registered memory itself (so has a table) still
    reads the owner's table for the owner's keys."""
    owner, peer = domains(), domains()
    peer.mem_reg(memoryview(bytearray(8)))              # the peer's own table
    seg = owner.mem_alloc(4096)
    reg = owner.mem_reg(seg.view, seg)
    mk = peer.rkey_unpack(owner.rkey_pack(reg), seg.address, 4096)
    assert mk.valid()
    owner.mem_dereg(reg)
    assert not mk.valid()


@needs_shm
def test_deregistering_twice_leaves_other_registrations_alone(domains):
    md = domains()
    first = md.mem_reg(memoryview(bytearray(8)))
    second = md.mem_reg(memoryview(bytearray(8)))
    mk = md.rkey_unpack(with_pid(md.rkey_pack(first), os.getpid() + 1), 0x1000, 8)
    md.mem_dereg(second)
    md.mem_dereg(second)                                 # idempotent
    assert mk.valid()
    third, fourth = md.mem_reg(memoryview(bytearray(8))), md.mem_reg(memoryview(bytearray(8)))
    assert len({first.slot, third.slot, fourth.slot}) == 3
