"""mpi_shim's blocking collectives on a shared-memory team (mpi_shim.shmcoll):
the team forms at a communicator's second blocking buffer collective, and
every member takes the same path whatever buffer form it passes (numpy
arrays on even ranks, ``[buf, count, type]`` specs and derived datatypes on
odd ones), next to nonblocking collectives and sizes that stay on messages.
Prints 'MPI-SHMCOLL OK <rank> <team kind>'."""
import faulthandler
import sys

import numpy as np

from mpi_shim import MPI
from ucxpy.shmteam import live_teams

faulthandler.dump_traceback_later(200, exit=True, file=sys.stderr)
world = MPI.COMM_WORLD
rank, size = world.rank, world.size
expect_team = sys.argv[1] == "team" if len(sys.argv) > 1 else True
odd = rank % 2 == 1


def spec(arr, mpitype, blocks=1):
    """Odd ranks describe their buffers with a message spec (the count is
    per block in the Allgather / Alltoall forms), even ranks pass arrays."""
    return [arr, arr.size // blocks, mpitype] if odd else arr


comm = world.Dup()
assert not comm._h.shm
comm.Barrier()                                   # first blocking buffer collective
assert not comm._h.shm
x = np.arange(10, dtype="f8") + rank
out = np.zeros(10)
comm.Allreduce(spec(x, MPI.DOUBLE), spec(out, MPI.DOUBLE), op=MPI.SUM)   # forms the team
assert np.array_equal(out, np.arange(10) * size + size * (size - 1) / 2), out
team = comm._h.shm
assert (team is not False) == (expect_team and size > 1), team

# a nonblocking allreduce in flight across blocking ones
pend = np.zeros(3, "i8")
req = comm.Iallreduce(np.full(3, rank, "i8"), pend, op=MPI.SUM)

for it in range(20):
    root = it % size
    # Bcast: plain, spec, a vector datatype, and a size beyond the team's limit
    for m in (1, 1000, 300000):                 # (over the team's limit with 2 ranks)
        buf = np.full(m, it, "u1") if rank == root else np.zeros(m, "u1")
        comm.Bcast(spec(buf, MPI.BYTE), root=root)
        assert (buf == it).all(), ("Bcast", m)
    vt = MPI.INT.Create_vector(4, 1, 2).Commit()
    v = np.arange(8, dtype="i4") * (it + 1) if rank == root else np.full(8, -1, "i4")
    comm.Bcast([v, 1, vt], root=root)
    want = np.full(8, -1, "i4") if rank != root else v.copy()
    want[::2] = np.arange(0, 8, 2) * (it + 1)
    assert np.array_equal(v, want), ("Bcast vector", v)
    vt.Free()
    # Allreduce / Reduce, IN_PLACE and not, whole and reduce-scattered
    for c in (1, 3000, 200000):
        a = (np.arange(c, dtype="i8") * 3 + rank + it) % 97
        allv = [(np.arange(c, dtype="i8") * 3 + r + it) % 97 for r in range(size)]
        o = np.zeros(c, "i8")
        comm.Allreduce(spec(a, MPI.INT64_T), spec(o, MPI.INT64_T), op=MPI.MAX)
        assert np.array_equal(o, np.maximum.reduce(allv)), ("Allreduce", c)
        b = a.copy()
        comm.Allreduce(MPI.IN_PLACE, spec(b, MPI.INT64_T), op=MPI.SUM)
        assert np.array_equal(b, np.add.reduce(allv)), ("Allreduce IN_PLACE", c)
        o = np.zeros(c, "i8") if rank == root else None
        comm.Reduce(spec(a, MPI.INT64_T), spec(o, MPI.INT64_T) if o is not None else None,
                    op=MPI.MIN, root=root)
        if rank == root:
            assert np.array_equal(o, np.minimum.reduce(allv)), ("Reduce", c)
    # Allgather and Alltoall, plain and spec forms, IN_PLACE Alltoall
    for per in (1, 64, 5000):
        s = np.full(per, rank + it, "i2")
        g = np.zeros(per * size, "i2")
        comm.Allgather(spec(s, MPI.SHORT), spec(g, MPI.SHORT, size))
        assert np.array_equal(g, np.repeat(np.arange(size) + it, per).astype("i2")), "Allgather"
        s = np.repeat(np.arange(size) * 100 + rank, per).astype("i4")
        r = np.zeros(per * size, "i4")
        comm.Alltoall(spec(s, MPI.INT, size), spec(r, MPI.INT, size))
        assert np.array_equal(r, np.repeat(rank * 100 + np.arange(size), per)), "Alltoall"
        comm.Alltoall(MPI.IN_PLACE, s)
        assert np.array_equal(s, np.repeat(rank * 100 + np.arange(size), per)), "Alltoall ip"
    comm.Barrier()

req.Wait()
assert (pend == size * (size - 1) // 2).all(), pend

# a split communicator gets a team of its own; Free releases both
half = comm.Split(rank % 2, rank)
for _ in range(3):
    t = np.array([rank], "i8")
    half.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)
    assert t[0] == sum(k for k in range(size) if k % 2 == rank % 2), t
mates = sum(1 for k in range(size) if k % 2 == rank % 2)
assert live_teams() == (1 + (mates > 1) if team else 0), live_teams()
half.Free()
comm.Free()
assert live_teams() == 0, live_teams()          # (WORLD ran no blocking collective)
print(f"MPI-SHMCOLL OK {rank} {type(team).__name__}", flush=True)
