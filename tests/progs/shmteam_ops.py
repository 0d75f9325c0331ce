"""ucxpy.shmteam.ShmTeam on its own (no MPI): every operation at sizes
around its thresholds (one slot, several pieces, the whole/reduce-scatter
switch), in place, every root, and a loop of mixed operations with ranks
kept out of step to exercise slot reuse.  Prints 'SHMTEAM OK <rank> <how>'.

argv[1]: "ops" (default), "dead" (the last rank dies while the others wait
in a barrier: they must raise, not hang), "refused" (the team must not
form: prints 'SHMTEAM NONE'), "one-refuses" (the last rank's configuration
says no: nobody gets a team), "limit" (UCXPY_SHM_COLL_TEAMS=1: a second
team does not form, and forms again once the first is closed), "sleepers"
(UCXPY_OVERSUBSCRIBED=y, naps of up to 30 s: members asleep in a barrier
are rung awake by the last one to arrive, and a receive asleep on the shm
transport is woken by the message, both within 0.3 s).
"""
import os
import pickle
import sys
import time

import numpy as np

import ucxpy
from ucxpy.schedules import WHOLE_REDUCE_MAX
from ucxpy.shmteam import ShmTeam, live_teams

mode = sys.argv[1] if len(sys.argv) > 1 else "ops"
w = ucxpy.init()
rank, n = w.rank, w.size


def exchange(obj):
    return [pickle.loads(b) for b in w.bootstrap.allgather(pickle.dumps(obj), timeout=60)]


def add(a, b, out):
    np.add(a, b, out=out)


if mode == "one-refuses" and rank == n - 1:
    w.worker.config.shm_coll = False
t = ShmTeam.create(w.worker, rank, w.eps, exchange)
if mode in ("refused", "one-refuses") or n == 1:
    assert t is None, "a team formed where it must not"
    print(f"SHMTEAM NONE {rank}", flush=True)
    w.finalize()
    sys.exit(0)
assert t is not None and t.size == n and t.rank == rank and live_teams() == 1
slot = t.slot

if mode == "limit":
    assert ShmTeam.create(w.worker, rank, w.eps, exchange) is None, "over the limit"
    t.close()
    t2 = ShmTeam.create(w.worker, rank, w.eps, exchange)
    assert t2 is not None and live_teams() == 1
    x = np.ones(4)
    t2.allreduce(x, x, add)
    assert (x == n).all()
    t2.close()
    print(f"SHMTEAM OK {rank} limit", flush=True)
    w.finalize()
    sys.exit(0)

if mode == "sleepers":
    import struct

    import ucxpy.worker
    from ucxpy import doorbell
    ucxpy.worker.OVERSUBSCRIBED_MAX_NAP = 30.0     # nothing but a wake-up ends a sleep early
    assert w.worker.oversubscribed()
    rings = []
    ring = doorbell.ring
    doorbell.ring = lambda name: rings.append(name) or ring(name)
    t.barrier()
    arrived = None
    if rank == 0:
        time.sleep(2.0)          # the others fall asleep in the barrier (naps of 1-2 s by now)
        arrived = time.time()
    t.barrier()
    left = time.time()
    seen = exchange((arrived, left, len(rings)))
    lag = max(x[1] for x in seen) - seen[0][0]
    assert lag < 0.3, f"the sleepers left the barrier {lag:.3f} s after the last arrival"
    assert seen[0][2] >= 1, "the last member to arrive rang nobody"
    if rank == 0:
        time.sleep(2.0)                          # rank 1 falls asleep in its receive
        w.send(struct.pack("<d", time.time()), 1, tag=5)
    elif rank == 1:
        buf = bytearray(8)
        w.recv(buf, 0, tag=5)
        lag = time.time() - struct.unpack("<d", buf)[0]
        assert lag < 0.3, f"the receive ended {lag:.3f} s after the send"
    t.close()
    print(f"SHMTEAM OK {rank} sleepers", flush=True)
    w.finalize()
    sys.exit(0)

if mode == "dead":
    t.barrier()
    if rank == n - 1:
        os._exit(3)                      # gone without a word
    t0 = time.monotonic()
    try:
        t.barrier()
    except ucxpy.ConnectionLost as e:
        print(f"SHMTEAM DETECTED {rank} after {time.monotonic() - t0:.1f}s: {e}", flush=True)
        os._exit(0)
    sys.exit(f"rank {rank}: the barrier completed without the dead member")

sizes = sorted({1, 7, 100, slot - 1, slot, slot + 1, 3 * slot + 5})
# -- bcast from every root
for root in range(n):
    for m in sizes:
        buf = np.full(m, 200, np.uint8) if rank == root else np.zeros(m, np.uint8)
        if rank == root:
            buf[::7] = np.arange(len(buf[::7])) % 251
        t.bcast(buf, root)
        want = np.full(m, 200, np.uint8)
        want[::7] = np.arange(len(want[::7])) % 251
        assert np.array_equal(buf, want), ("bcast", root, m)

# -- allreduce / reduce across the whole / reduce-scatter switch and pieces
counts = sorted({1, 5, WHOLE_REDUCE_MAX // 8, WHOLE_REDUCE_MAX // 8 + 1, slot // 8 + 3,
                 (3 * slot) // 8 + n + 1})
for c in counts:
    x = np.arange(c, dtype=np.float64) * (rank + 1)
    want = np.arange(c, dtype=np.float64) * (n * (n + 1) // 2)
    out = np.zeros(c)
    t.allreduce(x, out, add)
    assert np.array_equal(out, want), ("allreduce", c)
    y = x.copy()
    t.allreduce(y, y, add)                   # in place
    assert np.array_equal(y, want), ("allreduce in place", c)
    xi = (np.arange(c, dtype=np.int64) * 7 + rank * 13) % 101
    allx = [(np.arange(c, dtype=np.int64) * 7 + r * 13) % 101 for r in range(n)]
    for root in range(n):
        out = np.zeros(c, np.int64) if rank == root else None
        t.reduce(xi, out, lambda a, b, o: np.maximum(a, b, out=o), root)
        if rank == root:
            assert np.array_equal(out, np.maximum.reduce(allx)), ("reduce", c, root)

# -- allgather and alltoall, one piece and several
for b in sorted({1, 3, slot // n - 1, slot // n + 1, slot + 9}):
    send = np.full(b, rank + 1, np.uint8)
    recv = np.zeros(b * n, np.uint8)
    t.allgather(send, recv)
    assert np.array_equal(recv, np.repeat(np.arange(1, n + 1).astype(np.uint8), b)), \
        ("allgather", b)
    send = np.repeat((np.arange(n) * 16 + rank).astype(np.uint8), b)
    recv = np.zeros(b * n, np.uint8)
    t.alltoall(send, recv)
    assert np.array_equal(recv, np.repeat((rank * 16 + np.arange(n)).astype(np.uint8), b)), \
        ("alltoall", b)

# -- members that call different sizes or collectives raise (every member that
#    reads the others' slots), and the team goes on
if n > 1:
    def mismatched(call, expect=True):
        try:
            call()
        except ucxpy.TruncationError as e:
            assert expect and "different collectives or sizes" in str(e), e
        else:
            assert not expect, "a mismatched team operation completed"
    m = 4 + rank
    mismatched(lambda: t.allreduce(np.ones(m), np.zeros(m), add))
    mismatched(lambda: t.allreduce(np.ones(m * slot // 8 + 1), np.zeros(m * slot // 8 + 1), add))
    mismatched(lambda: t.allgather(np.ones(m, np.uint8), np.zeros(m * n, np.uint8)))
    mismatched(lambda: t.alltoall(np.ones(m * n, np.uint8), np.zeros(m * n, np.uint8)))
    mismatched(lambda: t.bcast(np.zeros(m, np.uint8), 0), expect=rank != 0)
    mismatched(lambda: t.barrier() if rank == 0 else t.allreduce(np.ones(1), np.zeros(1), add))
    t.barrier()
    v = np.full(3, float(rank))
    t.allreduce(v, v, add)
    assert (v == n * (n - 1) / 2).all(), ("allreduce after the mismatches", v)

# -- mixed operations with the ranks out of step: slot reuse must wait for readers
rng = np.random.default_rng(rank)
for i in range(300):
    if rng.random() < 0.3:
        time.sleep(rng.random() * 1e-3)      # this rank falls behind for a while
    root = i % n
    m = (i * 37) % (2 * slot) + 1
    buf = np.full(m, i % 256, np.uint8) if rank == root else np.zeros(m, np.uint8)
    t.bcast(buf, root)
    assert (buf == i % 256).all(), ("mixed bcast", i)
    if i % 3 == 0:
        v = np.full(3, float(rank + i))
        t.allreduce(v, v, add)
        assert (v == n * i + n * (n - 1) / 2).all(), ("mixed allreduce", i)
    if i % 5 == 0:
        t.barrier()

t.close()
assert live_teams() == 0
print(f"SHMTEAM OK {rank} slot={slot}", flush=True)
w.finalize()
