/*
 * oshmem_rma.c — OpenSHMEM RMA latency and bandwidth in C, the tests of
 * ucxpy-perf's RMA family with the same definitions (ucxpy/tools/perf.py),
 * so bench/oshmem_bench.py can set OSHMEM beside ucxpy's own shmem:
 *
 *   put_lat  shmem_putmem + shmem_quiet       time of one
 *   get_lat  shmem_getmem                     time of one
 *   amo_lat  shmem_long_atomic_fetch_add      time of one (8 B only)
 *   put_bw   WINDOW shmem_putmem_nbi, one shmem_quiet: time per put
 *
 * PE 0 measures against PE 1, which waits in the closing barrier.  Each test
 * and size runs a warm-up, then enough iterations for MAX_TIME seconds
 * (first argument, default 0.3).  Prints "test size latency_us bandwidth_GBps"
 * lines (PE 0), checks the data of the last put and get.
 *
 * The puts' source is memory never written (calloc: the kernel's zero page),
 * as ucxpy-perf's is (np.zeros), so the columns compare like with like;
 * the gets' destination is ordinary written memory, as there.
 */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZE (4 << 20)
#define WINDOW 64

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *target;                       /* symmetric heap: PE 1's region */
static long *word;                         /* symmetric heap (as ucxpy-perf's shmem driver) */
static char *src;                          /* the puts' source: never written */
static char *local;                        /* the gets' destination */

static void run(const char *test, size_t size, long n)
{
    if (!strcmp(test, "put_lat")) {
        for (long i = 0; i < n; i++) {
            shmem_putmem(target, src, size, 1);
            shmem_quiet();
        }
    } else if (!strcmp(test, "get_lat")) {
        for (long i = 0; i < n; i++)
            shmem_getmem(local, target, size, 1);
    } else if (!strcmp(test, "amo_lat")) {
        for (long i = 0; i < n; i++)
            (void)shmem_long_atomic_fetch_add(word, 1, 1);
    } else {                               /* put_bw */
        for (long i = 0; i < n; i++) {
            for (int w = 0; w < WINDOW; w++)
                shmem_putmem_nbi(target, src, size, 1);
            shmem_quiet();
        }
    }
}

int main(int argc, char **argv)
{
    double max_time = argc > 1 ? atof(argv[1]) : 0.3;
    static const char *tests[] = {"put_lat", "get_lat", "amo_lat", "put_bw"};
    static const size_t sizes[] = {8, 64, 1024, 16384, 1 << 20, 4 << 20};

    shmem_init();
    int me = shmem_my_pe();
    if (shmem_n_pes() != 2) {
        if (me == 0)
            fprintf(stderr, "oshmem_rma: run with 2 PEs\n");
        shmem_global_exit(2);
    }
    target = shmem_malloc(MAX_SIZE);
    word = shmem_malloc(sizeof(long));
    src = calloc(1, MAX_SIZE);
    local = malloc(MAX_SIZE);
    memset(local, 0x5a, MAX_SIZE);
    memset(target, 0xab, MAX_SIZE);        /* the puts write zeros over it */
    shmem_barrier_all();
    for (size_t t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            size_t size = sizes[s];
            if (!strcmp(tests[t], "amo_lat") && size != 8)
                continue;
            if (me == 0) {
                memset(local, 0x5a, size);
                run(tests[t], size, 5);    /* warm-up */
                long n = 1;
                double took = 0;
                while (took < max_time / 10 && n < (1L << 30)) {
                    n *= 2;
                    double t0 = now();
                    run(tests[t], size, n);
                    took = now() - t0;
                }
                n = (long)(n * (max_time / (took > 0 ? took : 1e-9)));
                n = n < 1 ? 1 : n;
                double t0 = now();
                run(tests[t], size, n);
                double per = (now() - t0) / (n * (strcmp(tests[t], "put_bw") ? 1 : WINDOW));
                printf("%s %zu %.3f %.4f\n", tests[t], size, per * 1e6,
                       strcmp(tests[t], "amo_lat") ? size / per / 1e9 : 0.0);
                fflush(stdout);
            }
            shmem_barrier_all();
            if (me == 1 && strcmp(tests[t], "amo_lat") && strcmp(tests[t], "get_lat") &&
                target[size - 1] != 0) {
                fprintf(stderr, "oshmem_rma: %s %zu: wrong data at PE 1 (%d)\n", tests[t], size, target[size - 1]);
                shmem_global_exit(1);
            }
            /* get_lat reads what put_lat's puts left at PE 1: zeros */
            if (me == 0 && !strcmp(tests[t], "get_lat") && local[size - 1] != 0) {
                fprintf(stderr, "oshmem_rma: get_lat %zu: wrong data\n", size);
                shmem_global_exit(1);
            }
            shmem_barrier_all();           /* checked before the next size writes */
        }
    }
    shmem_barrier_all();
    shmem_free(word);
    shmem_free(target);
    free(src);
    free(local);
    shmem_finalize();
    return 0;
}
