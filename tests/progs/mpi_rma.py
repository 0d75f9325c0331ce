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
sys.stdout.write(f"MPI-RMA OK {rank} ok\n")
sys.stdout.flush()
