"""asyncio integration (ucxpy.aio): awaiting tag, AM and RMA operations while
the event loop progresses the workers; timeouts and cancellation withdraw the
operations the helpers posted; failures and a closed worker raise instead of
hanging.  In-process worker pairs on every transport, plus a real 2-rank job."""
from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import ucxpy
from ucxpy import aio
from conftest import ROOT, Pair, run_job

pytestmark = pytest.mark.timeout(60)

SIZES = [0, 8, 300, 9000, 70_000, 1 << 20, 8 << 20]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 40))


def test_tag_every_size_class(pair):
    """Both workers live in this process: each is progressed while something
    awaits it, or by a progress() block (in a real job every process awaits
    its own operations)."""
    a, b = pair.workers
    ab, ba = pair.eps[0][1], pair.eps[1][0]

    async def main():
        async with aio.progress(a), aio.progress(b):
            for i, n in enumerate(SIZES):
                data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
                out = np.empty(n, np.uint8)
                recv = b.tag_recv_nb(out, tag=i)
                await aio.tag_send(ab, data, i)
                await aio.wait(recv)
                assert (out == data).all(), n
                back = np.empty(n, np.uint8)
                rtask = asyncio.ensure_future(aio.tag_recv(a, back, tag=100 + i, source=1))
                await aio.wait(ba.tag_send_nb(out, 100 + i))
                info = await rtask
                assert info.source == 1 and info.length == n and (back == data).all()
    run(main())


def test_many_concurrent_awaits(pair):
    a, b = pair.workers
    ab = pair.eps[0][1]
    n = 200

    async def main():
        bufs = [bytearray(4) for _ in range(n)]
        recvs = [asyncio.ensure_future(aio.tag_recv(b, bufs[i], tag=i)) for i in range(n)]
        async with aio.progress(a):
            await aio.wait_all([ab.tag_send_nb(i.to_bytes(4, "little"), i)
                                for i in reversed(range(n))])
            infos = await asyncio.gather(*recvs)
        assert [int.from_bytes(x, "little") for x in bufs] == list(range(n))
        assert [i.tag for i in infos] == list(range(n))
    run(main())


def test_timeout_and_cancellation_withdraw_the_receive(pair):
    a, b = pair.workers
    ab = pair.eps[0][1]

    async def main():
        await aio.tag_send(ab, b"x", 99)              # wire up a -> b (b needs no progress)
        with pytest.raises(ucxpy.TimeoutError):
            await aio.tag_recv(b, bytearray(8), tag=5, timeout=0.2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aio.tag_recv(b, bytearray(8), tag=5), 0.2)
        assert b.matcher.posted_count() == 0   # both withdrawn
        # neither abandoned receive swallows the message: a new one gets it
        async with aio.progress(a):
            await aio.tag_send(ab, b"for-you!", 5)
            buf = bytearray(8)
            info = await aio.tag_recv(b, buf, tag=5, timeout=10)
            assert buf == b"for-you!" and info.length == 8
            # wait() on a request it did not post leaves it valid
            req = b.tag_recv_nb(bytearray(1), tag=6)
            with pytest.raises(ucxpy.TimeoutError):
                await aio.wait(req, timeout=0.1)
            assert not req.done
            await aio.tag_send(ab, b"!", 6)
            await aio.wait(req, timeout=10)
    run(main())


def test_active_messages_and_rma(pair):
    a, b = pair.workers
    ab = pair.eps[0][1]
    got = []

    def handler(msg):
        if msg.is_rndv:
            buf = bytearray(msg.length)
            msg.receive(buf).add_done_callback(lambda r: got.append((msg.header, bytes(buf))))
        else:
            got.append((msg.header, bytes(msg.data)))
    b.set_am_handler(3, handler)
    region = bytearray(4096)
    mh = b.mem_map(region)
    rkey = ab.unpack_rkey(mh.pack_rkey())
    counter = b.mem_map(length=8)
    ckey = ab.unpack_rkey(counter.pack_rkey())

    async def main():
        async with aio.progress(b):            # b only serves: handlers, RMA target
            # (a is progressed by what it awaits; wait_until(a, ...) drives it too)
            await aio.am_send(ab, 3, b"small", b"x" * 100)
            await aio.am_send(ab, 3, b"big", b"y" * (1 << 20))
            await aio.wait_until(a, lambda: len(got) == 2, timeout=10)
            await aio.put(ab, b"hello", mh.address + 10, rkey)
            back = bytearray(5)
            await aio.get(ab, back, mh.address + 10, rkey)
            assert back == b"hello"
            olds = [await aio.atomic_fetch(ab, "add", 1, counter.address, ckey) for _ in range(5)]
            assert olds == [0, 1, 2, 3, 4]
            ab.put_nb(b"!" * 64, mh.address, rkey)
            await aio.flush(ab)
            await aio.flush(a)
        assert got == [(b"small", b"x" * 100), (b"big", b"y" * (1 << 20))]
        assert bytes(region[:64]) == b"!" * 64
    run(main())


def test_peer_failure_and_closed_worker_raise():
    p = Pair("tcp")
    a, b = p.workers
    try:
        async def main():
            async with aio.progress(a), aio.progress(b):
                await aio.tag_send(p.eps[0][1], b"hi", 1)        # wire up a -> b
                await aio.tag_recv(b, bytearray(2), tag=1)
            pending = asyncio.ensure_future(aio.tag_recv(a, bytearray(2), tag=2, source=1))
            await asyncio.sleep(0.05)
            for ep in list(b.endpoints.values()):
                ep.abort()
            b.close()
            with pytest.raises(ucxpy.ConnectionLost):
                await pending
            a.close()
            with pytest.raises(ucxpy.ConnectionLost):
                await aio.tag_recv(a, bytearray(2), tag=3)
        run(main())
    finally:
        p.workers = [w for w in p.workers if not w.closed]
        p.close()


def test_handler_exception_reaches_the_awaiting_coroutine():
    p = Pair("tcp")
    a, b = p.workers
    try:
        def bad(msg):
            raise RuntimeError("handler bug")
        a.set_am_handler(4, bad)

        async def main():
            async with aio.progress(b):
                await aio.am_send(p.eps[1][0], 4, b"", b"boom")
                with pytest.raises(RuntimeError, match="handler bug"):
                    await aio.tag_recv(a, bytearray(1), tag=9, timeout=10)
                # the driver recovers: the next await progresses again
                await aio.tag_send(p.eps[1][0], b"k", 9)
                assert (await aio.tag_recv(a, bytearray(1), tag=9, timeout=10)).length == 1
        run(main())
    finally:
        p.close()


def test_async_pingpong_job():
    r = run_job(["python", os.path.join(ROOT, "examples", "async_pingpong.py")], 2,
                timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "async pingpong: 2 ranks OK" in r.stdout, r.stdout
