/*
 * pingpong_lib.c — an 8 B MPI ping-pong as a C function, for a Python
 * process to call through ctypes (bench/gil_bench.py): the MPI library of
 * that process (mpi4py's) carries it while a Python thread of the same
 * process may be spinning.  ctypes drops the GIL for the call, so the
 * ping-pong runs at C speed unless the MPI library below takes the GIL per
 * message.
 *
 * double ucxpy_pingpong(int iters): half the round trip in seconds, between
 * ranks 0 and 1 of MPI_COMM_WORLD (MPI initialized by the caller); -1 when
 * a message did not carry the count it should (rank 1 adds one to each).
 */
#include <mpi.h>

double ucxpy_pingpong(int iters)
{
    int rank;
    long v = 0;
    int bad = 0;
    double t0;

    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(&v, 1, MPI_LONG, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(&v, 1, MPI_LONG, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad |= v != i + 1;
        } else if (rank == 1) {
            MPI_Recv(&v, 1, MPI_LONG, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad |= v != i;
            v++;
            MPI_Send(&v, 1, MPI_LONG, 0, 7, MPI_COMM_WORLD);
        }
    }
    if (bad)
        return -1.0;
    return (MPI_Wtime() - t0) / iters / 2;
}
