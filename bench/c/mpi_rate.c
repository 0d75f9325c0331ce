/*
 * mpi_rate.c — message rate and Allreduce for any MPI, by OSU's method
 * (bench/capi_bench.py; latency and bandwidth are mpi_pingpong.c's).
 *
 *   mpi_rate mr [max_time]         osu_mbw_mr's method: ranks pair up (rank
 *       r < n/2 sends to r + n/2); per iteration a sender posts a window of
 *       64 MPI_Isend of 8 bytes, the receiver 64 MPI_Irecv, both
 *       MPI_Waitall, and the receiver answers one 4-byte ack; the rate is
 *       the job's messages per second (every pair's, summed);
 *   mpi_rate allreduce [max_time]  osu_allreduce's: a barrier, then a timed
 *       loop of MPI_Allreduce (MPI_SUM) of 8 B and of 64 KiB of floats; the
 *       time per call averaged over ranks.
 *
 * Each figure is the best of 3 timed batches after a warm-up that sizes
 * them.  Each rank pins itself to CPU <rank mod CPUs>.  Rank 0 prints one
 * JSON line per figure: {"test": ..., "size": n, "value": x, "unit": ...}.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WINDOW 64
#define MR_SIZE 8

static int rank, size;

static void pin(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(rank % cpus, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
}

/* iterations of about `budget` seconds at `per` seconds each (rank 0's,
 * the same on every rank) */
static int iters_for(double budget, double per)
{
    double it = per > 0 ? budget / per : 10;
    MPI_Bcast(&it, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (it < 5)
        it = 5;
    if (it > 1000000)
        it = 1000000;
    return (int)it;
}

/* one osu_mbw_mr iteration batch: seconds */
static double mr_batch(char *buf, int iters)
{
    MPI_Request reqs[WINDOW];
    int half = size / 2, sender = rank < half, peer = sender ? rank + half : rank - half;
    int ack = 0;
    double t0;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    if (rank >= 2 * half) {                /* an odd rank out idles */
        MPI_Barrier(MPI_COMM_WORLD);
        return MPI_Wtime() - t0;
    }
    for (int i = 0; i < iters; i++) {
        if (sender) {
            for (int w = 0; w < WINDOW; w++)
                MPI_Isend(buf + w * MR_SIZE, MR_SIZE, MPI_CHAR, peer, 100, MPI_COMM_WORLD,
                          &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_INT, peer, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < WINDOW; w++)
                MPI_Irecv(buf + w * MR_SIZE, MR_SIZE, MPI_CHAR, peer, 100, MPI_COMM_WORLD,
                          &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_INT, peer, 101, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    return t;
}

static void message_rate(double budget)
{
    char *buf = calloc(WINDOW, MR_SIZE);
    double t = mr_batch(buf, 10), best = 1e30, worst;
    int iters = iters_for(budget / 3, t / 10);

    for (int b = 0; b < 3; b++) {
        t = mr_batch(buf, iters);
        MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (worst < best)
            best = worst;
    }
    if (rank == 0)
        printf("{\"test\": \"mr\", \"size\": %d, \"ranks\": %d, \"value\": %.1f, "
               "\"unit\": \"messages/s\"}\n",
               MR_SIZE, size, (double)(size / 2) * WINDOW * iters / best);
    free(buf);
}

static double allreduce_batch(float *in, float *out, int count, int iters)
{
    double t0, t, sum;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t = (MPI_Wtime() - t0) / iters;
    MPI_Allreduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum / size;
}

static void allreduce(double budget)
{
    int counts[] = {2, 16384};             /* 8 B, 64 KiB */
    float *in = malloc(16384 * sizeof(float)), *out = malloc(16384 * sizeof(float));

    for (int k = 0; k < 16384; k++)
        in[k] = (float)(rank + k % 7);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        double per = allreduce_batch(in, out, counts[c], 20), best = 1e30;
        int iters = iters_for(budget / 3, per);

        for (int b = 0; b < 3; b++) {
            per = allreduce_batch(in, out, counts[c], iters);
            if (per < best)
                best = per;
        }
        if (out[1] != (float)(size * (size - 1) / 2 + size * 1)) {
            fprintf(stderr, "rank %d: Allreduce gave %f\n", rank, out[1]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        if (rank == 0)
            printf("{\"test\": \"allreduce\", \"size\": %zu, \"ranks\": %d, \"value\": %.3f, "
                   "\"unit\": \"us\"}\n", counts[c] * sizeof(float), size, best * 1e6);
    }
    free(in);
    free(out);
}

int main(int argc, char **argv)
{
    const char *test = argc > 1 ? argv[1] : "mr";
    double budget = argc > 2 ? atof(argv[2]) : 0.5;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    pin();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(test, "mr") == 0 && size >= 2)
        message_rate(budget);
    else if (strcmp(test, "allreduce") == 0)
        allreduce(budget);
    else if (rank == 0)
        fprintf(stderr, "usage: mpi_rate mr|allreduce [max_time] (mr needs 2 ranks or more)\n");
    MPI_Finalize();
    return 0;
}
