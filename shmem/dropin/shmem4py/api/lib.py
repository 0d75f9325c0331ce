"""C-named OpenSHMEM routines over cffi pointers (see :mod:`shmem4py.api`)."""
import numpy as _np

import shmem as _shmem
from shmem import runtime as _runtime

from ._ffi import ffi as _ffi

SHMEM_MAJOR_VERSION = _shmem.MAJOR_VERSION
SHMEM_MINOR_VERSION = _shmem.MINOR_VERSION
SHMEM_MAX_NAME_LEN = 256
SHMEM_VENDOR_STRING = _ffi.new("char[]", _shmem.VENDOR_STRING.encode())
SHMEM_TEAM_NUM_CONTEXTS = 1

_TYPES = {"char": "b", "schar": "b", "short": "h", "int": "i", "long": "l", "longlong": "q",
          "uchar": "B", "ushort": "H", "uint": "I", "ulong": "L", "ulonglong": "Q",
          "float": "f", "double": "d", "longdouble": "g", "int8": "i1", "int16": "i2",
          "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2", "uint32": "u4",
          "uint64": "u8", "size": "u8", "ptrdiff": "i8"}


def _addr(ptr) -> int:
    return int(_ffi.cast("uintptr_t", ptr))


def _array(ptr, count, dtype):
    """A numpy view of ``count`` elements at ``ptr``: of the symmetric heap
    when ``ptr`` points into it (so the Python API finds the offset)."""
    dtype = _np.dtype(dtype)
    nbytes = int(count) * dtype.itemsize
    heap = _runtime.get().heap
    addr = _addr(ptr)
    if heap.base <= addr < heap.base + len(heap.u8):
        off = addr - heap.base
        return heap.u8[off:off + nbytes].view(dtype)
    return _np.frombuffer(_ffi.buffer(_ffi.cast("char*", ptr), nbytes), dtype)


def shmem_init():
    """Initialize the OpenSHMEM library (idempotent)."""
    _shmem.init()


def shmem_finalize():
    """Finalize the OpenSHMEM library."""
    _shmem.finalize()


def shmem_my_pe():
    """Return this PE's number."""
    return _shmem.my_pe()


def shmem_n_pes():
    """Return the number of PEs."""
    return _shmem.n_pes()


def shmem_pe_accessible(pe):
    """Return 1 if PE ``pe`` is accessible."""
    return int(_shmem.pe_accessible(pe))


def shmem_addr_accessible(ptr, pe):
    """Return 1 if ``ptr`` is symmetric and ``pe`` is accessible."""
    heap = _runtime.get().heap
    addr = _addr(ptr)
    return int(heap.base <= addr < heap.base + len(heap.u8) and _shmem.pe_accessible(pe))


def shmem_info_get_version(major, minor):
    """Store the OpenSHMEM version in ``*major`` and ``*minor``."""
    major[0], minor[0] = _shmem.MAJOR_VERSION, _shmem.MINOR_VERSION


def shmem_info_get_name(name):
    """Copy the vendor string into ``name``."""
    raw = _shmem.VENDOR_STRING.encode()[:SHMEM_MAX_NAME_LEN - 1] + b"\0"
    _ffi.memmove(name, raw, len(raw))


def shmem_malloc(size):
    """Collectively allocate symmetric memory; returns a ``void*``."""
    mem = _shmem.alloc(int(size))
    heap = _runtime.get().heap
    return _ffi.cast("void*", heap.base + heap.offset_of(mem, 0))


def shmem_calloc(count, size):
    """Collectively allocate zeroed symmetric memory; returns a ``void*``."""
    return shmem_malloc(int(count) * int(size))


def shmem_align(alignment, size):
    """Collectively allocate aligned symmetric memory; returns a ``void*``."""
    mem = _shmem.alloc(int(size), align=int(alignment))
    heap = _runtime.get().heap
    return _ffi.cast("void*", heap.base + heap.offset_of(mem, 0))


def shmem_free(ptr):
    """Collectively free symmetric memory."""
    heap = _runtime.get().heap
    off = _addr(ptr) - heap.base
    _shmem.free(heap.view(off, heap.allocator.live[off][2]))


def shmem_barrier_all():
    """Barrier over all PEs (completes outstanding stores)."""
    _shmem.barrier_all()


def shmem_quiet():
    """Complete this PE's outstanding operations."""
    _shmem.quiet()


def shmem_fence():
    """Order this PE's operations to each PE."""
    _shmem.fence()


def shmem_putmem(dest, src, nbytes, pe):
    """Copy ``nbytes`` bytes from local ``src`` to symmetric ``dest`` on ``pe``."""
    _shmem.put(_array(dest, nbytes, "u1"), _array(src, nbytes, "u1"), pe)


def shmem_getmem(dest, src, nbytes, pe):
    """Copy ``nbytes`` bytes from symmetric ``src`` on ``pe`` to local ``dest``."""
    _shmem.get(_array(dest, nbytes, "u1"), _array(src, nbytes, "u1"), pe)


def _typed(name, code):
    def put(dest, src, nelems, pe):
        _shmem.put(_array(dest, nelems, code), _array(src, nelems, code), pe)

    def get(dest, src, nelems, pe):
        _shmem.get(_array(dest, nelems, code), _array(src, nelems, code), pe)

    def p(dest, value, pe):
        _shmem.p(_array(dest, 1, code), value, pe)

    def g(src, pe):
        return _shmem.g(_array(src, 1, code), pe)
    for kind, fn, doc in (("put", put, "Typed put of ``nelems`` elements."),
                          ("get", get, "Typed get of ``nelems`` elements."),
                          ("p", p, "Typed put of one value."),
                          ("g", g, "Typed get of one value.")):
        fn.__name__ = f"shmem_{name}_{kind}"
        fn.__doc__ = doc
        globals()[fn.__name__] = fn


for _name, _code in _TYPES.items():
    _typed(_name, _code)


def _lock_array(lock):
    return _array(lock, 1, "i8")


def shmem_set_lock(lock):
    """Acquire the distributed lock at symmetric ``long *lock``."""
    _shmem.set_lock(_lock_array(lock))


def shmem_clear_lock(lock):
    """Release the distributed lock at ``lock``."""
    _shmem.clear_lock(_lock_array(lock))


def shmem_test_lock(lock):
    """Try to acquire the lock at ``lock``: 0 when acquired, 1 otherwise."""
    return int(_shmem.test_lock(_lock_array(lock)))


__all__ = [n for n in list(globals()) if n.startswith(("shmem_", "SHMEM_"))]
