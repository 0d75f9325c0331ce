"""A/B of mpi_shim's three allreduce schedules at one group size.

Run under a launcher, e.g. ``ucxpy-run -n 4 python bench/allreduce_algos.py``:
for each size every schedule (``ring``, ``halving_doubling``,
``recursive_doubling``) is forced in turn, three rounds interleaved, and
rank 0 prints the best time per call of each (the slowest rank's).  This is
how ``ucxpy.schedules.ALLREDUCE_RING_MIN`` was chosen.  The schedules are
the message algorithms, so shared-memory teams are off here (UCXPY_SHM_COLL).
"""
import os
import time

import numpy as np

os.environ["UCXPY_SHM_COLL"] = "n"         # read when MPI initializes, below
import mpi_shim.coll as coll  # noqa: E402
from mpi_shim import MPI  # noqa: E402

ALGOS = ("ring", "halving_doubling", "recursive_doubling")
SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 19, 1 << 20, 1 << 22)


def main():
    comm = MPI.COMM_WORLD
    best = {}
    for _round in range(3):
        for algo in ALGOS:
            coll.allreduce_algorithm = lambda nbytes, count, n, commutative, a=algo: a
            for nbytes in SIZES:
                x = np.ones(nbytes // 8)
                y = np.empty_like(x)
                iters = max(5, min(200, (1 << 25) // nbytes // comm.size))
                for _ in range(3):
                    comm.Allreduce(x, y)
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    comm.Allreduce(x, y)
                dt = comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)
                assert y[0] == comm.size and y[-1] == comm.size
                best[algo, nbytes] = min(dt, best.get((algo, nbytes), dt))
    if comm.rank == 0:
        print(f"# allreduce float64 on {comm.size} ranks, best us per call")
        print(f"{'bytes':>9} " + " ".join(f"{a:>19}" for a in ALGOS))
        for nbytes in SIZES:
            print(f"{nbytes:>9} " + " ".join(f"{best[a, nbytes] * 1e6:19.1f}" for a in ALGOS))


if __name__ == "__main__":
    main()
