"""mpi_shim and shmem events on the trace timeline (tests/test_trace.py):
a large Allreduce (ring), a small one (the shared-memory team that
COMM_WORLD forms at its second blocking collective), a nonblocking
Iallreduce (ring), a window's Fence/Lock/Unlock epochs, shmem put+quiet, fence,
barrier_all."""
import sys

import numpy as np

if sys.argv[1] == "mpi_shim":
    from mpi_shim import MPI
    c = MPI.COMM_WORLD
    big = np.ones(1 << 17)
    out = np.empty_like(big)
    c.Allreduce(big, out)
    c.Allreduce(np.ones(4), np.empty(4))
    c.Iallreduce(big, out).Wait()
    w = MPI.Win.Allocate(64, comm=c)
    w.Fence()
    w.Put(np.ones(8, "u1"), (c.rank + 1) % c.size)
    w.Fence()
    w.Lock(0)
    w.Unlock(0)
    w.Free()
else:
    import shmem
    shmem.init()
    dst = shmem.zeros(4, "i8")
    shmem.put(dst, np.ones(4, "i8"), (shmem.my_pe() + 1) % shmem.n_pes())
    shmem.fence()
    shmem.quiet()
    shmem.barrier_all()
    shmem.finalize()
