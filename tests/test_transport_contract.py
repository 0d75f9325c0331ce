"""The transport contract (ucxpy/transports/base.py), one suite for every
transport: the built-in ones (self, shm, tcp, ofi, verbs) and the toy one of
examples/toy_transport.py, each driven through the same fake owner.

Each transport's own test file covers what only it has (rings, sockets,
registrations, handshakes); this file is what the core may rely on from any
of them: attributes that make sense, per-endpoint FIFO with exact bytes,
the send() return convention (True: the buffer may be reused now; False:
on_complete exactly once later), direct receives into the owner's buffer,
size limits raising MessageTooLarge, wait_fds that wake a sleeper, and a lost
peer reported once through conn_failed, after which sends raise.
verbs runs only where an RDMA device exists; elsewhere its query() is still
checked (it must explain itself, not raise).
"""
from __future__ import annotations

import os
import select
import sys
import time

import numpy as np
import pytest

from ucxpy import context
from ucxpy.config import Config
from ucxpy.errors import ConnectionLost, MessageTooLarge
from ucxpy.transports.base import MAX_HEADER, Availability, Caps, Interface
from ucxpy.worker import host_id

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
context.register_transport("toy", "toy_transport:ToyInterface")

pytestmark = pytest.mark.timeout(120)

NAMES = [*(n for n in context.TRANSPORTS if n != "toy"), "toy"]
KEY = "contract-suite-job-key-0123456789abcdef"
DIRECT = 9


class Owner:
    """Records frames and failures; gives buffers for DIRECT frames when asked."""

    def __init__(self, give=False):
        self.direct_am_ids = frozenset((DIRECT,))
        self.give = give
        self.frames = []
        self.failed = []
        self.dests = []

    def recv_dest(self, ep, am_id, header, length):
        if not self.give:
            return None
        buf = bytearray(length)
        self.dests.append(buf)
        return memoryview(buf)

    def recv_frame(self, ep, am_id, header, payload):
        assert isinstance(header, memoryview) and isinstance(payload, memoryview)
        self.frames.append((ep, am_id, bytes(header), bytes(payload), payload))

    def conn_failed(self, ep, exc):
        self.failed.append((ep, exc))


def config():
    return Config.from_env({"UCXPY_OFI_PROVIDER": "tcp;ofi_rxm"}, auth_key=KEY,
                           tcp_iface="127.0.0.1")


def drive(ifaces, until, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not until():
        for i in ifaces:
            i.progress()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")


@pytest.fixture(params=NAMES)
def name(request):
    return request.param


@pytest.fixture
def pair(name):
    """(sender iface, its owner, receiver iface, its owner); the same
    interface twice for a loopback-only transport."""
    cls, avail = context.load_transport(name, config())
    if cls is None or not avail.available:
        pytest.skip(f"{name} is not available here: {avail.reason}")
    made = []

    def make(give=False):
        oa, ob = Owner(give), Owner(give)
        a = cls(oa, config())
        made.append(a)
        if a.attrs.caps & Caps.LOOPBACK:
            return a, oa, a, oa
        b = cls(ob, config())
        made.append(b)
        return a, oa, b, ob
    yield make
    for i in made:
        i.close()


def rand(n, seed):
    return np.random.default_rng(seed * 7919 + n).integers(0, 256, n, dtype=np.uint8).tobytes()


# ----------------------------------------------------------------- without a device

def test_query_is_an_availability_with_a_reason(name):
    cls, avail = context.load_transport(name, config())
    assert isinstance(avail, Availability)
    if cls is not None:
        assert issubclass(cls, Interface) and cls.name == name
        assert isinstance(cls.query(config()), Availability)
    if not avail.available:
        assert avail.reason.strip()


def test_attributes_make_sense(pair, name):
    a, _oa, b, _ob = pair()
    at = a.attrs
    assert isinstance(at.caps, Caps)
    assert 0 < at.max_short <= at.max_bcopy <= at.max_frame
    assert at.latency > 0 and at.bandwidth > 0 and at.overhead >= 0
    assert isinstance(a.address(), bytes) and a.address()
    assert a.is_reachable(b.address(), host_id())
    if at.caps & Caps.LOOPBACK:
        assert b is a


# ----------------------------------------------------------------- frames

def sizes_for(attrs):
    top = min(attrs.max_frame, 1 << 20)
    return sorted({0, 1, attrs.max_short, attrs.max_short + 1, attrs.max_bcopy,
                   attrs.max_bcopy + 1, top} & set(range(top + 1)))


def test_frames_arrive_in_order_with_their_bytes(pair):
    a, oa, b, ob = pair()
    ep = a.connect(b.address())
    headers = [b"", b"h", bytes(range(40)), bytes(MAX_HEADER)]
    sent, completions, copied = [], {}, set()
    for i, size in enumerate(sizes_for(a.attrs) * 2):
        header = headers[i % len(headers)]
        data = rand(size, i)
        payload = data if i % 3 == 0 else (bytearray(data) if i % 3 == 1
                                            else memoryview(np.frombuffer(data, np.uint8)))

        def done(exc, i=i):
            completions.setdefault(i, []).append(exc)
        if ep.send(1 + i % 5, header, payload, done):
            copied.add(i)
        sent.append((1 + i % 5, header, data))
    drive([a, b], lambda: len(ob.frames) == len(sent)
          and all(i in copied or i in completions for i in range(len(sent))), what="delivery")
    assert [(f[1], f[2], f[3]) for f in ob.frames] == sent
    for i in range(len(sent)):
        if i in copied:
            assert i not in completions, f"frame {i}: send returned True and completed later"
        else:
            assert completions[i] == [None], f"frame {i}: {completions.get(i)}"
    assert ep.pending == 0


def test_true_means_the_buffer_may_be_reused(pair):
    a, oa, b, ob = pair()
    ep = a.connect(b.address())
    expect = []
    for i, size in enumerate(sizes_for(a.attrs)):
        buf = bytearray(rand(size, 100 + i))
        expect.append(bytes(buf))
        later = []
        if ep.send(2, b"", buf, later.append):
            buf[:] = bytes(len(buf))            # the caller reuses it at once
        else:
            drive([a, b], lambda: later, what="completion")
            assert later == [None]
            buf[:] = bytes(len(buf))
    drive([a, b], lambda: len(ob.frames) == len(expect), what="delivery")
    assert [f[3] for f in ob.frames] == expect


def test_direct_frames_land_in_the_owners_buffer(pair):
    a, oa, b, ob = pair(give=True)
    if not b.attrs.caps & Caps.RX_ZCOPY:
        pytest.skip(f"{b.name} has no RX_ZCOPY: recv_dest is never asked")
    ep = a.connect(b.address())
    sizes = [s for s in sizes_for(a.attrs) if s]
    for i, size in enumerate(sizes):
        ep.send(DIRECT, b"d", rand(size, 200 + i))
    drive([a, b], lambda: len(ob.frames) == len(sizes), what="delivery")
    assert len(ob.dests) == len(sizes)
    for i, (size, f, dest) in enumerate(zip(sizes, ob.frames, ob.dests)):
        assert f[3] == rand(size, 200 + i) and bytes(dest) == f[3]
        assert f[4].obj is dest, f"frame {i}: payload is not the owner's buffer"


def test_limits_raise_message_too_large(pair):
    a, oa, b, ob = pair()
    ep = a.connect(b.address())
    with pytest.raises(MessageTooLarge):
        ep.send(1, bytes(MAX_HEADER + 1), b"")
    if a.attrs.max_frame < 64 << 20:
        with pytest.raises(MessageTooLarge):
            ep.send(1, b"", bytearray(a.attrs.max_frame + 1))
    ep.send(1, b"ok", b"still works")
    drive([a, b], lambda: ob.frames, what="delivery")
    assert ob.frames[0][2:4] == (b"ok", b"still works")


def test_wait_fds_wake_a_sleeping_receiver(pair):
    a, oa, b, ob = pair()
    ep = a.connect(b.address())
    ep.send(1, b"", b"first")                 # connect and wire up
    drive([a, b], lambda: ob.frames, what="first frame")
    fds = b.wait_fds()
    if not fds:
        pytest.skip(f"{b.name} offers no file descriptor to sleep on")
    while select.select(fds, [], [], 0)[0]:   # quiet
        b.progress()
        if a is not b:
            a.progress()
    ep.send(1, b"", b"wake")
    deadline = time.monotonic() + 10
    while not select.select(fds, [], [], 0.05)[0]:
        if a is not b:
            a.progress()                      # the sender may need to push
        assert time.monotonic() < deadline, "no wake-up on wait_fds"
    drive([a, b], lambda: len(ob.frames) == 2, what="second frame")


def test_lost_peer_is_reported_once_and_sends_raise(pair):
    a, oa, b, ob = pair()
    if b is a:
        pytest.skip("loopback: there is no peer to lose")
    ep = a.connect(b.address())
    ep.send(1, b"", b"hello")
    drive([a, b], lambda: ob.frames, what="delivery")
    b.close()
    deadline = time.monotonic() + 30
    while not oa.failed:
        a.progress()
        try:
            ep.send(1, b"", b"into the void")
        except ConnectionLost:
            pass
        assert time.monotonic() < deadline, "the lost peer was never reported"
        time.sleep(0.001)
    for _ in range(200):
        a.progress()
    assert len(oa.failed) == 1, oa.failed
    assert oa.failed[0][0] is ep and isinstance(oa.failed[0][1], ConnectionLost)
    with pytest.raises(ConnectionLost):
        ep.send(1, b"", b"after")


# ----------------------------------------------------------------- adding a transport

def test_register_transport_checks_its_arguments():
    from ucxpy.errors import ConfigError
    context.register_transport("toy", "toy_transport:ToyInterface")        # again: same
    with pytest.raises(ConfigError, match="already"):
        context.register_transport("toy", "elsewhere:Other")
    with pytest.raises(ConfigError):
        context.register_transport("a,b", "m:C")
    with pytest.raises(ConfigError):
        context.register_transport("nocolon", "module_only")
    assert Config.from_env({}, tls="toy").tls == ("toy",)
    with pytest.raises(ConfigError, match="unknown transport"):
        Config.from_env({}, tls="toy2")


def test_toy_example_is_a_working_transport():
    """examples/toy_transport.py: under 100 lines, and two workers exchange a
    tagged message over it (wire-up included) when it runs."""
    import subprocess
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "toy_transport.py")
    with open(path) as f:
        assert len(f.read().splitlines()) < 100
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCXPY_")}
    out = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=60,
                         env=env, cwd=os.path.dirname(path))
    assert out.returncode == 0, out.stderr
    assert "worker 1 received b'hello' over ['toy']" in out.stdout


def test_no_transport_knows_tags():
    """The first rule of the design: a transport moves bytes and knows no
    tags.  No module under ucxpy/transports names the tag protocols' calls
    (what the core's first fast path put there, now the data plane's:
    native/dp), and no operation of the contract takes a tag or a mask."""
    import ast
    import inspect
    from ucxpy.transports import base
    folder = os.path.dirname(base.__file__)
    banned = {"dispatch_tag", "offer_rts", "get_and_ack", "native_dispatch", "tcp_send_tag",
              "tcp_recv_tag", "send_eager", "recv_eager", "send_rts", "_fastpath"}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name)).read())
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} \
                | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} \
                | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                     ast.ClassDef))} \
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   for a in n.names} \
                | {n.module.rsplit(".", 1)[-1] for n in ast.walk(tree)
                   if isinstance(n, ast.ImportFrom) and n.module}
            assert not used & banned, (name, used & banned)
    for cls in (base.TransportEndpoint, base.Interface, base.MemoryDomain):
        for attr, fn in vars(cls).items():
            if callable(fn) and not attr.startswith("__"):
                params = set(inspect.signature(fn).parameters)
                assert not params & {"tag", "mask", "tag_mask"}, (cls.__name__, attr, params)
