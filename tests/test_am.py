"""Active messages: handlers, header+payload, rendezvous into a chosen buffer, order."""
from __future__ import annotations

import numpy as np
import pytest

import ucxpy
from conftest import Pair

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=[None, 0], ids=["auto-rndv", "always-rndv"])
def pair(tl, request):
    thresh = {} if request.param is None else {"rndv_thresh": request.param}
    p = Pair(tl, **thresh)
    yield p
    p.close()


def collecting_handler(store, bufsize=1 << 22):
    def handler(msg):
        if msg.is_rndv:
            buf = bytearray(msg.length)
            store.append((msg.header, buf, msg.receive(buf), msg.source))
        else:
            store.append((msg.header, bytes(msg.data), None, msg.source))
    return handler


def test_header_and_payload_sizes(pair):
    a, b = pair.workers
    got = []
    b.set_am_handler(5, collecting_handler(got))
    rng = np.random.default_rng(0)
    sizes = [0, 1, 100, 8191, 8192, 65536, 1 << 20, 3 << 20]
    payloads = [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]
    sends = [pair.eps[0][1].am_send_nb(5, f"h{i}".encode(), p) for i, p in enumerate(payloads)]
    pair.wait(*sends)
    pair.drive(lambda: len(got) == len(sizes))
    pair.wait(*[r for _, _, r, _ in got if r is not None])
    for i, (hdr, data, _, src) in enumerate(got):       # handler order == send order
        assert hdr == f"h{i}".encode() and src == 0
        assert bytes(data) == payloads[i].tobytes()


def test_held_until_handler_registered(pair):
    a, b = pair.workers
    for i in range(5):
        pair.eps[0][1].am_send_nb(9, bytes([i]), b"x" * (i * 1000))
    for _ in range(200):
        a.progress()
        b.progress()
    got = []
    b.set_am_handler(9, collecting_handler(got))
    pair.drive(lambda: len(got) == 5)
    pair.wait(*[r for _, _, r, _ in got if r is not None])
    assert [h for h, *_ in got] == [bytes([i]) for i in range(5)]
    assert [len(d) for _, d, _, _ in got] == [i * 1000 for i in range(5)]


def test_declined_rendezvous_completes_sender(tl):
    p = Pair(tl, rndv_thresh=0)
    try:
        a, b = p.workers
        seen = []
        b.set_am_handler(1, lambda msg: seen.append(msg.length))   # never receives
        s = p.eps[0][1].am_send_nb(1, b"", b"y" * 5000)
        p.wait(s)
        assert seen == [5000]
    finally:
        p.close()


def test_deferred_receive_and_truncation(tl):
    p = Pair(tl, rndv_thresh=0)
    try:
        a, b = p.workers
        kept = []
        b.set_am_handler(2, lambda msg: kept.append(msg) or True)
        s = p.eps[0][1].am_send_nb(2, b"", b"z" * 10000)
        p.drive(lambda: kept)
        small = kept[0].receive(bytearray(10))
        p.wait(s)
        with pytest.raises(ucxpy.TruncationError):
            small.wait()
    finally:
        p.close()


def test_bad_arguments(pair):
    a, b = pair.workers
    with pytest.raises(ValueError):
        b.set_am_handler(70000, print)
    with pytest.raises(ucxpy.MessageTooLarge):
        pair.eps[0][1].am_send_nb(1, b"h" * 5000, b"")
