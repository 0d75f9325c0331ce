/*
 * Multi-producer / single-consumer ring of variable-length frames in shared
 * memory: the receive queue ("inbox") of one process, which every peer
 * process on the host writes to.
 *
 * Theory of operation
 * -------------------
 * The control block holds two free-running 64-bit byte counters: ``head``
 * (advanced by a producer after a frame is fully written, store-release)
 * and ``tail`` (advanced by the consumer after a frame is consumed,
 * store-release).  ``head - tail`` is the number of bytes in use; the byte
 * position of a counter is ``counter & mask``.  Each counter lives on its own
 * 128-byte block (two cache lines: adjacent-line prefetchers otherwise cause
 * false sharing).
 *
 * Producers take turns through ``lock``: a push compare-and-swaps it from 0
 * to the producer's token (its pid), writes the frame, publishes ``head`` and
 * stores 0.  A push that finds the lock taken returns UCXPY_RING_BUSY at once
 * (the caller queues the frame, as for a full ring): send never blocks.  A
 * producer that died holding the lock published nothing (``head`` moves only
 * after the whole frame is written), so another process may break the lock
 * once it knows the holder is dead (ucxpy_ring_break_lock); the dead
 * producer's partial frame is simply overwritten.
 *
 * A frame is a 16-byte prefix {u32 paylen, u16 hdrlen, u8 am_id, u8 kind,
 * u64 source} followed by the header padded to 8 bytes and the payload padded
 * to 8 bytes, so every frame starts 8-aligned and payloads are 8-aligned.
 * ``source`` is the producer's connection id (ucxpy_ring_attach_producer); the
 * consumer hands frames to connections by it, and each producer pushes its
 * frames in order, so every connection's frames stay in order.  Frames never
 * wrap: when a frame does not fit before the end of the data area the producer
 * writes a PAD prefix that tells the consumer to skip to position 0.  A CLOSE
 * prefix (no header, no payload) is a connection's last frame.
 *
 * Everything the consumer reads from shared memory is copied to locals before
 * it is validated; a frame whose lengths do not fit the published bytes (or
 * the data area) yields UCXPY_RING_CORRUPT instead of an out-of-bounds read.
 *
 * Sleeping: a consumer about to block sets ``sleeping`` then re-checks
 * ``head``; a producer publishes ``head`` then checks ``sleeping`` (a full
 * fence on each side, Dekker style).  The producer that finds the flag set
 * clears it with an exchange and returns UCXPY_RING_NOTIFY, so exactly one
 * wake-up system call is made per sleep.  A producer waiting for free space
 * writes its source into ``waiters`` (or sets ``waiters_lost`` when the table
 * is full) and sets ``prod_waiting``; the consumer's release that finds
 * ``prod_waiting`` returns NOTIFY and ucxpy_ring_take_waiters names whom to
 * wake.  ``closed`` is set by the consumer: it takes no more frames.
 *
 * Corruption: the ring is shared with every peer, so a consumer that finds
 * it corrupt cannot tell whose frames it lost.  It resets the ring instead
 * (ucxpy_ring_reset, under the lock): it discards the published bytes from
 * its tail to ``head``, records that range under a new ``epoch`` and repairs
 * the control block.  Each producer knows where its own last frame ended; the
 * first push after a reset (or ucxpy_ring_check_lost) compares that with the
 * discarded ranges and reports LOST only to the connections that lost
 * frames, which then fail (LOST sticks to the handle: every later push
 * returns it too, so no caller can go on past a gap).  Everyone else goes on.
 *
 * The epoch is shared memory too, and a peer may scribble on it.  Only the
 * consumer writes it, by one at a time, each time with its record: a
 * producer takes an epoch that went backwards, or one whose record does not
 * name it, for a scribble and ignores it (no connection fails for it), and
 * the consumer, which keeps its own count, puts the shared copy back
 * (ucxpy_ring_check_header).
 */
#include <stdatomic.h>
#include <stdalign.h>
#include <string.h>

#include "ucxpy_native.h"

#define RING_MAGIC   0x32474e4950584355ULL /* "UCXPING2" little endian */
#define KIND_FRAME   1
#define KIND_PAD     2
#define KIND_CLOSE   3
#define ALIGN8(x)    (((uint64_t)(x) + 7u) & ~(uint64_t)7u)
#define MIN_CAPACITY 1024u
#define MAX_CAPACITY (1ULL << 32)
#define RESETS_KEPT  4

typedef struct ring_shared {
    alignas(128) uint64_t magic;                /* read-only after init ... */
    uint64_t capacity;
    _Atomic uint32_t closed;                    /* ... but for this, set once */
    alignas(128) _Atomic uint64_t head;         /* producers' block */
    _Atomic uint32_t lock;                      /* 0 or the pushing producer's token */
    _Atomic uint32_t prod_waiting;
    alignas(128) _Atomic uint64_t tail;         /* consumer-written block */
    alignas(128) _Atomic uint32_t sleeping;     /* consumer-written, rarely */
    alignas(128) _Atomic uint32_t waiters_lost; /* a waiter found the table full */
    _Atomic uint64_t waiters[UCXPY_RING_WAITERS];
    alignas(128) _Atomic uint64_t epoch;        /* resets so far (under the lock) */
    uint64_t reset_at[RESETS_KEPT];             /* per reset (epoch % RESETS_KEPT): */
    uint64_t reset_to[RESETS_KEPT];             /*   the bytes [at, to) were discarded */
    uint64_t reset_epoch[RESETS_KEPT];          /*   and the epoch it made */
} ring_shared_t;

_Static_assert(sizeof(ring_shared_t) <= UCXPY_RING_HDR_SIZE, "ring header too big");

typedef struct frame_prefix {
    uint32_t paylen;
    uint16_t hdrlen;
    uint8_t  am_id;
    uint8_t  kind;
    uint64_t source;
} frame_prefix_t;

_Static_assert(sizeof(frame_prefix_t) == UCXPY_RING_PREFIX, "prefix size");

#define SHARED(r) ((ring_shared_t *)(r)->shared)

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

size_t ucxpy_ring_mem_size(size_t capacity)
{
    return UCXPY_RING_HDR_SIZE + capacity;
}

/* Initialise a fresh ring in ``mem`` (memsize = header + power-of-two data).
 * Returns 0, or -1 when the size is not acceptable. */
int ucxpy_ring_init(void *mem, size_t memsize)
{
    ring_shared_t *s = (ring_shared_t *)mem;
    uint64_t cap;

    if (mem == NULL || ((uintptr_t)mem & 127) || memsize <= UCXPY_RING_HDR_SIZE)
        return -1;
    cap = memsize - UCXPY_RING_HDR_SIZE;
    if (!is_pow2(cap) || cap < MIN_CAPACITY || cap > MAX_CAPACITY)
        return -1;
    memset(mem, 0, UCXPY_RING_HDR_SIZE);
    s->capacity = cap;
    atomic_store_explicit(&s->head, 0, memory_order_relaxed);
    atomic_store_explicit(&s->tail, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    s->magic = RING_MAGIC;
    atomic_thread_fence(memory_order_seq_cst);
    return 0;
}

/* Fill the local handle ``r`` for the ring at ``mem``.  The geometry comes
 * from ``memsize`` (what we mapped), never from shared memory; the shared
 * copy is only checked against it.  This is the consumer's handle (see
 * ucxpy_ring_attach_producer).  Returns 0 or -1 (bad magic / size). */
/* The geometry both handles share: ``r`` cleared and pointed at the ring at
 * ``mem`` of ``memsize`` bytes we mapped.  Returns its capacity, or 0 when
 * the size or alignment is not acceptable (``r`` untouched then). */
static uint64_t attach_geometry(ucxpy_ring_t *r, void *mem, size_t memsize)
{
    uint64_t cap;

    if (r == NULL || mem == NULL || ((uintptr_t)mem & 127) ||
        memsize <= UCXPY_RING_HDR_SIZE)
        return 0;
    cap = memsize - UCXPY_RING_HDR_SIZE;
    if (!is_pow2(cap) || cap < MIN_CAPACITY || cap > MAX_CAPACITY)
        return 0;
    memset(r, 0, sizeof *r);
    r->shared = mem;
    r->data = (uint8_t *)mem + UCXPY_RING_HDR_SIZE;
    r->capacity = cap;
    r->mask = cap - 1;
    return cap;
}

int ucxpy_ring_attach(ucxpy_ring_t *r, void *mem, size_t memsize)
{
    ring_shared_t *s = (ring_shared_t *)mem;
    ucxpy_ring_t h;
    uint64_t cap = attach_geometry(&h, mem, memsize), head, tail;

    if (cap == 0 || r == NULL || s->magic != RING_MAGIC || s->capacity != cap)
        return -1;
    atomic_thread_fence(memory_order_acquire);
    head = atomic_load_explicit(&s->head, memory_order_acquire);
    tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    if (head - tail > cap || (head & 7) || (tail & 7))
        return -1;
    h.head = head;
    h.tail = tail;
    h.epoch = atomic_load_explicit(&s->epoch, memory_order_acquire);
    *r = h;
    return 0;
}

/* Fill ``r`` as a producer handle of the ring at ``mem``: its frames carry
 * ``source`` (nonzero) and it takes the lock as ``token`` (nonzero; the
 * process id, so that others can tell whether a holder still lives).  Only
 * the geometry we mapped is checked: the shared state is the consumer's to
 * validate and repair, and every push re-checks what it uses.  Returns 0 or
 * -1. */
int ucxpy_ring_attach_producer(ucxpy_ring_t *r, void *mem, size_t memsize,
                               uint64_t source, uint32_t token)
{
    ring_shared_t *s;
    unsigned k;

    if (source == 0 || token == 0 || attach_geometry(r, mem, memsize) == 0)
        return -1;
    r->source = source;
    r->token = token;
    /* no frame of ours yet (head 0): earlier resets discarded nothing of
     * ours.  An epoch no record names is a scribble: the newest record's. */
    s = SHARED(r);
    r->epoch = atomic_load_explicit(&s->epoch, memory_order_acquire);
    if (r->epoch != 0 && s->reset_epoch[r->epoch % RESETS_KEPT] != r->epoch) {
        r->epoch = 0;
        for (k = 0; k < RESETS_KEPT; k++)
            if (s->reset_epoch[k] % RESETS_KEPT == k && s->reset_epoch[k] > r->epoch)
                r->epoch = s->reset_epoch[k];
    }
    return 0;
}

/* Largest payload a frame with a ``hdrlen``-byte header may carry.  A frame
 * may occupy at most half the ring, so that it plus a worst-case PAD always
 * fits an empty ring. */
size_t ucxpy_ring_max_payload(const ucxpy_ring_t *r, size_t hdrlen)
{
    uint64_t limit = r->capacity / 2;
    uint64_t fixed = UCXPY_RING_PREFIX + ALIGN8(hdrlen);
    if (fixed >= limit)
        return 0;
    return (size_t)((limit - fixed) & ~(uint64_t)7u);
}

static int wake_check(_Atomic uint32_t *flag)
{
    /* Pairs with the fence in the arm functions: either the sleeper sees our
     * index update, or we see its flag. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(flag, memory_order_relaxed) &&
        atomic_exchange_explicit(flag, 0, memory_order_acq_rel))
        return UCXPY_RING_NOTIFY;
    return UCXPY_RING_OK;
}

static void put_prefix(uint8_t *at, uint8_t kind, uint8_t am_id, size_t hdrlen,
                       size_t paylen, uint64_t source)
{
    frame_prefix_t pfx = {(uint32_t)paylen, (uint16_t)hdrlen, am_id, kind, source};
    memcpy(at, &pfx, sizeof pfx);
}

/* Did a reset since this producer's last push discard any of its frames?
 * (Its frames all end at or before r->head.)  Brings r->epoch up to date;
 * once it finds a loss, it is lost for good.  A shared epoch no reset made
 * (see "Corruption" above) is ignored. */
static int lost_frames(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    uint64_t epoch = atomic_load_explicit(&s->epoch, memory_order_acquire), e;
    int lost = 0;

    if (epoch == r->epoch || r->lost)
        return (int)r->lost;
    if (epoch < r->epoch || s->reset_epoch[epoch % RESETS_KEPT] != epoch)
        return 0;                           /* scribbled: the consumer restores it */
    if (epoch - r->epoch > RESETS_KEPT)
        lost = 1;                           /* too many resets to tell: assume so */
    for (e = r->epoch + 1; !lost && e <= epoch; e++) {
        if (s->reset_epoch[e % RESETS_KEPT] != e)
            return 0;                       /* a scribbled record: as above */
        lost = r->head > s->reset_at[e % RESETS_KEPT];
    }
    r->epoch = epoch;
    r->lost = (uint32_t)lost;
    return lost;
}

/* Producer: did a reset discard frames of ours?  1 from the first check that
 * finds a loss on (the connection must fail), else 0. */
int ucxpy_ring_check_lost(ucxpy_ring_t *r)
{
    return r->token != 0 && lost_frames(r);
}

/* Append one record (kind FRAME or CLOSE) under the producers' lock. */
static inline __attribute__((always_inline)) int
push_record(ucxpy_ring_t *r, uint8_t kind, unsigned am_id,
                       const void *hdr, size_t hdrlen,
                       const void *payload, size_t paylen)
{
    ring_shared_t *s = SHARED(r);
    uint64_t need, head, pos, to_end, pad = 0, used;
    uint32_t free_lock = 0;
    int rc = UCXPY_RING_OK;

    if (r->token == 0)
        return UCXPY_RING_CORRUPT;          /* not a producer handle */
    if (am_id > 255 || hdrlen > 0xffff || paylen > 0xffffffffu)
        return UCXPY_RING_TOOBIG;
    need = UCXPY_RING_PREFIX + ALIGN8(hdrlen) + ALIGN8(paylen);
    if (need > r->capacity / 2)
        return UCXPY_RING_TOOBIG;
    if (atomic_load_explicit(&s->closed, memory_order_relaxed))
        return UCXPY_RING_CLOSED;
    if (atomic_load_explicit(&s->lock, memory_order_relaxed) != 0 ||
        !atomic_compare_exchange_strong_explicit(&s->lock, &free_lock, r->token,
                                                 memory_order_acquire, memory_order_relaxed))
        return UCXPY_RING_BUSY;

    if (lost_frames(r) && kind != KIND_CLOSE) {   /* (a close still tells the end) */
        rc = UCXPY_RING_LOST;
        goto unlock;
    }
    /* other producers move head: read it under the lock */
    head = atomic_load_explicit(&s->head, memory_order_relaxed);
    pos = head & r->mask;
    to_end = r->capacity - pos;
    if (need > to_end)
        pad = to_end;
    if ((head & 7) || head - r->tail > r->capacity ||
            need + pad > r->capacity - (head - r->tail)) {
        r->tail = atomic_load_explicit(&s->tail, memory_order_acquire);
        used = head - r->tail;
        if (used > r->capacity || (r->tail & 7) || (head & 7)) {
            rc = UCXPY_RING_CORRUPT;
            goto unlock;
        }
        if (need + pad > r->capacity - used) {
            rc = UCXPY_RING_FULL;
            goto unlock;
        }
    }
    if (pad) {
        put_prefix(r->data + pos, KIND_PAD, 0, 0, 0, r->source);
        head += pad;
        pos = 0;
    }
    put_prefix(r->data + pos, kind, (uint8_t)am_id, hdrlen, paylen, r->source);
    if (hdrlen)
        memcpy(r->data + pos + UCXPY_RING_PREFIX, hdr, hdrlen);
    if (paylen)
        memcpy(r->data + pos + UCXPY_RING_PREFIX + ALIGN8(hdrlen), payload, paylen);
    head += need;
    r->head = head;
    atomic_store_explicit(&s->head, head, memory_order_release);
unlock:
    atomic_store_explicit(&s->lock, 0, memory_order_release);
    if (rc != UCXPY_RING_OK)
        return rc;
    return wake_check(&s->sleeping);
}

/* Copy one frame (prefix + header + payload) into the ring.
 * Returns OK, NOTIFY (pushed; send the consumer a wake-up), FULL, BUSY
 * (another producer is pushing: try again), TOOBIG, CLOSED (the consumer
 * takes no more) or CORRUPT. */
int ucxpy_ring_push(ucxpy_ring_t *r, unsigned am_id,
                    const void *hdr, size_t hdrlen,
                    const void *payload, size_t paylen)
{
    return push_record(r, KIND_FRAME, am_id, hdr, hdrlen, payload, paylen);
}

/* The producer's connection ends: its last record.  Returns as push. */
int ucxpy_ring_push_close(ucxpy_ring_t *r)
{
    return push_record(r, KIND_CLOSE, 0, NULL, 0, NULL, 0);
}

/* Look at the oldest frame without consuming it.  On success stores
 * out[0]=am_id, out[1]=header offset, out[2]=header length, out[3]=payload
 * offset, out[4]=payload length (offsets relative to the data area),
 * out[5]=source, and returns 1; a CLOSE record returns 2 with out[5] set.
 * Returns 0 when empty, CORRUPT on inconsistent shared state.  Calling peek
 * again before release returns the same frame. */
int ucxpy_ring_peek(ucxpy_ring_t *r, uint64_t *out)
{
    ring_shared_t *s = SHARED(r);
    uint64_t tail, avail, pos, need, hoff;
    frame_prefix_t pfx;

    for (;;) {
        tail = r->tail;
        if (tail == r->head) {
            r->head = atomic_load_explicit(&s->head, memory_order_acquire);
            if (tail == r->head)
                return 0;
        }
        avail = r->head - tail;
        if (avail > r->capacity || (avail & 7))
            return UCXPY_RING_CORRUPT;
        pos = tail & r->mask;
        memcpy(&pfx, r->data + pos, sizeof pfx);
        if (pfx.kind == KIND_PAD) {
            need = r->capacity - pos;
            if (need > avail)
                return UCXPY_RING_CORRUPT;
            r->tail = tail + need;
            /* Publish now so producers can reuse the skipped bytes. */
            atomic_store_explicit(&s->tail, r->tail, memory_order_release);
            continue;
        }
        if (pfx.kind != KIND_FRAME && pfx.kind != KIND_CLOSE)
            return UCXPY_RING_CORRUPT;
        hoff = UCXPY_RING_PREFIX + ALIGN8(pfx.hdrlen);
        need = hoff + ALIGN8(pfx.paylen);
        if (need > avail || need > r->capacity - pos)
            return UCXPY_RING_CORRUPT;
        out[0] = pfx.am_id;
        out[1] = pos + UCXPY_RING_PREFIX;
        out[2] = pfx.hdrlen;
        out[3] = pos + hoff;
        out[4] = pfx.paylen;
        out[5] = pfx.source;
        r->peeked = need;
        return pfx.kind == KIND_CLOSE ? 2 : 1;
    }
}

/* Consume the frame returned by the last successful peek.  Returns NOTIFY
 * when a producer waiting for space should be woken, else OK. */
int ucxpy_ring_release(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);

    if (!r->peeked)
        return UCXPY_RING_OK;
    r->tail += r->peeked;
    r->peeked = 0;
    atomic_store_explicit(&s->tail, r->tail, memory_order_release);
    return wake_check(&s->prod_waiting);
}

/* Consumer is about to sleep: ask producers for a wake-up.  Returns 1 if
 * the ring already has data: do not sleep then. */
int ucxpy_ring_arm_consumer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    atomic_store_explicit(&s->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    r->head = atomic_load_explicit(&s->head, memory_order_acquire);
    return r->head != r->tail;
}

void ucxpy_ring_disarm_consumer(ucxpy_ring_t *r)
{
    atomic_store_explicit(&SHARED(r)->sleeping, 0, memory_order_relaxed);
}

/* Producer ``r`` no longer waits for space (its entry, if any, leaves the
 * table; the consumer may have taken it already). */
void ucxpy_ring_disarm_producer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    uint64_t mine;
    int i;

    for (i = 0; i < UCXPY_RING_WAITERS; i++) {
        mine = r->source;
        if (atomic_load_explicit(&s->waiters[i], memory_order_relaxed) == mine)
            atomic_compare_exchange_strong_explicit(&s->waiters[i], &mine, 0,
                                                    memory_order_relaxed,
                                                    memory_order_relaxed);
    }
}

/* Producer is about to wait for space: ask the consumer for a wake-up.
 * Returns the free bytes seen after arming (a large value means: retry the
 * push instead of sleeping). */
int64_t ucxpy_ring_arm_producer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    uint64_t used, head, cur;
    int i, listed = 0;

    for (i = 0; i < UCXPY_RING_WAITERS && !listed; i++) {
        cur = atomic_load_explicit(&s->waiters[i], memory_order_relaxed);
        if (cur == r->source)
            listed = 1;
        else if (cur == 0 &&
                 atomic_compare_exchange_strong_explicit(&s->waiters[i], &cur, r->source,
                                                         memory_order_relaxed,
                                                         memory_order_relaxed))
            listed = 1;
    }
    if (!listed)
        atomic_store_explicit(&s->waiters_lost, 1, memory_order_relaxed);
    atomic_store_explicit(&s->prod_waiting, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    r->tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    head = atomic_load_explicit(&s->head, memory_order_acquire);
    used = head - r->tail;
    if (used > r->capacity)
        return UCXPY_RING_CORRUPT;
    return (int64_t)(r->capacity - used);
}

/* Consumer: the sources waiting for space, after a release returned NOTIFY.
 * Moves up to ``n`` of them to ``out`` and returns how many, or that count
 * plus UCXPY_RING_WAITERS_LOST when some waiter could not be listed (then
 * wake every producer). */
int ucxpy_ring_take_waiters(ucxpy_ring_t *r, uint64_t *out, int n)
{
    ring_shared_t *s = SHARED(r);
    uint64_t src;
    int i, k = 0;

    for (i = 0; i < UCXPY_RING_WAITERS && k < n; i++) {
        if (atomic_load_explicit(&s->waiters[i], memory_order_relaxed) == 0)
            continue;
        src = atomic_exchange_explicit(&s->waiters[i], 0, memory_order_relaxed);
        if (src)
            out[k++] = src;
    }
    if (atomic_load_explicit(&s->waiters_lost, memory_order_relaxed) &&
            atomic_exchange_explicit(&s->waiters_lost, 0, memory_order_relaxed))
        k += UCXPY_RING_WAITERS_LOST;
    return k;
}

/* The token of the producer pushing right now (0: none). */
uint32_t ucxpy_ring_lock_owner(const ucxpy_ring_t *r)
{
    return atomic_load_explicit(&SHARED(r)->lock, memory_order_acquire);
}

/* Free the lock of ``token``, a producer known to be dead (it published
 * nothing of the frame it was writing).  Returns 1 if the lock was freed. */
int ucxpy_ring_break_lock(ucxpy_ring_t *r, uint32_t token)
{
    uint32_t held = token;
    return token != 0 &&
        atomic_compare_exchange_strong_explicit(&SHARED(r)->lock, &held, 0,
                                                memory_order_acq_rel, memory_order_relaxed);
}

/* Consumer: is the control block as we made it?  0 if so, else -1 (call
 * ucxpy_ring_reset).  A scribbled epoch describes no frame: it is put back
 * here (producers ignored it meanwhile). */
int ucxpy_ring_check_header(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);

    if (atomic_load_explicit(&s->epoch, memory_order_relaxed) != r->epoch)
        atomic_store_explicit(&s->epoch, r->epoch, memory_order_release);
    return s->magic == RING_MAGIC && s->capacity == r->capacity &&
           !atomic_load_explicit(&s->closed, memory_order_relaxed) ? 0 : -1;
}

/* Consumer found the ring corrupt: discard everything published, record
 * what was discarded for the producers, repair the control block.  Takes
 * the lock as ``token``; returns 1 when done, 0 when a producer holds the
 * lock (try again; ucxpy_ring_break_lock frees a dead holder's). */
int ucxpy_ring_reset(ucxpy_ring_t *r, uint32_t token)
{
    ring_shared_t *s = SHARED(r);
    uint32_t free_lock = 0;
    uint64_t head, epoch;

    if (!atomic_compare_exchange_strong_explicit(&s->lock, &free_lock, token,
                                                 memory_order_acquire, memory_order_relaxed))
        return 0;
    head = atomic_load_explicit(&s->head, memory_order_relaxed);
    if (head < r->tail || head - r->tail > r->capacity)
        head = r->tail + r->capacity;       /* a scribbled head: skip a whole lap */
    head = ALIGN8(head);
    epoch = r->epoch + 1;                   /* ours: the shared copy may be scribbled */
    s->reset_at[epoch % RESETS_KEPT] = r->tail;
    s->reset_to[epoch % RESETS_KEPT] = head;
    s->reset_epoch[epoch % RESETS_KEPT] = epoch;
    s->magic = RING_MAGIC;
    s->capacity = r->capacity;
    atomic_store_explicit(&s->closed, 0, memory_order_relaxed);
    atomic_store_explicit(&s->head, head, memory_order_relaxed);
    r->head = r->tail = head;
    r->peeked = 0;
    atomic_store_explicit(&s->tail, head, memory_order_relaxed);
    r->epoch = epoch;
    atomic_store_explicit(&s->epoch, epoch, memory_order_release);
    atomic_store_explicit(&s->lock, 0, memory_order_release);
    return 1;
}

/* Consumer takes no more frames: producers' pushes return CLOSED. */
void ucxpy_ring_close_consumer(ucxpy_ring_t *r)
{
    atomic_store_explicit(&SHARED(r)->closed, 1, memory_order_release);
}

int ucxpy_ring_is_closed(const ucxpy_ring_t *r)
{
    return (int)atomic_load_explicit(&SHARED(r)->closed, memory_order_acquire);
}

/* Bytes currently in use (refreshes the cached tail). */
uint64_t ucxpy_ring_used(ucxpy_ring_t *r)
{
    r->tail = atomic_load_explicit(&SHARED(r)->tail, memory_order_acquire);
    return atomic_load_explicit(&SHARED(r)->head, memory_order_acquire) - r->tail;
}
