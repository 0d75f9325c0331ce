/*
 * Single-producer / single-consumer ring of variable-length frames in shared
 * memory.
 *
 * Theory of operation
 * -------------------
 * The control block holds two free-running 64-bit byte counters: ``head``
 * (advanced by the producer after a frame is fully written, store-release)
 * and ``tail`` (advanced by the consumer after a frame is consumed,
 * store-release).  ``head - tail`` is the number of bytes in use; the byte
 * position of a counter is ``counter & mask``.  Each counter lives on its own
 * 128-byte block (two cache lines: adjacent-line prefetchers otherwise cause
 * false sharing).
 *
 * A frame is an 8-byte prefix {u32 paylen, u16 hdrlen, u8 am_id, u8 kind}
 * followed by the header padded to 8 bytes and the payload padded to 8 bytes,
 * so every frame starts 8-aligned and payloads are 8-aligned.  Frames never
 * wrap: when a frame does not fit before the end of the data area the producer
 * writes a PAD prefix that tells the consumer to skip to position 0.
 *
 * Everything the consumer reads from shared memory is copied to locals before
 * it is validated; a frame whose lengths do not fit the published bytes (or
 * the data area) yields UCXPY_RING_CORRUPT instead of an out-of-bounds read.
 *
 * Sleeping: a consumer about to block sets ``sleeping`` then re-checks
 * ``head``; a producer publishes ``head`` then checks ``sleeping`` (a full
 * fence on each side, Dekker style).  The producer that finds the flag set
 * clears it with an exchange and returns UCXPY_RING_NOTIFY, so exactly one
 * wake-up system call is made per sleep.  ``prod_waiting`` is the mirror image
 * for a producer waiting for free space.
 */
#include <stdatomic.h>
#include <stdalign.h>
#include <string.h>

#include "ucxpy_native.h"

#define RING_MAGIC   0x31474e4950584355ULL /* "UCXPING1" little endian */
#define KIND_FRAME   1
#define KIND_PAD     2
#define ALIGN8(x)    (((uint64_t)(x) + 7u) & ~(uint64_t)7u)
#define MIN_CAPACITY 1024u
#define MAX_CAPACITY (1ULL << 32)

typedef struct ring_shared {
    alignas(128) uint64_t magic;
    uint64_t capacity;
    alignas(128) _Atomic uint64_t head;         /* producer-written block */
    _Atomic uint32_t closed;
    _Atomic uint32_t prod_waiting;
    alignas(128) _Atomic uint64_t tail;         /* consumer-written block */
    alignas(128) _Atomic uint32_t sleeping;     /* consumer-written, rarely */
} ring_shared_t;

_Static_assert(sizeof(ring_shared_t) <= UCXPY_RING_HDR_SIZE, "ring header too big");

typedef struct frame_prefix {
    uint32_t paylen;
    uint16_t hdrlen;
    uint8_t  am_id;
    uint8_t  kind;
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
 * copy is only checked against it.  Returns 0 or -1 (bad magic / size). */
int ucxpy_ring_attach(ucxpy_ring_t *r, void *mem, size_t memsize)
{
    ring_shared_t *s = (ring_shared_t *)mem;
    uint64_t cap, head, tail;

    if (r == NULL || mem == NULL || ((uintptr_t)mem & 127) ||
        memsize <= UCXPY_RING_HDR_SIZE)
        return -1;
    cap = memsize - UCXPY_RING_HDR_SIZE;
    if (!is_pow2(cap) || cap < MIN_CAPACITY || cap > MAX_CAPACITY)
        return -1;
    if (s->magic != RING_MAGIC || s->capacity != cap)
        return -1;
    atomic_thread_fence(memory_order_acquire);
    head = atomic_load_explicit(&s->head, memory_order_acquire);
    tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    if (head - tail > cap || (head & 7) || (tail & 7))
        return -1;
    r->shared = mem;
    r->data = (uint8_t *)mem + UCXPY_RING_HDR_SIZE;
    r->capacity = cap;
    r->mask = cap - 1;
    r->head = head;
    r->tail = tail;
    r->peeked = 0;
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

/* Copy one frame (prefix + header + payload) into the ring.
 * Returns OK, NOTIFY (pushed; send the consumer a wake-up), FULL, TOOBIG or
 * CORRUPT. */
int ucxpy_ring_push(ucxpy_ring_t *r, unsigned am_id,
                    const void *hdr, size_t hdrlen,
                    const void *payload, size_t paylen)
{
    ring_shared_t *s = SHARED(r);
    uint64_t need, head, pos, to_end, pad = 0, used;
    frame_prefix_t pfx;

    if (am_id > 255 || hdrlen > 0xffff || paylen > 0xffffffffu)
        return UCXPY_RING_TOOBIG;
    need = UCXPY_RING_PREFIX + ALIGN8(hdrlen) + ALIGN8(paylen);
    if (need > r->capacity / 2)
        return UCXPY_RING_TOOBIG;

    head = r->head;
    pos = head & r->mask;
    to_end = r->capacity - pos;
    if (need > to_end)
        pad = to_end;
    if (need + pad > r->capacity - (head - r->tail)) {
        r->tail = atomic_load_explicit(&s->tail, memory_order_acquire);
        used = head - r->tail;
        if (used > r->capacity || (r->tail & 7))
            return UCXPY_RING_CORRUPT;
        if (need + pad > r->capacity - used)
            return UCXPY_RING_FULL;
    }
    if (pad) {
        pfx.paylen = 0;
        pfx.hdrlen = 0;
        pfx.am_id = 0;
        pfx.kind = KIND_PAD;
        memcpy(r->data + pos, &pfx, sizeof pfx);
        head += pad;
        pos = 0;
    }
    pfx.paylen = (uint32_t)paylen;
    pfx.hdrlen = (uint16_t)hdrlen;
    pfx.am_id = (uint8_t)am_id;
    pfx.kind = KIND_FRAME;
    memcpy(r->data + pos, &pfx, sizeof pfx);
    if (hdrlen)
        memcpy(r->data + pos + UCXPY_RING_PREFIX, hdr, hdrlen);
    if (paylen)
        memcpy(r->data + pos + UCXPY_RING_PREFIX + ALIGN8(hdrlen), payload, paylen);
    head += need;
    r->head = head;
    atomic_store_explicit(&s->head, head, memory_order_release);
    return wake_check(&s->sleeping);
}

/* Look at the oldest frame without consuming it.  On success stores
 * out[0]=am_id, out[1]=header offset, out[2]=header length, out[3]=payload
 * offset, out[4]=payload length (offsets relative to the data area) and
 * returns 1.  Returns 0 when empty, CLOSED when the producer closed the ring
 * and it is drained, CORRUPT on inconsistent shared state.  Calling peek
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
            if (tail == r->head) {
                if (atomic_load_explicit(&s->closed, memory_order_acquire)) {
                    r->head = atomic_load_explicit(&s->head, memory_order_acquire);
                    if (tail == r->head)
                        return UCXPY_RING_CLOSED;
                    continue;
                }
                return 0;
            }
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
            /* Publish now so the producer can reuse the skipped bytes. */
            atomic_store_explicit(&s->tail, r->tail, memory_order_release);
            continue;
        }
        if (pfx.kind != KIND_FRAME)
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
        r->peeked = need;
        return 1;
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

/* Index of the first ring at or after ``start`` with a frame or a state
 * change to report (closed, corrupt), or -1 when rings[start..n) are all
 * idle.  Lets a progress loop test many connections with one foreign call. */
int ucxpy_ring_poll_many(ucxpy_ring_t **rings, int n, int start)
{
    int i;
    for (i = start < 0 ? 0 : start; i < n; i++) {
        ucxpy_ring_t *r = rings[i];
        if (r == NULL)
            continue;
        if (r->tail != r->head)
            return i;
        r->head = atomic_load_explicit(&SHARED(r)->head, memory_order_acquire);
        if (r->tail != r->head ||
            atomic_load_explicit(&SHARED(r)->closed, memory_order_relaxed))
            return i;
    }
    return -1;
}

/* The native fast path of a blocking tagged receive (native/fastpath.c):
 * waits up to ``spins`` polls for a frame; if the next frame is an eager
 * tag frame (``am_id``, an 8-byte little-endian tag header) whose tag
 * equals ``tag`` under ``mask`` and whose payload fits ``capacity``, copies
 * the payload to ``buf``, consumes the frame and returns its length
 * (``*got_tag``: its tag; ``*wake``: the producer waits for space).  Returns -1 when no frame came (or the ring is closed or
 * corrupt: the Python path reports that) and -2 when the next frame is
 * another one, which stays in the ring for the Python path, in order. */
int64_t ucxpy_ring_recv_tag(ucxpy_ring_t *r, uint8_t am_id, uint64_t tag, uint64_t mask,
                            void *buf, uint64_t capacity, int spins, uint64_t *wake,
                            uint64_t *got_tag)
{
    uint64_t out[5], t;
    int rc;

    for (;;) {
        rc = ucxpy_ring_peek(r, out);
        if (rc == 1)
            break;
        if (rc < 0 || spins-- <= 0)
            return -1;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    if (out[0] != am_id || out[2] != sizeof t || out[4] > capacity)
        return -2;
    memcpy(&t, r->data + out[1], sizeof t);
    if ((t ^ tag) & mask)
        return -2;
    *got_tag = t;
    memcpy(buf, r->data + out[3], out[4]);
    *wake = ucxpy_ring_release(r) == UCXPY_RING_NOTIFY;
    return (int64_t)out[4];
}

/* Consumer is about to sleep: ask the producer for a wake-up.  Returns 1 if
 * the ring already has data (or was closed): do not sleep then. */
int ucxpy_ring_arm_consumer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    atomic_store_explicit(&s->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    r->head = atomic_load_explicit(&s->head, memory_order_acquire);
    return r->head != r->tail ||
           atomic_load_explicit(&s->closed, memory_order_acquire);
}

void ucxpy_ring_disarm_consumer(ucxpy_ring_t *r)
{
    atomic_store_explicit(&SHARED(r)->sleeping, 0, memory_order_relaxed);
}

void ucxpy_ring_disarm_producer(ucxpy_ring_t *r)
{
    atomic_store_explicit(&SHARED(r)->prod_waiting, 0, memory_order_relaxed);
}

/* Producer is about to wait for space: ask the consumer for a wake-up.
 * Returns the free bytes seen after arming (a large value means: retry the
 * push instead of sleeping). */
int64_t ucxpy_ring_arm_producer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    uint64_t used;
    atomic_store_explicit(&s->prod_waiting, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    r->tail = atomic_load_explicit(&s->tail, memory_order_acquire);
    used = r->head - r->tail;
    if (used > r->capacity)
        return UCXPY_RING_CORRUPT;
    return (int64_t)(r->capacity - used);
}

/* Producer will push no more frames; the consumer's peek reports CLOSED
 * once it has drained what was pushed before.  Returns NOTIFY when the
 * consumer sleeps and should be woken to notice. */
int ucxpy_ring_close_producer(ucxpy_ring_t *r)
{
    ring_shared_t *s = SHARED(r);
    atomic_store_explicit(&s->closed, 1, memory_order_release);
    return wake_check(&s->sleeping);
}

int ucxpy_ring_is_closed(const ucxpy_ring_t *r)
{
    return (int)atomic_load_explicit(&SHARED(r)->closed, memory_order_acquire);
}

/* Bytes currently in use (producer view, refreshes the cached tail). */
uint64_t ucxpy_ring_used(ucxpy_ring_t *r)
{
    r->tail = atomic_load_explicit(&SHARED(r)->tail, memory_order_acquire);
    return r->head - r->tail;
}
