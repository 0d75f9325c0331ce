/*
 * shmem_basics.c — a C OpenSHMEM program touching what Open MPI's OSHMEM
 * (spml/ucx, atomic/ucx) takes through libucp: puts and gets small and large
 * (static and symmetric-heap data, strided), blocking and non-blocking,
 * fence ordering, quiet, remote atomics (fetch-add from every PE, compare-
 * swap, swap, fetch, set), collectives, locks and shmem_ptr.  Every PE checks
 * its data; prints "PE p of n: OK" or exits non-zero (shmem_global_exit).
 * With an argument "die" PE 1 kills itself after the first barrier: the job
 * must then end with an error on every PE, never hang.
 * tests/test_ucp_openmpi.py runs it under ucxpy-ucx --check.
 */
#include <shmem.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "PE %d: ", me); fprintf(stderr, __VA_ARGS__); \
                       fputc('\n', stderr); shmem_global_exit(1); } while (0)
#define BIG (1 << 18)

static long counter, word, flag_;
static int ring[BIG];
static long lock;
static long psync[SHMEM_REDUCE_SYNC_SIZE];
static long pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
static long rsrc, rdst;

int main(int argc, char **argv)
{
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;

    /* puts into the right neighbour: small (eager) and large */
    int *src = malloc(BIG * sizeof(int));
    for (int i = 0; i < BIG; i++)
        src[i] = me * 1000003 + i;
    shmem_int_put(ring, src, 16, right);
    shmem_int_put(ring + 16, src + 16, BIG - 16, right);
    shmem_barrier_all();
    for (int i = 0; i < BIG; i += 997)
        if (ring[i] != left * 1000003 + i) FAIL("put: ring[%d]=%d", i, ring[i]);
    if (argc > 1 && !strcmp(argv[1], "die") && me == 1)
        raise(SIGKILL);                    /* a PE lost mid-job */

    /* gets from the left neighbour, blocking and non-blocking */
    int got[64];
    shmem_int_get(got, ring, 64, left);    /* left's ring holds left-1's values */
    int ll = (left + n - 1) % n;
    for (int i = 0; i < 64; i++)
        if (got[i] != ll * 1000003 + i) FAIL("get: got[%d]=%d", i, got[i]);
    int *big = malloc(BIG * sizeof(int));
    shmem_int_get_nbi(big, ring, BIG, left);
    shmem_quiet();
    if (big[BIG - 1] != ll * 1000003 + BIG - 1) FAIL("get_nbi: %d", big[BIG - 1]);

    /* the symmetric heap, strided puts */
    long *heap = shmem_malloc(256 * sizeof(long));
    for (int i = 0; i < 256; i++)
        heap[i] = -1;
    shmem_barrier_all();
    long vals[128];
    for (int i = 0; i < 128; i++)
        vals[i] = me * 100 + i;
    shmem_long_iput(heap, vals, 2, 1, 128, right);
    shmem_barrier_all();
    for (int i = 0; i < 256; i++)
        if (heap[i] != (i % 2 ? -1 : left * 100 + i / 2)) FAIL("iput: heap[%d]=%ld", i, heap[i]);
    shmem_barrier_all();                   /* checked before the next phase writes heap */

    /* fence: the data put before it is there when the flag put after it is */
    shmem_long_put(heap + 200, vals, 40, right);
    shmem_fence();
    shmem_long_p(&flag_, me + 1, right);
    shmem_long_wait_until(&flag_, SHMEM_CMP_EQ, left + 1);
    for (int i = 0; i < 40; i++)
        if (heap[200 + i] != left * 100 + i) FAIL("fence: heap[%d]=%ld", 200 + i, heap[200 + i]);
    shmem_barrier_all();

    /* atomics: fetch-add from every PE on PE 0, cswap, swap, fetch, set */
    long old = shmem_long_atomic_fetch_add(&counter, me + 1, 0);
    /* (others' adds and increments may come first) */
    if (old < 0 || old > (long)n * (n + 1) / 2 - (me + 1) + (n - 1)) FAIL("fetch_add old %ld", old);
    shmem_long_atomic_inc(&counter, 0);
    shmem_barrier_all();
    if (me == 0 && counter != (long)n * (n + 1) / 2 + n) FAIL("counter %ld", counter);
    long prev = shmem_long_atomic_compare_swap(&word, 0, me + 10, right);
    if (prev != 0) FAIL("cswap prev %ld", prev);
    shmem_barrier_all();
    if (word != left + 10) FAIL("cswap word %ld", word);
    shmem_barrier_all();                   /* checked before the swap below writes word */
    prev = shmem_long_atomic_swap(&word, 5, right);
    if (prev != me + 10) FAIL("swap prev %ld", prev);
    shmem_barrier_all();
    if (shmem_long_atomic_fetch(&word, right) != 5) FAIL("fetch");
    shmem_long_atomic_set(&word, 6, right);
    shmem_barrier_all();
    if (word != 6) FAIL("set %ld", word);

    /* a lock around a read-modify-write on PE 0 */
    shmem_set_lock(&lock);
    long v = shmem_long_g(&rdst, 0);
    shmem_long_p(&rdst, v + 1, 0);
    shmem_quiet();
    shmem_clear_lock(&lock);
    shmem_barrier_all();
    if (me == 0 && rdst != n) FAIL("lock: %ld", rdst);
    shmem_barrier_all();

    /* a collective: sum reduction */
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++)
        psync[i] = SHMEM_SYNC_VALUE;
    rsrc = me + 1;
    shmem_barrier_all();
    shmem_long_sum_to_all(&rdst, &rsrc, 1, 0, 0, n, pwrk, psync);
    if (rdst != (long)n * (n + 1) / 2) FAIL("sum_to_all %ld", rdst);

    void *p = shmem_ptr(heap, right);
    printf("PE %d of %d: OK (shmem_ptr to PE %d: %s)\n", me, n, right, p ? "mapped" : "NULL");
    shmem_barrier_all();
    shmem_free(heap);
    free(src);
    free(big);
    shmem_finalize();
    return 0;
}
