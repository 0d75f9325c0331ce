"""SPMD RMA test: keys exchanged through the launcher, put/get around the ring,
fence ordering, and atomic contention on one counter (exact final value).
Prints 'RMA-SUITE OK <rank> <mode>'."""
import os

import numpy as np

import ucxpy

world = ucxpy.init()
rank, size, w = world.rank, world.size, world.worker
iters = int(os.environ.get("RMA_ITERS", 200))
kind = os.environ.get("RMA_REGION", "shared")
n = 1 << 20

mh = w.mem_map(length=n) if kind == "shared" else w.mem_map(np.zeros(n, np.uint8))
packed = world.bootstrap.allgather(mh.address.to_bytes(8, "little") + mh.pack_rkey(), timeout=60)
addrs = [int.from_bytes(p[:8], "little") for p in packed]
rkeys = [world.ep(r).unpack_rkey(p[8:]) for r, p in enumerate(packed)]
right, left = (rank + 1) % size, (rank - 1) % size
ep_r = world.ep(right)

# 1. put a pattern into the right neighbour, get it back, verify
data = np.random.default_rng(rank).integers(0, 256, n - 4096, dtype=np.uint8)
ep_r.put(data, addrs[right] + 4096, rkeys[right], timeout=60)
ep_r.flush(timeout=60)
back = np.empty_like(data)
ep_r.get(back, addrs[right] + 4096, rkeys[right], timeout=60)
assert np.array_equal(back, data), "get after put mismatch"
world.barrier(timeout=60)
mine = np.frombuffer(mh.buf, np.uint8)[4096:]
assert np.array_equal(mine, np.random.default_rng(left).integers(0, 256, n - 4096, dtype=np.uint8))

# 2. fence: the later put lands last
ep_r.put(b"A" * 64, addrs[right] + 1024, rkeys[right])
ep_r.fence(timeout=60)
ep_r.put(b"B" * 64, addrs[right] + 1024, rkeys[right])
ep_r.flush(timeout=60)
world.barrier(timeout=60)
assert bytes(mh.buf[1024:1088]) == b"B" * 64

# 3. contention: every rank adds to counters on rank 0 (64-bit and 32-bit words)
ep0 = world.ep(0)
for i in range(iters):
    ep0.atomic_fetch("add", 1, addrs[0], rkeys[0], 8, timeout=60)
    ep0.atomic_post("add", 2, addrs[0] + 8, rkeys[0], 4)
    if i % 50 == 0:
        ep0.flush(timeout=60)
ep0.flush(timeout=60)
# a compare-and-swap lock word: exactly one rank wins
won = ep0.atomic_fetch("cswap", rank + 1, addrs[0] + 16, rkeys[0], 8, compare=0, timeout=60) == 0
world.barrier(timeout=60)
winners = world.bootstrap.allgather(bytes([won]), timeout=60)
assert sum(b[0] for b in winners) == 1, winners
if rank == 0:
    c64 = int(np.frombuffer(mh.buf, np.uint64, count=1)[0])
    c32 = int(np.frombuffer(mh.buf, np.uint32, count=1, offset=8)[0])
    assert c64 == size * iters, (c64, size * iters)
    assert c32 == 2 * size * iters, (c32, 2 * size * iters)
world.barrier(timeout=60)
print(f"RMA-SUITE OK {rank} {rkeys[right].mode}", flush=True)
mh.unmap()
world.finalize()
