"""Fault tolerance with ULFM: a rank dies, the survivors shrink and go on.

Run:  ucxpy-run -n 3 --fault-tolerant python examples/ulfm_shrink.py

Every rank does an Allreduce; then rank 1 (the victim) exits abruptly.  The
survivors see ERR_PROC_FAILED on the next Allreduce, acknowledge the
failure, build a communicator of the survivors with Shrink, agree on a flag
and finish an Allreduce on it, printing the verified sum.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mpi_shim import MPI  # noqa: E402

comm = MPI.COMM_WORLD.Dup()
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank, size = comm.Get_rank(), comm.Get_size()
victim = int(os.environ.get("ULFM_VICTIM", "1"))

x = np.array([rank + 1.0])
y = np.zeros(1)
comm.Allreduce(x, y)
assert y[0] == size * (size + 1) / 2
comm.Barrier()
if rank == victim:
    os._exit(3)                                  # dies without finalizing
time.sleep(0.5)
try:
    while True:                                  # until the failure is noticed
        comm.Allreduce(x, y)
except MPI.Exception as e:
    assert e.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED), e
    comm.Revoke()                                # everyone stops using comm
survivors = comm.Shrink()                        # agrees on who failed
assert survivors.Get_size() == size - 1
failed = comm.Get_failed()                       # known here by now
assert failed.Get_size() == 1, failed.Get_size()
comm.Ack_failed()
assert survivors.Agree(1) == 1
total = survivors.allreduce(rank + 1)
want = sum(r + 1 for r in range(size) if r != victim)
assert total == want, (total, want)
print(f"rank {rank}: survivors={survivors.Get_size()} sum={total} OK", flush=True)
survivors.Free()
comm.Free()
