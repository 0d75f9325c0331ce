/*
 * dp.h — ucxpy's native data plane: the stock protocols executed per
 * operation in C, without the interpreter (UCP's level, beside the core).
 *
 * Theory of operation.  Python is the control plane and the reference: it
 * wires peers up, picks lanes, protocols and thresholds, maps memory and
 * handles failures.  What it decides is handed down once, as plain C state
 * (a worker, a peer's mapped region), and the data plane then executes each
 * operation on that state alone.  Its callers are libucp.so.0 (C programs),
 * the Python binding (ucxpy._dp: the core, mpi_shim, shmem), and plain C test
 * programs; none of this code includes Python.h.
 *
 * Files, by concern (each opens with its own theory of operation):
 *   worker.c  the worker: its lock and its counters
 *   rma.c     put, get and atomics on a peer's memory mapped here
 *   match.c   tag matching (match.h)
 *   tag.c     tagged receives and unexpected messages on the worker's matcher
 *   inbox.c   the shm inbox's eager messages, consumed and matched in C
 *   lane.c    the shm eager send into a peer's inbox
 *   rndv.c    the shm rendezvous: the offer (RTS), its CMA read, the ATS
 *   tcp.c     the tcp eager path: a frame written or read whole on a socket
 *   am.c      active messages: the shm eager send, and arrivals for a C caller's handlers
 *   stream.c  a tcp connection's reader: the tagged eager frames at the stream's head
 *   proto.c   a protocol plug-in's C half (proto.h), for C callers' messages of its sizes
 *   binding.c the one Python binding (extension types, and a capsule with
 *             this API for other extension modules and libucp)
 *
 * One error model: every operation returns a ucxdp_status_t, whose values are
 * UCS's (ucs_status_t; libucp checks that at compile time).  A declined
 * operation (a stale key, an address outside the region, a misaligned
 * atomic) does nothing and says why by its status; the caller's reference
 * path (Python's, or libucp's bridge) then reports the error in its own words.
 *
 * Locking: a worker's lock guards its shared state (queues, pools: none yet
 * in RMA); counters are relaxed atomics, read at any time.  Operations on
 * mapped memory need no lock: the memory is the peer's and ordering is the
 * caller's (flush, fence, quiet, barriers), as UCP's is.
 */
#ifndef UCXDP_H
#define UCXDP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "match.h"

/* -- status: UCS's values ----------------------------------------------------- */
typedef enum {
    UCXDP_OK = 0,
    UCXDP_INPROGRESS = 1,
    /* (not UCS's) a receive matched a message the data plane does not
     * deliver itself (a buffer too small, or none): its payload is in the
     * receive's `handoff`, and the caller's reference path delivers it or
     * reports the error */
    UCXDP_HANDOFF = 2,
    UCXDP_ERR_NO_RESOURCE = -2,            /* declined for now: the caller's path sends */
    UCXDP_ERR_NO_MEMORY = -4,
    UCXDP_ERR_INVALID_PARAM = -5,          /* a bad operation, size or alignment */
    UCXDP_ERR_INVALID_ADDR = -7,           /* the region is no longer registered */
    UCXDP_ERR_MESSAGE_TRUNCATED = -9,
    UCXDP_ERR_OUT_OF_RANGE = -19,          /* outside the key's region */
    UCXDP_ERR_CONNECTION_RESET = -25,      /* the peer failed before it answered */
} ucxdp_status_t;

/* -- counters ------------------------------------------------------------------- */
/* What a worker's data plane executed (proof of use, ucxpy-info's stats and
 * traces read them).  Relaxed atomics: exact, never torn, read at any time. */
#define UCXDP_COUNTERS(X) X(put) X(get) X(atomic) X(put_bytes) X(get_bytes) \
    X(tag_eager) X(tag_expected) X(tag_unexpected) X(tag_handoff) X(tag_direct) X(tag_send) \
    X(rndv_offer) X(rndv_get) X(rndv_get_bytes) X(rndv_ats) X(rndv_expected) X(rndv_answered) \
    X(tcp_send) X(tcp_recv) X(am_send) X(am_recv) X(proto_send) X(proto_frame) X(proto_recv)
#define UCXDP_COUNTER_FIELD(name) uint64_t name;
typedef struct {
    UCXDP_COUNTERS(UCXDP_COUNTER_FIELD)
} ucxdp_counters_t;

#define UCXDP_COUNT(w, name, n) \
    __atomic_fetch_add(&(w)->counters.name, (uint64_t)(n), __ATOMIC_RELAXED)

/* -- the worker ------------------------------------------------------------------ */
/* freed unexpected messages kept for the next ones, by size class (tag.c) */
#define UCXDP_POOL_CLASSES 12              /* 4 KiB .. 8 MiB, powers of two */
#define UCXDP_POOL_DEPTH 64                /* blocks kept per class */

#define UCXDP_POLL_FDS 8

/* Who posted a receive, and so takes it from which done list: the Python
 * binding (ucxpy._dp.TagMatcher) or an external C caller (libucp). */
enum { UCXDP_OWNER_PY, UCXDP_OWNER_EXT, UCXDP_OWNERS };

struct ucxdp_inbox;

/* An active message an external caller's handler takes (am.c): `id`, its
 * user header and data, valid during the call (the worker's lock held). */
typedef void (*ucxdp_am_hook_t)(void *arg, int64_t source, unsigned id, const void *header,
                                uint64_t header_length, const void *data, uint64_t length);

typedef struct ucxdp_worker {
    pthread_mutex_t lock;
    ucxdp_counters_t counters;
    ucxdp_matcher_t matcher;               /* the worker's one matcher (tag.c) */
    /* matched receives not yet delivered, per owner (tag.c) */
    ucxdp_link_t done[UCXDP_OWNERS];
    /* the shm inbox whose eager messages this worker matches, or NULL (set
     * by the binding's Inbox while it lives) */
    struct ucxdp_inbox *inbox;
    /* Python's progress has work of its own beyond that inbox (another
     * transport's endpoints, a layer's callbacks): a C caller progressing
     * this worker then calls it every time (relaxed atomic, set by Python) */
    uint32_t py_poll;
    /* descriptors readable when Python's progress has work nobody else sees
     * (a connection request): a C caller polls them now and then (set by
     * Python once, at the worker's start) */
    int poll_fds[UCXDP_POLL_FDS];
    int npoll_fds;
    void *pool[UCXDP_POOL_CLASSES][UCXDP_POOL_DEPTH];
    int npool[UCXDP_POOL_CLASSES];
    /* an external caller's rendezvous sends (rndv.c): offered and waiting
     * for their answer (those Python's path moves: adopted), then answered
     * and not yet taken */
    ucxdp_link_t sends, adopted, sends_done;
    uint64_t send_ids;
    /* an external caller's active-message handlers (am.c): the ids it
     * claimed (a bitmap of UCXDP_AM_IDS, or NULL) and where their eager
     * arrivals go */
    uint8_t *am_claimed;
    ucxdp_am_hook_t am_hook;
    void *am_arg;
    /* tcp connections whose reading the transport may lend (stream.c),
     * registered by it; each kept alive by its registration */
    struct ucxdp_stream **streams;
    int nstreams, streams_cap;
    /* a protocol plug-in's C half (proto.c, proto.h), or NULL: its table,
     * its instance, the sizes it runs, its frames' id (wire.PLUGIN), and
     * whether its progress may have work left (relaxed atomic) */
    const struct ucxdp_proto_ops *proto_ops;
    void *proto;
    uint64_t proto_sizes[8][2];
    int nproto_sizes;
    unsigned proto_am_id;
    uint32_t proto_owed;
    /* Python's receives are on the done list (relaxed atomic: set when one
     * is appended, cleared when Python takes them): a C caller's pass that
     * matched one leaves its delivery to Python's next pass, which must
     * then deliver even if its own inbox read nothing */
    uint32_t py_done;
} ucxdp_worker_t;

/* A new worker in *out (UCXDP_ERR_NO_MEMORY); destroy accepts NULL and wants
 * its queues empty (their objects are their owners'). */
ucxdp_status_t ucxdp_worker_create(ucxdp_worker_t **out);
void ucxdp_worker_destroy(ucxdp_worker_t *w);
/* A consistent copy of the counters. */
void ucxdp_worker_counters(const ucxdp_worker_t *w, ucxdp_counters_t *out);

/* -- a peer's region mapped here (rma.c) ----------------------------------------- */
enum {
    UCXDP_RKEY_ATOMICS = 1,                /* CPU atomics are this key's atomic mode */
};

/* ucxpy.atomics.OPS' codes */
typedef enum {
    UCXDP_AMO_ADD, UCXDP_AMO_AND, UCXDP_AMO_OR, UCXDP_AMO_XOR, UCXDP_AMO_SWAP, UCXDP_AMO_CSWAP,
    UCXDP_AMO_LAST
} ucxdp_amo_op_t;

/* The region [base, base + length) of a peer, as the peer names it, mapped
 * here at `mapped`.  `guard`, when not NULL, is a word in shared memory that
 * holds `guard_value` for as long as the owner keeps the region registered.
 * The mapping itself is kept by whoever made the key (Python's memory
 * domain), for at least as long as the key is used. */
typedef struct ucxdp_rkey {
    char *mapped;
    uint64_t base;
    uint64_t length;
    const uint64_t *guard;
    uint64_t guard_value;
    unsigned flags;
} ucxdp_rkey_t;

/* Copy `length` bytes from `buffer` to the peer's `remote_addr`: UCXDP_OK when
 * done, else nothing done (OUT_OF_RANGE, INVALID_ADDR). */
ucxdp_status_t ucxdp_put(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                         const void *buffer, size_t length);
/* The same from the peer's `remote_addr` into `buffer`. */
ucxdp_status_t ucxdp_get(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                         void *buffer, size_t length);
/* Atomic `op` on the naturally aligned `size`-byte (4 or 8) word at
 * `remote_addr`; value and compare are truncated to the word; cswap stores
 * `value` where the word equals `compare`.  `old` not NULL: the old value
 * there (any op); NULL: a post (add, and, or, xor only).  Else nothing done:
 * INVALID_PARAM (op, size, alignment, a post of swap/cswap, a key without
 * CPU atomics), OUT_OF_RANGE, INVALID_ADDR. */
ucxdp_status_t ucxdp_atomic(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                            unsigned size, ucxdp_amo_op_t op, uint64_t value, uint64_t compare,
                            uint64_t *old);

/* -- tagged messages (tag.c) --------------------------------------------------- */
/* A posted tagged receive.  The caller sets the matcher fields (source, tag,
 * mask), `buffer` and `capacity`, and owns the memory; the worker links it
 * while it is posted or waits in the done list. */
typedef struct ucxdp_tag_recv {
    ucxdp_recv_t m;
    void *buffer;                          /* NULL: every match is handed to the caller */
    uint64_t capacity;
    uint8_t owner;                         /* UCXDP_OWNER_*: the done list it goes to */
    /* the outcome, once matched */
    ucxdp_status_t status;                 /* OK, HANDOFF (see `handoff`), NO_MEMORY */
    int64_t info_source;
    uint64_t info_tag;
    uint64_t info_length;
    void *handoff;                         /* HANDOFF: the eager payload's copy (free()) */
    ucxdp_link_t done;
} ucxdp_tag_recv_t;

/* An unexpected message: an eager payload kept in `data`, or, with `user`
 * set, the caller's own object (a rendezvous offer its path queued). */
typedef struct ucxdp_tag_unexp {
    ucxdp_unexp_t m;
    uint64_t length;
    void *user;
    uint64_t room;                         /* bytes `data` has (set by the allocation) */
    uint8_t data[];
} ucxdp_tag_unexp_t;

/* An unexpected message with room for `length` bytes of payload, or NULL;
 * freed with ucxdp_tag_unexp_free.  Large ones come from the worker's pool
 * (a window of unexpected 64 KiB messages would otherwise take fresh pages,
 * and their faults, from the allocator for every message). */
ucxdp_tag_unexp_t *ucxdp_tag_unexp_alloc(ucxdp_worker_t *w, uint64_t length);
void ucxdp_tag_unexp_free(ucxdp_worker_t *w, ucxdp_tag_unexp_t *u);

/* Post `r`: *taken = NULL and posted, or *taken = the oldest unexpected
 * message `r` matches, out of the queue (r not posted; the caller delivers
 * it and frees it with ucxdp_tag_unexp_free). */
ucxdp_status_t ucxdp_tag_post(ucxdp_worker_t *w, ucxdp_tag_recv_t *r, ucxdp_tag_unexp_t **taken);
/* Withdraw a posted receive: 1, or 0 when it is not posted (matched). */
int ucxdp_tag_cancel(ucxdp_worker_t *w, ucxdp_tag_recv_t *r);
/* An eager message arrived: into the earliest posted receive it matches (then
 * on the done list), else kept as an unexpected message.  NO_MEMORY: neither
 * (the caller keeps the frame). */
ucxdp_status_t ucxdp_tag_eager(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                               const void *payload, uint64_t length);
/* A message the caller's path handles arrived: the earliest posted receive it
 * matches, taken out (not on the done list), or NULL. */
ucxdp_tag_recv_t *ucxdp_tag_match(ucxdp_worker_t *w, int64_t source, uint64_t tag);
/* Queue the caller's unexpected message `u` (its m.source, m.tag, length,
 * user set; from ucxdp_tag_unexp_alloc). */
void ucxdp_tag_queue(ucxdp_worker_t *w, ucxdp_tag_unexp_t *u);
/* The oldest unexpected message matching, out of the queue when `remove`. */
ucxdp_tag_unexp_t *ucxdp_tag_probe(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                   uint64_t mask, int remove);
/* Move every matched receive of `owner`'s done list to `out` (a list head,
 * initialized here), in completion order. */
void ucxdp_tag_take_done(ucxdp_worker_t *w, int owner, ucxdp_link_t *out);
/* Put receives taken by ucxdp_tag_take_done back in front (not delivered). */
void ucxdp_tag_return_done(ucxdp_worker_t *w, int owner, ucxdp_link_t *list);
/* The receive a done-list link belongs to. */
#define UCXDP_DONE_RECV(l) ((ucxdp_tag_recv_t *)((char *)(l) - offsetof(ucxdp_tag_recv_t, done)))

/* The earliest posted receive a message of `length` bytes with `tag` from
 * `source` matches, when it is an external caller's with room for it (left
 * posted: ucxdp_match_arrived takes it out), else NULL; the worker's lock
 * held (rndv.c, proto.c: the offers a C receive takes) */
ucxdp_tag_recv_t *ucxdp_tag_peek_ext(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                     uint64_t length);
/* Put matched receive `r` (its outcome set) on its owner's done list; the
 * worker's lock held (rndv.c) */
void ucxdp_tag_done_locked(ucxdp_worker_t *w, ucxdp_tag_recv_t *r);
/* ucxdp_tag_eager with the worker's lock held by the caller (inbox.c) */
ucxdp_status_t ucxdp_tag_eager_locked(ucxdp_worker_t *w, int64_t source, uint64_t tag,
                                      const void *payload, uint64_t length);

/* -- the shm inbox (inbox.c) ---------------------------------------------------- */
struct ucxpy_ring;

/* The connections whose frames the data plane takes: a frame's connection
 * id -> the source its messages are matched as.  Python registers a
 * connection once its frames may be matched (wired up, not held, its peer
 * not failed) and forgets it otherwise. */
typedef struct {
    uint64_t conn;                         /* 0: a free entry */
    int64_t source;
    /* our lane back to that source (its ATS go by it), or NULL (rndv.c) */
    struct ucxdp_lane *lane;
} ucxdp_conn_t;

#define UCXDP_INBOX_RANGES 8
#define UCXDP_INBOX_OWED 16

/* an answer to an offer read here that its lane could not take yet */
typedef struct {
    struct ucxdp_lane *lane;
    uint64_t conn;
    uint64_t sreq_id;
} ucxdp_owed_ats_t;

typedef struct ucxdp_inbox {
    struct ucxpy_ring *ring;               /* the consumer's handle (Python's transport owns it) */
    unsigned eager_am_id;                  /* the frames taken: this id, an 8-byte tag header */
    ucxdp_conn_t *conns;                   /* open addressing, `nconns` live of `cap` */
    size_t cap, nconns;
    /* payload sizes [first, last] the caller's protocol runs (the protocol
     * table's "Python" entries): such frames are left to the caller */
    uint64_t handed[UCXDP_INBOX_RANGES][2];
    int nhanded;
    /* a producer waits for space and a consumer that cannot wake it
     * (ucxdp_inbox_progress's caller) took the frame: the binding's next
     * dispatch reports it to Python, which wakes it */
    int owed_wake;
    /* Python has frames of its own queued for this transport's peers (a
     * full ring): its progress must run to push them (set by Python) */
    int py_busy;
    /* the rendezvous (rndv.c; 0: none taken here): the frames' ids, and the
     * largest offer read whole, in C (below the interface's split floor) */
    unsigned rts_am_id, ats_am_id;
    uint64_t rndv_max;
    ucxdp_owed_ats_t owed[UCXDP_INBOX_OWED];
    int nowed;
    /* connections whose peer sleeps and had an answer pushed into its ring
     * (Python's path wakes them; wake_all: more than fit); `owed_wake` is
     * set with them.  Under the worker's lock. */
    uint64_t wake_conns[UCXDP_INBOX_OWED];
    int nwake, wake_all;
    /* the last dispatch stopped at a frame the caller's path runs */
    int stopped;
    /* active messages' eager frames (wire.AM and the user header; 0: none
     * taken here), taken for the worker's external handlers (am.c) */
    unsigned am_eager_id;
} ucxdp_inbox_t;

/* the registered connection `conn`, or NULL (the worker's lock held) */
ucxdp_conn_t *ucxdp_inbox_conn(const ucxdp_inbox_t *in, uint64_t conn);
/* An answer went into the ring of the peer behind connection `conn`, which
 * sleeps: Python's path wakes it (rndv.c; the worker's lock held). */
void ucxdp_inbox_peer_wake(ucxdp_inbox_t *in, uint64_t conn);

ucxdp_status_t ucxdp_inbox_init(ucxdp_inbox_t *in, struct ucxpy_ring *ring, unsigned eager_am_id);
void ucxdp_inbox_cleanup(ucxdp_inbox_t *in);
ucxdp_status_t ucxdp_inbox_add_conn(ucxdp_inbox_t *in, uint64_t conn, int64_t source);
void ucxdp_inbox_forget_conn(ucxdp_inbox_t *in, uint64_t conn);
/* The rendezvous frames the inbox takes: RTS (`rts_am_id`) of a registered
 * connection whose offer an external caller's posted receive takes, read
 * whole when it has at most `rndv_max` bytes; ATS (`ats_am_id`) of an
 * external caller's send (ucxdp_rndv_send).  0: none. */
void ucxdp_inbox_rndv(ucxdp_inbox_t *in, unsigned rts_am_id, unsigned ats_am_id,
                      uint64_t rndv_max);
/* Our lane back to the source of connection `conn` (NULL: none), by which
 * the ATS of offers read here go; the caller keeps it alive while set. */
void ucxdp_inbox_set_lane(ucxdp_inbox_t *in, uint64_t conn, struct ucxdp_lane *lane);
/* whether the caller's protocol runs messages of `length` bytes */
static inline int ucxdp_inbox_handed(const ucxdp_inbox_t *in, uint64_t length)
{
    for (int i = 0; i < in->nhanded; i++)
        if (length >= in->handed[i][0] && length <= in->handed[i][1])
            return 1;
    return 0;
}

/* The payload sizes whose messages the caller's protocol runs: `n` ranges
 * [first, last] (INVALID_PARAM beyond UCXDP_INBOX_RANGES). */
ucxdp_status_t ucxdp_inbox_hand_sizes(ucxdp_inbox_t *in, const uint64_t (*ranges)[2], int n);
/* Take up to `limit` frames, in order, while each is an eager message of a
 * registered connection, polling an empty inbox up to `spins` times first;
 * stops at any other frame (the caller's path takes it).  Returns how many;
 * *wake set when a producer waits for space (the caller wakes it); *bad set
 * when the ring is corrupt. */
long ucxdp_inbox_dispatch(ucxdp_worker_t *w, ucxdp_inbox_t *in, long limit, int spins,
                          int *wake, int *bad);
/* A C caller's progress (libucp's, which has no wake-up of its own):
 * ucxdp_inbox_dispatch without spinning, under the same lock; a wake owed
 * to a producer is kept for Python (owed_wake).  *flags: UCXDP_INBOX_WAKE
 * (one is owed), UCXDP_INBOX_BAD (a corrupt ring), UCXDP_INBOX_LEFT (a frame
 * the caller's path runs is next, or a receive of Python's matched: py_done),
 * UCXDP_INBOX_BUSY (py_busy): each a reason to run Python's progress. */
enum { UCXDP_INBOX_WAKE = 1, UCXDP_INBOX_BAD = 2, UCXDP_INBOX_LEFT = 4, UCXDP_INBOX_BUSY = 8 };
long ucxdp_inbox_progress(ucxdp_worker_t *w, ucxdp_inbox_t *in, long limit, unsigned *flags);
/* A blocking receive's shortcut, for a receive nothing posted or queued
 * could take the message from (the caller checked: ucxdp_match_idle_for):
 * polls an empty inbox up to `spins` times; when the next frame is an eager
 * message of connection `conn` (registered) whose tag equals `tag` under `mask` and whose
 * payload fits `capacity`, copies it to `buffer`, consumes it and returns
 * its length (*got: its tag; *wake: a producer waits for space).  -1: no
 * frame (or a corrupt ring: the caller's path reports it); -2: another frame
 * first, left in the inbox. */
int64_t ucxdp_inbox_try_recv(ucxdp_worker_t *w, ucxdp_inbox_t *in, uint64_t conn, uint64_t tag,
                             uint64_t mask, void *buffer, uint64_t capacity, int spins,
                             uint64_t *got, int *wake);

/* -- the shm eager send (lane.c) ------------------------------------------------- */
/* A connection to a peer's inbox, kept by Python's transport (lane.c says
 * what the flags mean). */
typedef struct ucxdp_lane {
    struct ucxpy_ring *ring;               /* the peer's inbox, as our producer handle */
    unsigned eager_am_id;
    uint64_t max_frame;                    /* the largest payload a frame carries */
    int open;                              /* a frame pushed now is next in order */
    int dead;                              /* gone for good (set before its ring goes) */
    /* the rendezvous (rndv.c): its frames' ids (0: none here), and what the
     * transport says of the two processes (0: unknown) */
    unsigned rts_am_id, ats_am_id;
    uint32_t pid;                          /* ours: the pid our offers' keys name */
    uint32_t peer_pid;                     /* the peer's: the pid of keys we read */
    int cma;                               /* CMA to the peer works */
    unsigned am_eager_id;                  /* active messages' eager frames (0: none, am.c) */
} ucxdp_lane_t;

/* Push an eager message of `length` bytes with `tag` into the lane: UCXDP_OK
 * (sent; *wake: the peer sleeps, wake it), or UCXDP_ERR_NO_RESOURCE with
 * nothing sent (the lane is not open, the ring full or busy, the message too
 * large for a frame): the caller's path sends it. */
ucxdp_status_t ucxdp_lane_eager(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t tag,
                                const void *buffer, uint64_t length, int *wake);

/* -- the shm rendezvous (rndv.c) ------------------------------------------------- */
/* The offer of send `sreq_id`: a TAG_RTS frame (wire.RTS: tag, sreq id, size,
 * address; then the shm key of [buffer, buffer + length) naming lane->pid)
 * pushed into the lane.  UCXDP_OK (*wake: wake the peer) or
 * UCXDP_ERR_NO_RESOURCE with nothing sent (the lane is not open or has no
 * rendezvous, the ring is full or busy): the caller's path offers it.  The
 * caller keeps the buffer until the peer's ATS. */
ucxdp_status_t ucxdp_lane_rts(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t tag,
                              uint64_t sreq_id, const void *buffer, uint64_t length, int *wake);
/* Read an offer whole: `length` bytes at the peer's `remote_addr` into
 * `buffer` by CMA, when `key` (`key_length` bytes) is a shm key of the
 * lane's peer that covers them and CMA to it works.  UCXDP_OK, or
 * UCXDP_ERR_NO_RESOURCE (none of that, or a short read): the caller's path
 * reads it and reports. */
ucxdp_status_t ucxdp_lane_get(ucxdp_worker_t *w, const ucxdp_lane_t *lane, const void *key,
                              size_t key_length, uint64_t remote_addr, void *buffer,
                              uint64_t length);
/* The answer to offer `sreq_id` (wire.ATS: sreq id, status) pushed into the
 * lane: UCXDP_OK (*wake) or UCXDP_ERR_NO_RESOURCE with nothing sent. */
ucxdp_status_t ucxdp_lane_ats(ucxdp_worker_t *w, const ucxdp_lane_t *lane, uint64_t sreq_id,
                              uint8_t status, int *wake);

/* -- an external caller's rendezvous sends (rndv.c) ----------------------------- */
/* The ids of external callers' sends have this bit; Python's never do. */
#define UCXDP_RNDV_EXT_ID (UINT64_C(1) << 63)

/* A rendezvous send: the caller sets `buffer`, `length` and `peer` (a key
 * of its own naming the peer, for ucxdp_rndv_fail_peer), owns the memory and
 * keeps the buffer until the send is answered. */
typedef struct ucxdp_rndv_send {
    const void *buffer;
    uint64_t length;
    int64_t peer;
    uint64_t id;                           /* given by ucxdp_rndv_send */
    ucxdp_status_t status;                 /* once answered: OK or CONNECTION_RESET */
    ucxdp_link_t link;                     /* in the worker's sends, then sends_done */
} ucxdp_rndv_send_t;

#define UCXDP_DONE_SEND(l) \
    ((ucxdp_rndv_send_t *)((char *)(l) - offsetof(ucxdp_rndv_send_t, link)))

/* Offer `s` with `tag` through `lane` (ucxdp_lane_rts): UCXDP_OK, and the
 * send waits for its answer (ATS, which ucxdp_rndv_answered records);
 * UCXDP_ERR_NO_RESOURCE with nothing sent. */
ucxdp_status_t ucxdp_rndv_send(ucxdp_worker_t *w, const ucxdp_lane_t *lane,
                               ucxdp_rndv_send_t *s, uint64_t tag, int *wake);
/* The answer to send `id` arrived (wire.ATS's status: 0 OK, 1 dropped by
 * the receiver, which completes the send as OK, 2 error): 1, or 0 when no
 * send waits for it (it failed already). */
int ucxdp_rndv_answered(ucxdp_worker_t *w, uint64_t id, uint8_t status);
/* The send `id` still waiting for its answer, now the caller's path's, or
 * NULL: that path moves its data when the receiver asks for frames or a
 * split, and answers it itself in the end (ucxdp_rndv_answered); the
 * inbox no longer takes its ATS. */
ucxdp_rndv_send_t *ucxdp_rndv_adopt(ucxdp_worker_t *w, uint64_t id);
/* Every send waiting for an answer of `peer`: answered with `status`. */
void ucxdp_rndv_fail_peer(ucxdp_worker_t *w, int64_t peer, ucxdp_status_t status);
/* Move every answered send to `out` (a list head, initialized here). */
void ucxdp_rndv_take_done(ucxdp_worker_t *w, ucxdp_link_t *out);

/* inbox.c's dispatch, the worker's lock held: take the RTS or ATS frame
 * (`out`: ucxpy_ring_peek's) of connection `c` (NULL: unregistered) when
 * the data plane runs it: 1 (consumed here, *wake: a producer to wake), or
 * 0 (left for the caller's path). */
int ucxdp_rndv_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                          const uint64_t *out, int *wake);
/* Push the answers owed (the lock held); drops those of dead lanes. */
void ucxdp_rndv_push_owed(ucxdp_worker_t *w, ucxdp_inbox_t *in);

/* -- active messages (am.c) ------------------------------------------------------ */
#define UCXDP_AM_IDS 65536
#define UCXDP_AM_HEADER_MAX 512            /* the largest user header sent in C */
#define UCXDP_AM_HEAD 4                    /* wire.AM: u16 id, u16 user header length */

/* An active message's frame header as it goes on the wire (wire.AM, then
 * the user header) into `out` (room for UCXDP_AM_HEAD + header_length):
 * its length.  The caller checked id and header_length. */
size_t ucxdp_am_head(uint8_t *out, unsigned id, const void *header, uint64_t header_length);

/* Where the eager arrivals of ids an external caller claims go (NULL: none;
 * claims stay).  Taken under the worker's lock, so once this returns with
 * NULL the hook is not running and will not run. */
void ucxdp_am_set_hook(ucxdp_worker_t *w, ucxdp_am_hook_t hook, void *arg);
/* Claim active-message `id` for the hook (on) or give it back to the
 * caller's path (off): UCXDP_OK, INVALID_PARAM (id), NO_MEMORY. */
ucxdp_status_t ucxdp_am_claim(ucxdp_worker_t *w, unsigned id, int on);
/* Push an eager active message into the lane: an `am_eager_id` frame whose
 * header is wire.AM (id, header length) and the user header, and whose
 * payload is the data.  UCXDP_OK (*wake: wake the peer), or
 * UCXDP_ERR_NO_RESOURCE with nothing sent (the lane has no such frames, is
 * not open, the ring is full or busy, the header or data too large): the
 * caller's path sends it. */
ucxdp_status_t ucxdp_lane_am(ucxdp_worker_t *w, const ucxdp_lane_t *lane, unsigned id,
                             const void *header, uint64_t header_length, const void *buffer,
                             uint64_t length, int *wake);
/* The inbox's frame ucxpy_ring_peek described in `out`, of connection `c`
 * (NULL: not registered), when it is an eager active message of a claimed
 * id: handed to the hook and released (*wake: a producer waits); 1 taken,
 * 0 not (the caller's path runs it).  The worker's lock held (inbox.c). */
int ucxdp_am_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                        const uint64_t *out, int *wake);
/* the inbox takes active messages' eager frames `am_eager_id` (0: none) */
void ucxdp_inbox_am(ucxdp_inbox_t *in, unsigned am_eager_id);
/* whether active message `id` is an external caller's (claimed, a hook set;
 * the worker's lock held) */
int ucxdp_am_runs(const ucxdp_worker_t *w, unsigned id);

/* -- a protocol plug-in's C half (proto.c; its interface: proto.h) ---------------- */
struct ucxdp_proto_ops;
/* Run `ops` (NULL: none) for C callers' messages of the `n` size ranges
 * [first, last], its frames being `am_id`; `param` goes to its create.
 * INVALID_PARAM (its ABI, too many ranges), NO_MEMORY; any earlier one is
 * destroyed.  The caller's Python half must be the same plug-in. */
ucxdp_status_t ucxdp_proto_set(ucxdp_worker_t *w, const struct ucxdp_proto_ops *ops,
                               uint64_t param, unsigned am_id, const uint64_t (*ranges)[2],
                               int n);
/* whether the C half runs messages of `length` bytes */
int ucxdp_proto_covers(const ucxdp_worker_t *w, uint64_t length);
/* ucxdp_rndv_send's send of the C half's sizes, the worker's lock held */
ucxdp_status_t ucxdp_proto_send_locked(ucxdp_worker_t *w, const ucxdp_lane_t *lane,
                                       ucxdp_rndv_send_t *s, uint64_t tag, int *wake);
/* inbox.c's dispatch, the lock held: the plug-in frame `out` of connection
 * `c` offered to the C half: 1 taken (*wake: a producer to wake), 0 not */
int ucxdp_proto_take_frame(ucxdp_worker_t *w, ucxdp_inbox_t *in, const ucxdp_conn_t *c,
                           const uint64_t *out, int *wake);
/* The same for a frame Python's path read (a connection the inbox does not
 * read; `conn` its id, 0: none): 1 taken, 0 the Python half's.  Takes the lock. */
int ucxdp_proto_frame(ucxdp_worker_t *w, uint64_t conn, const uint8_t *header,
                      size_t header_length, const uint8_t *payload, size_t length);
/* Push what the C half owes (the lock taken here) */
void ucxdp_proto_progress(ucxdp_worker_t *w, ucxdp_inbox_t *in);
/* ucxdp_rndv_fail_peer's part: the C half forgets `peer` (the lock held) */
void ucxdp_proto_fail_peer_locked(ucxdp_worker_t *w, int64_t peer);
/* the worker's send `id` waiting in `sends`, or NULL (the lock held; rndv.c) */
ucxdp_rndv_send_t *ucxdp_rndv_find_locked(ucxdp_worker_t *w, uint64_t id);

/* -- a tcp connection's reader (stream.c) ----------------------------------------- */
/* The bytes of an eager frame on a tcp stream (tcp_frames.PREFIX, then the
 * 8-byte tag): what ucxdp_tcp_eager_send wrote of a frame the socket took
 * in part, and the bound of what ucxdp_tcp_eager_recv gives back unread. */
#define UCXDP_TCP_EAGER_HEAD 24
#define UCXDP_TCP_PREFIX 16                /* tcp_frames.PREFIX alone */
#define UCXDP_TCP_FRAME_MAGIC 0xC5A7

/* An eager frame's head as it is on the wire (little-endian): the prefix
 * (magic, am id, flags, header length, padding, payload length), then the
 * 8-byte tag (tcp.c writes it, tcp.c and stream.c read it) */
typedef struct {
    uint16_t magic;
    uint8_t am_id;
    uint8_t flags;
    uint16_t hlen;
    uint16_t pad;
    uint64_t plen;
    uint64_t tag;
} ucxdp_tcp_head_t;
/* what the reader buffers: at most what the transport's own reader holds
 * (tcp_frames.RBUF_SIZE), which takes it back */
#define UCXDP_STREAM_BUF (64 * 1024)

/* why a reader stopped (ucxdp_stream_t.stopped) */
enum {
    UCXDP_STREAM_FRAME = 1,                /* a frame it does not run, or cannot hold */
    UCXDP_STREAM_EOF = 2,                  /* the peer closed the stream */
    UCXDP_STREAM_ERROR = 3,                /* the socket failed (the transport reads the error) */
    UCXDP_STREAM_CORRUPT = 4,              /* bytes that are not a frame */
    UCXDP_STREAM_RECLAIMED = 5,            /* the transport took the reading back */
};

/* A connection's reading, lent to the data plane by the tcp transport (the
 * memory is the transport's).  `lent`: the data plane reads the socket (set
 * by the transport while nothing of the stream is buffered in Python;
 * cleared by the data plane when it stops, with `stopped` saying why). */
typedef struct ucxdp_stream {
    int fd;
    int64_t source;                        /* the source its messages match as */
    unsigned eager_am_id;                  /* tagged eager frames: an 8-byte tag header */
    uint64_t eager_max;                    /* the largest payload taken here */
    uint32_t lent;
    uint32_t stopped;
    /* a frame written now is next in the connection's order (the transport
     * keeps it: open, nothing of its own queued) */
    uint32_t out_open;
    uint32_t dead;                         /* the transport forgot it for good */
    /* active messages' eager frames (wire.AM and the user header; 0: none),
     * taken for the worker's external handlers (am.c) and sent by them */
    unsigned am_eager_id;
    uint64_t start, end;                   /* read, not taken: [start, end) of buf */
    uint8_t buf[UCXDP_STREAM_BUF];
} ucxdp_stream_t;

/* A stream not lent yet, on socket `fd` (the caller sets `lent`). */
void ucxdp_stream_init(ucxdp_stream_t *s, int fd, int64_t source, unsigned eager_am_id,
                       uint64_t eager_max);
/* Read the socket and take the whole eager frames at the stream's head, in
 * order, up to `limit`: into the worker's matcher (ucxdp_tag_eager).  How
 * many; 0 when not lent.  Stops (see ucxdp_stream_t) at anything else. */
long ucxdp_stream_progress(ucxdp_worker_t *w, ucxdp_stream_t *s, long limit);
/* The bytes read and not taken (the stream's head: the transport parses
 * them before it reads the socket again), out of the stream; valid until the
 * stream is lent again. */
size_t ucxdp_stream_take(ucxdp_stream_t *s, const uint8_t **bytes);
/* Take the reading back (a no-op when not lent): `stopped` RECLAIMED. */
void ucxdp_stream_reclaim(ucxdp_stream_t *s);
/* Register `s` with the worker: 1 added, 0 already there, -1 no memory; or
 * forget it: 1 removed, 0 not registered.  Under the worker's lock. */
int ucxdp_streams_add(ucxdp_worker_t *w, ucxdp_stream_t *s);
int ucxdp_streams_remove(ucxdp_worker_t *w, ucxdp_stream_t *s);
/* A C caller's progress of every registered stream lent: ucxdp_stream_progress
 * on each, up to `limit` frames in all; *left set when a stream stopped and
 * waits for the transport (the caller runs Python's progress then). */
long ucxdp_streams_progress(ucxdp_worker_t *w, long limit, int *left);
/* Send an eager message on the stream when a frame written now is next
 * (out_open) and the message fits eager_max: UCXDP_OK (written whole), or
 * UCXDP_INPROGRESS with *rest > 0: the socket took only part, and the last
 * *rest bytes of the frame (`head`, the frame's first UCXDP_TCP_EAGER_HEAD
 * bytes, then the payload) are the caller's to queue before anything else
 * (out_open is cleared); or UCXDP_ERR_NO_RESOURCE with nothing written (the
 * caller's path sends). */
ucxdp_status_t ucxdp_stream_send(ucxdp_worker_t *w, ucxdp_stream_t *s, uint64_t tag,
                                 const void *buffer, uint64_t length, uint64_t *rest,
                                 uint8_t head[UCXDP_TCP_EAGER_HEAD]);

/* The largest head of an active message's frame on a stream: the prefix,
 * wire.AM, the user header. */
#define UCXDP_STREAM_AM_HEAD_MAX (UCXDP_TCP_PREFIX + UCXDP_AM_HEAD + UCXDP_AM_HEADER_MAX)
/* Send an eager active message on the stream (its `am_eager_id` frame) as
 * ucxdp_stream_send sends a tagged one: UCXDP_OK, UCXDP_INPROGRESS with the
 * last *rest bytes of the frame (`head`, *head_length bytes, then the data)
 * the caller's to queue, or UCXDP_ERR_NO_RESOURCE with nothing written (no
 * such frames here, not open, the header or data too large). */
ucxdp_status_t ucxdp_stream_am_send(ucxdp_worker_t *w, ucxdp_stream_t *s, unsigned id,
                                    const void *header, uint64_t header_length,
                                    const void *buffer, uint64_t length, uint64_t *rest,
                                    uint8_t head[UCXDP_STREAM_AM_HEAD_MAX], size_t *head_length);

/* -- the tcp eager path (tcp.c) ------------------------------------------------- */
#define UCXDP_TCP_SPILL_MAX (32768 + UCXDP_TCP_EAGER_HEAD)

/* Write one eager frame (`am_id`, `tag`, the payload) to the stream socket
 * `fd` with one sendmsg.  Returns the bytes of the frame (HEAD + length) the
 * socket did not take: 0 when it took it all (else the caller queues that
 * tail, which ucxdp_tcp_eager_frame rebuilds); -1 when it took none (full,
 * or an error the caller's path reports). */
int64_t ucxdp_tcp_eager_send(ucxdp_worker_t *w, int fd, unsigned am_id, uint64_t tag,
                             const void *buffer, uint64_t length);
/* Write one frame, `head` then the payload, with one sendmsg: the bytes it
 * did not take (0: all), or -1 when it took none (full, or an error). */
int64_t ucxdp_tcp_frame_send(int fd, const uint8_t *head, size_t head_length,
                             const void *buffer, uint64_t length);
/* A frame's prefix (tcp_frames.PREFIX: magic, am id, flags 0, header and
 * payload lengths) into `out`. */
void ucxdp_tcp_prefix(uint8_t out[UCXDP_TCP_PREFIX], unsigned am_id, uint16_t header_length,
                      uint64_t length);
/* The frame's first HEAD bytes, as ucxdp_tcp_eager_send writes them. */
void ucxdp_tcp_eager_head(uint8_t out[UCXDP_TCP_EAGER_HEAD], unsigned am_id, uint64_t tag,
                          uint64_t length);
/* Take the next frame of the stream socket `fd`, when nothing of it is
 * buffered by the caller, if it is a whole `am_id` eager message whose tag
 * equals `tag` under `mask` and whose payload fits `capacity`: polls up to
 * `spins` times.  Returns its length (*got: its tag); -1: no whole frame
 * (or an error or end of stream, which the caller's path reports); -2: the
 * next frame is another one, or not all there; -3: the stream is out of
 * step with the caller (a bad frame after bytes were taken: the caller
 * fails the connection).  `spill` (room for UCXDP_TCP_SPILL_MAX bytes)
 * receives what was read and not taken, *spill_length bytes, which are the
 * head of the stream: the caller parses them before anything else. */
int64_t ucxdp_tcp_eager_recv(ucxdp_worker_t *w, int fd, unsigned am_id, uint64_t tag,
                             uint64_t mask, void *buffer, uint64_t capacity, int spins,
                             uint64_t *got, uint8_t *spill, size_t *spill_length);

/* -- the C API of the Python binding (ucxpy._dp's capsule) ---------------------- */
/* Extension modules (mpi_shim._accel) and libucp (through its bridge) reach
 * the data plane of the Python process they run in through this table, so
 * there is one data plane per process, whoever calls it. */
#define UCXDP_CAPSULE "ucxpy._dp._C_API"
#define UCXDP_API_VERSION 6

typedef struct ucxdp_api {
    int version;
    /* the C object behind a ucxpy._dp.Worker / MappedKey, else NULL (no error set) */
    ucxdp_worker_t *(*worker_of)(void *py_object);
    const ucxdp_rkey_t *(*rkey_of)(void *py_object);
    /* the worker a MappedKey counts on */
    ucxdp_worker_t *(*rkey_worker)(void *py_object);
    ucxdp_status_t (*put)(ucxdp_worker_t *, const ucxdp_rkey_t *, uint64_t, const void *, size_t);
    ucxdp_status_t (*get)(ucxdp_worker_t *, const ucxdp_rkey_t *, uint64_t, void *, size_t);
    ucxdp_status_t (*atomic)(ucxdp_worker_t *, const ucxdp_rkey_t *, uint64_t, unsigned,
                             ucxdp_amo_op_t, uint64_t, uint64_t, uint64_t *);
    /* tagged receives of an external caller (owner UCXDP_OWNER_EXT) */
    ucxdp_status_t (*tag_post)(ucxdp_worker_t *, ucxdp_tag_recv_t *, ucxdp_tag_unexp_t **);
    int (*tag_cancel)(ucxdp_worker_t *, ucxdp_tag_recv_t *);
    void (*tag_take_done)(ucxdp_worker_t *, int, ucxdp_link_t *);
    void (*tag_unexp_free)(ucxdp_worker_t *, ucxdp_tag_unexp_t *);
    ucxdp_tag_unexp_t *(*tag_probe)(ucxdp_worker_t *, int64_t, uint64_t, uint64_t, int);
    /* the worker's inbox progressed by an external caller: ucxdp_inbox_progress
     * (0 and no flags when the worker has no inbox) */
    long (*inbox_progress)(ucxdp_worker_t *, long, unsigned *);
    /* `adopt(r)`: a Python request (a new reference, or NULL with an
     * exception) standing for the external receive `r`, which Python's path
     * matched (taken out of the matcher) and now delivers or fails through
     * it.  The external caller registers it once; called with the GIL. */
    void (*set_adopt)(void *(*adopt)(ucxdp_tag_recv_t *r));
    /* the C lane behind a ucxpy._dp.Lane, else NULL (no error set) */
    ucxdp_lane_t *(*lane_of)(void *py_object);
    ucxdp_status_t (*lane_eager)(ucxdp_worker_t *, const ucxdp_lane_t *, uint64_t, const void *,
                                 uint64_t, int *);
    /* the shm rendezvous (rndv.c) */
    ucxdp_status_t (*lane_rts)(ucxdp_worker_t *, const ucxdp_lane_t *, uint64_t, uint64_t,
                               const void *, uint64_t, int *);
    ucxdp_status_t (*lane_get)(ucxdp_worker_t *, const ucxdp_lane_t *, const void *, size_t,
                               uint64_t, void *, uint64_t);
    ucxdp_status_t (*lane_ats)(ucxdp_worker_t *, const ucxdp_lane_t *, uint64_t, uint8_t, int *);
    /* an external caller's rendezvous sends */
    ucxdp_status_t (*rndv_send)(ucxdp_worker_t *, const ucxdp_lane_t *, ucxdp_rndv_send_t *,
                                uint64_t, int *);
    void (*rndv_take_done)(ucxdp_worker_t *, ucxdp_link_t *);
    /* active messages (am.c) */
    void (*am_set_hook)(ucxdp_worker_t *, ucxdp_am_hook_t, void *);
    ucxdp_status_t (*am_claim)(ucxdp_worker_t *, unsigned, int);
    ucxdp_status_t (*lane_am)(ucxdp_worker_t *, const ucxdp_lane_t *, unsigned, const void *,
                              uint64_t, const void *, uint64_t, int *);
    /* tcp streams (stream.c): the C stream behind a ucxpy._dp.Stream, else
     * NULL (no error set), and the send */
    ucxdp_stream_t *(*stream_of)(void *py_object);
    ucxdp_status_t (*stream_send)(ucxdp_worker_t *, ucxdp_stream_t *, uint64_t, const void *,
                                  uint64_t, uint64_t *, uint8_t *);
    ucxdp_status_t (*stream_am_send)(ucxdp_worker_t *, ucxdp_stream_t *, unsigned, const void *,
                                     uint64_t, const void *, uint64_t, uint64_t *, uint8_t *,
                                     size_t *);
} ucxdp_api_t;

#endif
