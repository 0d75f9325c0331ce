/* A put or atomic to a PE that polls with shmem_test (shmem4py's
 * demo/race_winner_test.py in C).  PE 0 polls its own symmetric array with
 * shmem_int_test (OSHMEM's mca_spml_base_test reads the memory and calls no
 * progress); every other PE sets its slot with shmem_int_atomic_set (or
 * shmem_int_p when built with -DWITH_PUT) and goes on to shmem_free's
 * barrier.  On the real UCX the update lands without PE 0's progress; the
 * job ends at once.
 *
 *   oshcc -o /tmp/shmem_test_poll conformance/openmpi/shmem_test_poll.c
 *   ucxpy-ucx --check /usr/bin/oshrun --oversubscribe --timeout 10 -n 2 /tmp/shmem_test_poll
 *   ucxpy-ucx --reference /usr/bin/oshrun --oversubscribe --timeout 10 -n 2 /tmp/shmem_test_poll
 */
#include <stdio.h>
#include <shmem.h>

int main(void)
{
    shmem_init();
    int me = shmem_my_pe(), npes = shmem_n_pes();
    int *w = shmem_calloc(npes, sizeof(int));
    if (me == 0) {
        int idx = 0;
        while (!shmem_int_test(&w[idx], SHMEM_CMP_NE, 0))
            idx = (idx + 1) % npes;
        printf("PE 0 observed first update from PE %d\n", idx);
    } else {
#ifdef WITH_PUT
        shmem_int_p(&w[me], me, 0);
#else
        shmem_int_atomic_set(&w[me], me, 0);
#endif
    }
    shmem_free(w);
    shmem_finalize();
    return 0;
}
