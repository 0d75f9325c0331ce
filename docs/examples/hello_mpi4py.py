"""run: ucxpy-run -n 2 --as-mpi4py python docs/examples/hello_mpi4py.py

The README's mpi4py example: an unmodified mpi4py program, run on mpi_shim.
"""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
total = np.zeros(1)
comm.Allreduce(np.array([comm.Get_rank() + 1.0]), total, op=MPI.SUM)
assert total[0] == comm.Get_size() * (comm.Get_size() + 1) / 2
msg = comm.sendrecv(f"hello from {comm.rank}", dest=(comm.rank + 1) % comm.size,
                    source=(comm.rank - 1) % comm.size)
print(f"{MPI.Get_library_version().split()[0]} rank {comm.rank}: {msg}, sum {total[0]}")
