/*
 * mpi_basics.c — a C MPI program touching every path MPICH's ch4:ucx takes
 * through libucp: eager and rendezvous sends, synchronous sends, wildcards,
 * probe/mprobe, cancel, a non-contiguous datatype (ucp generic datatype),
 * collectives, and one-sided Put/Get/Accumulate on an allocated window.
 * Every rank checks its data; prints "rank R: OK" or exits non-zero.
 * tests/test_ucp_capi.py runs it under ucxpy-ucx --check.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "rank %d: ", rank); fprintf(stderr, __VA_ARGS__); \
                       fputc('\n', stderr); MPI_Abort(MPI_COMM_WORLD, 1); } while (0)

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;

    /* eager and rendezvous ring exchanges */
    for (int n = 1; n <= (1 << 20); n *= 16) {
        int *out = malloc(n * sizeof(int)), *in = malloc(n * sizeof(int));
        for (int i = 0; i < n; i++) out[i] = rank * 1000003 + i;
        MPI_Sendrecv(out, n, MPI_INT, right, n, in, n, MPI_INT, left, n, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i += 997)
            if (in[i] != left * 1000003 + i) FAIL("sendrecv %d: in[%d]=%d", n, i, in[i]);
        free(out);
        free(in);
    }

    /* synchronous send, wildcard receive with status */
    if (rank == 0) {
        for (int r = 1; r < size; r++) {
            int v;
            MPI_Status st;
            MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            if (v != st.MPI_SOURCE * 7 || st.MPI_TAG != st.MPI_SOURCE) FAIL("ssend %d", v);
        }
    } else {
        int v = rank * 7;
        MPI_Ssend(&v, 1, MPI_INT, 0, rank, MPI_COMM_WORLD);
    }
    /* the wildcard above must not see the next phase's messages (a double to
     * rank 0 with tag 42 once rank size-1's Ssend has matched) */
    MPI_Barrier(MPI_COMM_WORLD);

    /* probe and matched probe */
    double d = rank + 0.5, got;
    MPI_Request rq;
    MPI_Isend(&d, 1, MPI_DOUBLE, right, 42, MPI_COMM_WORLD, &rq);
    MPI_Status st;
    MPI_Probe(left, 42, MPI_COMM_WORLD, &st);
    int count;
    MPI_Get_count(&st, MPI_DOUBLE, &count);
    if (count != 1) FAIL("probe count %d", count);
    MPI_Message msg;
    MPI_Mprobe(left, 42, MPI_COMM_WORLD, &msg, &st);
    MPI_Mrecv(&got, 1, MPI_DOUBLE, &msg, &st);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    if (got != left + 0.5) FAIL("mrecv %g", got);

    /* cancel a receive that never matches */
    int never;
    MPI_Irecv(&never, 1, MPI_INT, left, 4242, MPI_COMM_WORLD, &rq);
    MPI_Cancel(&rq);
    MPI_Wait(&rq, &st);
    int cancelled;
    MPI_Test_cancelled(&st, &cancelled);
    if (!cancelled) FAIL("receive not cancelled");

    /* a strided (non-contiguous) datatype */
    MPI_Datatype vec;
    MPI_Type_vector(100, 1, 3, MPI_INT, &vec);
    MPI_Type_commit(&vec);
    int sv[300], rv[300];
    for (int i = 0; i < 300; i++) { sv[i] = rank * 1000 + i; rv[i] = -1; }
    MPI_Sendrecv(sv, 1, vec, right, 5, rv, 1, vec, left, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < 300; i++)
        if (rv[i] != (i % 3 ? -1 : left * 1000 + i)) FAIL("vector rv[%d]=%d", i, rv[i]);
    MPI_Type_free(&vec);

    /* collectives */
    long sum = 0, me = rank + 1;
    MPI_Allreduce(&me, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (sum != (long)size * (size + 1) / 2) FAIL("allreduce %ld", sum);
    int *all = malloc(size * sizeof(int));
    MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < size; i++) if (all[i] != i) FAIL("allgather");
    static double big[1 << 18];
    if (rank == 0) for (int i = 0; i < (1 << 18); i++) big[i] = i;
    MPI_Bcast(big, 1 << 18, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (big[12345] != 12345) FAIL("bcast");
    free(all);

    /* one-sided: Put, Get, Accumulate, under fence and lock */
    int *base;
    MPI_Win win;
    MPI_Win_allocate(64 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    for (int i = 0; i < 64; i++) base[i] = 0;
    MPI_Win_fence(0, win);
    int val = rank + 100;
    MPI_Put(&val, 1, MPI_INT, right, rank, 1, MPI_INT, win);
    MPI_Win_fence(0, win);
    if (base[left] != left + 100) FAIL("put: %d", base[left]);
    int one = 1;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    MPI_Accumulate(&one, 1, MPI_INT, 0, 63, 1, MPI_INT, MPI_SUM, win);
    MPI_Win_unlock(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
    int total;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    MPI_Get(&total, 1, MPI_INT, 0, 63, 1, MPI_INT, win);
    MPI_Win_unlock(0, win);
    if (total != size) FAIL("accumulate/get: %d", total);
    MPI_Win_free(&win);

    printf("rank %d: OK\n", rank);
    MPI_Finalize();
    return 0;
}
