"""mpi4py.futures on ucxpy, unmodified mpi4py code: estimate pi in parallel.

Two ways to run it (both with the drop-in mpi4py package):

    ucxpy-run -n 4 --as-mpi4py python -m mpi4py.futures examples/futures_pi.py
    ucxpy-run -n 1 --as-mpi4py python examples/futures_pi.py   # workers spawned

The first uses the job's ranks 1..3 as workers; the second spawns them with
MPI.COMM_SELF.Spawn through ucxpy-run.
"""
import math

from mpi4py.futures import MPIPoolExecutor


def partial_sum(args):
    lo, hi, n = args
    h = 1.0 / n
    return sum(4.0 / (1.0 + ((i + 0.5) * h) ** 2) for i in range(lo, hi)) * h


def main():
    n, chunks = 200_000, 8
    step = n // chunks
    work = [(k * step, (k + 1) * step, n) for k in range(chunks)]
    with MPIPoolExecutor(max_workers=3) as pool:
        pi = sum(pool.map(partial_sum, work))
    assert abs(pi - math.pi) < 1e-8, pi
    print(f"pi ~ {pi:.12f} (error {abs(pi - math.pi):.1e}) OK", flush=True)


if __name__ == "__main__":
    main()
