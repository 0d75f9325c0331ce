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
comm.Barrier()
print(f"MPI-FASTPATH OK {rank} {ENGINE.worker.fast_recvs}", flush=True)
