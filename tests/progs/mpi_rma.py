"""mpi_shim RMA spec: Put/Get/Accumulate under fence, passive-target
atomics under locks, PSCW, on Create/Allocate windows.
Prints 'MPI-RMA OK <rank> ok'."""
import sys

import numpy as np

from mpi_shim import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
N = 64
W = max(size, 2) * N           # words per window (2 blocks at least)

for flavor in ("create", "allocate"):
    if flavor == "create":
        mem = np.zeros(W, "i8")
        win = MPI.Win.Create(mem, MPI.INT64_T.Get_size(), comm=comm)
    else:
        win = MPI.Win.Allocate(W * 8, 8, comm=comm)
        mem = np.frombuffer(win.tomemory(), "i8")
        mem[:] = 0
    # fence epoch: everyone puts its slice into everyone
    win.Fence()
    for t in range(size):
        win.Put(np.full(N, rank + 1, "i8"), t, (rank * N, N, MPI.INT64_T))
    win.Fence()
    assert np.array_equal(mem[:size * N].reshape(size, N), np.repeat(np.arange(1, size + 1), N)
                          .reshape(size, N)), flavor
    got = np.zeros(N, "i8")
    win.Get(got, (rank + 1) % size, (((rank + 1) % size) * N, N, MPI.INT64_T))
    win.Fence()
    assert (got == (rank + 1) % size + 1).all()
    # accumulate: everybody adds into rank 0's first N words, and MAX into next N
    win.Accumulate(np.full(N, rank, "i8"), 0, (0, N, MPI.INT64_T), MPI.SUM)
    win.Accumulate(np.full(N, rank * 3, "i8"), 0, (N, N, MPI.INT64_T), MPI.MAX)
    win.Fence()
    if rank == 0:
        assert (mem[:N] == 1 + sum(range(size))).all(), mem[:N]
        assert (mem[N:2 * N] == max(2 if size > 1 else 0, 3 * (size - 1))).all()
    win.Fence()
    # passive target: a shared counter via Fetch_and_op under exclusive locks
    counter = np.zeros(1, "i8") if True else None
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
    win.Put(np.zeros(1, "i8"), 0, (5, 1, MPI.INT64_T)) if rank == 0 else None
    win.Unlock(0)
    comm.Barrier()
    seen = []
    for _ in range(10):
        win.Lock(0, MPI.LOCK_SHARED)
        old = np.zeros(1, "i8")
        win.Fetch_and_op(np.ones(1, "i8"), old, 0, 5, MPI.SUM)
        win.Unlock(0)
        seen.append(int(old[0]))
    comm.Barrier()
    allseen = sorted(sum(comm.allgather(seen), []))
    assert allseen == list(range(10 * size)), "fetch-and-add lost or duplicated updates"
    # compare-and-swap election: exactly one rank wins
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
    res = np.zeros(1, "i8")
    win.Compare_and_swap(np.array([rank + 100], "i8"), np.array([10 * size], "i8"), res, 0, 5)
    win.Unlock(0)
    winners = comm.allgather(int(res[0]) == 10 * size)
    assert sum(winners) == 1, winners
    # contention across the accumulate paths on rank 0's words 7..9: one-element
    # Fetch_and_op (ucxpy word atomics), three-element Accumulate (the AM
    # handler, word atomics at the target), rank 0 on its own memory; all
    # atomic together, so nothing is lost
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
    win.Put(np.zeros(3, "i8"), 0, (7, 3, MPI.INT64_T)) if rank == 0 else None
    win.Unlock(0)
    comm.Barrier()
    K, K2 = 100, 2000
    win.Lock_all()
    one, old, peek = np.ones(1, "i8"), np.zeros(1, "i8"), np.zeros(1, "i8")
    for i in range(K2):     # rank 0 updates its own words while the others hit word 7
        if rank == 0:
            win.Accumulate(np.ones(3, "i8"), 0, (7, 3, MPI.INT64_T), MPI.SUM)
        else:
            win.Fetch_and_op(one, old, 0, 7, MPI.SUM)
    win.Flush(0)
    comm.Barrier()
    for i in range(K):
        win.Fetch_and_op(one, old, 0, 7, MPI.SUM)
        win.Accumulate(np.ones(3, "i8"), 0, (7, 3, MPI.INT64_T), MPI.SUM)
        if i % 10 == 0:
            win.Get_accumulate(one, peek, 0, (8, 1, MPI.INT64_T), MPI.NO_OP)
            win.Flush(0)
            assert K2 <= peek[0] <= size * K + K2, peek
    win.Unlock_all()
    comm.Barrier()
    if rank == 0:
        assert list(mem[7:10]) == [2 * size * K + size * K2, size * K + K2, size * K + K2], \
            mem[7:10]
    comm.Barrier()
    # PSCW ring: each rank exposes to its left neighbour, accesses its right one
    comm.Barrier()
    grp = comm.Get_group()
    left, right = (rank - 1) % size, (rank + 1) % size
    win.Post(grp.Incl([left]))
    win.Start(grp.Incl([right]))
    win.Put(np.full(1, 1000 + rank, "i8"), right, (6, 1, MPI.INT64_T))
    win.Complete()
    win.Wait()
    assert mem[6] == 1000 + left
    grp.Free()
    comm.Barrier()
    win.Free()

# 32-bit words: a signed counter driven below zero by Fetch_and_op, bits set
# with BOR and swapped with REPLACE, every path mixed as above
win = MPI.Win.Allocate(4 * 4, 4, comm=comm)
mem = np.frombuffer(win.tomemory(), "i4")
mem[:] = 0
comm.Barrier()
win.Lock_all()
old = np.zeros(1, "i4")
for i in range(50):
    win.Fetch_and_op(np.array([-1], "i4"), old, 0, 0, MPI.SUM)
    win.Accumulate(np.array([-1, 0], "i4"), 0, (0, 2, MPI.INT32_T), MPI.SUM)
win.Fetch_and_op(np.array([1 << (rank % 31)], "i4"), old, 0, 2, MPI.BOR)
win.Fetch_and_op(np.array([rank + 1], "i4"), old, 0, 3, MPI.REPLACE)
win.Unlock_all()
comm.Barrier()
if rank == 0:
    assert mem[0] == -100 * size and mem[1] == 0, mem
    assert mem[2] == sum({1 << (r % 31) for r in range(size)}), mem
    assert 1 <= mem[3] <= size, mem
comm.Barrier()
win.Free()

# the whole-buffer fast paths (Put to a displacement, one-word Fetch_and_op
# and Compare_and_swap) next to the general ones they must agree with:
# NO_OP fetches without changing, REPLACE swaps, CAS swaps only on a match,
# an odd displacement (unaligned word) and a float counter take the general
# path, a negative displacement raises, a put to oneself is a local copy
win = MPI.Win.Allocate(64, 1, comm=comm)
mem = np.frombuffer(win.tomemory(), "u1")
mem[:] = 0
comm.Barrier()
peer = (rank + 1) % size
win.Lock_all()
win.Put(np.full(8, rank + 1, "u1"), peer, 8)                 # int displacement
win.Put(np.full(4, 200 + rank, "u1"), rank, 40)              # to oneself
win.Flush_all()
try:
    win.Put(np.zeros(1, "u1"), peer, -1)
except MPI.Exception as e:
    assert e.Get_error_class() == MPI.ERR_DISP, e
else:
    raise AssertionError("a negative displacement was accepted")
win.Unlock_all()
comm.Barrier()
left = (rank - 1) % size
assert list(mem[8:16]) == [left + 1] * 8 and list(mem[40:44]) == [200 + rank] * 4, mem
comm.Barrier()
got, mine = np.zeros(8, "u1"), np.zeros(4, "u1")
win.Lock_all()
win.Get(got, peer, 8)                      # int displacement, whole buffer
win.Get(mine, rank, 40)                    # from oneself
win.Flush_all()
win.Unlock_all()
assert list(got) == [rank + 1] * 8 and list(mine) == [200 + rank] * 4, (got, mine)
comm.Barrier()
win.Free()

win = MPI.Win.Allocate(64, 8, comm=comm)        # disp unit 8: displacements in words
words = np.frombuffer(win.tomemory(), "i8")
words[:] = 0
if rank == 0:
    words[0], words[1], words[2] = 41, 7, 3
comm.Barrier()
old = np.zeros(1, "i8")
win.Lock(0, MPI.LOCK_EXCLUSIVE)
win.Fetch_and_op(np.array([99], "i8"), old, 0, 0, MPI.NO_OP)   # fetch, no change
win.Flush(0)
assert old[0] >= 41, old
win.Unlock(0)
comm.Barrier()
if rank == 0:
    assert words[0] == 41, words                  # NO_OP changed nothing
comm.Barrier()
win.Lock(0, MPI.LOCK_EXCLUSIVE)
win.Fetch_and_op(np.array([1], "i8"), old, 0, 0, MPI.SUM)
win.Flush(0)
win.Unlock(0)
comm.Barrier()
if rank == 0:
    assert words[0] == 41 + size, words
comm.Barrier()
res = np.zeros(1, "i8")
win.Lock(0, MPI.LOCK_EXCLUSIVE)
win.Compare_and_swap(np.array([100 + rank], "i8"), np.array([7], "i8"), res, 0, 1)
win.Flush(0)
win.Unlock(0)
got = comm.allgather(int(res[0]))
assert sorted(got)[:1] == [7] and got.count(7) == 1, got      # exactly one rank swapped
comm.Barrier()
if rank == 0:
    assert 100 <= words[1] < 100 + size and got[words[1] - 100] == 7, (words, got)
    words[3] = 0
comm.Barrier()
win.Lock(0, MPI.LOCK_EXCLUSIVE)
win.Fetch_and_op(np.array([rank + 1], "i8"), old, 0, 2, MPI.REPLACE)
win.Flush(0)
win.Unlock(0)
assert 1 <= old[0] <= size or old[0] == 3, old
comm.Barrier()
fwin = MPI.Win.Allocate(24, 1, comm=comm)     # byte displacements: 1 is unaligned
fmem = np.frombuffer(fwin.tomemory(), "u1")
fmem[:] = 0
comm.Barrier()
fwin.Lock(0, MPI.LOCK_EXCLUSIVE)
fwin.Fetch_and_op(np.array([2], "i8"), old, 0, 1, MPI.SUM)     # unaligned: general path
fwin.Fetch_and_op(np.array([0.5]), np.zeros(1), 0, 16, MPI.SUM)   # float: general path
fwin.Flush(0)
fwin.Unlock(0)
comm.Barrier()
if rank == 0:
    assert int(np.frombuffer(bytes(fmem[1:9]), "i8")[0]) == 2 * size, fmem
    assert float(np.frombuffer(bytes(fmem[16:24]), "f8")[0]) == 0.5 * size, fmem
comm.Barrier()
fwin.Free()
win.Free()

# one-word atomics' old values in every result shape and sign, from the last
# rank (rank 0 itself in a one-rank job): mapped memory takes the native call
# (UCXPY_FASTPATH=y), tcp and UCXPY_FASTPATH=n the request path; both must
# give two's complement back as negative numbers, and a read-only result
# raises before the target word changes
awin = MPI.Win.Allocate(32, 8, comm=comm)
aw = np.frombuffer(awin.tomemory(), "u8")
aw[:] = 0
if rank == 0:
    aw[0], aw[1] = (1 << 64) - 2, (1 << 64) - 5       # u8 near the top; -5 as i8
comm.Barrier()
if rank == size - 1:
    awin.Lock(0, MPI.LOCK_EXCLUSIVE)
    u = np.zeros(1, "u8")
    awin.Fetch_and_op(np.array([1], "u8"), u, 0, 0, MPI.SUM)
    awin.Flush(0)
    assert u[0] == (1 << 64) - 2, u
    s0 = np.zeros((), "i8")                                   # 0-d result
    awin.Fetch_and_op(np.array(3, "i8"), s0, 0, 1, MPI.SUM)
    awin.Flush(0)
    assert int(s0) == -5, s0
    s2 = np.zeros((1, 1), "i8")                               # 2-d result
    awin.Fetch_and_op(np.array([99], "i8"), s2, 0, 1, MPI.NO_OP)
    awin.Flush(0)
    assert s2[0, 0] == -2, s2
    c4 = np.zeros(1, "i4")                                    # 32-bit CAS at byte 16
    awin.Compare_and_swap(np.array([-7], "i4"), np.array([0], "i4"), c4, 0, 2)
    awin.Flush(0)
    assert c4[0] == 0, c4
    awin.Compare_and_swap(np.array([9], "i4"), np.array([-7], "i4"), c4, 0, 2)
    awin.Flush(0)
    assert c4[0] == -7, c4
    awin.Compare_and_swap(np.array([5], "i4"), np.array([-7], "i4"), c4, 0, 2)   # no match
    awin.Flush(0)
    assert c4[0] == 9, c4
    ro = np.zeros(1, "i8")
    ro.flags.writeable = False
    try:
        awin.Fetch_and_op(np.array([1], "i8"), ro, 0, 1, MPI.SUM)
    except (MPI.Exception, ValueError, BufferError, TypeError):
        pass
    else:
        raise AssertionError("a read-only result was accepted")
    awin.Flush(0)
    awin.Unlock(0)
comm.Barrier()
if rank == 0:
    assert aw[0] == (1 << 64) - 1 and int(aw[1].view("i8")) == -2, aw
    assert int(aw[2:3].view("i4")[0]) == 9 and int(aw[2:3].view("i4")[1]) == 0, aw
comm.Barrier()
awin.Free()

# Allocate_shared: every rank maps every other rank's part (ucxpy shared
# segments mapped through the remote key, whatever the lane: tcp too);
# parts of different sizes, one of them empty, and stores seen by loads
swin = MPI.Win.Allocate_shared(8 * (rank % 3), 8, comm=comm)
part = np.frombuffer(swin.tomemory(), "i8")
part[:] = 1000 + rank
swin.Sync()
comm.Barrier()
right = (rank + 1) % size
for r in range(size):
    buf, du = swin.Shared_query(r)
    peer = np.frombuffer(buf, "i8")
    assert du == 8 and len(peer) == r % 3 and (peer == 1000 + r).all(), (r, peer)
comm.Barrier()
rpart = np.frombuffer(swin.Shared_query(right)[0], "i8")
if len(rpart) and right != rank:
    rpart[0] = -(rank + 1)                       # a store into the neighbour's part
swin.Sync()
comm.Barrier()
swin.Sync()
left = (rank - 1) % size
if len(part) and left != rank:
    assert part[0] == -(left + 1), (part, left)
comm.Barrier()
swin.Free()
sys.stdout.write(f"MPI-RMA OK {rank} ok\n")
sys.stdout.flush()
