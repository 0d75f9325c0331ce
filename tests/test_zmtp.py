"""The rank's ZMTP connections (ucxpy.bootstrap.zmtp) against libzmq's
ROUTER and PUB sockets (pyzmq, as the launcher's rendezvous service uses
them): messages both ways with short and long frames, a subscription, a
timeout in the middle of a message, and the errors a rank reports."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from ucxpy.bootstrap.zmtp import Connection, parse_endpoint


@pytest.fixture
def router():
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    yield r, f"tcp://127.0.0.1:{port}"
    r.close()
    ctx.term()


def test_dealer_round_trip_short_and_long_frames(router):
    r, addr = router
    c = Connection(addr, b"DEALER", timeout=5)
    try:
        big = bytes(range(256)) * 1000                 # a LONG frame (8-octet size)
        c.send_multipart([b"id", b"", big, b"x" * 255])
        assert r.poll(5000)
        frames = r.recv_multipart()
        assert frames[1:] == [b"id", b"", big, b"x" * 255]
        r.send_multipart([frames[0], b"reply", big])
        assert c.recv_multipart(5) == [b"reply", big]
        assert c.recv_multipart(0) is None             # nothing more: no wait
    finally:
        c.close()


def test_a_message_split_by_a_timeout_is_read_whole_later():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    addr = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    peer = {}

    def serve():
        s, _ = srv.accept()
        peer["s"] = s
        s.recv(64)                                     # the client's greeting
        from ucxpy.bootstrap.zmtp import GREETING, _command
        s.sendall(GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"}))
    t = threading.Thread(target=serve)
    t.start()
    c = Connection(addr, b"DEALER", timeout=5)
    t.join()
    try:
        s = peer["s"]
        s.sendall(b"\x01\x03abc\x00")                  # frame 1 (MORE), half of frame 2's head
        assert c.recv_multipart(0.2) is None
        s.sendall(b"\x02de")
        assert c.recv_multipart(5) == [b"abc", b"de"]
    finally:
        c.close()
        peer["s"].close()
        srv.close()


def test_subscription_receives_notices():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    c = Connection(f"tcp://127.0.0.1:{port}", b"SUB", timeout=5)
    try:
        c.subscribe(b"")
        got, deadline = None, time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            pub.send_multipart([b"FAIL", b"{}", b"mac"])   # until the subscription is in
            got = c.recv_multipart(0.05)
        assert got == [b"FAIL", b"{}", b"mac"]
    finally:
        c.close()
        pub.close()
        ctx.term()


def test_wrong_peer_type_and_unreachable_and_bad_endpoints(router):
    r, addr = router
    with pytest.raises(ConnectionError):                 # (libzmq hangs up)
        Connection(addr, b"SUB", timeout=5)            # a ROUTER is not a PUB
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(OSError):
        Connection(f"tcp://127.0.0.1:{port}", b"DEALER", timeout=5)
    for bad in ("ipc:///tmp/x", "tcp://host", "tcp://host:port"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)
    assert parse_endpoint("tcp://[::1]:5") == (socket.AF_INET6, "::1", 5)


def test_a_silent_server_times_out():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        with pytest.raises(TimeoutError):
            Connection(f"tcp://127.0.0.1:{srv.getsockname()[1]}", b"DEALER", timeout=0.5)
    finally:
        srv.close()
