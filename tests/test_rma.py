"""RMA and atomics between in-process workers, per transport and access mode."""
from __future__ import annotations

import numpy as np
import pytest

import ucxpy
from conftest import Pair, transport_available

pytestmark = pytest.mark.timeout(60)


def test_rdma_lane_uses_one_sided_ops(tl):
    """On a lane that moves registered memory itself (ofi) RMA goes by
    fi_write/fi_read; shm maps or uses CMA; tcp is served by the target."""
    p = Pair(tl)
    try:
        a, b = p.workers
        mh = b.mem_map(np.zeros(1 << 16, np.uint8))
        rkey = p.eps[0][1].unpack_rkey(mh.pack_rkey())
        assert rkey.mode == {"ofi": "rdma", "shm": "am", "tcp": "am"}[tl]   # same pid: no CMA
        p.wait(p.eps[0][1].put_nb(b"rdma!", mh.address + 7, rkey))
        assert bytes(mh.buf[7:12]) == b"rdma!"
        mh.unmap()
    finally:
        p.close()


@pytest.fixture(params=["shared", "user"])
def region(pair, request):
    """(MemHandle on worker 1, RemoteKey on worker 0's endpoint to it)."""
    a, b = pair.workers
    if request.param == "shared":
        mh = b.mem_map(length=1 << 21)
    else:
        mh = b.mem_map(np.zeros(1 << 21, np.uint8))
    rkey = pair.eps[0][1].unpack_rkey(mh.pack_rkey())
    yield mh, rkey
    mh.unmap()


@pytest.mark.parametrize("size", [0, 1, 8, 4097, 1 << 20])
def test_put_get_roundtrip(pair, region, size):
    mh, rkey = region
    ep = pair.eps[0][1]
    data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    off = 24
    pair.wait(ep.put_nb(data, mh.address + off, rkey))
    assert bytes(mh.buf[off:off + size]) == data.tobytes()
    back = np.zeros(size, np.uint8)
    pair.wait(ep.get_nb(back, mh.address + off, rkey))
    assert np.array_equal(back, data)


@pytest.mark.parametrize("size", [4, 8])
def test_atomics(pair, region, size):
    mh, rkey = region
    ep = pair.eps[0][1]
    dt = np.uint32 if size == 4 else np.uint64
    word = np.frombuffer(mh.buf, dt, count=4)
    addr = mh.address + size          # word[1]
    mask = (1 << (8 * size)) - 1

    def fetch(op, v, compare=0):
        return pair.wait(ep.atomic_fetch_nb(op, v, addr, rkey, size, compare))[0]

    word[1] = 10
    assert fetch("add", 5) == 10 and word[1] == 15
    pair.wait(ep.atomic_post("add", -1 & mask, addr, rkey, size))
    assert word[1] == 14
    assert fetch("swap", 99) == 14 and word[1] == 99
    assert fetch("cswap", 7, compare=1) == 99 and word[1] == 99       # no match: unchanged
    assert fetch("cswap", 7, compare=99) == 99 and word[1] == 7
    assert fetch("and", 0b110) == 7 and word[1] == 0b110
    assert fetch("or", 0b1) == 0b110 and word[1] == 0b111
    assert fetch("xor", 0b101) == 0b111 and word[1] == 0b010
    pair.wait(ep.atomic_post("or", mask, addr, rkey, size))
    assert int(word[1]) == mask and word[0] == 0 and word[2] == 0     # neighbours untouched


def test_bad_accesses(pair, region):
    mh, rkey = region
    ep = pair.eps[0][1]
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.put_nb(b"x" * 16, mh.address + mh.length - 8, rkey)
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.get_nb(bytearray(1), mh.address - 1, rkey)
    with pytest.raises(ucxpy.RemoteAccessError, match="misaligned"):
        ep.atomic_fetch_nb("add", 1, mh.address + 4, rkey, 8)
    with pytest.raises(ValueError):
        ep.atomic_fetch_nb("nand", 1, mh.address, rkey)
    with pytest.raises(ValueError):
        ep.atomic_post("swap", 1, mh.address, rkey)
    with pytest.raises(ucxpy.RemoteAccessError, match="malformed"):
        ep.unpack_rkey(b"garbage")
    with pytest.raises(ucxpy.RemoteAccessError):
        ep.unpack_rkey(mh.pack_rkey()[:-1])
    with pytest.raises(ucxpy.RemoteAccessError, match="another worker"):
        pair.eps[1][0].unpack_rkey(mh.pack_rkey())       # key of worker 1 used towards worker 0


def test_stale_key_after_unmap(pair, region):
    mh, rkey = region
    ep = pair.eps[0][1]
    mh.unmap()
    # mapped/CMA/AM check the registration themselves; on an RDMA lane the
    # revoked registration makes the provider refuse the access
    match = None if rkey.mode == "rdma" else "stale|unmapped"
    with pytest.raises(ucxpy.RemoteAccessError, match=match):
        r = ep.put_nb(b"late", mh.address, rkey)
        pair.wait(r)
    with pytest.raises(ucxpy.RemoteAccessError):
        mh.pack_rkey()


def test_flush_and_fence_order(pair, region):
    mh, rkey = region
    ep = pair.eps[0][1]
    a, b = pair.workers
    reqs = [ep.put_nb(np.full(64, i, np.uint8), mh.address, rkey) for i in range(50)]
    pair.drive(lambda: all(r.done for r in reqs))    # the target must progress in AM mode
    ep.flush(timeout=10)
    assert bytes(mh.buf[:64]) == bytes([49]) * 64     # last write wins: issue order kept
    r1 = ep.put_nb(b"A" * 8, mh.address, rkey)
    r2 = ep.atomic_fetch_nb("add", 1, mh.address, rkey, 8)
    pair.wait(r1, r2)
    assert r2.result == int.from_bytes(b"A" * 8, "little")


def test_unmapped_memory_is_not_reachable(pair):
    a, b = pair.workers
    mh = b.mem_map(bytearray(64))
    rkey = pair.eps[0][1].unpack_rkey(mh.pack_rkey())
    with pytest.raises(ucxpy.RemoteAccessError):
        pair.eps[0][1].put_nb(b"x", mh.address + 64, rkey)
    mh.unmap()
    with pytest.raises(ValueError):
        b.mem_map()


def test_progress_thread_serves_passive_target():
    """With a progress thread the target answers AM-mode RMA while its
    application thread never calls ucxpy."""
    import time
    p = Pair("tcp")
    try:
        a, b = p.workers
        b.start_progress_thread()
        mh = b.mem_map(np.zeros(4096, np.uint8))
        ep = p.eps[0][1]
        rkey = ep.unpack_rkey(mh.pack_rkey())
        assert rkey.mode == "am"
        ep.put(b"served", mh.address, rkey, timeout=10)       # progresses only worker a
        assert bytes(mh.buf[:6]) == b"served"
        for _ in range(100):
            ep.atomic_post("add", 1, mh.address + 8, rkey)
        ep.flush(timeout=10)
        assert int(np.frombuffer(mh.buf, np.uint64, 1, 8)[0]) == 100
        got = bytearray(6)
        ep.get(got, mh.address, rkey, timeout=10)
        assert got == b"served"
        # the application thread of b can still use its worker concurrently
        r = b.tag_recv_nb(bytearray(2), 3)
        ep.tag_send(b"ok", 3)
        t0 = time.monotonic()
        while not r.done and time.monotonic() - t0 < 10:
            a.progress()
            time.sleep(0.001)
        assert r.done and r.wait().length == 2
        b.stop_progress_thread()
    finally:
        p.close()


def test_rkey_map_gives_the_peers_shared_segment(tl):
    """``RemoteKey.map()`` (rkey_ptr): a segment from ``mem_map(length,
    shared=True)`` maps on any lane of this host (tcp too: Allocate_shared
    needs it), stores show on both sides; user buffers and, without the shm
    transport, plain ``mem_map(length)`` memory do not map."""
    p = Pair(tl)
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        mh = b.mem_map(length=4096, shared=True)
        view = ep.unpack_rkey(mh.pack_rkey()).map()
        assert view is not None and view.nbytes == 4096 and not view.readonly
        view[100:105] = b"mapd!"
        assert bytes(mh.buf[100:105]) == b"mapd!"
        mh.buf[0:2] = b"ok"
        assert bytes(view[0:2]) == b"ok"
        user = b.mem_map(bytearray(64))
        assert ep.unpack_rkey(user.pack_rkey()).map() is None
        plain = b.mem_map(length=64)
        assert (ep.unpack_rkey(plain.pack_rkey()).map() is None) == (tl != "shm")
        for h in (mh, user, plain):
            h.unmap()
        assert bytes(view[100:105]) == b"mapd!"     # the mapping outlives the unlink
    finally:
        p.close()


# -- atomic_fetch_now: the native atomic on mapped memory --------------------------

@pytest.fixture
def mapped():
    """(Pair over shm, MemHandle on worker 1, worker 0's mapped key to it)."""
    if not transport_available("shm"):
        pytest.skip("transport shm unavailable")
    p = Pair("shm")
    mh = p.workers[1].mem_map(length=64)
    key = p.eps[0][1].unpack_rkey(mh.pack_rkey())
    assert key.mode == "mapped" and key.native is not None and key.native.atomics
    yield p, mh, key
    p.close()


@pytest.mark.parametrize("size", [4, 8])
def test_atomic_fetch_now_does_every_op_at_once(mapped, size):
    p, mh, key = mapped
    ep = p.eps[0][1]
    words = np.frombuffer(mh.buf, np.uint32 if size == 4 else np.uint64, count=4)
    addr, mask = mh.address + size, (1 << (8 * size)) - 1
    words[1] = 10
    assert ep.atomic_fetch_now("add", 5, addr, key, size) == 10 and words[1] == 15
    assert ep.atomic_fetch_now("add", -1, addr, key, size) == 15 and words[1] == 14  # masked
    assert ep.atomic_fetch_now("swap", 99, addr, key, size) == 14 and words[1] == 99
    assert ep.atomic_fetch_now("cswap", 7, addr, key, size, compare=1) == 99 and words[1] == 99
    assert ep.atomic_fetch_now("cswap", 7, addr, key, size, compare=99) == 99 and words[1] == 7
    assert ep.atomic_fetch_now("and", 0b110, addr, key, size) == 7 and words[1] == 0b110
    assert ep.atomic_fetch_now("or", 0b1, addr, key, size) == 0b110 and words[1] == 0b111
    assert ep.atomic_fetch_now("xor", 0b101, addr, key, size) == 0b111 and words[1] == 0b010
    assert ep.atomic_fetch_now("or", mask, addr, key, size) == 0b010 and int(words[1]) == mask
    assert words[0] == 0 and words[2] == 0                        # neighbours untouched
    assert ep.atomic_fetch("add", 1, addr, key, size) == mask and words[1] == 0   # wraps
    last = mh.address + mh.length - size                          # the region's last word
    assert ep.atomic_fetch_now("add", 3, last, key, size) == 0
    assert ep.atomic_fetch("add", 0, last, key, size) == 3


def test_atomic_fetch_now_leaves_what_it_cannot_do_to_the_request_path(mapped):
    p, mh, key = mapped
    ep = p.eps[0][1]
    before = bytes(mh.buf)
    for args in [("add", 1, mh.address + mh.length - 4, key, 8),    # runs past the end
                 ("add", 1, mh.address - 8, key, 8),                # before the start
                 ("add", 1, mh.address + (1 << 70), key, 8),        # beyond 64 bits
                 ("add", 1, mh.address + 4, key, 8),                # misaligned
                 ("nand", 1, mh.address, key, 8),                   # no such op
                 ("add", 1, mh.address, key, 2),                    # no such size
                 ("add", 1, mh.address, key, 1 << 100)]:            # nor this one
        assert ep.atomic_fetch_now(*args) is None, args
    assert bytes(mh.buf) == before                                  # nothing done
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.atomic_fetch("add", 1, mh.address + mh.length - 4, key, 8)
    with pytest.raises(ucxpy.RemoteAccessError, match="misaligned"):
        ep.atomic_fetch("add", 1, mh.address + 4, key, 8)
    with pytest.raises(ValueError):
        ep.atomic_fetch("nand", 1, mh.address, key)
    with pytest.raises(ValueError, match="4 or 8"):
        ep.atomic_fetch("add", 1, mh.address, key, 1 << 100)
    with pytest.raises(TypeError):
        ep.atomic_fetch_now("add", "one", mh.address, key, 8)
    with pytest.raises(TypeError):
        ep.atomic_fetch_now("add", 1, mh.address, key, "8")
    mh.unmap()                                                      # a stale key
    assert ep.atomic_fetch_now("add", 1, mh.address, key, 8) is None
    with pytest.raises(ucxpy.RemoteAccessError, match="stale|unmapped"):
        ep.atomic_fetch("add", 1, mh.address, key, 8)


def test_atomic_fetch_now_is_off_when_traced(mapped):
    p, mh, key = mapped
    a = p.workers[0]
    a.tr = object()                    # any recorder: the trace must see every atomic
    try:
        assert p.eps[0][1].atomic_fetch_now("add", 1, mh.address, key) is None
    finally:
        a.tr = None


@pytest.mark.parametrize("cfg", [{"fastpath": False}, {"atomic_mode": "device"}],
                         ids=["fastpath-off", "device-atomics"])
def test_no_native_atomics_without_fastpath_or_with_device_atomics(cfg):
    if not transport_available("shm"):
        pytest.skip("transport shm unavailable")
    p = Pair("shm", **cfg)
    try:
        mh = p.workers[1].mem_map(length=64)
        key = p.eps[0][1].unpack_rkey(mh.pack_rkey())
        assert key.mode == "mapped"
        # device atomics leave put and get native, they are plain copies
        assert (key.native is None) == ("fastpath" in cfg)
        assert key.native is None or not key.native.atomics
        assert p.eps[0][1].atomic_fetch_now("add", 1, mh.address, key) is None
        if "fastpath" in cfg:          # the Python path still does it
            assert p.eps[0][1].atomic_fetch("add", 2, mh.address, key) == 0
            assert np.frombuffer(mh.buf, np.uint64, count=1)[0] == 2
    finally:
        p.close()


def test_self_keys_have_no_native_map():
    """The loopback domain's validity is not one word: its keys stay in Python."""
    p = Pair("self")
    try:
        w = p.workers[0]
        mh = w.mem_map(length=64)
        key = p.eps[0][0].unpack_rkey(mh.pack_rkey())
        assert key.native is None
        assert p.eps[0][0].atomic_fetch("add", 5, mh.address, key) == 0
    finally:
        p.close()


def test_mapped_put_and_get_take_one_native_call(mapped):
    """put_nb/get_nb on a mapped key: done at once, the Python checks only
    for what the native copy refuses (and they still raise)."""
    p, mh, key = mapped
    ep = p.eps[0][1]
    assert ep.put_nb(np.arange(8, dtype=np.uint8), mh.address + 3, key).done
    back = np.zeros(4, np.uint32)                                  # any writable buffer
    assert ep.get_nb(back, mh.address, key).done
    assert back.view(np.uint8).tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7] + [0] * 5
    assert ep.put_nb(b"", mh.address + mh.length, key).done         # empty, at the end
    with pytest.raises(ucxpy.InvalidBuffer, match="contiguous"):
        ep.put_nb(np.arange(64, dtype=np.uint8)[::2], mh.address, key)
    ep.put(bytearray(b"last"), mh.address + mh.length - 4, key)     # the region's last bytes
    assert bytes(mh.buf[-4:]) == b"last"
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.put_nb(b"x" * 5, mh.address + mh.length - 4, key)
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.get_nb(bytearray(1), mh.address - 1, key)
    with pytest.raises(ucxpy.RemoteAccessError, match="outside"):
        ep.get_nb(bytearray(1), mh.address + (1 << 70), key)
    with pytest.raises(ucxpy.InvalidBuffer, match="read-only"):
        ep.get_nb(b"ro", mh.address, key)
    with pytest.raises(ucxpy.InvalidBuffer):
        ep.put_nb(object(), mh.address, key)
    mh.unmap()
    with pytest.raises(ucxpy.RemoteAccessError, match="stale|unmapped"):
        ep.put_nb(b"late", mh.address, key)


def test_data_plane_keys_reject_bad_arguments():
    from ucxpy import _dp
    w, region = _dp.Worker(), bytearray(64)
    addr = np.frombuffer(region, np.uint8).ctypes.data
    with pytest.raises(TypeError):
        _dp.MappedKey(object(), addr, 0, 64)                       # not a data-plane worker
    with pytest.raises(ValueError):
        _dp.MappedKey(w, 0, 0, 64)                                 # no address
    with pytest.raises(ValueError):
        _dp.MappedKey(w, addr, (1 << 64) - 8, 64)                  # wraps
    key = _dp.MappedKey(w, addr, 0x1000, 64, atomics=True, keep=region)
    with pytest.raises(TypeError):
        key.fetch(0x1000, 8, 0, 1)                                 # compare missing
    with pytest.raises(TypeError):
        key.put(0x1000, b"x", True)
    with pytest.raises(TypeError):
        key.put("0x1000", b"x")
    assert key.put(0x1000 + 60, b"four") and not key.put(0x1000 + 61, b"four")
    assert not key.post(0x1000, 8, 4, 1)                           # swap has no post form
    assert w.counters()["put"] == 1 and w.counters()["put_bytes"] == 4
