"""MPI matching rules of the tag API, on two in-process workers per transport."""
from __future__ import annotations

import numpy as np
import pytest

import ucxpy
from ucxpy import ANY_SOURCE
from conftest import Pair, transport_available

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=[None, 0], ids=["auto-rndv", "always-rndv"])
def pair(tl, request):
    thresh = {} if request.param is None else {"rndv_thresh": request.param}
    p = Pair(tl, **thresh)
    yield p
    p.close()


def test_unexpected_then_recv(pair):
    a, b = pair.workers
    pair.eps[0][1].tag_send_nb(b"hello", 7)
    for _ in range(50):
        a.progress()
        b.progress()
    buf = bytearray(5)
    (info,) = pair.wait(b.tag_recv_nb(buf, 7))
    assert bytes(buf) == b"hello" and tuple(info) == (0, 7, 5)


def test_wildcard_source_and_mask(pair):
    a, b = pair.workers
    pair.eps[0][1].tag_send_nb(b"x" * 3, 0x1234_0001)
    buf = bytearray(8)
    (info,) = pair.wait(b.tag_recv_nb(buf, 0x1234_0000, tag_mask=0xFFFF_0000, source=ANY_SOURCE))
    assert info.source == 0 and info.tag == 0x1234_0001 and info.length == 3
    r = b.tag_recv_nb(buf, 0, tag_mask=0)           # any tag at all
    pair.eps[0][1].tag_send_nb(b"yy", 99)
    (info,) = pair.wait(r)
    assert info.tag == 99 and bytes(buf[:2]) == b"yy"


def test_source_filter(tl):
    p = Pair(tl, n=3)
    try:
        w0, w1, w2 = p.workers
        r_from_2 = w0.tag_recv_nb(bytearray(4), 5, source=2)
        p.eps[1][0].tag_send_nb(b"one", 5)
        p.drive(lambda: w0.matcher.unexpected_depth() > 0, 10)
        assert not r_from_2.done
        p.eps[2][0].tag_send_nb(b"two", 5)
        (info,) = p.wait(r_from_2)
        assert info.source == 2
        assert p.wait(w0.tag_recv_nb(bytearray(4), 5, source=p.eps[0][1]))[0].source == 1
    finally:
        p.close()


def test_non_overtaking_mixed_protocols(tl):
    """A large (rendezvous) message sent first is matched first, even though a
    small eager one behind it completes sooner."""
    p = Pair(tl)
    try:
        a, b = p.workers
        big = np.random.default_rng(1).integers(0, 255, 1 << 20, dtype=np.uint8)
        s1 = p.eps[0][1].tag_send_nb(big, 3)
        s2 = p.eps[0][1].tag_send_nb(b"small", 3)
        r1 = b.tag_recv_nb(np.zeros(1 << 20, np.uint8), 3)
        r2 = b.tag_recv_nb(bytearray(1 << 20), 3)
        i1, i2, _, _ = p.wait(r1, r2, s1, s2)
        assert i1.length == 1 << 20 and i2.length == 5
        assert np.array_equal(np.frombuffer(r1.buf, np.uint8), big)
    finally:
        p.close()


def test_order_of_many_messages(pair):
    a, b = pair.workers
    n = 300
    sends = [pair.eps[0][1].tag_send_nb(i.to_bytes(4, "little"), 11) for i in range(n)]
    bufs = [bytearray(4) for _ in range(n)]
    recvs = [b.tag_recv_nb(buf, 11) for buf in bufs]
    pair.wait(*sends, *recvs)
    assert [int.from_bytes(x, "little") for x in bufs] == list(range(n))


def test_earliest_posted_receive_wins(pair):
    """A wildcard receive posted before an exact one takes the message."""
    a, b = pair.workers
    wild = b.tag_recv_nb(bytearray(8), 0, tag_mask=0)
    exact = b.tag_recv_nb(bytearray(8), 42, source=0)
    pair.eps[0][1].tag_send_nb(b"first", 42)
    pair.wait(wild)
    assert not exact.done
    pair.eps[0][1].tag_send_nb(b"second", 42)
    pair.wait(exact)
    # and the reverse: exact posted first wins over a later wildcard
    exact = b.tag_recv_nb(bytearray(8), 43, source=0)
    wild = b.tag_recv_nb(bytearray(8), 0, tag_mask=0)
    pair.eps[0][1].tag_send_nb(b"third", 43)
    pair.wait(exact)
    assert not wild.done
    assert wild.cancel() and wild.cancelled


def test_truncation(pair):
    a, b = pair.workers
    s = pair.eps[0][1].tag_send_nb(b"0123456789" * 100, 1)
    r = b.tag_recv_nb(bytearray(10), 1)
    pair.drive(lambda: r.done and s.done)
    with pytest.raises(ucxpy.TruncationError) as ei:
        r.wait()
    assert ei.value.size == 1000 and ei.value.capacity == 10
    s.wait()   # the sender is not at fault
    # the stream stays usable
    pair.eps[0][1].tag_send_nb(b"ok", 1)
    buf = bytearray(2)
    pair.wait(b.tag_recv_nb(buf, 1))
    assert buf == b"ok"


def test_probe_and_matched_probe(pair):
    a, b = pair.workers
    assert b.tag_probe_nb(9) is None
    pair.eps[0][1].tag_send_nb(b"abcdef", 9)
    pair.drive(lambda: b.tag_probe_nb(9) is not None)   # the sender progresses too
    info = b.tag_probe(9, timeout=10)
    assert tuple(info) == (0, 9, 6)
    msg = b.tag_probe(9, remove=True, timeout=10)
    assert b.tag_probe_nb(9) is None        # taken off the queue
    buf = bytearray(6)
    (got,) = pair.wait(b.tag_recv_message_nb(buf, msg))
    assert buf == b"abcdef" and got.length == 6
    with pytest.raises(ucxpy.InvalidBuffer):
        b.tag_recv_message_nb(buf, msg)


def test_cancel_and_timeout(pair):
    a, b = pair.workers
    r = b.tag_recv_nb(bytearray(4), 77)
    assert r.cancel() and r.cancelled
    with pytest.raises(ucxpy.Canceled):
        r.wait()
    with pytest.raises(ucxpy.TimeoutError):
        b.tag_recv(bytearray(4), 78, timeout=0.2)
    assert b.matcher.posted_count() == 0   # the timed-out receive was withdrawn
    pair.eps[0][1].tag_send_nb(b"late", 78)
    pair.drive(lambda: b.matcher.unexpected_depth() > 0)
    assert b.tag_probe_nb(78) is not None


def test_bad_buffers(pair):
    a, b = pair.workers
    with pytest.raises(ucxpy.InvalidBuffer):
        b.tag_recv_nb(b"readonly", 1)
    with pytest.raises(ucxpy.InvalidBuffer):
        pair.eps[0][1].tag_send_nb(12345, 1)
    with pytest.raises(ucxpy.InvalidBuffer):
        pair.eps[0][1].tag_send_nb(np.zeros((4, 4))[:, 1], 1)   # not contiguous


def test_many_outstanding(pair):
    a, b = pair.workers
    n = 2000
    rng = np.random.default_rng(5)
    payloads = [rng.integers(0, 255, int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
                for _ in range(n)]
    recvs = [b.tag_recv_nb(bytearray(300), i % 7, source=0) for i in range(n)]
    sends = [pair.eps[0][1].tag_send_nb(payloads[i], i % 7) for i in range(n)]
    infos = pair.wait(*recvs, *sends, timeout=60)[:n]
    for i, (r, info) in enumerate(zip(recvs, infos)):
        assert info.length == len(payloads[i])
        assert bytes(r.buf[:info.length]) == payloads[i]


def test_loopback_self_send():
    p = Pair("tcp", n=1)
    try:
        (w,) = p.workers
        ep = p.eps[0][0]
        assert ep.transport_endpoint() is not None and ep.lane.name == "self"
        buf = bytearray(3)
        r = w.tag_recv_nb(buf, 1)
        ep.tag_send_nb(b"me!", 1)
        p.wait(r)
        assert buf == b"me!"
    finally:
        p.close()


def test_peer_abort_fails_dependent_receive():
    p = Pair("tcp")
    a, b = p.workers
    try:
        p.eps[0][1].tag_send_nb(b"hi", 1)          # wire up both directions
        p.wait(b.tag_recv_nb(bytearray(2), 1))
        p.eps[1][0].tag_send_nb(b"hi", 1)
        p.wait(a.tag_recv_nb(bytearray(2), 1))
        r = b.tag_recv_nb(bytearray(2), 2, source=0)
        for ep in list(a.endpoints.values()):
            ep.abort()
        a.close()
        p.workers = [b]
        p.drive(lambda: r.done, 10)
        with pytest.raises(ucxpy.ConnectionLost) as ei:
            r.wait()
        assert ei.value.peer == 0
        with pytest.raises(ucxpy.ConnectionLost) as ei:   # raised by the post itself
            p.eps[1][0].tag_send_nb(b"late", 3)
        assert ei.value.peer == 0
    finally:
        p.close()


@pytest.mark.parametrize("refuse", [None, "get", "put", "get+put", "get-fails-later"])
@pytest.mark.parametrize("split", ["0", "inf"], ids=["split", "nosplit"])
def test_rendezvous_paths_and_fallbacks(monkeypatch, refuse, split):
    """get, split (sender puts the first half while the receiver gets the
    rest), and the fall back to data frames when a one-sided copy is refused
    (e.g. CMA denied for one peer): the data always arrives intact."""
    if not transport_available("shm"):
        pytest.skip("shm unavailable")
    from ucxpy.transports import shm

    calls = {"get": 0, "put": 0}

    def refusing(op):
        def refused(self, *args, **kwargs):
            calls[op] += 1
            raise ucxpy.RemoteAccessError("process_vm_readv: Operation not permitted")
        return refused

    def fails_later(self, local, remote_addr, rkey, on_complete):
        calls["get"] += 1
        on_complete(ucxpy.RemoteAccessError("provider: Operation canceled"))
        return False
    if refuse == "get-fails-later":
        monkeypatch.setattr(shm.ShmEndpoint, "get", fails_later)
    else:
        for op in (refuse or "").split("+"):
            if op:
                monkeypatch.setattr(shm.ShmEndpoint, op, refusing(op))
    sizes = (1, 4096, 8191, (1 << 20) + 5)
    # the receiver gets [start, n) of every message; with split it also asks
    # the sender to put the first, page-aligned half (start > 0 only)
    starts = [(n // 2) & ~4095 if split == "0" else 0 for n in sizes]
    want_get = len(sizes) if refuse and "get" in refuse else 0
    want_put = sum(1 for s in starts if s) if refuse and "put" in refuse else 0
    p = Pair("shm", rndv_thresh=0, rndv_split_thresh=split, stats=True)
    try:
        a, b = p.workers
        for n in sizes:
            data = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
            out = np.zeros(n + 3, np.uint8)
            r = b.tag_recv_nb(out, 4)
            s = p.eps[0][1].tag_send_nb(data, 4)
            info, _ = p.wait(r, s)
            assert info.length == n and np.array_equal(out[:n], data)
            assert not b.rndv.recvs and not a.rndv.sends
        # the refusal path really ran, once per refused copy, and was counted
        # where it happened: get refusals at the receiver, put refusals at
        # the sender
        assert (calls["get"], calls["put"]) == (want_get, want_put), calls
        recv_stats, send_stats = b.stats()["worker"], a.stats()["worker"]
        assert recv_stats.get("rndv.fallback", 0) == want_get, recv_stats
        assert send_stats.get("rndv.fallback", 0) == want_put, send_stats
        if split == "0":
            assert recv_stats.get("rndv.split.msgs", 0) == sum(1 for s in starts if s)
        if not refuse:
            assert recv_stats.get("rndv.rtr.msgs", 0) == 0      # nothing fell back
    finally:
        p.close()


def test_bucketed_receives_and_the_notify_hook(tl):
    """A layer's bucket_mask and notify hook (mpi_shim's MASK_TAG receives
    and synchronous-send acknowledgement): bucketed receives match as
    masked ones; ``notify(req)`` runs, once and after completion, exactly
    for the receives matched by a message with notify bits the receive's
    mask leaves out: arrived after the receive, before it (unexpected), or
    delivered by the data plane (shm, in C); never for a receive that asked
    for those bits."""
    p = Pair(tl)
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        m = b.matcher
        m.bucket_mask, m.notify_mask = ucxpy.tag.FULL_MASK ^ 0xFF00, 0xFF00
        seen = []
        m.notify = lambda r: seen.append((r, r.done))
        bufs = [bytearray(4) for _ in range(8)]

        def recv(i, tag=0x10, mask=m.bucket_mask):
            return b.tag_recv_nb(bufs[i], tag, mask, 0)

        r = recv(0)
        assert m.counts() == (1, 0)
        ep.tag_send_nb(b"sync", 0x310)
        assert p.wait(r)[0].tag == 0x310 and seen == [(r, True)]
        seen.clear()
        ep.tag_send_nb(b"sync", 0x110)                      # unexpected first
        p.drive(lambda: m.unexpected_depth() > 0, 10)
        r = recv(1)
        assert p.wait(r)[0].tag == 0x110 and seen == [(r, True)]
        seen.clear()
        r = recv(2, 0x510, ucxpy.tag.FULL_MASK)             # it asked for those bits
        ep.tag_send_nb(b"full", 0x510)
        assert p.wait(r)[0].tag == 0x510 and seen == []
        # a window: plain, plain, notifying, plain
        tags = [0x10, 0x10, 0x210, 0x10]
        reqs = [recv(i) for i in range(4)]
        native = b.dp.counters()["tag_expected"] if b.dp is not None else 0
        for i, t in enumerate(tags):
            ep.tag_send_nb(bytes([i]) * 4, t)
        b.wait_for(reqs[0])
        p.wait(*reqs)
        assert [r.result.tag for r in reqs] == tags
        assert [bytes(x) for x in bufs[:4]] == [bytes([i]) * 4 for i in range(4)]
        assert seen == [(reqs[2], True)]
        if tl == "shm" and b.dp is not None and b.tr is None:
            # the data plane matched and delivered all four, the notifying one too
            assert b.dp.counters()["tag_expected"] - native == 4
        assert m.counts() == (0, 0)
    finally:
        p.close()


def test_receive_of_any_size(pair):
    """tag_recv_any_nb: the message's bytes in a buffer of exactly its size,
    posted before or after the message, eager or rendezvous (the pair's
    thresholds), matched in posting order with other receives, cancellable."""
    a, b = pair.workers
    ep = pair.eps[0][1]
    big = bytes(range(256)) * 400                       # 100 KiB: rendezvous on most lanes
    r = b.tag_recv_any_nb(3, source=0)
    assert r.buf is None and not r.done
    ep.tag_send_nb(big, 3)
    (info,) = pair.wait(r)
    assert info.length == len(big) and bytes(r.buf) == big and len(r.buf) == len(big)
    ep.tag_send_nb(b"early", 4)                          # unexpected first
    pair.drive(lambda: b.matcher.unexpected_depth() > 0, 10)
    r = b.tag_recv_any_nb(4, source=0)
    pair.wait(r)
    assert bytes(r.buf) == b"early"
    ep.tag_send_nb(b"", 5)                               # empty
    r = b.tag_recv_any_nb(5)
    assert pair.wait(r)[0].length == 0 and bytes(r.buf) == b""
    fixed, any_ = bytearray(4), None
    first = b.tag_recv_nb(fixed, 6, source=0)            # posted first: takes the first message
    any_ = b.tag_recv_any_nb(6, source=0)
    ep.tag_send_nb(b"one!", 6)
    ep.tag_send_nb(b"second", 6)
    pair.wait(first, any_)
    assert bytes(fixed) == b"one!" and bytes(any_.buf) == b"second"
    late = b.tag_recv_any_nb(7, source=0)
    assert late.cancel() and late.done and b.matcher.posted_count() == 0


def test_the_payload_pool_reuses_buffers_of_delivered_messages():
    """``PayloadPool``: unexpected payloads of 4 KiB and more are copied into
    reused power-of-two buffers (a view of the payload's length); smaller
    ones are bytes; a buffer still exported elsewhere is not reused."""
    from ucxpy.buffers import PayloadPool
    pool = PayloadPool()
    small = pool.copy(memoryview(b"abc"))
    assert type(small) is bytes and small == b"abc"
    pool.give(small)                                  # (nothing to keep)
    a = pool.copy(memoryview(bytes(range(256)) * 20))  # 5120 B: the 8 KiB class
    assert type(a) is memoryview and len(a) == 5120 and len(a.obj) == 8192
    assert bytes(a) == bytes(range(256)) * 20
    buf = a.obj
    pool.give(a)
    b = pool.copy(memoryview(b"\x07" * 8000))
    assert b.obj is buf and bytes(b) == b"\x07" * 8000
    held = memoryview(b)[:10]                         # exported further
    pool.give(b)
    assert pool.copy(memoryview(b"y" * 4096)).obj is not buf and bytes(held) == b"\x07" * 10
    for _ in range(PayloadPool.KEEP + 4):
        pool.give(pool.copy(memoryview(b"z" * 4096)))
    views = [pool.copy(memoryview(b"z" * 4096)) for _ in range(PayloadPool.KEEP + 4)]
    for v in views:
        pool.give(v)
    assert len(pool._free[4096]) == PayloadPool.KEEP


def test_unexpected_eager_messages_of_pooled_sizes_arrive_intact(pair):
    """Messages that arrive before their receive, of sizes the payload pool
    holds, are delivered whole and in order, also when their buffers are
    reused by the next ones."""
    import numpy as np
    a, b = pair.workers
    ep = pair.eps[0][1]
    sizes = [4096, 5000, 8192, 3, 16000, 4097]
    sent = [np.full(n, i + 1, np.uint8) for i, n in enumerate(sizes)]
    for rnd in range(2):
        sends = [ep.tag_send_nb(x, 900 + rnd) for x in sent]
        for _ in range(50):
            a.progress()
            b.progress()
        outs = [np.zeros(n, np.uint8) for n in sizes]
        recvs = [b.tag_recv_nb(o, 900 + rnd, source=0) for o in outs]
        pair.wait(*sends, *recvs)
        assert [r.result.length for r in recvs] == sizes
        assert all(np.array_equal(o, x) for o, x in zip(outs, sent))


@pytest.mark.parametrize("over", ["y", "n"])
def test_wait_all_waits_for_every_request_and_raises_none_of_theirs(over):
    """``Worker.wait_all``: one wait loop for all (more ranks than CPUs) or
    one wait after the other; a request that fails is done with its error,
    which is its own to raise."""
    p = Pair("shm" if transport_available("shm") else "tcp", oversubscribed=over)
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        outs = [bytearray(4) for _ in range(3)]
        recvs = [b.tag_recv_nb(o, 40 + i, source=0) for i, o in enumerate(outs)]
        short = b.tag_recv_nb(bytearray(1), 43, source=0)
        for i in range(3):
            ep.tag_send_nb(b"m%03d" % i, 42 - i)       # in the opposite order
        ep.tag_send_nb(b"long", 43)
        reqs = recvs + [short]

        def drive_a():
            a.progress()
            return 0
        b.add_progress_callback(drive_a)               # (the sender's side, in-process)
        b.wait_all(reqs, timeout=10)
        assert all(r.done for r in reqs) and [bytes(o) for o in outs] == [b"m002", b"m001", b"m000"]
        assert isinstance(short.exc, ucxpy.TruncationError)
        b.wait_all([], timeout=1)
    finally:
        p.close()


def test_when_completes_by_progress_and_keeps_requests_added_meanwhile():
    """Worker.when (libucp's non-blocking flush): done at once when the
    predicate holds; else completed by the progress pass that finds it true,
    or failed with what it raises.  A when() made by a completion's callback
    in that pass waits for a later one, and once none is left the worker's
    progress no longer calls the pass (it removed itself mid-iteration)."""
    p = Pair("shm" if transport_available("shm") else "tcp")
    try:
        w = p.workers[1]
        assert w.when(lambda: True).done
        flag, later = [False], []
        first = w.when(lambda: flag[0])
        first.add_done_callback(lambda r: later.append(w.when(lambda: len(later) > 5)))
        boom = w.when(lambda: 1 / 0 if flag[0] else False)
        w.progress()
        assert not first.done and not boom.done
        flag[0] = True
        w.progress()
        assert first.done and first.exc is None and isinstance(boom.exc, ZeroDivisionError)
        assert len(later) == 1 and not later[0].done
        later.extend([None] * 5)
        w.progress()
        assert later[0].done and w._when_pass not in w._callbacks
    finally:
        p.close()
