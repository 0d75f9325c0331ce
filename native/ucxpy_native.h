/*
 * ucxpy native helpers: shared-memory MPSC frame ring (a process's inbox), atomics on arbitrary
 * addresses, memory fences and cross-memory attach (CMA).
 *
 * Everything here is compiled into the cffi module ``ucxpy._native`` by
 * native/build_native.py.  The declarations below are mirrored (by hand) in
 * the cdef of that file; keep the two in sync.
 */
#ifndef UCXPY_NATIVE_H
#define UCXPY_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* a spin-wait's pause between two polls (the ring's receive, the tcp fast path) */
static inline void ucxpy_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ------------------------------------------------------------------ ring */

/* Bytes of ring control block placed before the data area. */
#define UCXPY_RING_HDR_SIZE 1024
/* Fixed prefix in front of each frame. */
#define UCXPY_RING_PREFIX 16
/* Producers a consumer can name when it frees space (others: all woken). */
#define UCXPY_RING_WAITERS 32
#define UCXPY_RING_WAITERS_LOST 0x10000
/* Words ucxpy_ring_peek stores. */
#define UCXPY_RING_PEEK_OUT 6

/* Return codes of the ring calls. */
#define UCXPY_RING_OK        0
#define UCXPY_RING_NOTIFY    1    /* push/release done; the peer wants a wake-up */
#define UCXPY_RING_FULL     -1    /* push: not enough free space right now */
#define UCXPY_RING_TOOBIG   -2    /* push: frame can never fit this ring */
#define UCXPY_RING_CORRUPT  -3    /* shared state is inconsistent */
#define UCXPY_RING_CLOSED   -4    /* push: the consumer takes no more frames */
#define UCXPY_RING_BUSY     -5    /* push: another producer holds the lock */
#define UCXPY_RING_LOST     -6    /* push: a reset of the ring discarded frames of ours */

/*
 * Process-local handle of one ring.  It holds the trusted geometry (never
 * re-read from shared memory) and the cached indices: a producer caches the
 * consumer's tail, the consumer caches the producers' head, so the fast paths
 * touch another process's cache line only when the cached value is exhausted.
 */
typedef struct ucxpy_ring {
    void     *shared;     /* control block in shared memory */
    uint8_t  *data;       /* data area (shared + UCXPY_RING_HDR_SIZE) */
    uint64_t  capacity;   /* data area bytes, power of two */
    uint64_t  mask;
    uint64_t  head;       /* producer: head after its last push; consumer: cached head */
    uint64_t  tail;       /* consumer: own tail; producer: cached tail */
    uint64_t  peeked;     /* consumer: size of the frame returned by peek */
    uint64_t  source;     /* producer: the connection id its frames carry */
    uint32_t  token;      /* producer: its lock token (pid); 0 for the consumer */
    uint32_t  lost;       /* producer: a reset discarded frames of ours (sticky) */
    uint64_t  epoch;      /* the ring's resets: a producer's checked so far, the
                           * consumer's own count (the shared copy is checked
                           * against it) */
} ucxpy_ring_t;

size_t  ucxpy_ring_mem_size(size_t capacity);
int     ucxpy_ring_init(void *mem, size_t memsize);
int     ucxpy_ring_attach(ucxpy_ring_t *r, void *mem, size_t memsize);
int     ucxpy_ring_attach_producer(ucxpy_ring_t *r, void *mem, size_t memsize,
                                   uint64_t source, uint32_t token);
size_t  ucxpy_ring_max_payload(const ucxpy_ring_t *r, size_t hdrlen);
int     ucxpy_ring_push(ucxpy_ring_t *r, unsigned am_id,
                        const void *hdr, size_t hdrlen,
                        const void *payload, size_t paylen);
int     ucxpy_ring_push_close(ucxpy_ring_t *r);
int     ucxpy_ring_peek(ucxpy_ring_t *r, uint64_t *out);
int     ucxpy_ring_release(ucxpy_ring_t *r);
int     ucxpy_ring_arm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_producer(ucxpy_ring_t *r);
int64_t ucxpy_ring_arm_producer(ucxpy_ring_t *r);
int     ucxpy_ring_take_waiters(ucxpy_ring_t *r, uint64_t *out, int n);
uint32_t ucxpy_ring_lock_owner(const ucxpy_ring_t *r);
int     ucxpy_ring_break_lock(ucxpy_ring_t *r, uint32_t token);
int     ucxpy_ring_check_lost(ucxpy_ring_t *r);
int     ucxpy_ring_check_header(ucxpy_ring_t *r);
int     ucxpy_ring_reset(ucxpy_ring_t *r, uint32_t token);
void    ucxpy_ring_close_consumer(ucxpy_ring_t *r);
int     ucxpy_ring_is_closed(const ucxpy_ring_t *r);
uint64_t ucxpy_ring_used(ucxpy_ring_t *r);

/* --------------------------------------------------------------- atomics */

uint32_t ucxpy_atomic_load32(void *addr);
uint64_t ucxpy_atomic_load64(void *addr);
void     ucxpy_atomic_store32(void *addr, uint32_t v);
void     ucxpy_atomic_store64(void *addr, uint64_t v);
void     ucxpy_atomic_add32(void *addr, uint32_t v);
void     ucxpy_atomic_add64(void *addr, uint64_t v);
void     ucxpy_atomic_and32(void *addr, uint32_t v);
void     ucxpy_atomic_and64(void *addr, uint64_t v);
void     ucxpy_atomic_or32(void *addr, uint32_t v);
void     ucxpy_atomic_or64(void *addr, uint64_t v);
void     ucxpy_atomic_xor32(void *addr, uint32_t v);
void     ucxpy_atomic_xor64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_fetch_add32(void *addr, uint32_t v);
uint64_t ucxpy_atomic_fetch_add64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_fetch_and32(void *addr, uint32_t v);
uint64_t ucxpy_atomic_fetch_and64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_fetch_or32(void *addr, uint32_t v);
uint64_t ucxpy_atomic_fetch_or64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_fetch_xor32(void *addr, uint32_t v);
uint64_t ucxpy_atomic_fetch_xor64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_swap32(void *addr, uint32_t v);
uint64_t ucxpy_atomic_swap64(void *addr, uint64_t v);
uint32_t ucxpy_atomic_cswap32(void *addr, uint32_t expected, uint32_t desired);
uint64_t ucxpy_atomic_cswap64(void *addr, uint64_t expected, uint64_t desired);

void ucxpy_fence_acquire(void);
void ucxpy_fence_release(void);
void ucxpy_fence_seq_cst(void);

/* ------------------------------------------------------------------- CMA */

int64_t  ucxpy_cma_read(int pid, void *local, uint64_t remote_addr, size_t len);
int64_t  ucxpy_cma_write(int pid, const void *local, uint64_t remote_addr, size_t len);
uint64_t ucxpy_cma_probe_addr(void);
int      ucxpy_cma_probe(int pid, uint64_t remote_probe_addr);
int      ucxpy_cma_allow_any_peer(void);

#endif
