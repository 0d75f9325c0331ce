"""Private POSIX shared-memory files: the one place ucxpy creates and opens
/dev/shm segments (the shm transport's rings, RMA regions from
``mem_map(length=n)`` that same-host peers map, and through them shmem's
symmetric heap and mpi_shim's ``Allocate_shared`` windows).

A segment is created with mode 600 and ``O_EXCL`` under a name the caller
makes unique, and opened with ``O_NOFOLLOW`` after checking that it is a
regular file of this user that nobody else may read or write: a file some
other user planted under an expected name is refused, not mapped.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat
import time

from .transports.liveness import pid_alive

SHM_DIR = "/dev/shm"


_libc = None
MAP_FAILED = (1 << 64) - 1


def _c():
    global _libc
    if _libc is None:
        import ctypes       # deferred: only fixed mappings (UCP_MEM_MAP_FIXED) need ctypes
        lib = ctypes.CDLL(None, use_errno=True)
        for name, args in (("mmap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_long]),
                           ("mremap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                       ctypes.c_int, ctypes.c_void_p]),
                           ("munmap", [ctypes.c_void_p, ctypes.c_size_t])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, (ctypes.c_int if name == "munmap" else ctypes.c_void_p)
        _libc = lib
    return _libc


def page_round(length: int) -> int:
    return -(-length // mmap.PAGESIZE) * mmap.PAGESIZE


def alias_fixed(source: int, length: int, address: int) -> None:
    """Map the shared pages at ``source`` (a mapping of a segment, at least
    ``length`` bytes) a second time at exactly ``address``, which must be
    page-aligned and free: both addresses then reach the same memory (UCP's
    ``UCP_MEM_MAP_FIXED``).  The range is first reserved with
    MAP_FIXED_NOREPLACE, so nothing already mapped there is replaced: a range
    in use raises OSError EEXIST.  Undo with :func:`unmap_fixed`."""
    import ctypes       # deferred: as in _c
    length = page_round(length)
    if address % mmap.PAGESIZE:
        raise OSError(errno.EINVAL, f"fixed address {address:#x} is not page-aligned")
    c = _c()
    PROT_NONE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0, 0x02, 0x20, 0x100000
    got = c.mmap(address, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                 -1, 0)
    if got is None or got == MAP_FAILED or got != address:
        err = ctypes.get_errno()
        if got not in (None, MAP_FAILED):        # a kernel without NOREPLACE put it elsewhere
            c.munmap(got, length)
            err = errno.EEXIST
        raise OSError(err, f"cannot place {length} bytes at {address:#x}: "
                           f"{os.strerror(err)}")
    MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
    got = c.mremap(source, 0, length, MREMAP_MAYMOVE | MREMAP_FIXED, address)
    if got is None or got == MAP_FAILED:
        err = ctypes.get_errno()
        c.munmap(address, length)
        raise OSError(err, f"cannot alias {length} bytes at {address:#x}: {os.strerror(err)}")


def unmap_fixed(address: int, length: int) -> None:
    _c().munmap(address, page_round(length))


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _map(fd: int, length: int, populate: bool) -> mmap.mmap:
    """A shared mapping of ``fd``; ``populate`` fills its page tables now
    (``MAP_POPULATE``), so the first touch of each page later takes no
    fault."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    return mmap.mmap(fd, length, flags=flags)


def create(name: str, length: int, allocate: bool = False,
           populate: bool = False) -> mmap.mmap:
    """Create segment ``name`` of ``length`` bytes and map it.  ``allocate``
    reserves its pages now (``posix_fallocate``: a full /dev/shm fails here,
    not with SIGBUS on first touch); otherwise the file is sparse.
    ``populate``: see :func:`_map`."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        if allocate:
            os.posix_fallocate(fd, 0, length)
        else:
            os.ftruncate(fd, length)
        return _map(fd, length, populate)
    except BaseException:
        unlink_quiet(path)
        raise
    finally:
        os.close(fd)


def open_private(name: str, length: int, exact: bool = False,
                 unlink: bool = False, populate: bool = False) -> mmap.mmap:
    """Map the first ``length`` bytes of an existing segment ``name`` of this
    user (PermissionError if it is not a private regular file of ours;
    OSError EINVAL if it is shorter than ``length``, or not exactly that long
    with ``exact``).  ``unlink``: remove the name once it is open.
    ``populate``: see :func:`_map`."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(errno.EPERM, f"shm segment {name} is not owned by us "
                                  f"alone (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        if unlink:
            unlink_quiet(path)
        if st.st_size < length or exact and st.st_size != length:
            raise OSError(errno.EINVAL, f"shm segment {name} has {st.st_size} bytes, "
                                        f"expected {'' if exact else 'at least '}{length}")
        return _map(fd, length, populate)
    finally:
        os.close(fd)


def reap_dead(pattern, min_age: float = 0.0) -> int:
    """Unlink segments left by processes that are gone: names matching the
    compiled ``pattern`` whose first group is the creator's pid, not ours,
    no longer alive, and (``min_age`` > 0) older than ``min_age`` seconds
    (the guard for peers in another pid namespace sharing /dev/shm).
    Returns the number removed."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    now, me, removed = time.time(), os.getpid(), 0
    for name in names:
        m = pattern.match(name)
        if m is None or int(m.group(1)) == me:
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            if min_age and now - os.stat(path).st_mtime < min_age or pid_alive(int(m.group(1))):
                continue
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
