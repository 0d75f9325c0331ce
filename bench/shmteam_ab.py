"""A/B of shared-memory teams against messages for mpi_shim's blocking
collectives at one group size: how ``ucxpy.schedules.TEAM_MAX`` was chosen.

Run under a launcher, e.g. ``ucxpy-run -n 4 python bench/shmteam_ab.py``.
Two duplicates of COMM_WORLD run the same calls, three rounds interleaved:
one with a team that takes every size (TEAM_MAX lifted), one kept on
messages (its team refused before its first collective).  Rank 0 prints
the best time per call of each (the slowest rank's), in microseconds.
"""
import time

import numpy as np

import ucxpy.schedules as schedules
from mpi_shim import MPI

SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
OPS = ("allreduce", "bcast", "alltoall", "allgather")


def call(comm, op, nbytes):
    n = comm.size
    if op == "allreduce":
        x, y = np.ones(nbytes // 8), np.empty(nbytes // 8)
        return lambda: comm.Allreduce(x, y)
    if op == "bcast":
        b = np.zeros(nbytes, np.uint8)
        return lambda: comm.Bcast(b, 0)
    if op == "alltoall":                      # nbytes: the whole receive buffer
        s, r = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        return lambda: comm.Alltoall(s, r)
    s, r = np.zeros(nbytes // n, np.uint8), np.zeros(nbytes // n * n, np.uint8)
    return lambda: comm.Allgather(s, r)


def main():
    world = MPI.COMM_WORLD
    schedules.TEAM_MAX = {k: (1 << 62, 1 << 62) for k in schedules.TEAM_MAX}
    team, msgs = world.Dup(), world.Dup()
    msgs._h.shm = False                        # this one never forms a team
    best = {}
    for _round in range(3):
        for label, comm in (("team", team), ("messages", msgs)):
            for op in OPS:
                for nbytes in SIZES:
                    f = call(comm, op, nbytes)
                    iters = max(3, min(200, (1 << 25) // nbytes // comm.size))
                    for _ in range(3):
                        f()
                    comm.Barrier()
                    t = time.perf_counter()
                    for _ in range(iters):
                        f()
                    dt = comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)
                    key = (label, op, nbytes)
                    best[key] = min(dt, best.get(key, dt))
    assert team._h.shm or world.size == 1, "no team formed"
    if world.rank == 0:
        print(f"# best us per call on {world.size} ranks: team / messages")
        print(f"{'bytes':>9} " + " ".join(f"{op:>19}" for op in OPS))
        for nbytes in SIZES:
            cells = [f"{best['team', op, nbytes] * 1e6:8.0f} /"
                     f"{best['messages', op, nbytes] * 1e6:8.0f}" for op in OPS]
            print(f"{nbytes:>9} " + " ".join(f"{c:>19}" for c in cells))


if __name__ == "__main__":
    main()
