"""Two ranks of mpi_shim: blocking Recv on ucxpy's native fast path, with
data, status, synchronous sends (their acknowledgement) and ANY_TAG checked.
Prints 'MPI-FASTPATH OK <rank> <fast receives>'."""
import numpy as np

from mpi_shim import MPI
from mpi_shim.engine import ENGINE

comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
buf = np.zeros(4, np.int64)
st = MPI.Status()
for i in range(1000):
    out = np.full(4, i, np.int64)
    if rank == 0:
        (comm.Ssend if i % 10 == 0 else comm.Send)(out, dest=1, tag=i % 7)
        comm.Recv(buf, source=1, tag=MPI.ANY_TAG if i % 3 else 100 + i % 7, status=st)
        assert st.Get_tag() == 100 + i % 7 and st.Get_source() == 1 and st.Get_count(MPI.BYTE) == 32
    else:
        comm.Recv(buf, source=0, tag=i % 7, status=st)
        assert st.Get_tag() == i % 7 and st.Get_source() == 0
        (comm.Ssend if i % 10 == 5 else comm.Send)(buf, dest=0, tag=100 + i % 7)
    assert (buf == i).all(), (i, buf)
# the send side's forms: bytes, bytearray, every element type's format, and
# what the one-pass Send must hand to the general parser (it raises the same)
for i, out in enumerate([b"bytes", bytearray(b"bytearray"), np.arange(3, dtype=np.float32),
                         np.arange(2, dtype=np.complex128), np.array([True, False])]):
    want = memoryview(out).tobytes()
    if rank == 0:
        comm.Send(out, dest=1, tag=50 + i)
    else:
        got = bytearray(len(want))
        comm.Recv(got, source=0, tag=50 + i, status=st)
        assert bytes(got) == want and st.Get_count(MPI.BYTE) == len(want), (i, got)
for bad in (np.arange(8)[::2], np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])):
    for call in (lambda: comm.Send(bad, dest=peer, tag=1),
                 lambda: comm.Recv(bad, source=peer, tag=1)):
        try:
            call()
        except Exception:
            pass
        else:
            raise AssertionError(f"{bad!r} was accepted")
comm.Barrier()
print(f"MPI-FASTPATH OK {rank} {ENGINE.worker.fast_recvs} {ENGINE.worker.fast_sends}", flush=True)
