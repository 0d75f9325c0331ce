"""Two ranks of mpi_shim: the calls whose common case runs in C
(mpi_shim.accel: Send, Recv, Isend, Irecv, Waitall, Put, Get, Flush,
Fetch_and_op, Compare_and_swap) next to the cases they hand to the Python
methods, which must behave the same: every value checked, every error class
compared.  Prints 'MPI-ACCEL OK <rank> <KIND>=<calls done in C> ...'."""
import numpy as np

from mpi_shim import MPI, accel

comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
st = MPI.Status()


def error_class(call):
    try:
        call()
    except MPI.Exception as e:
        return e.Get_error_class()
    except (TypeError, ValueError, BufferError) as e:
        return type(e).__name__
    return None


# -- point to point: every plain element type, bytes, bytearray; status, ANY_TAG
kinds = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8", np.intc, np.longlong]
for i, dt in enumerate(kinds):
    out = (np.arange(6) * (i + 3)).astype(dt)
    got = np.zeros(6, dt)
    if rank == 0:
        comm.Send(out, 1, i)
        comm.Recv(got, 1, MPI.ANY_TAG, st)
        assert st.Get_tag() == 100 + i and st.Get_source() == 1, (st.Get_tag(), i)
    else:
        comm.Recv(got, 0, i, st)
        assert st.Get_count(MPI.BYTE) == out.nbytes
        comm.Send(got, 0, 100 + i)
    assert (got == out).all(), (dt, got)
for i, out in enumerate([b"bytes!", bytearray(b"bytearray"), np.ones((2, 3), "i4")]):
    want = memoryview(out).tobytes()
    back = bytearray(len(want))
    if rank == 0:
        comm.Send(out, 1, 30 + i)
    else:
        comm.Recv(back, 0, 30 + i, st)
        assert bytes(back) == want and st.Get_count(MPI.BYTE) == len(want), (i, back)
# synchronous sends into the C Recv (it acknowledges them), and keyword calls
for i in range(20):
    buf = np.full(2, i, "i8")
    if rank == 0:
        comm.Ssend(buf, 1, 7)
        comm.Send(buf, dest=1, tag=8)
    else:
        got = np.zeros(2, "i8")
        comm.Recv(got, 0, 7)
        assert (got == i).all()
        comm.Recv(buf=got, source=0, tag=8)
        assert (got == i).all()
# non-blocking: windows of Isend/Irecv completed by one Waitall, statuses too
for rnd in range(10):
    outs = [np.full(3, rnd * 10 + k, "i4") for k in range(8)]
    ins = [np.zeros(3, "i4") for _ in range(8)]
    reqs = [comm.Irecv(b, peer, 40 + k) for k, b in enumerate(ins)]
    reqs += [comm.Isend(b, peer, 40 + k) for k, b in enumerate(outs)]
    if rnd % 2:
        assert MPI.Request.Waitall(reqs) is True
    else:
        sts = [MPI.Status() for _ in reqs]
        MPI.Request.Waitall(reqs, sts)
        assert [s.Get_tag() for s in sts[:8]] == list(range(40, 48)), [s.Get_tag() for s in sts]
    assert all(r == MPI.REQUEST_NULL for r in reqs)
    assert all((b == rnd * 10 + k).all() for k, b in enumerate(ins)), ins
# a large message (rendezvous: Isend's request stays in flight), then Waitall
big = np.arange(1 << 18, dtype="i8")
back = np.zeros_like(big)
reqs = [comm.Irecv(back, peer, 60), comm.Isend(big, peer, 60)]
MPI.Request.Waitall(reqs)
assert (back == big).all()
# Waitall over a mixed list (a null request, a persistent one): Python's
reqs = [MPI.REQUEST_NULL, comm.Irecv(np.zeros(1, "i8"), peer, 61),
        comm.Isend(np.ones(1, "i8"), peer, 61)]
MPI.Request.Waitall(reqs)
pr = comm.Recv_init(np.zeros(1, "i8"), peer, 62)
ps = comm.Send_init(np.ones(1, "i8"), peer, 62)
for _ in range(3):
    MPI.Prequest.Startall([pr, ps])
    MPI.Request.Waitall([pr, ps])
pr.Free()
ps.Free()
# truncation: the Python path reports it, through Waitall and Recv alike
if rank == 0:
    comm.Send(np.ones(4, "i8"), 1, 63)
    comm.Send(np.ones(4, "i8"), 1, 64)
else:
    r = comm.Irecv(np.zeros(2, "i8"), 0, 63)
    assert error_class(lambda: MPI.Request.Waitall([r])) == MPI.ERR_TRUNCATE
    assert error_class(lambda: comm.Recv(np.zeros(2, "i8"), 0, 64)) == MPI.ERR_TRUNCATE
# an Irecv's request in the other calls (its op is ucxpy's receive request
# itself, mpi_shim.ops.PostedRecv): Wait with a status, Get_status, Test,
# Cancel
if rank == 0:
    comm.Send(np.full(2, 7, "i8"), 1, 65)
    comm.Send(np.full(2, 8, "i8"), 1, 66)
else:
    a, b = np.zeros(2, "i8"), np.zeros(2, "i8")
    ra, rb = comm.Irecv(a, 0, 65), comm.Irecv(b, 0, 66)
    st = MPI.Status()
    ra.Wait(st)
    assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)) == (0, 65, 16), st
    assert (a == 7).all() and ra == MPI.REQUEST_NULL
    while not rb.Get_status(st):
        pass
    assert st.Get_tag() == 66 and rb != MPI.REQUEST_NULL
    assert rb.Test() and rb == MPI.REQUEST_NULL and (b == 8).all()
    rc = comm.Irecv(np.zeros(1, "i8"), 0, 67)          # never sent
    rc.Cancel()
    rc.Wait(st)
    assert st.Is_cancelled()
# what the C calls hand to Python raises as before
assert error_class(lambda: comm.Send(np.zeros(1), 5, 0)) == MPI.ERR_RANK
assert error_class(lambda: comm.Send(np.zeros(1), peer, -5)) == MPI.ERR_TAG
assert error_class(lambda: comm.Send(np.zeros(1), peer, comm.Get_attr(MPI.TAG_UB) + 1)) == MPI.ERR_TAG
assert error_class(lambda: comm.Recv(np.zeros(1), 5, 0)) == MPI.ERR_RANK
assert error_class(lambda: comm.Isend(np.zeros(1), True + 4, 0)) == MPI.ERR_RANK
assert error_class(lambda: comm.Irecv(np.zeros(1), -7, 0)) == MPI.ERR_RANK
assert error_class(lambda: comm.Recv(b"read-only", peer, 0)) is not None
assert error_class(lambda: comm.Recv(np.zeros(4)[::2], peer, 0)) is not None
comm.Barrier()

# -- windows ------------------------------------------------------------------
win = MPI.Win.Allocate(256, 1, comm=comm)
mem = np.frombuffer(win.tomemory(), "u1")
mem[:] = 0
native = win._impl()._native
mapped = native is not None and native.mapped(peer)
assert native is None or not native.mapped(rank)       # oneself: Python's local copy
comm.Barrier()
win.Lock(peer, MPI.LOCK_SHARED)
win.Put(np.arange(16, dtype="u1"), peer)
win.Put(np.full(4, 7, "i2"), peer, 16)
win.Put(bytearray(b"abcd"), peer, 40)
win.Flush(peer)
got = np.zeros(16, "u1")
win.Get(got, peer)
win.Flush(peer)
assert (got == np.arange(16)).all(), got
g16 = np.zeros(4, "i2")
win.Get(g16, peer, 16)
win.Flush(peer)
assert (g16 == 7).all(), g16
# out of the window, a read-only origin for Get, a negative displacement:
# Python's errors
assert error_class(lambda: win.Put(np.zeros(8, "u1"), peer, 250)) is not None
assert error_class(lambda: win.Get(b"12345678", peer, 0)) is not None
assert error_class(lambda: win.Put(np.zeros(1, "u1"), peer, -1)) == MPI.ERR_DISP
for _ in range(200):                   # Flush with nothing outstanding, many times
    win.Flush(peer)
win.Unlock(peer)
comm.Barrier()
assert bytes(mem[40:44]) == b"abcd" and (mem[:16] == np.arange(16)).all(), mem[:44]
comm.Barrier()
win.Free()

# one-word atomics: 4 and 8 bytes, signed and unsigned, every predefined op
win = MPI.Win.Allocate(64, 8, comm=comm)
words = np.frombuffer(win.tomemory(), "i8")
words[:] = 0
comm.Barrier()
ops = [(MPI.SUM, lambda a, b: a + b), (MPI.BAND, lambda a, b: a & b),
       (MPI.BOR, lambda a, b: a | b), (MPI.BXOR, lambda a, b: a ^ b),
       (MPI.REPLACE, lambda a, b: b), (MPI.NO_OP, lambda a, b: a)]
if rank == 0:
    for dt, slot in (("i8", 0), ("u8", 1), ("i4", 4), ("u4", 5)):
        info = np.iinfo(dt)
        win.Lock(1, MPI.LOCK_EXCLUSIVE)
        cur = 0
        for k, (op, fn) in enumerate(ops * 3):
            val = np.array([(-5 - k) if info.min < 0 else (0x9E3779B9 * (k + 1)) & info.max], dt)
            old = np.zeros(1, dt)
            win.Fetch_and_op(val, old, 1, slot, op)
            win.Flush(1)
            assert int(old[0]) == cur, (dt, k, old, cur)
            cur = int(np.array([fn(np.array([cur], dt)[0], val[0])], dt)[0])
        res = np.zeros(1, dt)
        win.Compare_and_swap(np.array([3], dt), np.array([cur + 1 if cur < info.max else 0], dt),
                             res, 1, slot)                      # no match: unchanged
        win.Compare_and_swap(np.array([3], dt), np.array([cur], dt), res, 1, slot)
        win.Flush(1)
        assert int(res[0]) == cur, (dt, res, cur)
        fres = np.zeros(1, dt)
        win.Fetch_and_op(np.zeros(1, dt), fres, 1, slot, MPI.NO_OP)
        win.Flush(1)
        assert int(fres[0]) == 3, (dt, fres)
        win.Unlock(1)
    # what the C path declines: a float (Python's accumulate path), a user op,
    # differing types, a 2-element buffer
    win.Lock(1, MPI.LOCK_EXCLUSIVE)
    fo = np.zeros(1, "f8")
    win.Fetch_and_op(np.array([1.5]), fo, 1, 6, MPI.SUM)
    win.Fetch_and_op(np.array([1.5]), fo, 1, 6, MPI.SUM)
    win.Flush(1)
    assert fo[0] == 1.5, fo
    assert error_class(lambda: win.Fetch_and_op(np.ones(2, "i8"), np.zeros(2, "i8"), 1, 2)) \
        == "ValueError"
    assert error_class(lambda: win.Fetch_and_op(np.ones(1, "i8"), np.zeros(1, "i4"), 1, 2)) \
        == "ValueError"
    win.Unlock(1)
comm.Barrier()
if rank == 1:
    assert list(words[:2]) == [3, 3] and list(words[4:6] & 0xFFFFFFFF) == [3, 3], list(words)
    assert np.frombuffer(words[6:7], "f8")[0] == 3.0, words
comm.Barrier()
win.Free()
# after Free the window is gone: the Python path says so
assert error_class(lambda: win.Put(np.zeros(1, "u1"), peer)) is not None
assert error_class(lambda: win.Flush(peer)) is not None

counts = accel.counts()
comm.Barrier()
print(f"MPI-ACCEL OK {rank} MAPPED={int(mapped)} "
      + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
