"""The ofi (libfabric) transport: frames, one-sided get/put, failures, and
the core's suites over it, on every provider that works here (tcp;ofi_rxm, shm)."""
from __future__ import annotations

import gc
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

ofi = pytest.importorskip("ucxpy.transports.ofi")
if ofi.lib is None:
    pytest.skip("ucxpy._ofi is not built (no libfabric headers)", allow_module_level=True)

from conftest import PROGS, ROOT, Pair, run_job  # noqa: E402
from ucxpy.config import Config  # noqa: E402
from ucxpy.errors import (ConnectionLost, MessageTooLarge, ProtocolError,  # noqa: E402
                          RemoteAccessError)
from ucxpy.transports.base import Caps  # noqa: E402
from ucxpy.transports.ofi import OfiInterface  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PROVIDERS = ["tcp;ofi_rxm", "shm"]


def _works(prov):
    out = ofi.ffi.new("char[256]")
    return ofi.lib.uxofi_probe(prov.encode(), out, 256) == 0


def ofi_env() -> dict:
    """The UCXPY_OFI_* variables the fixtures set, and nothing else of the
    caller's environment (a Config reads its variables once, from this)."""
    return {k: v for k, v in os.environ.items() if k.startswith("UCXPY_OFI_")}


@pytest.fixture(params=PROVIDERS)
def provider(request, monkeypatch):
    if not _works(request.param):
        pytest.skip(f"libfabric provider {request.param} unavailable")
    monkeypatch.setenv("UCXPY_OFI_PROVIDER", request.param)
    return request.param


class FakeOwner:
    direct_am_ids = frozenset()

    def __init__(self):
        self.frames = []
        self.failed = []

    def recv_frame(self, ep, am_id, header, payload):
        self.frames.append((ep, am_id, bytes(header), bytes(payload)))

    def recv_dest(self, ep, am_id, header, length):
        return None

    def conn_failed(self, ep, exc):
        self.failed.append((ep, exc))


#: the job key the cross-process tests share with their children
JOB_KEY = "ofi-test-job-key-0123456789"


@pytest.fixture
def two(provider):
    owners = [FakeOwner(), FakeOwner()]
    cfg = Config.from_env(ofi_env(), auth_key=JOB_KEY)
    ifaces = [OfiInterface(o, cfg) for o in owners]
    yield ifaces, owners
    for i in ifaces:
        i.close()


def drive(ifaces, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        for i in ifaces:
            i.progress()
        assert time.monotonic() < deadline, "condition not reached"


# -- pure helpers -----------------------------------------------------------------

def test_address_roundtrip_and_malformed():
    a = ofi.pack_address(42, 7, "tcp;ofi_rxm", "10.0.0.0/24", b"host", b"\x02\x00name")
    d = ofi.unpack_address(a)
    assert (d["pid"], d["uuid"], d["provider"], d["fabric"], d["host_id"], d["name"]) == \
        (42, 7, "tcp;ofi_rxm", "10.0.0.0/24", b"host", b"\x02\x00name")
    for bad in (b"", a[:10], a + b"x", b"XXXX" + a[4:]):
        with pytest.raises(ValueError):
            ofi.unpack_address(bad)


def test_rkey_roundtrip_and_malformed():
    k = ofi.pack_rkey(5, 0xABCDEF, 0x1000, 4096, True)
    assert ofi.unpack_rkey(k) == (5, 0xABCDEF, 0x1000, 4096, True)
    with pytest.raises(RemoteAccessError):
        ofi.unpack_rkey(k[:-1])
    with pytest.raises(RemoteAccessError):
        ofi.unpack_rkey(b"NOPE" + k[4:])


def test_query_reports_provider(provider):
    avail = OfiInterface.query(Config.from_env(ofi_env()))
    assert avail.available, avail.reason
    assert "libfabric" in avail.reason and avail.devices == [provider]


def test_bogus_provider_is_unavailable_with_reason(monkeypatch):
    monkeypatch.setenv("UCXPY_OFI_PROVIDER", "no-such-provider")
    avail = OfiInterface.query(Config.from_env(ofi_env()))
    assert not avail.available and "no-such-provider" in avail.reason
    import ucxpy
    ctx = ucxpy.Context(ucxpy.Config.from_env(ofi_env(), tls="ofi,tcp"))
    assert "ofi" in ctx.unavailable and [c.name for c in ctx.transports] == ["self", "tcp"]


# -- frames ------------------------------------------------------------------------

def test_frames_in_order_all_sizes(two):
    (a, b), (oa, ob) = two
    ep = a.connect(b.address())
    mf = a.attrs.max_frame
    sizes = [0, 1, 255, 4096, 16385, mf - 1, mf, 3, 70, mf, 0] * 6
    for i, n in enumerate(sizes):
        ep.send(40 + i % 7, struct.pack("<I", i), bytes([i % 251]) * n)
    drive([a, b], lambda: len(ob.frames) == len(sizes))
    for i, (tep, am, hdr, pl) in enumerate(ob.frames):
        assert am == 40 + i % 7 and struct.unpack("<I", hdr)[0] == i
        assert pl == bytes([i % 251]) * sizes[i]
    assert all(f[0] is ob.frames[0][0] for f in ob.frames)      # one accepted endpoint
    # the accepted endpoint answers on the same connection
    back = ob.frames[0][0]
    back.send(9, b"re", b"ply")
    drive([a, b], lambda: oa.frames)
    assert oa.frames[0][0] is ep and oa.frames[0][1:] == (9, b"re", b"ply")


def test_many_frames_queue_without_blocking(two):
    (a, b), (_oa, ob) = two
    ep = a.connect(b.address())
    n = 3 * (a.tx_depth + a.rx_depth)
    for i in range(n):
        assert ep.send(1, b"", struct.pack("<I", i)) is True    # copied: done at once
    assert ep.pending > 0
    drive([a, b], lambda: len(ob.frames) == n)
    assert [struct.unpack("<I", f[3])[0] for f in ob.frames] == list(range(n))


def test_too_large_frame_raises(two):
    (a, b), _ = two
    ep = a.connect(b.address())
    with pytest.raises(MessageTooLarge):
        ep.send(1, b"", bytes(a.attrs.max_frame + 1))
    with pytest.raises(MessageTooLarge):
        ep.send(1, bytes(2000), b"")


def test_close_tells_peer(two):
    (a, b), (_oa, ob) = two
    ep = a.connect(b.address())
    ep.send(1, b"h", b"last")
    ep.close()
    ep.close()                      # idempotent
    drive([a, b], lambda: ob.failed)
    assert ob.frames[-1][3] == b"last"
    assert isinstance(ob.failed[0][1], ConnectionLost)
    with pytest.raises(ConnectionLost):
        ep.send(1, b"", b"")


def test_malformed_frame_fails_that_connection(two):
    (a, b), (_oa, ob) = two
    ep = a.connect(b.address())
    ep.send(1, b"", b"ok")
    drive([a, b], lambda: ob.frames)
    # a frame whose lengths do not add up, with the next sequence number
    slot = a._tx_free.pop()
    off = (slot - a._tx0) * a.slot_size
    ofi.PREFIX.pack_into(a._tx_view, off, ofi.FRAME_MAGIC, 1, ofi.KIND_DATA, 5, ep._tx_seq,
                         999, ep.conn_id, a.uuid, ep.token)
    assert ofi.lib.uxofi_send(a._h, slot, a._tx_ptr + off, ofi.PREFIX.size + 8, a._tx_desc,
                              ep.fi_addr) == 0
    a._tx_owner[slot] = [ep, ofi.PREFIX.size + 8, 0]
    drive([a, b], lambda: ob.failed)
    assert isinstance(ob.failed[0][1], ProtocolError)
    # garbage from nowhere is dropped and counted, nothing crashes
    before = b.rejected
    slot = a._tx_free.pop()
    off = (slot - a._tx0) * a.slot_size
    a._tx_view[off:off + 40] = b"\xff" * 40
    ofi.lib.uxofi_send(a._h, slot, a._tx_ptr + off, 40, a._tx_desc, ep.fi_addr)
    a._tx_owner[slot] = [ep, 40, 0]
    drive([a, b], lambda: b.rejected > before)


# -- one-sided ---------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 4096, 3 << 20])
def test_get_and_put_through_registered_memory(two, size):
    (a, b), _ = two
    ep = a.connect(b.address())
    assert a.attrs.caps & Caps.GET_ZCOPY and a.attrs.caps & Caps.PUT_ZCOPY
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    remote = memoryview(src).cast("B")
    raddr, rkey = b.pack_local_key(remote)
    dst = np.zeros(size, np.uint8)
    done = []
    assert ep.get(memoryview(dst), raddr, rkey, done.append) is False
    drive([a, b], lambda: done)
    assert done == [None] and np.array_equal(dst, src)
    # put the reverse pattern into the middle of the remote buffer
    half = size // 2
    out = np.full(size - half, 7, np.uint8)
    ep.put(memoryview(out), raddr + half, rkey, done.append)
    drive([a, b], lambda: len(done) == 2)
    assert done[1] is None and (src[half:] == 7).all() and np.array_equal(src[:half], dst[:half])


def test_get_outside_region_or_foreign_key_raises(two):
    (a, b), _ = two
    ep = a.connect(b.address())
    buf = memoryview(bytearray(100))
    raddr, rkey = b.pack_local_key(buf)
    with pytest.raises(RemoteAccessError):
        ep.get(memoryview(bytearray(101)), raddr, rkey, lambda e: None)
    with pytest.raises(RemoteAccessError):
        ep.get(memoryview(bytearray(10)), raddr - 1, rkey, lambda e: None)
    _addr, own = a.pack_local_key(memoryview(bytearray(8)))
    with pytest.raises(RemoteAccessError):
        ep.get(memoryview(bytearray(8)), _addr, own, lambda e: None)


def test_registration_lives_as_long_as_the_view(two):
    (a, b), _ = two
    base = len(b.md.regs)
    view = memoryview(bytearray(1 << 16))
    b.pack_local_key(view)
    assert b.pack_local_key(view)[1] == b.pack_local_key(view)[1]   # reused
    assert len(b.md.regs) == base + 1
    del view
    gc.collect()
    b.progress()
    assert len(b.md.regs) == base and not b.md.regs.dead


# -- peer death (real processes) --------------------------------------------------

CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from ucxpy.config import Config
from ucxpy.transports.ofi import OfiInterface
class O:
    direct_am_ids = frozenset()
    def recv_frame(self, *a): pass
    def recv_dest(self, *a): return None
    def conn_failed(self, *a): pass
i = OfiInterface(O(), Config.from_env())
ep = i.connect(bytes.fromhex(sys.argv[2]))
ep.send(3, b"", b"alive")
print(i.address().hex(), flush=True)
while True:
    i.progress(); time.sleep(0.001)
"""


def test_peer_death_fails_endpoints(two):
    (a, _b), (oa, _ob) = two
    child = subprocess.Popen([sys.executable, "-c", CHILD, ROOT, a.address().hex()],
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, UCXPY_AUTH_KEY=JOB_KEY))
    try:
        caddr = bytes.fromhex(child.stdout.readline().strip())
        drive([a], lambda: oa.frames)
        ep = a.connect(caddr)
        ep.send(1, b"", b"x")
        child.send_signal(signal.SIGKILL)
        child.wait()
        drive([a], lambda: len(oa.failed) == 2, timeout=10)
        assert all(isinstance(e, ConnectionLost) for _ep, e in oa.failed)
        assert {f[0] for f in oa.failed} == {ep, oa.frames[0][0]}
        with pytest.raises(ConnectionLost):
            ep.send(1, b"", b"x")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# -- the core over ofi ---------------------------------------------------------------

@pytest.mark.parametrize("rndv", [None, 0], ids=["auto-rndv", "always-rndv"])
def test_core_tag_sizes_over_ofi(provider, rndv):
    cfg = {} if rndv is None else {"rndv_thresh": rndv}
    p = Pair("ofi", **cfg)
    try:
        w0, w1 = p.workers
        assert p.eps[0][1].transport_endpoint().iface.name == "ofi"
        for n in (0, 1, 65536, 65537, (1 << 22) + 3):
            data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
            out = np.empty(n, np.uint8)
            r = w1.tag_recv_nb(out, tag=n)
            s = p.eps[0][1].tag_send_nb(data, n)
            p.wait(r, s)
            assert np.array_equal(out, data)
    finally:
        p.close()


@pytest.mark.parametrize("prog", ["tag_suite.py", "rma_suite.py"])
def test_spmd_suites_over_ofi(provider, prog):
    cp = run_job(["python", os.path.join(PROGS, prog)], 2, timeout=180,
                 env={"UCXPY_TLS": "ofi", "UCXPY_OFI_PROVIDER": provider})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("SUITE OK") == 2, cp.stdout
    if prog == "rma_suite.py":      # put/get by fi_write/fi_read, not active messages
        assert cp.stdout.count("rdma") == 2, cp.stdout
