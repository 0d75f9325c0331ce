"""mpi_shim point-to-point spec: matching, ordering, truncation, ssend, the
progress rule, probes, context isolation.  Prints 'MPI-P2P OK <rank> ok'."""
import os
import time

import sys

import numpy as np

from mpi_shim import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert (rank, size) == (comm.rank, comm.size)
right, left = (rank + 1) % size, (rank - 1) % size
big = int(os.environ.get("MPI_P2P_BIG", 1 << 20))

# 1. ring with every datatype spec form, eager and rendezvous sizes
for n in (0, 1, 100, 5000, big):
    a = np.arange(n, dtype="d") + rank
    b = np.full(n + 1, -1.0)
    st = MPI.Status()
    comm.Sendrecv([a, MPI.DOUBLE], right, 7, [b, n, MPI.DOUBLE], left, 7, st)
    assert np.array_equal(b[:n], np.arange(n) + left) and b[n] == -1
    assert (st.source, st.tag, st.Get_count(MPI.DOUBLE)) == (left, 7, n), st
r = comm.Irecv([b, (3, 2), MPI.DOUBLE], left, 8)
comm.Send([np.array([1.0, 2.0, 3.0]), MPI.DOUBLE], right, 8)
r.Wait()
assert list(b[2:5]) == [1, 2, 3]

# 2. wildcards and non-overtaking: rank 0 collects a stream from every rank
N = 50
if rank == 0:
    last = {}
    buf = np.empty(2, "i")
    for _ in range((size - 1) * N):
        st = MPI.Status()
        comm.Recv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
        src, seq = buf
        assert st.source == src and st.tag == seq % 3
        assert seq == last.get(src, -1) + 1, "messages from one source overtook"
        last[src] = seq
else:
    reqs = [comm.Isend(np.array([rank, i], "i"), 0, tag=i % 3) for i in range(N)]
    MPI.Request.Waitall(reqs)

# 3. tag matching is exact: a later message with the wanted tag is taken first
if size >= 2 and rank < 2:
    other = 1 - rank
    if rank == 0:
        r = comm.isend("first", other, tag=1)      # not send: that may wait for the match
        comm.send("second", other, tag=2)
        r.wait()
    else:
        assert comm.recv(source=0, tag=2) == "second"
        assert comm.recv(source=0, tag=1) == "first"

# 4. truncation raises MPI.Exception(ERR_TRUNCATE) for both API styles
comm.Barrier()
if size >= 2 and rank < 2:
    other = 1 - rank
    if rank == 0:
        comm.Send(np.zeros(10, "i"), other, tag=4)
        comm.Send(np.zeros(100000, "i"), other, tag=4)
    else:
        for n in (10, 100000):
            try:
                comm.Recv(np.empty(n - 1, "i"), 0, tag=4)
            except MPI.Exception as e:
                assert e.Get_error_class() == MPI.ERR_TRUNCATE, e
            else:
                raise AssertionError("truncation not reported")
comm.Barrier()

# 5. ssend completes only once matched
if size >= 2 and rank < 2:
    if rank == 1:
        req = comm.Issend(b"sync", 0, tag=5)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            assert not req.Test(), "ssend completed before the receive was posted"
        comm.Send(b"go", 0, tag=6)
        req.Wait()
    else:
        comm.Recv(bytearray(2), 1, tag=6)
        buf = bytearray(4)
        comm.Recv(buf, 1, tag=5)
        assert buf == b"sync"
comm.Barrier()

# 6. the progress rule: a pending receive completes while its owner is blocked
#    elsewhere (rank 0 sits in a barrier while rank 1's synchronous send needs
#    rank 0's matching receive)
if size >= 2:
    if rank == 0:
        r = comm.Irecv(bytearray(200000), 1, tag=11)
        comm.Barrier()
        r.Wait()
    elif rank == 1:
        comm.Ssend(bytearray(200000), 0, tag=11)
        comm.Barrier()
    else:
        comm.Barrier()

# 7. probes and matched probes
# (ring exchanges use isend: a blocking send may wait for its match)
s1 = comm.isend({"from": rank}, right, tag=12)
st = MPI.Status()
comm.Probe(left, 12, st)
assert st.source == left and st.Get_count() > 0
msg = comm.mprobe(left, 12)
assert msg.recv() == {"from": left}
assert not comm.Iprobe(left, 12)
s2 = comm.Isend(np.full(4, rank, "l"), right, tag=13)
m = comm.Mprobe(MPI.ANY_SOURCE, 13, st)
out = np.empty(st.Get_count(MPI.LONG), "l")
m.Recv(out)
assert (out == left).all()
MPI.Request.Waitall([s1, s2])

# 8. communicators isolate traffic: same tag on a duplicate never matches
dup = comm.Dup()
req = dup.irecv(source=left, tag=14)
s1 = comm.isend("world", right, tag=14)
s2 = dup.isend("dup", right, tag=14)
assert req.wait() == "dup"
assert comm.recv(source=left, tag=14) == "world"
MPI.Request.waitall([s1, s2])
dup.Free()

# 9. cancel a receive that cannot match; persistent requests; PROC_NULL
r = comm.Irecv(bytearray(1), left, tag=999)
r.Cancel()
st = MPI.Status()
r.Wait(st)
assert st.Is_cancelled()
sbuf, rbuf = np.zeros(3, "i"), np.zeros(3, "i")
ps = comm.Send_init(sbuf, right, 15)
pr = comm.Recv_init(rbuf, left, 15)
for it in range(3):
    sbuf[:] = it + rank
    MPI.Prequest.Startall([ps, pr])
    MPI.Prequest.Waitall([ps, pr])
    assert (rbuf == it + left).all()
comm.Send(b"x", MPI.PROC_NULL)
st = MPI.Status()
comm.Recv(bytearray(1), MPI.PROC_NULL, status=st)
assert st.source == MPI.PROC_NULL

# 10. errors are MPI.Exception with the standard classes
for fn, cls in ((lambda: comm.Send(b"", size), MPI.ERR_RANK),
                (lambda: comm.send(None, 0, tag=-5), MPI.ERR_TAG)):
    try:
        fn()
    except MPI.Exception as e:
        assert e.Get_error_class() == cls, (e, cls)
    else:
        raise AssertionError("no error")
comm.Barrier()
sys.stdout.write(f"MPI-P2P OK {rank} ok\n")
sys.stdout.flush()
