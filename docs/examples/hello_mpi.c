/* The README's C example: an MPI program built with MPICH's mpicc (the mpich
 * wheel's) and run on ucxpy's libucp.so.0 by ucxpy-ucx (tests/test_docs.py).
 *
 *   mpicc -o /tmp/hello_mpi docs/examples/hello_mpi.c
 *   ucxpy-ucx --check mpiexec -n 2 /tmp/hello_mpi
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, mine, sum = 0, left;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Sendrecv(&rank, 1, MPI_INT, (rank + 1) % size, 0, &left, 1, MPI_INT,
                 (rank + size - 1) % size, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (sum != size * (size + 1) / 2 || left != (rank + size - 1) % size) {
        fprintf(stderr, "rank %d: wrong result (sum %d, left %d)\n", rank, sum, left);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("rank %d of %d: sum %d, left neighbour %d\n", rank, size, sum, left);
    MPI_Finalize();
    return 0;
}
