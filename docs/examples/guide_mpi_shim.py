"""run: ucxpy-run -n 2 python docs/examples/guide_mpi_shim.py

The user guide's MPI program: mpi_shim's MPI module, with mpi4py's names,
on ucxpy (no MPI library underneath): point-to-point on buffers and on
Python objects, a collective, and an RMA window.
"""
import numpy as np

from mpi_shim import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size

# buffers: nonblocking receive and send, completed together
inp = np.empty(4, dtype="i")
reqs = [comm.Irecv(inp, source=left, tag=1),
        comm.Isend(np.full(4, rank, dtype="i"), dest=right, tag=1)]
MPI.Request.Waitall(reqs)
assert (inp == left).all()

# Python objects (pickled)
got = comm.sendrecv({"from": rank}, dest=right, source=left)
assert got == {"from": left}

# a collective
total = np.zeros(1)
comm.Allreduce(np.array([rank + 1.0]), total, op=MPI.SUM)
assert total[0] == size * (size + 1) / 2

# one-sided: every rank puts its rank into its right neighbour's window
mem = np.zeros(1, dtype="i")
win = MPI.Win.Create(mem, comm=comm)
win.Fence()
win.Put(np.array([rank], dtype="i"), right)
win.Fence()
assert mem[0] == left
win.Free()

print(f"{MPI.Get_library_version().split()[0]} rank {rank} of {size}: guide_mpi_shim OK")
