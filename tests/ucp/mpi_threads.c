/*
 * mpi_threads.c — MPI_THREAD_MULTIPLE through libucp: every rank runs
 * THREADS threads at once, each exchanging messages of eager and rendezvous
 * sizes with the same thread of the partner rank on its own communicator
 * (blocking and non-blocking, data checked), while the libucp worker is
 * progressed by all of them.  Two ranks; prints "rank R: OK" or exits non-zero.
 * tests/test_ucp_capi.py runs it under ucxpy-ucx --check.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
#define ROUNDS 200

static int rank, peer;
static MPI_Comm comms[THREADS];
static int failed;

static void *exchange(void *arg)
{
    int t = (int)(long)arg;
    static const int sizes[] = {1, 64, 4096, 65536};      /* ints: up to 256 KiB */
    MPI_Comm comm = comms[t];

    for (int round = 0; round < ROUNDS && !failed; round++) {
        int n = sizes[round % 4];
        int *out = malloc(n * sizeof(int)), *in = malloc(n * sizeof(int));
        for (int i = 0; i < n; i++)
            out[i] = ((rank * THREADS + t) << 20) + round * 7 + i;
        if (round % 2) {
            MPI_Sendrecv(out, n, MPI_INT, peer, round, in, n, MPI_INT, peer, round, comm,
                         MPI_STATUS_IGNORE);
        } else {
            MPI_Request r[2];
            MPI_Irecv(in, n, MPI_INT, peer, round, comm, &r[0]);
            MPI_Isend(out, n, MPI_INT, peer, round, comm, &r[1]);
            MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        }
        for (int i = 0; i < n; i += 61)
            if (in[i] != ((peer * THREADS + t) << 20) + round * 7 + i) {
                fprintf(stderr, "rank %d thread %d round %d: in[%d] = %d\n", rank, t, round, i,
                        in[i]);
                failed = 1;
                break;
            }
        free(out);
        free(in);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int provided, size, sum;
    pthread_t th[THREADS];

    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided != MPI_THREAD_MULTIPLE || size != 2) {
        fprintf(stderr, "rank %d: needs MPI_THREAD_MULTIPLE (got %d) and 2 ranks (got %d)\n",
                rank, provided, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    peer = 1 - rank;
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, exchange, (void *)(long)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    MPI_Allreduce(&failed, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int t = 0; t < THREADS; t++)
        MPI_Comm_free(&comms[t]);
    if (sum) {
        fprintf(stderr, "rank %d: a thread's data was wrong\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("rank %d: OK\n", rank);
    MPI_Finalize();
    return 0;
}
