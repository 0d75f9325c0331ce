"""mpi_shim collectives spec: results against numpy for every standard op,
IN_PLACE, v-variants, nonblocking overlap, non-commutative user ops, and
isolation from point-to-point traffic.  Prints 'MPI-COLL OK <rank> ok'."""
import faulthandler
import sys

import numpy as np

from mpi_shim import MPI

faulthandler.dump_traceback_later(250, exit=True, file=sys.stderr)
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(42)
data = [rng.integers(-50, 50, 17).astype("i8") for _ in range(size)]
mine = data[rank]
allv = np.stack(data)

# an ANY_TAG receive posted first must not catch collective traffic
stray = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)

# (op, expected) pairs: MPI handles compare by value but are unhashable, as in mpi4py
REF = [(MPI.SUM, allv.sum(0)), (MPI.PROD, allv.prod(0)), (MPI.MAX, allv.max(0)),
       (MPI.MIN, allv.min(0)), (MPI.BAND, np.bitwise_and.reduce(allv)),
       (MPI.BOR, np.bitwise_or.reduce(allv)), (MPI.BXOR, np.bitwise_xor.reduce(allv)),
       (MPI.LAND, np.logical_and.reduce(allv).astype("i8")),
       (MPI.LOR, np.logical_or.reduce(allv).astype("i8")),
       (MPI.LXOR, (np.count_nonzero(allv, 0) % 2).astype("i8"))]
for op, ref in REF:
    if size == 1 and op in (MPI.LAND, MPI.LOR, MPI.LXOR):
        ref = mine          # one operand: copied as is, not normalized
    out = np.empty_like(mine)
    comm.Allreduce(mine, out, op)
    assert np.array_equal(out, ref), (op, out, ref)
    for root in {0, size - 1}:
        out = np.zeros_like(mine)
        comm.Reduce(mine, out, op, root)
        if rank == root:
            assert np.array_equal(out, ref), op
inp = mine.copy()
comm.Allreduce(MPI.IN_PLACE, inp, MPI.SUM)
assert np.array_equal(inp, allv.sum(0))
out = np.empty_like(mine)
comm.Scan(mine, out)
assert np.array_equal(out, allv[:rank + 1].sum(0))
out[:] = 7
comm.Exscan(mine, out)
if rank:
    assert np.array_equal(out, allv[:rank].sum(0))

# MAXLOC/MINLOC on pairs
pairs = np.array([(float(rank % 3), rank)], dtype=MPI.DOUBLE_INT.np_dtype if False else
                 np.dtype([("v", "f8"), ("i", "i4")], align=True))
res = np.empty_like(pairs)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [res, MPI.DOUBLE_INT], MPI.MAXLOC)
best = max(r % 3 for r in range(size))
assert res["v"][0] == best and res["i"][0] == min(r for r in range(size) if r % 3 == best)
assert comm.allreduce((rank % 2, rank), MPI.MINLOC) == (0, 0)

# a non-commutative (associative) user op must combine in rank order:
# digit concatenation, a op b = a * 10**digits(b) + b
def _concat(a, b, dt):
    x, y = np.frombuffer(a, "i8"), np.frombuffer(b, "i8", count=len(np.frombuffer(a, "i8")))
    out = np.frombuffer(b, "i8")
    out[:] = [int(f"{p}{q}") for p, q in zip(x, y)]


concat = MPI.Op.Create(_concat, commute=False)
x = np.array([rank + 1], "i8")
y = np.zeros(1, "i8")
comm.Allreduce(x, y, op=concat)
ref = int("".join(str(r + 1) for r in range(size)))
assert y[0] == ref, (y, ref)
for root in range(size):
    y[:] = 0
    comm.Reduce(x, y, op=concat, root=root)
    assert rank != root or y[0] == ref, (y, ref, root)
y[:] = 0
comm.Scan(x, y, op=concat)
assert y[0] == int("".join(str(r + 1) for r in range(rank + 1))), y
assert comm.allreduce([rank], op=MPI.SUM) == list(range(size))   # list concatenation order
concat.Free()

# bcast / gather / scatter / allgather / alltoall, buffer and v forms
for root in range(size):
    buf = np.arange(1000, dtype="f4") if rank == root else np.zeros(1000, "f4")
    comm.Bcast(buf, root)
    assert np.array_equal(buf, np.arange(1000, dtype="f4"))
rbuf = np.zeros((size, 3), "i") if rank == 0 else None
comm.Gather(np.full(3, rank, "i"), rbuf, root=0)
if rank == 0:
    assert (rbuf == np.arange(size)[:, None]).all()
counts = [r + 1 for r in range(size)]
displs = list(np.cumsum([0] + counts[:-1]))
allg = np.zeros(sum(counts), "i")
comm.Allgatherv(np.full(rank + 1, rank, "i"), [allg, counts, displs, MPI.INT])
assert np.array_equal(allg, np.repeat(np.arange(size), counts))
sc = np.zeros(rank + 1, "i")
comm.Scatterv([np.repeat(np.arange(size), counts).astype("i"), counts, displs, MPI.INT]
              if rank == 0 else None, sc, root=0)
assert (sc == rank).all()
a2a = np.zeros(size, "i")
comm.Alltoall(np.arange(size, dtype="i") + 100 * rank, a2a)
assert np.array_equal(a2a, np.arange(size) * 100 + rank)
# Alltoall on whole buffers takes the plain path; it must interoperate with
# ranks whose arguments go through the general parser (same messages)
for k in (1, 3):
    send = (np.arange(size * k, dtype="i4") + 1000 * rank).reshape(size, k)
    recv = np.zeros((size, k), "i4")
    if rank % 2:
        comm.Alltoall([send, MPI.INT], [recv, MPI.INT])
    else:
        comm.Alltoall(send, recv)
    want = np.array([[1000 * r + rank * k + j for j in range(k)] for r in range(size)], "i4")
    assert np.array_equal(recv, want), (k, recv, want)
rb = bytearray(2 * size)
comm.Alltoall(bytes(b"%c" % (65 + rank)) * (2 * size), rb)
assert bytes(rb) == b"".join(b"%c%c" % (65 + r, 65 + r) for r in range(size)), rb
req = comm.Ialltoall(np.full(size, rank, "f8"), out := np.zeros(size))
req.Wait()
assert list(out) == list(range(size)), out
rs = np.zeros(2, "i8")
comm.Reduce_scatter_block(np.tile(np.array([rank, 1], "i8"), size), rs)
assert list(rs) == [sum(range(size)), size]

# nonblocking collectives overlap with each other and with p2p
r1 = comm.Ibarrier()
big = np.full(300000, rank, "f8")
outb = np.empty_like(big)
r2 = comm.Iallreduce(big, outb, MPI.SUM)
other = comm.Dup()        # (comm has the wildcard receive `stray` pending)
other.send(rank, (rank + 1) % size, tag=77)
got = other.recv(source=(rank - 1) % size, tag=77)
MPI.Request.Waitall([r1, r2])
assert got == (rank - 1) % size and (outb == sum(range(size))).all()

# plain numpy arrays take the reduction fast path (no message parser, the
# ring reducing straight into recvbuf): same results as the [buf, type]
# forms, which parse; send buffers untouched; odd sizes and every dtype
for dt, mtype in (("i4", MPI.INT), ("i8", MPI.INT64_T), ("f4", MPI.FLOAT),
                  ("f8", MPI.DOUBLE), ("c16", MPI.C_DOUBLE_COMPLEX), ("u1", MPI.UINT8_T)):
    for count in (0, 1, 5, 9000, 70001):   # 70001 f8: ring / Rabenseifner (>= 512 KiB)
        mk = [(np.arange(count) * (r + 1) % 97).astype(dt) for r in range(size)]
        send = mk[rank].reshape(-1, 1) if count else mk[rank]     # 2-D is fine too
        keep = send.copy()
        fast, slow = np.empty_like(send), np.empty_like(send)
        for op in (MPI.SUM, MPI.MAX) if dt != "c16" else (MPI.SUM, MPI.PROD):
            comm.Allreduce(send, fast, op)
            comm.Allreduce([send, mtype], [slow, mtype], op)
            assert np.array_equal(fast, slow), (dt, count, op)
            assert np.array_equal(send, keep), (dt, count, "sendbuf changed")
        ref = np.sum(np.stack(mk), 0, dtype=dt).reshape(send.shape)
        comm.Allreduce(send, fast, MPI.SUM)
        assert np.array_equal(fast, ref), (dt, count)
        inp = send.copy()
        comm.Allreduce(MPI.IN_PLACE, inp, MPI.SUM)
        assert np.array_equal(inp, ref), (dt, count, "IN_PLACE")
        out = np.zeros_like(send)
        comm.Reduce(send, out if rank == size - 1 else None, MPI.SUM, size - 1)
        assert rank != size - 1 or np.array_equal(out, ref), (dt, count, "Reduce")
# Rabenseifner in every group size, the fold of ranks beyond a power of two
# included (the layer picks it for powers of two >= 4 only, so it is forced
# here), counts from one element per rank up, IN_PLACE too
import ucxpy.coll as _coll  # noqa: E402  (the collective engine picks the schedule)
_saved = _coll.allreduce_algorithm
_coll.allreduce_algorithm = lambda nb, cnt, n, com: \
    "halving_doubling" if com and cnt >= n > 1 else _saved(nb, cnt, n, com)
try:
    for count in (size, 1001, 70001):
        x = np.arange(count, dtype="f8") * (rank + 1)
        y = np.empty_like(x)
        comm.Allreduce(x, y, MPI.SUM)
        assert np.array_equal(y, np.arange(count) * sum(range(1, size + 1))), count
        assert np.array_equal(x, np.arange(count) * (rank + 1)), "sendbuf changed"
        z = x.copy()
        comm.Allreduce(MPI.IN_PLACE, z, MPI.SUM)
        assert np.array_equal(z, y), (count, "IN_PLACE")
finally:
    _coll.allreduce_algorithm = _saved
# big-endian and bool arrays go through the parser, with the same results
be = np.arange(10, dtype=">f8") * (rank + 1)
out = np.empty_like(be)
comm.Allreduce(be, out, MPI.SUM)
assert np.array_equal(out, np.arange(10) * sum(range(1, size + 1)))
flags = np.array([rank == 0, True, False])
out = np.empty_like(flags)
comm.Allreduce(flags, out, MPI.LOR)
assert list(out) == [True, True, False]
# several large nonblocking allreduces at once (each keeps its own scratch)
bigs = [np.full(100000 + 7 * j, rank + j, "f8") for j in range(3)]
outs = [np.empty_like(b) for b in bigs]
reqs = [comm.Iallreduce(b, o, MPI.SUM) for b, o in zip(bigs, outs)]
MPI.Request.Waitall(reqs[::-1])
for j, o in enumerate(outs):
    assert (o == sum(r + j for r in range(size))).all(), j
# a mismatch still raises, at once and on every rank
try:
    comm.Allreduce(np.zeros(3), np.zeros(4), MPI.SUM)
except ValueError:
    pass
else:
    raise AssertionError("Allreduce accepted buffers of different counts")

# lowercase forms
assert comm.bcast({"k": rank}, root=size - 1) == {"k": size - 1}
assert comm.gather(rank, root=0) == (list(range(size)) if rank == 0 else None)
assert comm.allgather(str(rank)) == [str(r) for r in range(size)]
assert comm.alltoall([(rank, d) for d in range(size)]) == [(s, rank) for s in range(size)]
assert comm.scan(rank) == sum(range(rank + 1))

# the stray receive saw no collective message; satisfy it now
comm.send("p2p", rank, tag=3)
assert stray.wait() == "p2p"
other.Free()
sys.stdout.write(f"MPI-COLL OK {rank} ok\n")
sys.stdout.flush()
