"""Blocking small collectives run straight (ucxpy.coll's *_now) next to
the generator schedules: ranks of one job take different paths (odd ranks
pass buffer specs the direct path leaves to the parser, even ranks plain
arrays), so each round's messages must match exactly.  Checks Barrier,
Bcast, Allreduce (commutative, non-commutative user op, IN_PLACE, several
element types, a rendezvous-sized vector) and Alltoall, then prints
'COLL-DIRECT OK <rank>'."""
import numpy as np

from mpi_shim import MPI
from ucxpy import coll as G

#: calls of the straight-line collectives, counted to show which path ran
taken = {}
for _name in ("barrier_now", "bcast_now", "allreduce_now", "alltoall_now"):
    def _counting(*a, _f=getattr(G, _name), _n=_name):
        taken[_n] = taken.get(_n, 0) + 1
        return _f(*a)
    setattr(G, _name, _counting)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
odd = rank % 2 == 1


def spec(a):
    """A form only the general parser handles (the generator path)."""
    return [a, MPI.Datatype.fromcode(a.dtype.char)] if odd else a


for it in range(200):
    comm.Barrier()
    # Bcast from every root
    root = it % size
    b = np.full(5, it if rank == root else -1, np.int64)
    comm.Bcast(spec(b), root)
    assert (b == it).all(), (it, b)
    # Allreduce of several types and ops
    for dt in ("i4", "i8", "f8", "u4"):
        x = np.arange(3, dtype=dt) + rank + it
        out = np.zeros(3, dt)
        comm.Allreduce(spec(x), spec(out), MPI.SUM)
        want = sum(np.arange(3, dtype=dt) + r + it for r in range(size)).astype(dt)
        assert (out == want).all(), (dt, out, want)
    y = np.array([rank + 1.5])
    comm.Allreduce(MPI.IN_PLACE, spec(y), MPI.MAX)
    assert y[0] == size + 0.5, y
    # Alltoall
    sa = np.arange(size * 2, dtype=np.int32) + 100 * rank
    ra = np.zeros_like(sa)
    comm.Alltoall(spec(sa), spec(ra))
    assert all(ra[2 * r] == 100 * r + 2 * rank and ra[2 * r + 1] == 100 * r + 2 * rank + 1
               for r in range(size)), ra

# a non-commutative op keeps rank order: 2x2 matrix products
def matmul(a, b, dt):
    a = np.frombuffer(a, np.float64).reshape(-1, 2, 2)
    b2 = np.frombuffer(b, np.float64).reshape(-1, 2, 2)
    b2[...] = a @ b2


op = MPI.Op.Create(matmul, commute=False)
mats = [np.array([[1.0, r + 1], [0, 1]]) for r in range(size)]
res = np.zeros((2, 2))
comm.Allreduce(spec(mats[rank].copy()), spec(res), op)
want = mats[0]
for m in mats[1:]:
    want = want @ m
assert np.allclose(res, want), (res, want)
op.Free()

# vectors above the eager sizes (rendezvous rounds), still recursive doubling
big = np.full(40000, rank + 1.0)
outb = np.empty_like(big)
comm.Allreduce(spec(big), spec(outb), MPI.SUM)
assert (outb == size * (size + 1) / 2).all()
bb = np.arange(30000, dtype=np.float64) if rank == 0 else np.zeros(30000)
comm.Bcast(spec(bb), 0)
assert (bb == np.arange(30000)).all()
comm.Barrier()
print(f"COLL-DIRECT OK {rank} {sum(v for k, v in taken.items() if k != 'barrier_now')}",
      flush=True)
