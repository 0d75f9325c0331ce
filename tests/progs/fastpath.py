"""Two ranks: the cases the native fast path (Worker.recv_poller) must
take, and those it must leave to the Python path, with data checked.
Prints 'FASTPATH OK <rank> <fast receives>'; any mismatch raises."""
import numpy as np

import ucxpy

world = ucxpy.init()
rank, peer = world.rank, 1 - world.rank
w = world.worker
assert world.size == 2

# 1. ping-pong of exact 8-byte receives: the fast path's own case
buf = bytearray(8)
for i in range(2000):
    if rank == 0:
        world.send(i.to_bytes(8, "little"), dest=1, tag=11)
        info = world.recv(buf, source=1, tag=12, timeout=60)
    else:
        info = world.recv(buf, source=0, tag=11, timeout=60)
        world.send(buf, dest=0, tag=12)
    assert int.from_bytes(buf, "little") == i and info.length == 8, (i, bytes(buf), info)
world.barrier(timeout=60)
hits = w.fast_recvs

if rank == 1:
    # 2. order: tag 1 then tag 2; rank 0 receives tag 2 first
    world.send(b"first", dest=0, tag=1)
    world.send(b"second", dest=0, tag=2)
    # 3. a wildcard is posted on rank 0 meanwhile: tag 3, then 9 for it
    world.send(b"exact", dest=0, tag=3)
    world.send(b"wild", dest=0, tag=9)
    # 4. truncation; 5. empty message; 6. rendezvous size
    world.send(bytes(16), dest=0, tag=4)
    world.send(b"", dest=0, tag=5)
    big = np.arange(1 << 18, dtype=np.uint32)
    world.send(big, dest=0, tag=6)
else:
    a, b = bytearray(6), bytearray(6)
    assert world.recv(b, source=1, tag=2, timeout=60).length == 6 and bytes(b) == b"second"
    assert world.recv(a, source=1, tag=1, timeout=60).length == 5 and a[:5] == b"first"
    wild = bytearray(4)
    wr = world.irecv(wild, source=ucxpy.ANY_SOURCE, tag=9)
    e = bytearray(5)
    assert world.recv(e, source=1, tag=3, timeout=60).length == 5 and bytes(e) == b"exact"
    assert wr.wait(timeout=60).length == 4 and bytes(wild) == b"wild"
    try:
        world.recv(bytearray(8), source=1, tag=4, timeout=60)
    except ucxpy.TruncationError:
        pass
    else:
        raise SystemExit("a 16-byte message into 8 bytes did not raise TruncationError")
    assert world.recv(bytearray(4), source=1, tag=5, timeout=60).length == 0
    big = np.zeros(1 << 18, np.uint32)
    assert world.recv(big, source=1, tag=6, timeout=60).length == big.nbytes
    assert np.array_equal(big, np.arange(1 << 18, dtype=np.uint32))
world.barrier(timeout=60)
print(f"FASTPATH OK {rank} {hits} {w.fast_recvs}", flush=True)
world.finalize()
