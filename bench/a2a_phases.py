"""Where an all-to-all's CPU goes, per rank and phase (docs/notes/performance-history.md,
"The all-to-all: the receive side in C, CMA rendezvous").

The all-to-all of ``make bench-scale`` (each rank posts an ``Irecv`` from and
an ``Isend`` to every other rank, then ``Waitall``), run many times, with
each phase's CPU time taken apart (``time.thread_time``): the receives
posted, the sends posted, the wait.  Run on mpi_shim under ``ucxpy-run`` and
on mpi4py + MPICH under ``mpiexec`` in one go::

    python bench/a2a_phases.py [--ranks 8] [--size 65536] [--reps 300]

Per implementation it prints the CPU per rank and repeat of each phase (the
mean over ranks), the minor page faults per repeat, two times: the median
over repeats of rank 0's, and of the slowest rank's (what ``make
bench-scale`` reports); and when the ranks leave the Barrier before each
repeat, the k-th of them microseconds after the last one arrived (medians):
with more ranks than CPUs they leave as they get a CPU, each after the one
before it on that CPU has posted its sends and receives and waits.  With
more ranks than CPUs the wall time follows the CPU the ranks need: halving
a phase's CPU is what shortens the all-to-all.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


def rank_main(impl: str, size: int, reps: int) -> None:
    import resource

    import numpy as np
    if impl == "ours":
        from mpi_shim import MPI
    else:
        from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    sbuf = np.full(size, rank % 251, dtype=np.uint8)
    rbuf = np.zeros((n, size), dtype=np.uint8)
    srcs = [(rank - k) % n for k in range(1, n)]
    dsts = [(rank + k) % n for k in range(1, n)]
    cpu = time.thread_time_ns
    phases = [0, 0, 0]
    walls, arrivals, exits = [], [], []

    def once(timed: bool) -> None:
        arrived = time.time()
        comm.Barrier()
        if timed:
            arrivals.append(arrived)
            exits.append(time.time())
        t0, a = time.perf_counter(), cpu()
        reqs = [comm.Irecv(rbuf[s], s, 7) for s in srcs]
        b = cpu()
        reqs += [comm.Isend(sbuf, d, 7) for d in dsts]
        c = cpu()
        MPI.Request.Waitall(reqs)
        d = cpu()
        if timed:
            walls.append(time.perf_counter() - t0)
            phases[0] += b - a
            phases[1] += c - b
            phases[2] += d - c

    for _ in range(5):
        once(False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(reps):
        once(True)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    bad = [s for s in srcs if rbuf[s][0] != s % 251 or rbuf[s][-1] != s % 251]
    if bad:
        raise SystemExit(f"rank {rank}: wrong data from {bad[:8]}")
    got = comm.gather((walls, phases, faults), root=0)
    marks = comm.gather((arrivals, exits), root=0)
    if rank == 0:
        slowest = [max(w[i] for w, _, _ in got) for i in range(reps)]
        per = [sum(p[i] for _, p, _ in got) / n / reps / 1e3 for i in range(3)]
        # the ranks leave the Barrier that follows an all-to-all one after
        # another: the k-th to leave, microseconds after the last arrived
        order = [sorted(e[i] - max(a[i] for a, _ in marks) for _, e in marks)
                 for i in range(reps)]
        cascade = [round(statistics.median(o[k] for o in order) * 1e6) for k in range(n)]
        print(f"{impl:6} {n} ranks, {size} B to every peer: rank 0 "
              f"{statistics.median(walls) * 1e3:.3f} ms, slowest rank "
              f"{statistics.median(slowest) * 1e3:.3f} ms; CPU per rank: "
              f"Irecv {per[0]:.1f} us, Isend {per[1]:.1f} us, Waitall {per[2]:.1f} us, "
              f"all {sum(per):.1f} us; minor faults {sum(f for _, _, f in got) / n / reps:.2f}",
              flush=True)
        print(f"{impl:6} leaving the Barrier after the last arrival (us, by order): {cascade}",
              flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--size", type=int, default=64 << 10)
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--impls", default="ours,mpich")
    p.add_argument("--rank-main", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank_main:
        rank_main(a.rank_main[0], int(a.rank_main[1]), int(a.rank_main[2]))
        return 0
    me = [sys.executable, os.path.abspath(__file__), "--rank-main"]
    rc = 0
    for impl in a.impls.split(","):
        launcher = [os.path.join(BIN, "ucxpy-run")] if impl == "ours" else \
            [os.path.join(BIN, "mpiexec")]
        cmd = launcher + ["-n", str(a.ranks)] + me + [impl, str(a.size), str(a.reps)]
        try:
            rc |= subprocess.run(cmd, timeout=600).returncode
        except subprocess.TimeoutExpired:
            print(f"{impl}: timed out", flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
