"""Cross-host traffic check: tagged messages, active messages, RMA and atomics
between every pair of ranks, with the lane each pair uses.

Usage: rel_xhost.py RANKS_PER_HOST [EXPECTED_REMOTE_LANE]
Ranks k*RANKS_PER_HOST .. (k+1)*RANKS_PER_HOST-1 share a host.  Same-host
peers must use shm, other hosts EXPECTED_REMOTE_LANE (default tcp); every
byte is verified.  Prints 'XHOST OK <rank> lanes=<peer>:<lane>,...
modes=<peer>:<rkey mode>,...'."""
import sys
import zlib

import numpy as np

import ucxpy

per_host = int(sys.argv[1])
remote_lane = sys.argv[2] if len(sys.argv) > 2 else "tcp"
world = ucxpy.init()
rank, size, w = world.rank, world.size, world.worker
host = rank // per_host
T = 60
SIZES = (0, 100, 20000, (1 << 20) + 3)
AM_ID = 77


def pattern(src, dst, n):
    return np.random.default_rng((src * 131 + dst) * 7919 + n).integers(0, 256, n, dtype=np.uint8)


peers = [p for p in range(size) if p != rank]

# -- tagged: every size to every peer, all posted at once ---------------------
recvs = {}
for p in peers:
    for n in SIZES:
        buf = np.empty(n, np.uint8)
        recvs[(p, n)] = (buf, world.irecv(buf, source=p, tag=n))
sends = [world.isend(pattern(rank, p, n), dest=p, tag=n) for p in peers for n in SIZES]
for (p, n), (buf, r) in recvs.items():
    info = r.wait(timeout=T)
    assert info.source == p and info.length == n, info
    assert np.array_equal(buf, pattern(p, rank, n)), f"tag {n} B from {p} corrupted"
for s in sends:
    s.wait(timeout=T)

# -- active messages: eager and rendezvous to every peer ----------------------
got = {}
pending = []


def on_am(msg):
    if msg.is_rndv:
        buf = bytearray(msg.length)
        req = msg.receive(buf)
        pending.append((msg.source, bytes(msg.header), buf, req))
    else:
        got[(msg.source, bytes(msg.header))] = zlib.crc32(msg.data)


w.set_am_handler(AM_ID, on_am)
world.barrier(timeout=T)
am_sizes = (10, 3 << 20)
for p in peers:
    for n in am_sizes:
        world.ep(p).am_send(AM_ID, b"%d" % n, pattern(rank, p, n), timeout=T)
w.wait_until(lambda: len(got) + len(pending) == len(peers) * len(am_sizes), T, "AMs")
for src, hdr, buf, req in pending:
    req.wait(timeout=T)
    got[(src, hdr)] = zlib.crc32(buf)
for p in peers:
    for n in am_sizes:
        assert got[(p, b"%d" % n)] == zlib.crc32(pattern(p, rank, n)), f"AM {n} B from {p}"

# -- RMA: put into every peer's region, read it back, atomics ------------------
chunk = 1 << 16
mh = w.mem_map(length=chunk * (size + 1))
mh.buf[:] = b"\0" * mh.length
packed = world.bootstrap.allgather(mh.address.to_bytes(8, "little") + mh.pack_rkey(), timeout=T)
base = [int.from_bytes(k[:8], "little") for k in packed]
rkeys = {p: world.ep(p).unpack_rkey(packed[p][8:]) for p in peers}
world.barrier(timeout=T)
for p in peers:
    world.ep(p).put(pattern(rank, p, chunk), base[p] + chunk * rank, rkeys[p], timeout=T)
    world.ep(p).atomic_post("add", 1, base[p] + chunk * size, rkeys[p])
for p in peers:
    world.ep(p).flush(timeout=T)
world.barrier(timeout=T)
for p in peers:
    assert bytes(mh.buf[chunk * p:chunk * (p + 1)]) == pattern(p, rank, chunk).tobytes(), \
        f"put from {p} corrupted"
    back = np.empty(chunk, np.uint8)
    world.ep(p).get(back, base[p] + chunk * rank, rkeys[p], timeout=T)
    assert np.array_equal(back, pattern(rank, p, chunk)), f"get from {p} corrupted"
    old = world.ep(p).atomic_fetch("add", 0, base[p] + chunk * size, rkeys[p], timeout=T)
    assert old == size - 1, (p, old)
world.barrier(timeout=T)
counter = int.from_bytes(mh.buf[chunk * size:chunk * size + 8], "little")
assert counter == size - 1, counter

# -- lanes ---------------------------------------------------------------------
lanes = {p: world.ep(p).transport_endpoint().iface.name for p in peers}
modes = {p: rkeys[p].mode for p in peers}
for p in peers:
    want = "shm" if p // per_host == host else remote_lane
    assert lanes[p] == want, f"rank {rank} -> {p}: lane {lanes[p]}, expected {want}"
print(f"XHOST OK {rank} lanes=" + ",".join(f"{p}:{lanes[p]}" for p in peers)
      + " modes=" + ",".join(f"{p}:{modes[p]}" for p in peers), flush=True)
world.finalize()
