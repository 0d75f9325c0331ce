"""Loopback ("self") transport: deferred delivery, order, copies, zero copy."""
from __future__ import annotations

import select
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ucxpy.config import Config  # noqa: E402
from ucxpy.errors import ConnectionLost, InvalidBuffer, MessageTooLarge, TransportUnavailable  # noqa: E402
from ucxpy.transports.base import MAX_HEADER, Caps  # noqa: E402
from ucxpy.transports.loopback import SelfInterface  # noqa: E402

DIRECT = 7


class FakeOwner:
    def __init__(self, direct=(DIRECT,)):
        self.direct_am_ids = frozenset(direct)
        self.frames = []
        self.dests = []
        self.failed = []
        self.on_frame = None

    def recv_dest(self, ep, am_id, header, length):
        view = memoryview(bytearray(length))
        self.dests.append(view)
        return view

    def recv_frame(self, ep, am_id, header, payload):
        keep = payload if any(payload is d for d in self.dests) else bytes(payload)
        self.frames.append((ep, am_id, bytes(header), keep))
        if self.on_frame:
            self.on_frame(ep, am_id, header, payload)

    def conn_failed(self, ep, exc):
        self.failed.append((ep, exc))


@pytest.fixture
def iface():
    owner = FakeOwner()
    i = SelfInterface(owner, Config())
    yield i, owner
    i.close()


@pytest.mark.timeout(10)
def test_address_and_reachability(iface):
    i, _ = iface
    other = SelfInterface(FakeOwner(), Config())
    try:
        assert i.attrs.caps & Caps.LOOPBACK
        assert i.is_reachable(i.address(), b"host")
        assert not i.is_reachable(other.address(), b"host")
        assert i.address() != other.address()
        with pytest.raises(TransportUnavailable):
            i.connect(other.address())
    finally:
        other.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("size", [0, 1, 255, 256, 16 << 10, 1 << 20, 64 << 20])
@pytest.mark.parametrize("am", [1, DIRECT], ids=["buffered", "direct"])
def test_delivered_on_next_progress(iface, size, am):
    i, owner = iface
    ep = i.connect(i.address())
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    done = []
    finished = ep.send(am, b"hdr", data, done.append)
    assert not owner.frames               # never delivered from inside send
    assert ep.pending == 1
    assert i.progress() == 1
    (rep, am_id, hdr, payload), = owner.frames
    assert rep is ep and am_id == am and hdr == b"hdr"
    assert np.array_equal(np.frombuffer(payload, np.uint8), data)
    if am == DIRECT:
        assert payload is owner.dests[0]
    if finished:
        assert done == [] and size <= i.attrs.max_bcopy
    else:
        assert done == [None]
    assert i.progress() == 0


@pytest.mark.timeout(10)
def test_small_payload_is_copied(iface):
    i, owner = iface
    ep = i.connect(i.address())
    buf = bytearray(b"before")
    assert ep.send(1, bytearray(b"h"), buf) is True
    buf[:] = b"after!"
    i.progress()
    assert owner.frames[0][3] == b"before"


@pytest.mark.timeout(10)
def test_order_and_no_recursion(iface):
    i, owner = iface
    ep = i.connect(i.address())

    def reply(ep, am_id, header, payload):     # each frame triggers another: must not recurse
        n = int.from_bytes(header, "little")
        if n < 1000:
            ep.send(1, (n + 1).to_bytes(4, "little"))

    owner.on_frame = reply
    for n in range(3):
        ep.send(1, (n * 10_000).to_bytes(4, "little"), b"x" * n)
    assert i.progress() == 3                  # replies wait for the next call
    ep.send(1, (5000).to_bytes(4, "little"))
    while i.progress():
        pass
    got = [int.from_bytes(f[2], "little") for f in owner.frames]
    assert got[:3] == [0, 10_000, 20_000]
    assert got[3:5] == [1, 5000]              # FIFO: reply queued before the later send
    assert sorted(got[3:]) == sorted([5000] + list(range(1, 1001)))


@pytest.mark.timeout(10)
def test_limits_and_bad_buffers(iface):
    i, _ = iface
    ep = i.connect(i.address())
    with pytest.raises(MessageTooLarge):
        ep.send(1, b"x" * (MAX_HEADER + 1))
    with pytest.raises(InvalidBuffer):
        ep.send(1, b"h", np.zeros((4, 4))[:, 0])


@pytest.mark.timeout(10)
def test_wait_fds_readable_while_queued(iface):
    i, _ = iface
    ep = i.connect(i.address())
    fds = i.wait_fds()
    assert select.select(fds, [], [], 0)[0] == []
    ep.send(1, b"x")
    assert select.select(fds, [], [], 1)[0] == fds
    i.progress()
    assert select.select(fds, [], [], 0)[0] == []


@pytest.mark.timeout(10)
def test_close(iface):
    i, owner = iface
    ep = i.connect(i.address())
    big = np.zeros(1 << 20, np.uint8)
    ep.send(1, b"a")
    ep.close()
    with pytest.raises(ConnectionLost):
        ep.send(1, b"b")
    i.progress()
    assert [f[2] for f in owner.frames] == [b"a"]    # queued before close: still delivered
    ep2 = i.connect(i.address())
    done = []
    assert ep2.send(1, b"c", big, done.append) is False
    i.close()
    assert len(done) == 1 and isinstance(done[0], ConnectionLost)
    with pytest.raises(ConnectionLost):
        ep2.send(1, b"d")
    i.close()
