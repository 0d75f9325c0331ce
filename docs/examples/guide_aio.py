"""run: ucxpy-run -n 2 python docs/examples/guide_aio.py

The user guide's asyncio program (ucxpy.aio): the event loop progresses the
worker while a coroutine awaits, so a target serves one-sided operations
while it awaits nothing of its own, and an abandoned receive is withdrawn.
"""
import asyncio

import numpy as np

import ucxpy
from ucxpy import aio


async def main(world):
    w, peer = world.worker, 1 - world.rank
    ep = world.ep(peer)
    if world.rank == 0:                     # the target: memory, and progress
        mh = w.mem_map(length=4096)
        head = mh.address.to_bytes(8, "little") + mh.pack_rkey()
        await aio.tag_send(ep, head, tag=1)
        async with aio.progress(w):         # keep serving RMA and AM meanwhile
            await aio.tag_recv(w, bytearray(1), tag=2, source=peer, timeout=10)
        assert bytes(mh.buf[:5]) == b"hello"
        assert int.from_bytes(mh.buf[8:16], "little") == 3
    else:                                   # the initiator
        head = bytearray(512)
        info = await aio.tag_recv(w, head, tag=1, source=peer, timeout=10)
        addr = int.from_bytes(head[:8], "little")
        rkey = ep.unpack_rkey(bytes(head[8:info.length]))
        await aio.put(ep, b"hello", addr, rkey)
        old = await aio.atomic_fetch(ep, "add", 3, addr + 8, rkey)
        assert old == 0
        await aio.flush(ep)
        await aio.tag_send(ep, b"x", tag=2)

    # a receive that times out is withdrawn: it cannot swallow a later message
    if world.rank == 1:
        try:
            await aio.tag_recv(w, bytearray(16), tag=3, source=peer, timeout=0.2)
            raise AssertionError("expected a TimeoutError")
        except ucxpy.TimeoutError:
            pass
        await aio.tag_send(ep, b"go", tag=4)
        buf = np.zeros(2, np.int64)
        await aio.tag_recv(w, buf, tag=3, source=peer, timeout=10)
        assert buf.tolist() == [0, 7]
    else:
        await aio.tag_recv(w, bytearray(2), tag=4, source=peer, timeout=10)
        await aio.wait(world.isend(np.array([0, 7]), dest=peer, tag=3))

world = ucxpy.init()
assert world.size == 2, "run with 2 ranks"
asyncio.run(main(world))
print(f"rank {world.rank}: guide_aio OK")
world.finalize()
