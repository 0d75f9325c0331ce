"""Ping-pong and a ring with asyncio: ucxpy.aio awaits operations while the
event loop progresses the worker, so other coroutines run meanwhile.

    ucxpy-run -n 2 python examples/async_pingpong.py
"""
import asyncio
import time

import numpy as np

import ucxpy
from ucxpy import aio


async def ticker(stop: asyncio.Event, ticks: list):
    """Another coroutine: keeps running while ranks wait on the network."""
    while not stop.is_set():
        ticks.append(time.monotonic())
        await asyncio.sleep(0.001)


async def main(world):
    rank, size = world.rank, world.size
    peer_r, peer_l = (rank + 1) % size, (rank - 1) % size
    stop, ticks = asyncio.Event(), []
    tick_task = asyncio.ensure_future(ticker(stop, ticks))

    # a ring: rank-stamped buffers of every size class, concurrently in flight
    for n in (8, 20_000, 1 << 20):
        out = np.full(n // 4, rank, np.int32)
        inp = np.empty(n // 4, np.int32)
        recv = asyncio.ensure_future(aio.wait(world.irecv(inp, source=peer_l, tag=n)))
        await aio.wait(world.isend(out, peer_r, tag=n))
        await recv
        assert (inp == peer_l).all(), f"rank {rank}: ring data corrupted at {n} B"

    if size >= 2 and rank < 2:
        buf = np.zeros(8, np.uint8)
        iters = 500
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                await aio.wait(world.isend(buf, 1, tag=2))
                await aio.wait(world.irecv(buf, source=1, tag=2))
            else:
                await aio.wait(world.irecv(buf, source=0, tag=2))
                await aio.wait(world.isend(buf, 0, tag=2))
        half_rtt = (time.perf_counter() - t0) / iters / 2
        if rank == 0:
            print(f"async pingpong 8 B: {half_rtt * 1e6:.1f} us half round trip", flush=True)
    stop.set()
    await tick_task
    assert ticks, "the other coroutine never ran"


if __name__ == "__main__":
    world = ucxpy.init()
    asyncio.run(main(world))
    world.barrier()
    if world.rank == 0:
        print(f"async pingpong: {world.size} ranks OK", flush=True)
    world.finalize()
