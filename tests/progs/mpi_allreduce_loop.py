"""Allreduce in a loop on every rank (oversubscription: more ranks than
cores).  Checks each result exactly and reports whether the worker waits in
oversubscribed mode.  Prints 'ARLOOP <rank> ok iters=<n> oversubscribed=<0|1>'."""
import faulthandler
import os
import sys

import numpy as np

from mpi_shim import MPI

faulthandler.dump_traceback_later(200, exit=True, file=sys.stderr)
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
iters = int(os.environ.get("ARLOOP_ITERS", "300"))
small, out = np.empty(1), np.empty(1)
big = np.empty(20000)                  # 160 KB: the ring
bout = np.empty_like(big)
for i in range(iters):
    small[0] = rank + i
    comm.Allreduce(small, out, MPI.SUM)
    assert out[0] == sum(range(size)) + size * i, (i, out[0])
    if i % 10 == 0:
        big[:] = rank * i
        comm.Allreduce(big, bout, MPI.SUM)
        assert (bout == i * sum(range(size))).all(), i
from mpi_shim.engine import ENGINE
flag = int(ENGINE.worker.oversubscribed())
sys.stdout.write(f"ARLOOP {rank} ok iters={iters} oversubscribed={flag}\n")
sys.stdout.flush()
