/*
 * Atomic read-modify-write on arbitrary (naturally aligned) addresses, for
 * RMA/SHMEM atomics on shared or registered memory, plus memory fences.
 *
 * All operations are sequentially consistent: they implement remote atomics
 * whose users expect the strongest ordering.  Callers must check alignment;
 * a misaligned address is undefined behaviour (split locks on x86).
 */
#include <stdint.h>

#include "ucxpy_native.h"

#define SC __ATOMIC_SEQ_CST

#define DEFINE_RMW(bits, op)                                                   \
    void ucxpy_atomic_##op##bits(void *addr, uint##bits##_t v)                 \
    {                                                                          \
        (void)__atomic_fetch_##op((uint##bits##_t *)addr, v, SC);              \
    }                                                                          \
    uint##bits##_t ucxpy_atomic_fetch_##op##bits(void *addr, uint##bits##_t v) \
    {                                                                          \
        return __atomic_fetch_##op((uint##bits##_t *)addr, v, SC);             \
    }

#define DEFINE_ALL(bits)                                                       \
    DEFINE_RMW(bits, add)                                                      \
    DEFINE_RMW(bits, and)                                                      \
    DEFINE_RMW(bits, or)                                                       \
    DEFINE_RMW(bits, xor)                                                      \
    uint##bits##_t ucxpy_atomic_load##bits(void *addr)                         \
    {                                                                          \
        return __atomic_load_n((uint##bits##_t *)addr, SC);                    \
    }                                                                          \
    void ucxpy_atomic_store##bits(void *addr, uint##bits##_t v)                \
    {                                                                          \
        __atomic_store_n((uint##bits##_t *)addr, v, SC);                       \
    }                                                                          \
    uint##bits##_t ucxpy_atomic_swap##bits(void *addr, uint##bits##_t v)       \
    {                                                                          \
        return __atomic_exchange_n((uint##bits##_t *)addr, v, SC);             \
    }                                                                          \
    /* Returns the previous value; the swap happened iff it equals expected */ \
    uint##bits##_t ucxpy_atomic_cswap##bits(void *addr, uint##bits##_t expected,\
                                            uint##bits##_t desired)            \
    {                                                                          \
        __atomic_compare_exchange_n((uint##bits##_t *)addr, &expected, desired,\
                                    0, SC, SC);                                \
        return expected;                                                       \
    }

DEFINE_ALL(32)
DEFINE_ALL(64)

void ucxpy_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
void ucxpy_fence_release(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
void ucxpy_fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
