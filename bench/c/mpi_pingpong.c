/*
 * mpi_pingpong.c — a C ping-pong for any MPI (bench/ucp_bench.py).
 *
 * Two ranks.  For each size: latency as half the round trip of blocking
 * Send/Recv (best of 3 timed batches after a warm-up), and bandwidth as a
 * window of 64 Isends answered by one small ack (rank 0 -> 1).  Each rank
 * pins itself to CPU <rank> when there are enough CPUs.  Rank 0 prints one
 * JSON line per size: {"size": n, "lat_us": x, "bw_MBps": y}.
 * Usage: mpi_pingpong [max_time_per_size_seconds]
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WINDOW 64

static int iters_for(size_t n, double budget, double per_iter_guess)
{
    double it = budget / per_iter_guess;
    if (it < 10) it = 10;
    if (it > 200000) it = 200000;
    (void)n;
    return (int)it;
}

int main(int argc, char **argv)
{
    int rank;
    double budget = argc > 1 ? atof(argv[1]) : 0.3;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(rank, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
    size_t sizes[] = {8, 64, 1024, 16384, 65536, 1 << 20, 4 << 20};
    char *buf = malloc(4 << 20), ack = 0;
    MPI_Request reqs[WINDOW];
    memset(buf, 1, 4 << 20);
    int peer = 1 - rank;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        /* latency: estimate, then best of 3 batches */
        double best = 1e30;
        int iters = 100;
        for (int batch = -1; batch < 3; batch++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) {
                if (rank == 0) {
                    MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                }
            }
            double per = (MPI_Wtime() - t0) / iters / 2;
            if (batch < 0) {
                MPI_Bcast(&per, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
                iters = iters_for(n, budget / 3, 2 * per);
            } else if (per < best) {
                best = per;
            }
        }
        /* bandwidth */
        int bw_iters = n >= (1 << 20) ? 4 : 20;
        double bw_best = 0;
        for (int batch = 0; batch < 3; batch++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < bw_iters; i++) {
                for (int w = 0; w < WINDOW; w++) {
                    if (rank == 0)
                        MPI_Isend(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &reqs[w]);
                    else
                        MPI_Irecv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &reqs[w]);
                }
                MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
                if (rank == 0)
                    MPI_Recv(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                else
                    MPI_Send(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
            }
            double mbps = (double)n * WINDOW * bw_iters / (MPI_Wtime() - t0) / 1e6;
            if (mbps > bw_best)
                bw_best = mbps;
        }
        if (rank == 0)
            printf("{\"size\": %zu, \"lat_us\": %.3f, \"bw_MBps\": %.1f}\n", n, best * 1e6,
                   bw_best);
        fflush(stdout);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
