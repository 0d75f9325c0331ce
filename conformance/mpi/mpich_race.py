"""The MPICH race behind run.py's MPICH_RACES, shown without mpi4py's tests.

Each rank sends one message to itself and one to every other rank (same tag),
then, like MPICH's MPIR_Dist_graph_create_impl, probes MPI_ANY_SOURCE and
receives MPI_ANY_SOURCE.  MPI lets the receive match another message than the
probe saw only if a matching message arrived in between; here every message
was sent before the probes, yet under MPIR_CVAR_NOLOCAL=1 (self traffic on
MPICH's shared memory, the rest on the netmod) the two disagree now and then.

    ucxpy-ucx mpiexec -n 2 python conformance/mpi/mpich_race.py     # ucxpy's libucp
    ucxpy-ucx --reference mpiexec -n 2 python conformance/mpi/mpich_race.py   # real UCX

Prints per rank how many of the probe/receive pairs disagreed (a few in a
thousand on ucxpy's libucp, 2026-12-05).  On the real UCX (--reference) it
hangs in its first round, as MPICH's ANY_SOURCE-with-self tests do there.
"""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
size, rank = comm.Get_size(), comm.Get_rank()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500
disagree = 0
for it in range(rounds):
    # to itself 1 int, to every other rank 2: the count tells the messages apart
    reqs = [comm.Isend(np.full(1 + (d != rank), d, "i"), d, 77) for d in range(size)]
    for _ in range(size):
        probed, got = MPI.Status(), MPI.Status()
        comm.Probe(MPI.ANY_SOURCE, 77, probed)
        comm.Recv(np.zeros(4, "i"), MPI.ANY_SOURCE, 77, got)
        if probed.Get_source() != got.Get_source():
            disagree += 1
    MPI.Request.Waitall(reqs)
    comm.Barrier()
print(f"rank {rank}: the receive took another message than the probe saw "
      f"{disagree} times in {rounds * size}", flush=True)
