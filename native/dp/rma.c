/*
 * rma.c — put, get and atomics on a peer's memory mapped into this process.
 *
 * Theory of operation.  A same-host peer's registered region is mapped here
 * by Python's memory domain (ucxpy.rma's MAPPED mode); its ucxdp_rkey_t says
 * where.  Every operation checks, in this order, that [remote_addr,
 * remote_addr + length) lies within the region (OUT_OF_RANGE), that an
 * atomic's word is 4 or 8 bytes, naturally aligned, of a known op, and that
 * the key's atomic mode is CPU atomics (INVALID_PARAM), and that the owner
 * still has the region registered: its guard word still holds the key's
 * guard value (INVALID_ADDR).  Only then does it touch the memory: a memmove,
 * or one CPU atomic instruction, which the active-message target of a peer on
 * another host applies to the same words too (rma.py), so both modes may hit
 * one word concurrently.  The operation is complete when the call returns.
 */
#include <string.h>

#include "dp.h"

/* [remote_addr, remote_addr + length) lies within the key's region */
static inline int rkey_covers(const ucxdp_rkey_t *key, uint64_t remote_addr, uint64_t length)
{
    return remote_addr >= key->base && remote_addr - key->base <= key->length
        && key->length - (remote_addr - key->base) >= length;
}

/* the owner still has the region registered */
static inline int rkey_live(const ucxdp_rkey_t *key)
{
    return key->guard == NULL
        || __atomic_load_n(key->guard, __ATOMIC_ACQUIRE) == key->guard_value;
}

/* where `remote_addr` (checked) is here */
static inline char *rkey_local(const ucxdp_rkey_t *key, uint64_t remote_addr)
{
    return key->mapped + (remote_addr - key->base);
}

ucxdp_status_t ucxdp_put(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                         const void *buffer, size_t length)
{
    if (!rkey_covers(key, remote_addr, length))
        return UCXDP_ERR_OUT_OF_RANGE;
    if (!rkey_live(key))
        return UCXDP_ERR_INVALID_ADDR;
    if (length)
        memmove(rkey_local(key, remote_addr), buffer, length);
    UCXDP_COUNT(w, put, 1);
    UCXDP_COUNT(w, put_bytes, length);
    return UCXDP_OK;
}

ucxdp_status_t ucxdp_get(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                         void *buffer, size_t length)
{
    if (!rkey_covers(key, remote_addr, length))
        return UCXDP_ERR_OUT_OF_RANGE;
    if (!rkey_live(key))
        return UCXDP_ERR_INVALID_ADDR;
    if (length)
        memmove(buffer, rkey_local(key, remote_addr), length);
    UCXDP_COUNT(w, get, 1);
    UCXDP_COUNT(w, get_bytes, length);
    return UCXDP_OK;
}

/* amo_fetch<bits>: the fetching form of `op` on the word at `p` (cswap
 * stores `value` where the word equals `compare`), returning the old value;
 * amo_post<bits>: the posted form of add/and/or/xor, nothing carried back */
#define AMO_FUNCS(bits)                                                                   \
static uint##bits##_t amo_fetch##bits(uint##bits##_t *p, ucxdp_amo_op_t op,                \
                                      uint##bits##_t value, uint##bits##_t compare)        \
{                                                                                         \
    switch (op) {                                                                         \
    case UCXDP_AMO_ADD: return __atomic_fetch_add(p, value, __ATOMIC_SEQ_CST);             \
    case UCXDP_AMO_AND: return __atomic_fetch_and(p, value, __ATOMIC_SEQ_CST);             \
    case UCXDP_AMO_OR: return __atomic_fetch_or(p, value, __ATOMIC_SEQ_CST);               \
    case UCXDP_AMO_XOR: return __atomic_fetch_xor(p, value, __ATOMIC_SEQ_CST);             \
    case UCXDP_AMO_SWAP: return __atomic_exchange_n(p, value, __ATOMIC_SEQ_CST);           \
    default:                                                                              \
        __atomic_compare_exchange_n(p, &compare, value, 0, __ATOMIC_SEQ_CST,              \
                                    __ATOMIC_SEQ_CST);                                    \
        return compare;                    /* the old value, either way */                \
    }                                                                                     \
}                                                                                         \
static void amo_post##bits(uint##bits##_t *p, ucxdp_amo_op_t op, uint##bits##_t value)     \
{                                                                                         \
    switch (op) {                                                                         \
    case UCXDP_AMO_ADD: __atomic_add_fetch(p, value, __ATOMIC_SEQ_CST); break;            \
    case UCXDP_AMO_AND: __atomic_and_fetch(p, value, __ATOMIC_SEQ_CST); break;            \
    case UCXDP_AMO_OR: __atomic_or_fetch(p, value, __ATOMIC_SEQ_CST); break;              \
    default: __atomic_xor_fetch(p, value, __ATOMIC_SEQ_CST); break;                       \
    }                                                                                     \
}
AMO_FUNCS(64)
AMO_FUNCS(32)

ucxdp_status_t ucxdp_atomic(ucxdp_worker_t *w, const ucxdp_rkey_t *key, uint64_t remote_addr,
                            unsigned size, ucxdp_amo_op_t op, uint64_t value, uint64_t compare,
                            uint64_t *old)
{
    char *p;

    if (!rkey_covers(key, remote_addr, size))
        return UCXDP_ERR_OUT_OF_RANGE;
    if ((size != 4 && size != 8) || (unsigned)op >= UCXDP_AMO_LAST
            || (old == NULL && op >= UCXDP_AMO_SWAP) || !(key->flags & UCXDP_RKEY_ATOMICS))
        return UCXDP_ERR_INVALID_PARAM;
    p = rkey_local(key, remote_addr);
    if ((uintptr_t)p % size)
        return UCXDP_ERR_INVALID_PARAM;
    if (!rkey_live(key))
        return UCXDP_ERR_INVALID_ADDR;
    if (size == 8) {
        if (old != NULL)
            *old = amo_fetch64((uint64_t *)p, op, value, compare);
        else
            amo_post64((uint64_t *)p, op, value);
    } else {
        if (old != NULL)
            *old = amo_fetch32((uint32_t *)p, op, (uint32_t)value, (uint32_t)compare);
        else
            amo_post32((uint32_t *)p, op, (uint32_t)value);
    }
    UCXDP_COUNT(w, atomic, 1);
    return UCXDP_OK;
}
