"""SPMD tag test: every size class through a ring, wildcards, ordering.
Prints 'TAG-SUITE OK <rank> <lane>' on success; any mismatch raises."""
import os
import sys

import numpy as np

import ucxpy

world = ucxpy.init()
rank, size = world.rank, world.size
right, left = (rank + 1) % size, (rank - 1) % size
max_size = int(os.environ.get("TAG_SUITE_MAX", 1 << 26))
sizes = [s for s in (0, 1, 8, 255, 256, 4095, 8192, 8193, 65536, (1 << 20) + 7,
                     (1 << 22) + 3, 1 << 26) if s <= max_size]


def pattern(src, n):
    return np.random.default_rng(src * 1_000_003 + n).integers(0, 256, n, dtype=np.uint8)


# 1. every size class around the ring, data verified byte for byte
for n in sizes:
    out = pattern(rank, n)
    inp = np.empty(n, np.uint8)
    r = world.irecv(inp, source=left, tag=n)
    world.send(out, dest=right, tag=n, timeout=120)
    info = r.wait(timeout=120)
    assert info.source == left and info.length == n, info
    assert np.array_equal(inp, pattern(left, n)), f"size {n}: data corrupted"

# 2. wildcard source: everyone reports to rank 0
if rank == 0:
    seen = set()
    buf = bytearray(8)
    for _ in range(size - 1):
        info = world.recv(buf, source=ucxpy.ANY_SOURCE, tag=5, timeout=60)
        assert int.from_bytes(buf, "little") == info.source
        seen.add(info.source)
    assert seen == set(range(1, size)), seen
else:
    world.send(rank.to_bytes(8, "little"), dest=0, tag=5)

# 3. non-overtaking: a stream mixing eager and rendezvous sizes arrives in order
if size >= 2 and rank in (0, 1):
    lens = [(i * 7919) % 70000 if i % 5 else 300000 + i for i in range(60)]
    if rank == 1:
        reqs = [world.isend(np.full(n, i % 251, np.uint8), dest=0, tag=9)
                for i, n in enumerate(lens)]
        for q in reqs:
            q.wait(timeout=60)
    else:
        buf = np.empty(max(lens), np.uint8)
        for i, n in enumerate(lens):
            info = world.recv(buf, source=1, tag=9, timeout=60)
            assert info.length == n and (n == 0 or (buf[0] == i % 251 and buf[n - 1] == i % 251)), \
                f"message {i} out of order"

# 4. a receive from an invalid rank is a clear error
try:
    world.recv(bytearray(1), source=size + 3, tag=1)
except ucxpy.InvalidRank:
    pass
else:
    sys.exit("InvalidRank not raised")

world.barrier(timeout=60)
lane = world.ep(right).transport_endpoint().iface.name if size > 1 else "self"
print(f"TAG-SUITE OK {rank} {lane}", flush=True)
world.finalize()
