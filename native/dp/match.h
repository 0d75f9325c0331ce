/*
 * match.h — tag matching with MPI's rules (match.c), the data plane's one
 * matcher.
 *
 * A posted receive (ucxdp_recv_t) names a source (or UCXDP_ANY_SOURCE), a
 * tag and a mask; a message (source, tag) matches it when the sources agree
 * and (tag ^ recv.tag) & recv.mask == 0.  A message that finds no receive is
 * kept as an unexpected message (ucxdp_unexp_t) until a receive or a probe
 * takes it.  The caller owns both kinds of object (their memory, what they
 * carry: a buffer, a payload, a rendezvous offer); the matcher only links
 * them into its queues through the fields below, which it alone touches
 * while an object is queued.
 *
 * MPI's order: a message takes the earliest posted receive it matches; a
 * receive or probe takes the oldest unexpected message it matches; each
 * source's messages arrive in order (the transports' promise).
 */
#ifndef UCXDP_MATCH_H
#define UCXDP_MATCH_H

#include <stddef.h>
#include <stdint.h>

#define UCXDP_ANY_SOURCE (-1)
#define UCXDP_FULL_MASK UINT64_MAX

/* the object of type `type` whose member `field` is at `ptr` */
#define UCXDP_CONTAINER(ptr, type, field) ((type *)((char *)(ptr) - offsetof(type, field)))

/* an intrusive doubly-linked list (a ring with a head node) */
typedef struct ucxdp_link {
    struct ucxdp_link *next, *prev;
} ucxdp_link_t;

static inline void ucxdp_list_init(ucxdp_link_t *head)
{
    head->next = head->prev = head;
}

static inline int ucxdp_list_empty(const ucxdp_link_t *head)
{
    return head->next == head;
}

static inline void ucxdp_list_append(ucxdp_link_t *head, ucxdp_link_t *l)
{
    l->prev = head->prev;
    l->next = head;
    head->prev->next = l;
    head->prev = l;
}

static inline void ucxdp_list_remove(ucxdp_link_t *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->next = l->prev = l;
}

/* Move every entry of `head` to `out` (a list head, initialized here), in order. */
static inline void ucxdp_list_take_all(ucxdp_link_t *head, ucxdp_link_t *out)
{
    if (head->next != head) {
        out->next = head->next;
        out->prev = head->prev;
        out->next->prev = out;
        out->prev->next = out;
        head->next = head->prev = head;
    } else {
        out->next = out->prev = out;
    }
}

/* a hash of lists, keyed by (source, tag) */
typedef struct {
    ucxdp_link_t *heads;
    size_t nbuckets;                       /* a power of two */
    size_t count;
} ucxdp_hash_t;

typedef struct ucxdp_recv {
    /* set by the caller before posting */
    int64_t source;
    uint64_t tag, mask;
    /* the matcher's */
    ucxdp_link_t link;                     /* in its hash bucket or the wildcard list */
    uint64_t seq;
    uint8_t where;
} ucxdp_recv_t;

typedef struct ucxdp_unexp {
    /* set by the caller before queueing */
    int64_t source;
    uint64_t tag;
    /* the matcher's */
    ucxdp_link_t all;                      /* arrival order */
    ucxdp_link_t by_key;                   /* its (source, tag) bucket, arrival order */
} ucxdp_unexp_t;

typedef struct {
    ucxdp_hash_t exact;                    /* a source, the full mask: by (source, tag) */
    ucxdp_hash_t bucketed;                 /* a source, bucket_mask: by (source, tag & it) */
    ucxdp_link_t wild;                     /* all other receives, in posting order */
    size_t nwild;
    uint64_t bucket_mask;                  /* 0: no second hash */
    uint64_t seq;
    ucxdp_link_t unexp;                    /* every unexpected message, arrival order */
    ucxdp_hash_t unexp_by_key;
    size_t nunexp;
} ucxdp_matcher_t;

int ucxdp_match_init(ucxdp_matcher_t *m);          /* 0, or -1: no memory */
void ucxdp_match_cleanup(ucxdp_matcher_t *m);      /* the queues' objects stay the caller's */
/* A layer's common mask (mpi_shim leaves out its sequence bits): receives of a
 * source with exactly this mask are hashed too.  Only while nothing is posted. */
int ucxdp_match_set_bucket_mask(ucxdp_matcher_t *m, uint64_t mask);

/* Post `r`: the oldest unexpected message it matches, taken out of the queue
 * (r is not posted then), or NULL with r posted.  -1 in *err: no memory. */
ucxdp_unexp_t *ucxdp_match_post(ucxdp_matcher_t *m, ucxdp_recv_t *r, int *err);
/* Post `r` without looking at the unexpected messages (the caller did). */
int ucxdp_match_post_only(ucxdp_matcher_t *m, ucxdp_recv_t *r);
/* Take a posted receive out (cancel): 1, or 0 when it is not posted. */
int ucxdp_match_remove(ucxdp_matcher_t *m, ucxdp_recv_t *r);
int ucxdp_match_is_posted(const ucxdp_recv_t *r);

/* A message (source, tag) arrived: the earliest posted receive it matches,
 * taken out, or NULL (queue it with ucxdp_match_unexpected). */
ucxdp_recv_t *ucxdp_match_arrived(ucxdp_matcher_t *m, int64_t source, uint64_t tag);
/* The receive ucxdp_match_arrived would take, left posted, or NULL. */
ucxdp_recv_t *ucxdp_match_peek(const ucxdp_matcher_t *m, int64_t source, uint64_t tag);
/* Queue an unexpected message, after every other one.  -1: no memory. */
int ucxdp_match_unexpected(ucxdp_matcher_t *m, ucxdp_unexp_t *u);
/* The oldest unexpected message (source, tag, mask) matches, taken out of
 * the queue when `remove`; or NULL. */
ucxdp_unexp_t *ucxdp_match_probe(ucxdp_matcher_t *m, int64_t source, uint64_t tag,
                                 uint64_t mask, int remove);
/* Take an unexpected message out of the queue (the caller's own reasons). */
void ucxdp_match_unexp_remove(ucxdp_matcher_t *m, ucxdp_unexp_t *u);

/* Could a message from `source` with `tag` (under `mask`) find nothing but a
 * receive about to be posted for it (no wildcard receive, no unexpected
 * message, no posted receive of its key, under `mask` none at all of
 * another kind)?  The blocking receive's shortcut (Worker.tag_try_recv). */
int ucxdp_match_idle_for(const ucxdp_matcher_t *m, int64_t source, uint64_t tag, uint64_t mask);

/* Every posted receive, in posting order within each queue: `fn(r, arg)`;
 * fn may remove r (and only r).  For peer failure and shutdown. */
void ucxdp_match_each_posted(ucxdp_matcher_t *m, void (*fn)(ucxdp_recv_t *, void *), void *arg);
size_t ucxdp_match_posted_count(const ucxdp_matcher_t *m);

#endif
