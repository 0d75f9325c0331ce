"""Atomics, fences and copies on memory mapped into this process.

The public face of the native module for the layers above the core: shmem
and mpi_shim use these on symmetric-heap and window memory that
:meth:`ucxpy.Worker.mem_map` segments map into the process (``rkey`` access
mode ``mapped``), instead of reaching into ``ucxpy._native``.  Every
operation is a C11 atomic (sequentially consistent) on a naturally aligned
32- or 64-bit word; fences are the C11 ones.  The functions are the native
ones themselves (no Python wrapper on the hot path): they take a pointer
from :func:`pointer` and plain ints.

``available`` is False where the native module is not built; then only
:func:`address_of` works (and :func:`apply` raises RemoteAccessError).
"""
from __future__ import annotations

from .errors import RemoteAccessError

try:
    from ._native import ffi, lib
except ImportError:  # pragma: no cover - built at install time
    ffi = lib = None

available = lib is not None

#: operation codes of :func:`apply` (and of the AM-mode wire format)
OPS = {"add": 0, "and": 1, "or": 2, "xor": 3, "swap": 4, "cswap": 5}
#: the operations that have a non-fetching form
POST_OPS = ("add", "and", "or", "xor")
MASK = {4: 0xFFFF_FFFF, 8: 0xFFFF_FFFF_FFFF_FFFF}

if available:
    load32, load64 = lib.ucxpy_atomic_load32, lib.ucxpy_atomic_load64
    store32, store64 = lib.ucxpy_atomic_store32, lib.ucxpy_atomic_store64
    add32, add64 = lib.ucxpy_atomic_add32, lib.ucxpy_atomic_add64
    fetch_add32, fetch_add64 = lib.ucxpy_atomic_fetch_add32, lib.ucxpy_atomic_fetch_add64
    fetch_and32, fetch_and64 = lib.ucxpy_atomic_fetch_and32, lib.ucxpy_atomic_fetch_and64
    fetch_or32, fetch_or64 = lib.ucxpy_atomic_fetch_or32, lib.ucxpy_atomic_fetch_or64
    fetch_xor32, fetch_xor64 = lib.ucxpy_atomic_fetch_xor32, lib.ucxpy_atomic_fetch_xor64
    swap32, swap64 = lib.ucxpy_atomic_swap32, lib.ucxpy_atomic_swap64
    cswap32, cswap64 = lib.ucxpy_atomic_cswap32, lib.ucxpy_atomic_cswap64
    fence_acquire, fence_release = lib.ucxpy_fence_acquire, lib.ucxpy_fence_release
    fence_seq_cst = lib.ucxpy_fence_seq_cst
    memmove = ffi.memmove                      # memmove(dest, src, n): pointers or buffers
    _FETCH = {8: (fetch_add64, fetch_and64, fetch_or64, fetch_xor64, swap64),
              4: (fetch_add32, fetch_and32, fetch_or32, fetch_xor32, swap32)}
    _CSWAP = {8: cswap64, 4: cswap32}


def pointer(address: int):
    """A byte pointer to ``address`` for the functions above (offsets add: ``p + off``)."""
    return ffi.cast("char *", address)


def buffer(ptr, length: int):
    """The ``length`` bytes at ``ptr`` as a writable buffer (numpy.frombuffer takes it)."""
    return ffi.buffer(ptr, length)


def address_of(view) -> int:
    """Address of a buffer's first byte.  The temporary cffi export is released
    at once: a lingering export on a memoryview trips CPython's garbage
    collector (BufferError in tp_clear, then a crash); ``view`` pins the memory."""
    if ffi is None:
        return id(view)
    with ffi.from_buffer(view) as p:
        return int(ffi.cast("uintptr_t", p))


def apply(address: int, op: int, size: int, value: int, compare: int = 0) -> int:
    """Apply :data:`OPS` code ``op`` to the ``size``-byte word at ``address``;
    returns the old value (``compare`` is cswap's expected value)."""
    if not available:
        raise RemoteAccessError("ucxpy._native is not built: run pip install -e .")
    p = ffi.cast("void *", address)
    value &= MASK[size]
    if op == 5:
        return _CSWAP[size](p, compare & MASK[size], value)
    return _FETCH[size][op](p, value)
