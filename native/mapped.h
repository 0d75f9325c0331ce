/* Access to a peer's memory mapped into this process (ucxpy.rma's MAPPED
 * mode), shared by ucxpy._fastpath (native/fastpath.c) and mpi_shim's
 * entry points (native/mpi_accel.c).
 *
 * A mapping is (mapped address, length, guard address, guard value): the
 * guard word, where its address is not 0, holds the guard value for as long
 * as the owner keeps the region registered. */
#ifndef UCXPY_MAPPED_H
#define UCXPY_MAPPED_H

#include <stdint.h>
#include <string.h>

#include "ucxpy_native.h"

/* the region is still registered: its guard word holds the guard value */
static inline int
map_valid(unsigned long long guard, unsigned long long guard_id)
{
    return !guard || ucxpy_atomic_load64((void *)(uintptr_t)guard) == guard_id;
}

/* [offset, offset + n) lies within a region of ``length`` bytes */
static inline int
map_range(long long offset, unsigned long long n, unsigned long long length)
{
    return offset >= 0 && (unsigned long long)offset <= length
        && length - (unsigned long long)offset >= n;
}

/* copy n bytes between a local buffer and mapped memory; long copies let
 * other threads run (the caller holds the GIL) */
static inline void
map_copy(char *peer, char *local, size_t n, int put)
{
    if (n >= (1 << 20)) {
        Py_BEGIN_ALLOW_THREADS
        memmove(put ? peer : local, put ? local : peer, n);
        Py_END_ALLOW_THREADS
    } else if (n) {
        memmove(put ? peer : local, put ? local : peer, n);
    }
}

/* ucxpy.atomics.OPS' codes */
enum { MAP_ADD, MAP_AND, MAP_OR, MAP_XOR, MAP_SWAP, MAP_CSWAP, MAP_NOPS };

/* the fetching atomic ``op`` on the aligned ``size``-byte (4 or 8) word at
 * ``p``; value and compare are truncated to the word; returns the old value */
static inline unsigned long long
map_fetch(void *p, int size, int op, unsigned long long value, unsigned long long compare)
{
    if (size == 8) {
        switch (op) {
        case MAP_ADD: return ucxpy_atomic_fetch_add64(p, value);
        case MAP_AND: return ucxpy_atomic_fetch_and64(p, value);
        case MAP_OR: return ucxpy_atomic_fetch_or64(p, value);
        case MAP_XOR: return ucxpy_atomic_fetch_xor64(p, value);
        case MAP_SWAP: return ucxpy_atomic_swap64(p, value);
        default: return ucxpy_atomic_cswap64(p, compare, value);
        }
    } else {
        uint32_t v = (uint32_t)value, c = (uint32_t)compare;
        switch (op) {
        case MAP_ADD: return ucxpy_atomic_fetch_add32(p, v);
        case MAP_AND: return ucxpy_atomic_fetch_and32(p, v);
        case MAP_OR: return ucxpy_atomic_fetch_or32(p, v);
        case MAP_XOR: return ucxpy_atomic_fetch_xor32(p, v);
        case MAP_SWAP: return ucxpy_atomic_swap32(p, v);
        default: return ucxpy_atomic_cswap32(p, c, v);
        }
    }
}

#endif
