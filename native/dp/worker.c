/*
 * worker.c — the data plane's worker: its lock and its counters.
 *
 * Theory of operation.  One ucxdp_worker_t stands beside each core Worker
 * (Python's ucxpy.Worker makes it through ucxpy._dp.Worker; libucp's
 * ucp_worker_h reaches the same one through the bridge).  Its lock guards the
 * state that operations share (the matcher and the done list of tag.c); its
 * counters say what the data plane executed and are read without the lock.
 */
#include <stdlib.h>
#include <string.h>

#include "dp.h"

ucxdp_status_t ucxdp_worker_create(ucxdp_worker_t **out)
{
    ucxdp_worker_t *w = calloc(1, sizeof(*w));

    if (w == NULL)
        return UCXDP_ERR_NO_MEMORY;
    if (ucxdp_match_init(&w->matcher) < 0) {
        free(w);
        return UCXDP_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&w->lock, NULL) != 0) {
        ucxdp_match_cleanup(&w->matcher);
        free(w);
        return UCXDP_ERR_NO_MEMORY;
    }
    for (int i = 0; i < UCXDP_OWNERS; i++)
        ucxdp_list_init(&w->done[i]);
    ucxdp_list_init(&w->sends);
    ucxdp_list_init(&w->adopted);
    ucxdp_list_init(&w->sends_done);
    *out = w;
    return UCXDP_OK;
}

void ucxdp_worker_destroy(ucxdp_worker_t *w)
{
    if (w == NULL)
        return;
    ucxdp_proto_set(w, NULL, 0, 0, NULL, 0);  /* (a plug-in's C half, if any) */
    pthread_mutex_destroy(&w->lock);
    ucxdp_match_cleanup(&w->matcher);
    free(w->am_claimed);
    free(w->streams);
    for (int c = 0; c < UCXDP_POOL_CLASSES; c++)
        while (w->npool[c] > 0)
            free(w->pool[c][--w->npool[c]]);
    free(w);
}

void ucxdp_worker_counters(const ucxdp_worker_t *w, ucxdp_counters_t *out)
{
#define UCXDP_COUNTER_READ(name) out->name = __atomic_load_n(&w->counters.name, __ATOMIC_RELAXED);
    UCXDP_COUNTERS(UCXDP_COUNTER_READ)
#undef UCXDP_COUNTER_READ
}
