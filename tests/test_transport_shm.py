"""The shm transport between real processes, driven through a fake owner."""
from __future__ import annotations

import glob
import hashlib
import multiprocessing as mp
import os
import random
import select
import signal
import struct
import time

import pytest

pytest.importorskip("ucxpy._native")

from ucxpy.config import Config  # noqa: E402
from ucxpy._native import lib  # noqa: E402
from ucxpy.errors import (ConnectionLost, MessageTooLarge, ProtocolError,  # noqa: E402
                          RemoteAccessError)
from ucxpy.transports.base import Caps  # noqa: E402
from ucxpy.transports import shm  # noqa: E402
from ucxpy.transports.shm import ShmInterface, local_host_id, reap_stale_segments  # noqa: E402

pytestmark = pytest.mark.timeout(60)

AM_DATA, AM_KEY, AM_HELLO = 1, 2, 3
GET_SIZE = 64 << 20
HDR_SIZE = lib.UCXPY_RING_HDR_SIZE


class FakeOwner:
    """Records what the transport reports; optionally echoes every frame."""

    direct_am_ids = frozenset()

    def __init__(self, echo=False):
        self.echo = echo
        self.frames = []
        self.failed = []
        self.keep = []

    def recv_frame(self, ep, am_id, header, payload):
        if am_id == AM_KEY and self.echo:
            self._serve_key(ep)
        elif self.echo:
            ep.send(am_id, bytes(header), bytes(payload))
        else:
            self.frames.append((ep, am_id, bytes(header), bytes(payload)))

    def recv_dest(self, ep, am_id, header, length):
        return None

    def conn_failed(self, ep, exc):
        self.failed.append((ep, exc))

    def _serve_key(self, ep):
        buf = bytearray(random.Random(5).randbytes(GET_SIZE))
        self.keep.append(buf)
        addr, rkey = ep.pack_local_key(buf)
        ep.send(AM_KEY, struct.pack("<Q", addr) + rkey, hashlib.sha256(buf).digest())


def _peer_main(conn, overrides, mode):
    """Child process: an interface that echoes, stalls or connects back."""
    owner = FakeOwner(echo=mode in ("echo", "connect"))
    iface = ShmInterface(owner, Config.from_env({}, **overrides))
    conn.send(iface.address())
    if mode == "connect":
        ep = iface.connect(conn.recv())
        ep.send(AM_HELLO, b"hello", b"")
    next_check = 0.0
    while True:
        if mode != "stall" or not owner.frames:
            iface.progress()
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.005
            if conn.poll():
                cmd = conn.recv()
                if cmd == "stop":
                    break
                if cmd == "failed":
                    conn.send([str(e) for _ep, e in owner.failed])
                if cmd == "delayed-send":
                    time.sleep(0.3)
                    owner_ep = owner.frames[0][0] if owner.frames else None
                    if owner_ep is None:
                        for ep in iface._eps:
                            ep.send(AM_DATA, b"late", b"wake up")
        if mode == "stall" and owner.frames:
            time.sleep(0.001)
    iface.close()


class Peer:
    def __init__(self, mode="echo", **overrides):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(child, overrides, mode), daemon=True)
        self.proc.start()
        self.address = self.recv()

    def recv(self, timeout=30):
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.05):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise AssertionError(f"peer process silent (exit code {self.proc.exitcode})")
        return self.conn.recv()

    def stop(self):
        if self.proc.is_alive():
            try:
                self.conn.send("stop")
            except OSError:
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture
def peers():
    started = []

    def start(mode="echo", **overrides):
        p = Peer(mode, **overrides)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc.is_alive():
            p.proc.kill()
        p.proc.join(10)


@pytest.fixture
def local():
    made = []

    def make(**overrides):
        owner = FakeOwner()
        iface = ShmInterface(owner, Config.from_env({}, **overrides))
        made.append(iface)
        return owner, iface

    yield make
    for iface in made:
        iface.close()


def drive(iface, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        iface.progress()
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")


def _segments(pid):
    return glob.glob(f"/dev/shm/ucxpy-shm-{pid}-*")


# -- tests -----------------------------------------------------------------------------

def test_attributes_and_reachability(local):
    _owner, iface = local()
    a = iface.attrs
    assert a.caps & Caps.AM_SHORT and a.caps & Caps.AM_BCOPY and a.caps & Caps.INTRA_HOST
    assert a.max_short == 256 and a.max_bcopy == shm.EAGER_LIMIT == 256 << 10
    _o, small = local(shm_ring_size=65536)       # an eighth of a small ring at most
    assert small.attrs.max_bcopy == 8192 and small.attrs.max_frame == 16384
    assert a.max_frame == iface.ring_size // 4
    assert iface.is_reachable(iface.address(), local_host_id())
    assert not iface.is_reachable(iface.address(), b"other-host/boot/1")
    assert not iface.is_reachable(b"garbage", local_host_id())
    assert ShmInterface.query(Config.from_env({})).available


def test_cma_can_be_disabled(local):
    _owner, iface = local(shm_cma=False)
    assert not iface.attrs.caps & Caps.GET_ZCOPY and iface.attrs.max_get == 0


def test_frames_in_order_byte_for_byte_all_sizes(peers, local):
    owner, iface = local()
    peer = peers("echo")
    ep = iface.connect(peer.address)
    mf = iface.attrs.max_frame
    sizes = [0, 1, 7, 8, 9, 255, 256, 257, 1000, 4095, 4096, 8191, 8192, 8193,
             65536, 100003, mf - 1, mf, 0, 3]
    rng = random.Random(7)
    sent = []
    for i, n in enumerate(sizes):
        hdr = struct.pack("<I", i) + rng.randbytes(i % 13)
        payload = rng.randbytes(n)
        kind = i % 3    # bytes, bytearray, memoryview of a numpy-like view
        buf = payload if kind == 0 else bytearray(payload) if kind == 1 else memoryview(payload)
        ep.send(AM_DATA, hdr, buf)
        sent.append((AM_DATA, hdr, payload))
    drive(iface, lambda: len(owner.frames) == len(sent))
    got = [(am, h, p) for _ep, am, h, p in owner.frames]
    assert got == sent
    with pytest.raises(MessageTooLarge):
        ep.send(AM_DATA, b"", bytes(mf + 1))
    with pytest.raises(MessageTooLarge):
        ep.send(AM_DATA, bytes(2000), b"")
    peer.stop()


def test_ring_full_back_pressure_keeps_order(peers, local):
    # a ring with room for frames above the eager-copy limit (a quarter of it)
    owner, iface = local(shm_ring_size=1 << 19)
    peer = peers("echo", shm_ring_size=1 << 19)
    ep = iface.connect(peer.address)
    assert iface.attrs.max_bcopy + 1000 <= iface.attrs.max_frame
    rng = random.Random(11)
    sent, done, results = [], [], []
    big = iface.attrs.max_bcopy + 1000
    os.kill(peer.proc.pid, signal.SIGSTOP)       # the peer cannot drain the ring meanwhile
    try:
        for i in range(5000):
            n = big if i % 50 == 0 else rng.randrange(0, 3000)
            payload = bytearray(rng.randbytes(n))
            hdr = struct.pack("<I", i)
            results.append(ep.send(AM_DATA, hdr, payload, on_complete=done.append))
            sent.append((hdr, bytes(payload)))
        assert ep.pending > 1000                 # the ring filled up: the rest is queued
    finally:
        os.kill(peer.proc.pid, signal.SIGCONT)
    assert False in results                      # large payloads queued by reference
    assert results.count(False) == sum(1 for i in range(5000)
                                       if i % 50 == 0 and not results[i])
    drive(iface, lambda: len(owner.frames) == len(sent), timeout=40)
    assert [(h, p) for _ep, _am, h, p in owner.frames] == sent
    assert done == [None] * results.count(False)
    assert ep.pending == 0
    peer.stop()


def test_get_zcopy_64MiB_via_cma(peers, local):
    owner, iface = local()
    if not iface.attrs.caps & Caps.GET_ZCOPY:
        pytest.skip(f"CMA unavailable: {iface.cma_reason}")
    peer = peers("echo")
    ep = iface.connect(peer.address)
    ep.send(AM_KEY, b"", b"")
    drive(iface, lambda: owner.frames, timeout=40)
    _ep, am, hdr, digest = owner.frames[0]
    assert am == AM_KEY
    (addr,), rkey = struct.unpack_from("<Q", hdr), hdr[8:]
    if not ep.cma_ok():
        pytest.skip("CMA to the peer process is not permitted")
    dst = bytearray(GET_SIZE)
    t = time.perf_counter()
    assert ep.get(memoryview(dst), addr, rkey, None) is True
    dt = time.perf_counter() - t
    assert hashlib.sha256(dst).digest() == digest
    print(f"CMA get 64 MiB: {GET_SIZE / dt / 1e9:.2f} GB/s")
    part = bytearray(4096)
    assert ep.get(part, addr + GET_SIZE - 4096, rkey, None)
    assert part == dst[-4096:]
    with pytest.raises(RemoteAccessError):
        ep.get(part, addr + GET_SIZE - 4095, rkey, None)          # past the end
    with pytest.raises(RemoteAccessError):
        ep.get(part, addr - 1, rkey, None)                        # before the start
    with pytest.raises(RemoteAccessError):
        ep.get(part, addr, b"junk", None)
    peer.stop()


@pytest.mark.parametrize("who_connects", ["we", "peer"])
def test_peer_death_is_connection_lost(peers, local, who_connects):
    owner, iface = local(shm_ring_size=1 << 19)      # frames above max_bcopy fit
    if who_connects == "we":
        peer = peers("stall", shm_ring_size=1 << 19)
        ep = iface.connect(peer.address)
        ep.send(AM_DATA, b"first", b"")
    else:
        peer = peers("connect")
        peer.conn.send(iface.address())
        drive(iface, lambda: owner.frames)
        ep = owner.frames[0][0]
        assert ep.accepted and owner.frames[0][1] == AM_HELLO
    # With a stalled peer the ring fills up and sends queue by reference.
    done = []
    if who_connects == "we":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            while ep.pending == 0:
                ep.send(AM_DATA, b"", bytes(iface.attrs.max_bcopy + 1), on_complete=done.append)
            time.sleep(0.1)              # the peer may still drain one batch
            iface.progress()
            if ep.pending:
                break
        assert ep.pending > 0
        done.clear()
    time.sleep(0.05)
    os.kill(peer.proc.pid, signal.SIGKILL)
    t = time.monotonic()
    drive(iface, lambda: owner.failed, timeout=10)
    assert time.monotonic() - t < 2.0
    assert len(owner.failed) == 1
    failed_ep, exc = owner.failed[0]
    assert failed_ep is ep and isinstance(exc, ConnectionLost)
    if who_connects == "we":
        assert done and all(isinstance(e, ConnectionLost) for e in done), (done, exc)
    with pytest.raises(ConnectionLost):
        ep.send(AM_DATA, b"", b"")
    for _ in range(200):
        iface.progress()
    assert len(owner.failed) == 1              # reported exactly once
    peer.proc.join(10)
    # the killed peer's inbox is unlinked by us; ours is the only one left
    assert _segments(peer.proc.pid) == [] and _segments(os.getpid()) == [iface._inbox.path]


def test_graceful_close_reaches_the_peer_and_frees_segments(peers, local):
    owner, iface = local()
    peer = peers("echo")
    ep = iface.connect(peer.address)
    ep.send(AM_DATA, b"x", b"y")
    drive(iface, lambda: owner.frames)
    assert _segments(os.getpid()) == [iface._inbox.path]   # one inbox, no per-pair segments
    ep.close()
    ep.close()                                   # idempotent
    with pytest.raises(ConnectionLost):
        ep.send(AM_DATA, b"", b"")
    deadline = time.monotonic() + 10
    while True:
        peer.conn.send("failed")
        reports = peer.recv()
        if reports or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert reports and "closed" in reports[0]
    assert owner.failed == []                    # our own close is not a failure
    peer.stop()


def test_wait_fds_wakes_a_sleeping_consumer(peers, local):
    owner, iface = local()
    peer = peers("connect")
    peer.conn.send(iface.address())
    drive(iface, lambda: owner.frames)
    owner.frames.clear()
    drive(iface, lambda: True)
    fds = iface.wait_fds()                       # arms the rings: we go to sleep
    peer.conn.send("delayed-send")
    t = time.monotonic()
    readable, _, _ = select.select(fds, [], [], 10)
    assert readable and time.monotonic() - t < 5
    drive(iface, lambda: owner.frames)
    assert owner.frames[0][2:] == (b"late", b"wake up")
    # armed with data already waiting: select must not block
    peer.conn.send("delayed-send")
    time.sleep(0.6)
    fds = iface.wait_fds()
    readable, _, _ = select.select(fds, [], [], 5)
    assert readable
    peer.stop()


def test_connect_to_vanished_interface_fails(local):
    owner, iface = local()
    _o2, gone = local()
    address = gone.address()
    gone.close()                                 # unlinks its inbox
    with pytest.raises(ConnectionLost, match="inbox"):
        iface.connect(address)
    assert _segments(os.getpid()) == [iface._inbox.path]
    iface.close()
    assert _segments(os.getpid()) == []


def test_corrupt_inbox_fails_only_the_connections_that_lost_frames(local):
    """b's inbox is scribbled over: b discards what it held and goes on; the
    connection whose frame was lost fails on both sides (ProtocolError at
    the sender), another connection into the same inbox keeps working."""
    owner_a, a = local()
    owner_b, b = local()
    owner_c, c = local()
    ep = a.connect(b.address())
    healthy = c.connect(b.address())
    ep.send(AM_DATA, b"ok", b"fine")
    healthy.send(AM_DATA, b"c1", b"")
    drive(b, lambda: len(owner_b.frames) == 2)
    ep.send(AM_DATA, b"h", b"p")
    # scribble over the next frame prefix in b's inbox
    pos = HDR_SIZE + (b._rx.tail & (b._inbox.capacity - 1))
    struct.pack_into("<IHBBQ", b._inbox.mm, pos, 1 << 30, 5, AM_DATA, 1, ep._out)
    drive(b, lambda: b.resets == 1)
    drive(a, lambda: owner_a.failed)
    failed_ep, exc = owner_a.failed[0]
    assert failed_ep is ep and isinstance(exc, ProtocolError) and "lost" in str(exc)
    drive(b, lambda: owner_b.failed)
    assert owner_b.failed[0][0] is owner_b.frames[0][0]
    healthy.send(AM_DATA, b"c2", b"")
    drive(b, lambda: len(owner_b.frames) == 3)
    assert owner_b.frames[2][2] == b"c2" and len(owner_b.failed) == 1
    assert owner_c.failed == []


def test_scribbled_epoch_fails_no_connection(local):
    """A peer scribbles on the reset count (epoch) of b's inbox: no reset
    made it, so no connection into the inbox fails (before, every producer
    took it for resets it could not tell apart and failed), and b puts the
    count back."""
    owner_a, a = local()
    owner_b, b = local()
    ep = a.connect(b.address())
    ep.send(AM_DATA, b"1", b"")
    drive(b, lambda: len(owner_b.frames) == 1)
    epoch_at = 896                          # native/ring.c's ring_shared_t
    struct.pack_into("<Q", b._inbox.mm, epoch_at, 0x746006_4dd412ac79)
    assert a._check_lost() == 0             # what a peer's reset notice runs
    ep.send(AM_DATA, b"2", b"")
    drive(b, lambda: len(owner_b.frames) == 2)
    b._check_peers()
    assert struct.unpack_from("<Q", b._inbox.mm, epoch_at)[0] == 0
    assert owner_a.failed == [] and owner_b.failed == [] and b.resets == 0


def test_endpoint_closed_from_inside_recv_frame(local):
    owner_a, a = local()
    owner_b, b = local()
    ep = a.connect(b.address())
    for i in range(10):
        ep.send(AM_DATA, b"%d" % i, b"x" * 100)
    seen = []

    def recv_and_close(rep, am_id, header, payload):
        seen.append(bytes(header))
        rep.close()

    owner_b.recv_frame = recv_and_close
    drive(b, lambda: seen)
    for _ in range(100):
        b.progress()
        a.progress()
    assert seen == [b"0"]
    drive(a, lambda: owner_a.failed)             # a learns that b closed
    assert isinstance(owner_a.failed[0][1], ConnectionLost)


def _exit_now():
    pass


def test_stale_segments_of_dead_processes_are_reaped():
    p = mp.get_context("spawn").Process(target=_exit_now)
    p.start()
    p.join(30)
    path = f"/dev/shm/ucxpy-shm-{p.pid}-{'ab' * 8}"
    young = f"/dev/shm/ucxpy-shm-{p.pid}-{'cd' * 8}"
    try:
        for f in (path, young):
            open(f, "wb").close()
        os.utime(path, (time.time() - 3600, time.time() - 3600))
        assert reap_stale_segments() >= 1
        assert not os.path.exists(path) and os.path.exists(young)
    finally:
        for f in (path, young):
            if os.path.exists(f):
                os.unlink(f)


def test_frames_outlive_their_closed_connector(local):
    """The connector closes its interface (and unlinks its inbox) before the
    peer accepted: the frames it pushed are in the peer's inbox and are
    delivered, then the connection fails; no segment is left behind."""
    (oa, a), (ob, b) = local(), local()
    ep = a.connect(b.address())
    ep.send(AM_DATA, b"last", b"words")
    a.close()
    assert _segments(os.getpid()) == [b._inbox.path]
    drive(b, lambda: ob.frames and ob.failed)
    assert ob.frames[0][1:] == (AM_DATA, b"last", b"words")
    assert isinstance(ob.failed[0][1], ConnectionLost)
    b.close()
    assert _segments(os.getpid()) == []


def test_inboxes_grow_with_processes_not_pairs(local):
    """Every connection into an interface shares its one inbox, and a peer's
    inbox is mapped once however many endpoints go to it."""
    ifaces = [local() for _ in range(4)]
    eps = {}
    for i, (_o, x) in enumerate(ifaces):
        for j, (_p, y) in enumerate(ifaces):
            if i != j:
                eps[i, j] = x.connect(y.address())
                eps[i, j].send(AM_DATA, b"%d>%d" % (i, j), b"")
    extra = ifaces[0][1].connect(ifaces[1][1].address())
    extra.send(AM_DATA, b"0>1 again", b"")
    for _ in range(3):
        for _o, x in ifaces:
            x.progress()
    assert len(_segments(os.getpid())) == 4
    for _o, x in ifaces:
        assert len(x._peer_inboxes) == 3
    for j, (o, _y) in enumerate(ifaces):
        got = sorted(bytes(f[2]) for f in o.frames)
        want = sorted(b"%d>%d" % (i, j) for i in range(4) if i != j)
        assert got == sorted(want + ([b"0>1 again"] if j == 1 else []))


def test_connection_made_while_the_inbox_is_being_read(local):
    """A peer connects (CONNECT datagram, then frame) while we are reading
    our inbox, after we last read the socket: its frame, met later in the same
    pass, is delivered, not dropped as one of an unknown connection."""
    (oa, a), (ob, b), (od, d) = local(), local(), local()
    a.connect(b.address()).send(AM_DATA, b"first", b"")
    recv = ob.recv_frame
    late = []

    def recv_and_connect(ep, am_id, header, payload):
        recv(ep, am_id, header, payload)
        if not late:
            late.append(d.connect(b.address()))
            late[0].send(AM_DATA, b"late", b"")

    ob.recv_frame = recv_and_connect
    drive(b, lambda: len(ob.frames) == 2)
    assert [bytes(f[2]) for f in ob.frames] == [b"first", b"late"]
    assert b.dropped_frames == 0


def test_the_eager_limit_shares_the_receive_queue_among_local_peers():
    """``protocol_thresholds``: on a lane whose receive queue every same-host
    peer writes to and whose rendezvous reads one-sidedly, the eager limit is
    at most the queue over twice the peers (floor MIN_SHARED_EAGER); other
    lanes, and a job of one rank per host, keep the transport's limit."""
    from ucxpy.endpoint import MIN_SHARED_EAGER, protocol_thresholds
    from ucxpy.transports.base import Caps, TransportAttrs
    import ucxpy
    cfg = ucxpy.Config.from_env({})
    attrs = TransportAttrs(caps=Caps.GET_ZCOPY, max_short=256, max_bcopy=64 << 10,
                           max_frame=512 << 10, latency=1e-6, bandwidth=1e9,
                           rx_shared=2 << 20)
    rndv = lambda peers, a=attrs: protocol_thresholds(a, cfg, peers)[1]     # noqa: E731
    assert rndv(0) == rndv(7) == rndv(15) == (64 << 10) + 1
    assert rndv(31) == (2 << 20) // 62 + 1
    assert rndv(1000) == MIN_SHARED_EAGER + 1
    from ucxpy.record import replace
    no_get = replace(attrs, caps=Caps(0))
    unshared = replace(attrs, rx_shared=0)
    assert rndv(31, no_get) == rndv(31, unshared) == (64 << 10) + 1


def test_housekeeping_stretches_with_the_ranks_per_cpu(local):
    """With more ranks than CPUs a rank runs a fraction of the time: its
    control-socket checks, every ``_HOUSEKEEPING`` seconds of wall time, are
    spaced by the owner's ``cpu_share()`` (read at each liveness check), and
    an owner without one keeps the plain interval.  A connection made
    between two checks is still accepted at the first frame."""
    owner, iface = local()
    owner.cpu_share = lambda: 16.0
    now = time.monotonic()
    iface._next_liveness = 0.0
    iface._housekeeping(now)
    assert iface._housekeeping_every == pytest.approx(16 * shm._HOUSEKEEPING)
    iface._housekeeping(now + 1e-3)             # (the next check is 16 ms on)
    assert iface._next_housekeeping == pytest.approx(now + 17 * shm._HOUSEKEEPING)
    del owner.cpu_share
    iface._next_liveness = 0.0
    iface._housekeeping(now)
    assert iface._housekeeping_every == shm._HOUSEKEEPING
    owner.cpu_share = lambda: 1e6               # no check for a long while
    iface._next_liveness = 0.0
    iface._housekeeping(time.monotonic())
    _o2, peer = local()
    ep = peer.connect(iface.address())
    ep.send(AM_DATA, b"h", b"after")
    drive(iface, lambda: owner.frames)
    assert owner.frames[0][1:] == (AM_DATA, b"h", b"after")


def test_worker_cpu_share_is_ranks_per_usable_cpu():
    from ucxpy.worker import Worker, usable_cpus
    import ucxpy
    w = Worker(ucxpy.Context(ucxpy.Config.from_env({}, tls=("self",))))
    try:
        assert w.cpu_share() == 1.0                   # outside a job
        w.set_local_ranks(8 * usable_cpus())
        assert w.cpu_share() == 8.0
        w.set_local_ranks(1)
        assert w.cpu_share() == 1.0                   # never below one
    finally:
        w.close()
