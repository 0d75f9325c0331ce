/*
 * tag.c — tagged receives and unexpected messages on the worker's one
 * matcher (dp.h's ucxdp_tag_*), under the worker's lock.
 *
 * Theory of operation.  A receive (ucxdp_tag_recv_t) is posted once; a
 * message that arrives either finds the earliest posted receive it matches
 * (match.c: MPI's order) or waits as an unexpected message, which the next
 * matching receive or probe takes, oldest first.  The data plane delivers an
 * eager payload itself when the receive has a buffer it fits in: it copies
 * it there and puts the receive on the worker's done list, which the owner
 * (the Python binding, libucp) takes in its progress and completes in its
 * own terms, outside the lock (UCP's rule: completion inside progress).  Any
 * other match is handed off: the payload's copy goes with the receive to
 * the caller's reference path, which delivers it or reports the error
 * (truncation, a receive of any size).
 *
 * Messages whose protocol the caller runs (a rendezvous offer handled in
 * Python) are matched here too, with ucxdp_tag_match, and queued here when
 * nothing matches, with ucxdp_tag_queue: one matcher whoever runs the
 * protocol, so MPI's order holds across them.
 */
#include <stdlib.h>
#include <string.h>

#include "dp.h"


/* -- the unexpected messages' pool ------------------------------------------------- */
#define POOL_MIN_SHIFT 12                  /* 4 KiB: smaller ones come from malloc */

/* the class of a block of `bytes`, or -1 (malloc's) */
static int pool_class(uint64_t bytes)
{
    int c = 0;

    if (bytes <= ((uint64_t)1 << POOL_MIN_SHIFT) / 2)
        return -1;
    while (((uint64_t)1 << (POOL_MIN_SHIFT + c)) < bytes)
        if (++c == UCXDP_POOL_CLASSES)
            return -1;
    return c;
}

/* a block of class `c` (or of `bytes` from malloc when c < 0), its room set */
static ucxdp_tag_unexp_t *block_new(int c, uint64_t bytes)
{
    size_t size = c < 0 ? (size_t)bytes : (size_t)1 << (POOL_MIN_SHIFT + c);
    ucxdp_tag_unexp_t *u = malloc(size);

    if (u != NULL)
        u->room = size - sizeof(*u);
    return u;
}

/* a block of class `c` from the pool (the lock held), or NULL */
static ucxdp_tag_unexp_t *pool_take(ucxdp_worker_t *w, int c)
{
    return c >= 0 && w->npool[c] > 0 ? w->pool[c][--w->npool[c]] : NULL;
}

ucxdp_tag_unexp_t *ucxdp_tag_unexp_alloc(ucxdp_worker_t *w, uint64_t length)
{
    uint64_t bytes = sizeof(ucxdp_tag_unexp_t) + length;
    int c = pool_class(bytes);
    ucxdp_tag_unexp_t *u;

    pthread_mutex_lock(&w->lock);
    u = pool_take(w, c);
    pthread_mutex_unlock(&w->lock);
    return u != NULL ? u : block_new(c, bytes);
}

void ucxdp_tag_unexp_free(ucxdp_worker_t *w, ucxdp_tag_unexp_t *u)
{
    int c;

    if (u == NULL)
        return;
    /* (its class by what it can hold: a caller's message says a length it
     * does not carry here) */
    c = pool_class(sizeof(*u) + u->room);
    if (c >= 0 && ((size_t)1 << (POOL_MIN_SHIFT + c)) == sizeof(*u) + u->room) {
        pthread_mutex_lock(&w->lock);
        if (w->npool[c] < UCXDP_POOL_DEPTH) {
            w->pool[c][w->npool[c]++] = u;
            u = NULL;
        }
        pthread_mutex_unlock(&w->lock);
    }
    free(u);
}

/* the lock held (inbox.c's dispatch holds it for a batch) */
static ucxdp_tag_unexp_t *unexp_alloc_locked(ucxdp_worker_t *w, uint64_t length)
{
    uint64_t bytes = sizeof(ucxdp_tag_unexp_t) + length;
    int c = pool_class(bytes);
    ucxdp_tag_unexp_t *u = pool_take(w, c);

    return u != NULL ? u : block_new(c, bytes);
}

static inline void done_append(ucxdp_worker_t *w, ucxdp_tag_recv_t *r)
{
    int owner = r->owner < UCXDP_OWNERS ? r->owner : UCXDP_OWNER_PY;

    ucxdp_list_append(&w->done[owner], &r->done);
    if (owner == UCXDP_OWNER_PY)
        __atomic_store_n(&w->py_done, 1, __ATOMIC_RELAXED);
}

ucxdp_status_t ucxdp_tag_post(ucxdp_worker_t *w, ucxdp_tag_recv_t *r, ucxdp_tag_unexp_t **taken)
{
    ucxdp_unexp_t *u;
    int err;

    pthread_mutex_lock(&w->lock);
    u = ucxdp_match_post(&w->matcher, &r->m, &err);
    pthread_mutex_unlock(&w->lock);
    *taken = u == NULL ? NULL : UCXDP_CONTAINER(u, ucxdp_tag_unexp_t, m);
    return err ? UCXDP_ERR_NO_MEMORY : UCXDP_OK;
}

int ucxdp_tag_cancel(ucxdp_worker_t *w, ucxdp_tag_recv_t *r)
{
    int removed;

    pthread_mutex_lock(&w->lock);
    removed = ucxdp_match_remove(&w->matcher, &r->m);
    pthread_mutex_unlock(&w->lock);
    return removed;
}

/* the worker's lock held */
static ucxdp_status_t eager_locked(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                   const void *payload, uint64_t length)
{
    ucxdp_recv_t *m = ucxdp_match_arrived(&w->matcher, source, tag);
    ucxdp_tag_recv_t *r;
    ucxdp_tag_unexp_t *u;

    UCXDP_COUNT(w, tag_eager, 1);
    if (m == NULL) {
        u = unexp_alloc_locked(w, length);
        if (u == NULL)
            return UCXDP_ERR_NO_MEMORY;
        u->m.source = source;
        u->m.tag = tag;
        u->length = length;
        u->user = NULL;
        memcpy(u->data, payload, length);
        ucxdp_match_unexpected(&w->matcher, &u->m);
        UCXDP_COUNT(w, tag_unexpected, 1);
        return UCXDP_OK;
    }
    r = UCXDP_CONTAINER(m, ucxdp_tag_recv_t, m);
    r->info_source = source;
    r->info_tag = tag;
    r->info_length = length;
    r->handoff = NULL;
    if (r->buffer != NULL && length <= r->capacity) {
        memcpy(r->buffer, payload, length);
        r->status = UCXDP_OK;
        UCXDP_COUNT(w, tag_expected, 1);
    } else {
        /* (malloc(0) may be NULL: one byte more).  Without memory the
         * receive completes with NO_MEMORY: an error, not a hang */
        r->handoff = malloc(length + 1);
        if (r->handoff != NULL) {
            memcpy(r->handoff, payload, length);
            r->status = UCXDP_HANDOFF;
        } else {
            r->status = UCXDP_ERR_NO_MEMORY;
        }
        UCXDP_COUNT(w, tag_handoff, 1);
    }
    done_append(w, r);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_tag_eager(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                               const void *payload, uint64_t length)
{
    ucxdp_status_t status;

    pthread_mutex_lock(&w->lock);
    status = eager_locked(w, source, tag, payload, length);
    pthread_mutex_unlock(&w->lock);
    return status;
}

ucxdp_tag_recv_t *ucxdp_tag_match(ucxdp_worker_t *w, int64_t source, uint64_t tag)
{
    ucxdp_recv_t *m;

    pthread_mutex_lock(&w->lock);
    m = ucxdp_match_arrived(&w->matcher, source, tag);
    pthread_mutex_unlock(&w->lock);
    return m == NULL ? NULL : UCXDP_CONTAINER(m, ucxdp_tag_recv_t, m);
}

void ucxdp_tag_queue(ucxdp_worker_t *w, ucxdp_tag_unexp_t *u)
{
    pthread_mutex_lock(&w->lock);
    ucxdp_match_unexpected(&w->matcher, &u->m);
    pthread_mutex_unlock(&w->lock);
}

ucxdp_tag_unexp_t *ucxdp_tag_probe(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                   uint64_t mask, int remove)
{
    ucxdp_unexp_t *u;

    pthread_mutex_lock(&w->lock);
    u = ucxdp_match_probe(&w->matcher, source, tag, mask, remove);
    pthread_mutex_unlock(&w->lock);
    return u == NULL ? NULL : UCXDP_CONTAINER(u, ucxdp_tag_unexp_t, m);
}

void ucxdp_tag_take_done(ucxdp_worker_t *w, int owner, ucxdp_link_t *out)
{
    pthread_mutex_lock(&w->lock);
    ucxdp_list_take_all(&w->done[owner], out);
    if (owner == UCXDP_OWNER_PY)
        __atomic_store_n(&w->py_done, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->lock);
}

void ucxdp_tag_return_done(ucxdp_worker_t *w, int owner, ucxdp_link_t *list)
{
    ucxdp_link_t *done = &w->done[owner];

    if (list->next == list)
        return;
    pthread_mutex_lock(&w->lock);
    /* list's entries, then what is on the done list now */
    list->prev->next = done->next;
    done->next->prev = list->prev;
    done->next = list->next;
    list->next->prev = done;
    list->next = list->prev = list;
    if (owner == UCXDP_OWNER_PY)
        __atomic_store_n(&w->py_done, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&w->lock);
}

/* for inbox.c: the lock held by the caller */
ucxdp_status_t ucxdp_tag_eager_locked(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                      const void *payload, uint64_t length)
{
    return eager_locked(w, source, tag, payload, length);
}

ucxdp_tag_recv_t *ucxdp_tag_peek_ext(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                     uint64_t length)
{
    ucxdp_recv_t *m = ucxdp_match_peek(&w->matcher, source, tag);
    ucxdp_tag_recv_t *r = m != NULL ? UCXDP_CONTAINER(m, ucxdp_tag_recv_t, m) : NULL;

    if (r == NULL || r->owner != UCXDP_OWNER_EXT || r->buffer == NULL || length > r->capacity)
        return NULL;
    return r;
}

void ucxdp_tag_done_locked(ucxdp_worker_t *w, ucxdp_tag_recv_t *r)
{
    done_append(w, r);
}
