/*
 * ucxpy native helpers: shared-memory SPSC frame ring, atomics on arbitrary
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

/* ------------------------------------------------------------------ ring */

/* Bytes of ring control block placed before the data area. */
#define UCXPY_RING_HDR_SIZE 512
/* Fixed prefix in front of each frame. */
#define UCXPY_RING_PREFIX 8

/* Return codes of the ring calls. */
#define UCXPY_RING_OK        0
#define UCXPY_RING_NOTIFY    1    /* push/release done; the peer wants a wake-up */
#define UCXPY_RING_FULL     -1    /* push: not enough free space right now */
#define UCXPY_RING_TOOBIG   -2    /* push: frame can never fit this ring */
#define UCXPY_RING_CORRUPT  -3    /* shared state is inconsistent */
#define UCXPY_RING_CLOSED   -4    /* peek: producer closed and ring drained */

/*
 * Process-local handle of one ring.  It holds the trusted geometry (never
 * re-read from shared memory) and the cached indices: a producer caches the
 * consumer's tail, a consumer caches the producer's head, so the fast paths
 * touch the peer's cache line only when the cached value is exhausted.
 */
typedef struct ucxpy_ring {
    void     *shared;     /* control block in shared memory */
    uint8_t  *data;       /* data area (shared + UCXPY_RING_HDR_SIZE) */
    uint64_t  capacity;   /* data area bytes, power of two */
    uint64_t  mask;
    uint64_t  head;       /* producer: own head; consumer: cached head */
    uint64_t  tail;       /* consumer: own tail; producer: cached tail */
    uint64_t  peeked;     /* consumer: size of the frame returned by peek */
} ucxpy_ring_t;

size_t  ucxpy_ring_mem_size(size_t capacity);
int     ucxpy_ring_init(void *mem, size_t memsize);
int     ucxpy_ring_attach(ucxpy_ring_t *r, void *mem, size_t memsize);
size_t  ucxpy_ring_max_payload(const ucxpy_ring_t *r, size_t hdrlen);
int     ucxpy_ring_push(ucxpy_ring_t *r, unsigned am_id,
                        const void *hdr, size_t hdrlen,
                        const void *payload, size_t paylen);
int     ucxpy_ring_peek(ucxpy_ring_t *r, uint64_t *out);
int     ucxpy_ring_release(ucxpy_ring_t *r);
int     ucxpy_ring_poll_many(ucxpy_ring_t **rings, int n, int start);
int64_t ucxpy_ring_recv_tag(ucxpy_ring_t *r, uint8_t am_id, uint64_t tag, uint64_t mask,
                            void *buf, uint64_t capacity, int spins, uint64_t *wake,
                            uint64_t *got_tag);
int     ucxpy_ring_arm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_consumer(ucxpy_ring_t *r);
void    ucxpy_ring_disarm_producer(ucxpy_ring_t *r);
int64_t ucxpy_ring_arm_producer(ucxpy_ring_t *r);
int     ucxpy_ring_close_producer(ucxpy_ring_t *r);
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
