/*
 * match.c — the data plane's tag matching (match.h), UCX's structure
 * (src/ucp/tag/tag_match.c) with ucxpy.tag's rules.
 *
 * Theory of operation.  Posted receives sit in one of three queues, by what
 * they name: a source and the full mask -> the exact hash, keyed by (source,
 * tag); a source and the layer's bucket mask -> the bucketed hash, keyed by
 * (source, tag & mask); anything else (any source, any other mask) -> the
 * wildcard list.  Every receive gets the next sequence number when posted.
 * An arriving (source, tag) looks at the first receive of its exact bucket
 * list with its key, the first of its bucketed list with its key, and walks
 * the wildcard list until a receive posted later than the best candidate:
 * the lowest sequence number that matches wins, which is MPI's "earliest
 * posted" rule.  A hash bucket is a list of receives of several keys in
 * posting order; its first one with the key is that key's oldest.
 *
 * Unexpected messages sit in one list in arrival order and in a hash by
 * (source, tag), also in arrival order.  A receive with a source and the full
 * mask takes the first of its key's bucket with its key; any other receive or
 * probe walks the arrival list.  Both give the oldest match.
 *
 * Hashes grow (doubling) when they hold twice as many entries as buckets, so
 * a bucket stays a few entries long; they never shrink.
 */
#include <stdlib.h>

#include "match.h"

enum { WHERE_NONE, WHERE_EXACT, WHERE_BUCKETED, WHERE_WILD };

#define HASH_MIN_BUCKETS 64

/* -- lists ---------------------------------------------------------------------- */

/* -- hashes ----------------------------------------------------------------------- */
static inline uint64_t key_hash(int64_t source, uint64_t tag)
{
    uint64_t h = tag ^ ((uint64_t)source * 0x9E3779B97F4A7C15ULL);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 32);
}

static int hash_init(ucxdp_hash_t *h)
{
    h->heads = malloc(HASH_MIN_BUCKETS * sizeof(*h->heads));
    if (h->heads == NULL)
        return -1;
    h->nbuckets = HASH_MIN_BUCKETS;
    h->count = 0;
    for (size_t i = 0; i < h->nbuckets; i++)
        ucxdp_list_init(&h->heads[i]);
    return 0;
}

static inline ucxdp_link_t *hash_bucket(const ucxdp_hash_t *h, int64_t source, uint64_t tag)
{
    return &h->heads[key_hash(source, tag) & (h->nbuckets - 1)];
}

/* Rehash into twice the buckets; each bucket's order is kept because a
 * bucket's entries are moved in order and keys never span two new buckets'
 * relative order (entries of one key stay in one bucket, in order).
 * `key_of` gives an entry's key.  On no memory the hash stays as it is. */
static void hash_grow(ucxdp_hash_t *h, void (*key_of)(ucxdp_link_t *, int64_t *, uint64_t *))
{
    size_t n = h->nbuckets * 2;
    ucxdp_link_t *heads = malloc(n * sizeof(*heads));

    if (heads == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        ucxdp_list_init(&heads[i]);
    for (size_t i = 0; i < h->nbuckets; i++) {
        ucxdp_link_t *head = &h->heads[i];
        while (!ucxdp_list_empty(head)) {
            ucxdp_link_t *l = head->next;
            int64_t source;
            uint64_t tag;
            key_of(l, &source, &tag);
            ucxdp_list_remove(l);
            ucxdp_list_append(&heads[key_hash(source, tag) & (n - 1)], l);
        }
    }
    free(h->heads);
    h->heads = heads;
    h->nbuckets = n;
}

/* -- posted receives -------------------------------------------------------------- */
static void recv_key(ucxdp_link_t *l, int64_t *source, uint64_t *tag)
{
    ucxdp_recv_t *r = UCXDP_CONTAINER(l, ucxdp_recv_t, link);
    *source = r->source;
    *tag = r->tag & r->mask;               /* exact: the full mask; bucketed: its mask */
}

static void unexp_key(ucxdp_link_t *l, int64_t *source, uint64_t *tag)
{
    ucxdp_unexp_t *u = UCXDP_CONTAINER(l, ucxdp_unexp_t, by_key);
    *source = u->source;
    *tag = u->tag;
}

int ucxdp_match_init(ucxdp_matcher_t *m)
{
    if (hash_init(&m->exact) < 0)
        return -1;
    if (hash_init(&m->bucketed) < 0) {
        free(m->exact.heads);
        return -1;
    }
    if (hash_init(&m->unexp_by_key) < 0) {
        free(m->bucketed.heads);
        free(m->exact.heads);
        return -1;
    }
    ucxdp_list_init(&m->wild);
    ucxdp_list_init(&m->unexp);
    m->nwild = 0;
    m->nunexp = 0;
    m->bucket_mask = 0;
    m->seq = 0;
    return 0;
}

void ucxdp_match_cleanup(ucxdp_matcher_t *m)
{
    free(m->exact.heads);
    free(m->bucketed.heads);
    free(m->unexp_by_key.heads);
    m->exact.heads = m->bucketed.heads = m->unexp_by_key.heads = NULL;
}

int ucxdp_match_set_bucket_mask(ucxdp_matcher_t *m, uint64_t mask)
{
    if (ucxdp_match_posted_count(m))
        return -1;
    m->bucket_mask = mask == UCXDP_FULL_MASK ? 0 : mask;
    return 0;
}

size_t ucxdp_match_posted_count(const ucxdp_matcher_t *m)
{
    return m->exact.count + m->bucketed.count + m->nwild;
}

int ucxdp_match_is_posted(const ucxdp_recv_t *r)
{
    return r->where != WHERE_NONE;
}

int ucxdp_match_post_only(ucxdp_matcher_t *m, ucxdp_recv_t *r)
{
    ucxdp_hash_t *h = NULL;

    r->seq = ++m->seq;
    if (r->source != UCXDP_ANY_SOURCE) {
        if (r->mask == UCXDP_FULL_MASK) {
            h = &m->exact;
            r->where = WHERE_EXACT;
        } else if (m->bucket_mask && r->mask == m->bucket_mask) {
            h = &m->bucketed;
            r->where = WHERE_BUCKETED;
        }
    }
    if (h == NULL) {
        r->where = WHERE_WILD;
        ucxdp_list_append(&m->wild, &r->link);
        m->nwild++;
        return 0;
    }
    if (h->count >= 2 * h->nbuckets)
        hash_grow(h, recv_key);
    ucxdp_list_append(hash_bucket(h, r->source, r->tag & r->mask), &r->link);
    h->count++;
    return 0;
}

/* the first receive of `h`'s bucket of (source, key) with that key */
static ucxdp_recv_t *hash_first(const ucxdp_hash_t *h, int64_t source, uint64_t key,
                                uint64_t mask)
{
    ucxdp_link_t *head = hash_bucket(h, source, key), *l;

    for (l = head->next; l != head; l = l->next) {
        ucxdp_recv_t *r = UCXDP_CONTAINER(l, ucxdp_recv_t, link);
        if (r->source == source && (r->tag & mask) == key && r->mask == mask)
            return r;
    }
    return NULL;
}

int ucxdp_match_remove(ucxdp_matcher_t *m, ucxdp_recv_t *r)
{
    switch (r->where) {
    case WHERE_EXACT: m->exact.count--; break;
    case WHERE_BUCKETED: m->bucketed.count--; break;
    case WHERE_WILD: m->nwild--; break;
    default: return 0;
    }
    ucxdp_list_remove(&r->link);
    r->where = WHERE_NONE;
    return 1;
}

ucxdp_recv_t *ucxdp_match_arrived(ucxdp_matcher_t *m, int64_t source, uint64_t tag)
{
    ucxdp_recv_t *best = ucxdp_match_peek(m, source, tag);

    if (best != NULL)
        ucxdp_match_remove(m, best);
    return best;
}

ucxdp_recv_t *ucxdp_match_peek(const ucxdp_matcher_t *m, int64_t source, uint64_t tag)
{
    ucxdp_recv_t *best = m->exact.count ? hash_first(&m->exact, source, tag, UCXDP_FULL_MASK)
                                        : NULL;
    ucxdp_link_t *l;

    if (m->bucketed.count) {
        ucxdp_recv_t *b = hash_first(&m->bucketed, source, tag & m->bucket_mask,
                                     m->bucket_mask);
        if (b != NULL && (best == NULL || b->seq < best->seq))
            best = b;
    }
    for (l = m->wild.next; l != &m->wild; l = l->next) {
        ucxdp_recv_t *w = UCXDP_CONTAINER(l, ucxdp_recv_t, link);
        if (best != NULL && w->seq > best->seq)
            break;
        if ((w->source == UCXDP_ANY_SOURCE || w->source == source)
                && ((tag ^ w->tag) & w->mask) == 0) {
            best = w;
            break;
        }
    }
    return best;
}

/* -- unexpected messages -------------------------------------------------------------- */
int ucxdp_match_unexpected(ucxdp_matcher_t *m, ucxdp_unexp_t *u)
{
    ucxdp_hash_t *h = &m->unexp_by_key;

    if (h->count >= 2 * h->nbuckets)
        hash_grow(h, unexp_key);
    ucxdp_list_append(&m->unexp, &u->all);
    ucxdp_list_append(hash_bucket(h, u->source, u->tag), &u->by_key);
    h->count++;
    m->nunexp++;
    return 0;
}

void ucxdp_match_unexp_remove(ucxdp_matcher_t *m, ucxdp_unexp_t *u)
{
    ucxdp_list_remove(&u->all);
    ucxdp_list_remove(&u->by_key);
    m->unexp_by_key.count--;
    m->nunexp--;
}

ucxdp_unexp_t *ucxdp_match_probe(ucxdp_matcher_t *m, int64_t source, uint64_t tag,
                                 uint64_t mask, int remove)
{
    ucxdp_unexp_t *found = NULL;
    ucxdp_link_t *head, *l;

    if (!m->nunexp)
        return NULL;
    if (source != UCXDP_ANY_SOURCE && mask == UCXDP_FULL_MASK) {
        head = hash_bucket(&m->unexp_by_key, source, tag);
        for (l = head->next; l != head; l = l->next) {
            ucxdp_unexp_t *u = UCXDP_CONTAINER(l, ucxdp_unexp_t, by_key);
            if (u->source == source && u->tag == tag) {
                found = u;
                break;
            }
        }
    } else {
        for (l = m->unexp.next; l != &m->unexp; l = l->next) {
            ucxdp_unexp_t *u = UCXDP_CONTAINER(l, ucxdp_unexp_t, all);
            if ((source == UCXDP_ANY_SOURCE || u->source == source)
                    && ((u->tag ^ tag) & mask) == 0) {
                found = u;
                break;
            }
        }
    }
    if (found != NULL && remove)
        ucxdp_match_unexp_remove(m, found);
    return found;
}

ucxdp_unexp_t *ucxdp_match_post(ucxdp_matcher_t *m, ucxdp_recv_t *r, int *err)
{
    ucxdp_unexp_t *u = ucxdp_match_probe(m, r->source, r->tag, r->mask, 1);

    *err = 0;
    if (u != NULL) {
        r->where = WHERE_NONE;
        return u;
    }
    *err = ucxdp_match_post_only(m, r);
    return NULL;
}

int ucxdp_match_idle_for(const ucxdp_matcher_t *m, int64_t source, uint64_t tag, uint64_t mask)
{
    if (m->nwild || m->nunexp)
        return 0;
    if (mask == UCXDP_FULL_MASK) {
        if (m->exact.count && hash_first(&m->exact, source, tag, UCXDP_FULL_MASK) != NULL)
            return 0;
    } else if (m->exact.count) {
        return 0;
    }
    if (m->bucketed.count) {
        if (mask != UCXDP_FULL_MASK && mask != m->bucket_mask)
            return 0;
        if (hash_first(&m->bucketed, source, tag & m->bucket_mask, m->bucket_mask) != NULL)
            return 0;
    }
    return 1;
}

void ucxdp_match_each_posted(ucxdp_matcher_t *m, void (*fn)(ucxdp_recv_t *, void *), void *arg)
{
    ucxdp_hash_t *hashes[] = {&m->exact, &m->bucketed};
    ucxdp_link_t *l, *next;

    for (size_t i = 0; i < 2; i++)
        for (size_t b = 0; b < hashes[i]->nbuckets; b++)
            for (l = hashes[i]->heads[b].next; l != &hashes[i]->heads[b]; l = next) {
                next = l->next;
                fn(UCXDP_CONTAINER(l, ucxdp_recv_t, link), arg);
            }
    for (l = m->wild.next; l != &m->wild; l = next) {
        next = l->next;
        fn(UCXDP_CONTAINER(l, ucxdp_recv_t, link), arg);
    }
}
