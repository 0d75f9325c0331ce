"""Quick multi-rank smoke of mpi_shim: p2p, collectives."""
import sys

import numpy as np
from mpi_shim import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size
# p2p pickle ring
req = comm.isend({"r": rank}, right, tag=3)
got = comm.recv(source=left, tag=3)
req.wait()
assert got == {"r": left}, got
# buffer ring
a = np.full(10, rank, "i")
b = np.empty(10, "i")
comm.Sendrecv(a, right, 1, b, left, 1)
assert (b == left).all()
# ssend
if size > 1:
    if rank == 0:
        comm.ssend("sync", 1, tag=9)
    elif rank == 1:
        assert comm.recv(source=0, tag=9) == "sync"
# collectives
assert comm.bcast(rank, root=size - 1) == size - 1
assert comm.allreduce(rank) == sum(range(size))
assert comm.reduce(rank, root=0) == (sum(range(size)) if rank == 0 else None)
assert comm.allgather(rank) == list(range(size))
assert comm.gather(rank, root=0) == (list(range(size)) if rank == 0 else None)
assert comm.scatter(list(range(size)) if rank == 0 else None, root=0) == rank
assert comm.alltoall([rank * 10 + i for i in range(size)]) == [i * 10 + rank for i in range(size)]
assert comm.scan(1) == rank + 1
assert comm.exscan(1) == (None if rank == 0 else rank)
x = np.arange(5, dtype="d") + rank
y = np.empty(5)
comm.Allreduce(x, y, op=MPI.MAX)
assert (y == np.arange(5) + size - 1).all(), y
g = np.empty(size * 2, "i")
comm.Allgather(np.array([rank, rank], "i"), g)
assert (g == np.repeat(np.arange(size), 2)).all(), g
r = comm.Ibarrier(); r.Wait()
sub = comm.Split(rank % 2, rank)
assert sub.allreduce(1) == len(range(rank % 2, size, 2))
sys.stdout.write(f"MPI-SMOKE OK {rank} ok\n")
sys.stdout.flush()
