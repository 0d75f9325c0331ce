"""The implementation behind an ``MPI.File`` handle: open files and data movement.

A :class:`FileImpl` holds the file descriptor (one per process, opened by
every member of the file's communicator), a private duplicate of that
communicator for the file's collectives, the access mode, hints, the view,
the individual file pointer and the shared one (:mod:`.sharedfp`).

Data movement.  A memory message is converted by the view's data
representation (:mod:`.datarep`) into file bytes in pieces of at most
``CHUNK`` bytes (contiguous native memory is used in place, never copied),
and each piece goes to the file runs the view maps it to
(:meth:`.FileView.runs`) with ``os.pwrite``/``os.preadv`` at explicit
offsets: no file position is shared between threads or handles and nothing
but the piece in flight is held in memory.  Reads of runs with small holes
between them read the covering range once and pick the runs out of it
(data sieving; the holes are never written).  In atomic mode every access
holds an ``fcntl`` byte-range lock over the file bytes it touches: shared
for reads, exclusive for writes.

Collective data access calls are independent I/O plus the agreement MPI
asks for (ordered accesses agree on their parts through the shared
pointer); errors of collective calls are agreed on where the members could
otherwise disagree (open, view changes).
"""
from __future__ import annotations

import builtins
import errno
import fcntl
import operator
import os
import stat

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .exceptions import (ERR_ACCESS, ERR_AMODE, ERR_ARG, ERR_BAD_FILE, ERR_FILE_EXISTS,
                         ERR_FILE_IN_USE, ERR_IO, ERR_NO_SPACE, ERR_NO_SUCH_FILE, ERR_NOT_SAME,
                         ERR_QUOTA, ERR_READ_ONLY, ERR_UNSUPPORTED_OPERATION, Exception)
from .msgspec import parse
from .sharedfp import SharedPointer

MODE_CREATE, MODE_RDONLY, MODE_WRONLY, MODE_RDWR = 1, 2, 4, 8
MODE_DELETE_ON_CLOSE, MODE_UNIQUE_OPEN, MODE_EXCL, MODE_APPEND, MODE_SEQUENTIAL = \
    16, 32, 64, 128, 256
_ALL_MODES = (MODE_CREATE | MODE_RDONLY | MODE_WRONLY | MODE_RDWR | MODE_DELETE_ON_CLOSE |
              MODE_UNIQUE_OPEN | MODE_EXCL | MODE_APPEND | MODE_SEQUENTIAL)
#: bytes of memory data converted and moved at a time
CHUNK = 4 << 20
#: the most file bytes a sieving read covers at once
SIEVE_MAX = 8 << 20
#: hole bytes a sieving read may read instead of one more system call
SIEVE_HOLE_PER_CALL = 4096

_ERRNO_CLASS = {
    errno.ENOENT: ERR_NO_SUCH_FILE, errno.EEXIST: ERR_FILE_EXISTS, errno.EACCES: ERR_ACCESS,
    errno.EPERM: ERR_ACCESS, errno.EROFS: ERR_READ_ONLY, errno.EISDIR: ERR_BAD_FILE,
    errno.ENOTDIR: ERR_BAD_FILE, errno.ENAMETOOLONG: ERR_BAD_FILE, errno.ELOOP: ERR_BAD_FILE,
    errno.ENOSPC: ERR_NO_SPACE, errno.EDQUOT: ERR_QUOTA, errno.EBUSY: ERR_FILE_IN_USE,
    errno.ETXTBSY: ERR_FILE_IN_USE,
}


def os_error(e: OSError, what: str) -> Exception:
    """The MPI.Exception standing for an operating system error."""
    exc = Exception(_ERRNO_CLASS.get(e.errno, ERR_IO), f"{what}: {e.strerror or e}")
    exc.__cause__ = e
    return exc


def check_amode(amode: int) -> None:
    """Raise MPI.Exception (ERR_AMODE) for an access mode MPI forbids."""
    access = [m for m in (MODE_RDONLY, MODE_WRONLY, MODE_RDWR) if amode & m]
    if len(access) != 1:
        raise Exception(ERR_AMODE, "the access mode needs exactly one of MODE_RDONLY, "
                                   "MODE_WRONLY and MODE_RDWR")
    if amode & ~_ALL_MODES:
        raise Exception(ERR_AMODE, f"unknown access mode bits {amode & ~_ALL_MODES:#x}")
    if amode & MODE_RDONLY and amode & (MODE_CREATE | MODE_EXCL):
        raise Exception(ERR_AMODE, "MODE_CREATE and MODE_EXCL need write access, not "
                                   "MODE_RDONLY")
    if amode & MODE_SEQUENTIAL and amode & MODE_RDWR:
        raise Exception(ERR_AMODE, "MODE_SEQUENTIAL cannot be combined with MODE_RDWR")


def _os_flags(amode: int, creator: bool) -> int:
    flags = {MODE_RDONLY: os.O_RDONLY, MODE_WRONLY: os.O_WRONLY, MODE_RDWR: os.O_RDWR}[
        amode & (MODE_RDONLY | MODE_WRONLY | MODE_RDWR)]
    if creator and amode & MODE_CREATE:
        flags |= os.O_CREAT
    if creator and amode & MODE_EXCL and amode & MODE_CREATE:
        flags |= os.O_EXCL
    # never O_APPEND: with it Linux appends every pwrite
    return flags | os.O_CLOEXEC


def _agree(comm, error):
    """Raise at every member the first member's error (collective)."""
    errors = comm.allgather(None if error is None else (error.Get_error_code(), error.message))
    for rank, err in enumerate(errors):
        if err is not None:
            if error is not None:
                raise error
            raise Exception(err[0], f"on rank {rank} of the file's group: {err[1]}")


def _permissions(hints: dict) -> int:
    """The permissions of a file created (the "file_perm" hint, octal; else 0o666)."""
    try:
        return int(hints.get("file_perm", "666"), 8) & 0o7777
    except ValueError:
        return 0o666                 # a hint that cannot be used is ignored


def _open_fd(path, amode: int, creator: bool, perm: int):
    try:
        fd = os.open(path, _os_flags(amode, creator), perm)
    except OSError as e:
        raise os_error(e, f"cannot open {os.fsdecode(path)!r}") from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise Exception(ERR_BAD_FILE, f"{os.fsdecode(path)!r} is a directory")
    return fd


class FileImpl:
    """The state of one open file (see the module docstring)."""

    __slots__ = ("comm", "rank", "fd", "path", "amode", "hints", "errhandler", "view",
                 "position", "shared", "atomic", "split", "dirty", "closed", "predefined",
                 "_hid", "__weakref__")

    def __init__(self, comm, fd, path, amode, hints, errhandler, view):
        self.comm, self.fd, self.path, self.amode = comm, fd, path, amode
        self.rank = comm.Get_rank()
        self.hints, self.errhandler, self.view = hints, errhandler, view
        self.position = 0
        self.shared = None
        self.atomic = False
        self.split = None             # (split collective name, bytes moved) while active
        self.dirty = False
        self.closed = self.predefined = False

    # -- opening and closing ---------------------------------------------------------------
    @classmethod
    def open(cls, comm, path, amode: int, hints: dict, errhandler, view):
        """Open ``path`` at every member of ``comm`` (collective; see File.Open).

        ``view`` is the initial view.  Raises MPI.Exception at every member
        when any member fails.
        """
        comm = comm.Dup()
        fd = None
        try:
            error = None
            try:
                check_amode(amode)
            except Exception as e:
                error = e
            modes = comm.allgather(amode)
            if error is None and len(set(modes)) > 1:
                error = Exception(ERR_NOT_SAME, f"the members open with different access "
                                                f"modes {sorted(set(modes))}")
            _agree(comm, error)
            perm = _permissions(hints)
            # rank 0 creates the file (so MODE_EXCL means one creator), then the others open it
            error = None
            if comm.Get_rank() == 0:
                try:
                    fd = _open_fd(path, amode, True, perm)
                except Exception as e:
                    error = e
            first = comm.bcast(None if error is None else (error.Get_error_code(),
                                                           error.message), 0)
            if first is not None:
                raise error if error is not None else Exception(*first)
            if comm.Get_rank() != 0:
                try:
                    fd = _open_fd(path, amode, False, perm)
                except Exception as e:
                    error = e
            _agree(comm, error)
            impl = cls(comm, fd, os.fspath(path), amode, hints, errhandler, view)
            start = 0
            if amode & MODE_APPEND:
                start = impl.view.end_offset(impl.size())
                impl.position = start
            impl.shared = SharedPointer(comm, start)
            return impl
        except BaseException:
            if fd is not None:
                os.close(fd)
            comm.Free()
            raise

    def close(self) -> None:
        """Close the file at every member (collective), deleting it with
        MODE_DELETE_ON_CLOSE once every member has closed it."""
        self.closed = True
        error = None
        try:
            if self.dirty and not self.amode & MODE_DELETE_ON_CLOSE:
                os.fsync(self.fd)
        except OSError as e:
            error = os_error(e, "cannot flush the file at close")
        os.close(self.fd)
        self.shared.close()
        self.view = None
        if self.amode & MODE_DELETE_ON_CLOSE:
            # every member has closed the file (the window's release is a barrier);
            # every member returns once it is gone
            deleted = None
            if self.rank == 0:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    deleted = (os_error(e, "").Get_error_code(), f"cannot delete the file "
                                                                  f"at close: {e.strerror}")
            deleted = self.comm.bcast(deleted, 0)
            if deleted is not None:
                error = error or Exception(*deleted)
        self.comm.Free()
        if error is not None:
            raise error

    # -- whole-file operations ---------------------------------------------------------------
    def size(self) -> int:
        """The file's size in bytes."""
        try:
            return os.fstat(self.fd).st_size
        except OSError as e:
            raise os_error(e, "cannot get the file size") from None

    def resize(self, size: int, preallocate: bool) -> None:
        """Set (or with ``preallocate`` grow to at least) ``size`` bytes at rank 0
        once every member has called; every member returns once it is done
        (collective)."""
        self.check_writable()
        if self.amode & MODE_SEQUENTIAL:
            raise Exception(ERR_UNSUPPORTED_OPERATION, "files opened with MODE_SEQUENTIAL "
                                                       "cannot be resized")
        if size < 0:
            raise Exception(ERR_ARG, f"invalid file size {size}")
        error = None
        # nobody may still be reading or writing what the new size cuts off
        self.comm.Barrier()
        if self.rank == 0:
            try:
                if not preallocate:
                    if self.size() != size:
                        os.ftruncate(self.fd, size)
                elif self.size() < size:
                    try:
                        os.posix_fallocate(self.fd, 0, size)
                    except OSError as e:
                        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                            raise
                        os.ftruncate(self.fd, size)        # the file system cannot reserve
                self.dirty = True
            except OSError as e:
                error = (os_error(e, "cannot resize the file").Get_error_code(), e.strerror)
        error = self.comm.bcast(error, 0)
        if error is not None:
            raise Exception(*error)

    def sync(self) -> None:
        """Write this process's data through to the storage device (nothing to
        do when it wrote nothing since the last sync)."""
        if not self.dirty:
            return
        try:
            os.fsync(self.fd)
        except OSError as e:
            if e.errno != errno.EINVAL:            # special files cannot be synced
                raise os_error(e, "cannot sync the file") from None
        self.dirty = False

    # -- access checks ---------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Raise ERR_READ_ONLY for a file opened with MODE_RDONLY."""
        if self.amode & MODE_RDONLY:
            raise Exception(ERR_READ_ONLY, "the file was opened with MODE_RDONLY")

    def check_access(self, reading: bool, pointer: str) -> None:
        """Raise for an access the access mode forbids (``pointer``: "explicit",
        "individual" or "shared")."""
        if reading and self.amode & MODE_WRONLY:
            raise Exception(ERR_ACCESS, "the file was opened with MODE_WRONLY")
        if not reading:
            self.check_writable()
        if pointer != "shared":
            self.check_not_sequential(f"{pointer} file offsets")

    def check_not_sequential(self, what: str) -> None:
        """Raise ERR_UNSUPPORTED_OPERATION for ``what`` on a MODE_SEQUENTIAL file."""
        if self.amode & MODE_SEQUENTIAL:
            raise Exception(ERR_UNSUPPORTED_OPERATION, f"{what} are not supported on files "
                                                       f"opened with MODE_SEQUENTIAL")

    # -- data access -----------------------------------------------------------------------------
    def transfer(self, reading: bool, pointer: str, buf, offset=None) -> int:
        """Read or write message ``buf`` where ``pointer`` says: "explicit" (etype
        ``offset`` of the view), "individual" or "shared" (that file pointer,
        which advances) or "ordered" (collective: consecutive parts of the
        shared pointer's range in rank order).  Returns the memory bytes moved.
        """
        if pointer == "ordered":
            return self._ordered(reading, buf)
        self.check_access(reading, pointer)
        msg = parse(buf, writable=reading)
        count = self.etypes_of(msg)
        if pointer == "explicit":
            offset = operator.index(offset)
            if offset < 0:
                raise Exception(ERR_ARG, f"invalid file offset {offset}")
        elif pointer == "individual":
            offset = self.position
        else:
            offset = self.shared.fetch_add(count)
        moved, done = self.access(reading, msg, offset)
        if pointer == "individual":
            self.position = offset + done
        return moved

    def _ordered(self, reading: bool, buf) -> int:
        # a member whose arguments are bad still takes part (with no data), then raises
        error = msg = None
        count = 0
        try:
            self.check_access(reading, "shared")
            msg = parse(buf, writable=reading)
            count = self.etypes_of(msg)
        except builtins.Exception as e:
            error, count = e, 0
        start = self.shared.ordered(count)
        if error is not None:
            raise error
        return self.access(reading, msg, start)[0]

    def access(self, reading: bool, msg, offset: int):
        """Move ``msg`` to/from etype ``offset`` of the view.

        Returns ``(memory bytes moved, etypes moved)``; a read stops at the end
        of the file.
        """
        view = self.view
        rep = view.rep
        total = rep.stream_size(msg)
        start = offset * view.esize
        if total == 0:
            return 0, 0
        lock = self._lock(view.span(start, total), reading) if self.atomic else None
        try:
            if reading:
                moved, stream = self._read(view, rep, msg, start)
            else:
                moved, stream = self._write(view, rep, msg, start), total
                self.dirty = True
        except OSError as e:
            raise os_error(e, "read failed" if reading else "write failed") from None
        finally:
            if lock is not None:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, lock[1], lock[0], os.SEEK_SET)
        return moved, stream // view.esize

    def etypes_of(self, msg) -> int:
        """Etypes of the view ``msg`` accesses; raises ERR_ARG for a part of one."""
        esize = self.view.esize
        n, rest = divmod(self.view.rep.stream_size(msg), esize)
        if rest:
            raise Exception(ERR_ARG, f"only whole etypes can be accessed: the message has "
                                     f"{n * esize + rest} bytes, the etype {esize}")
        return n

    def _lock(self, span, reading):
        lo, hi = span
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_SH if reading else fcntl.LOCK_EX, hi - lo, lo,
                        os.SEEK_SET)
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise Exception(ERR_UNSUPPORTED_OPERATION, "atomic mode needs byte-range "
                                "locks, which this file system refuses") from None
            raise os_error(e, "cannot lock the file range") from None
        return lo, hi - lo

    def _write(self, view, rep, msg, start) -> int:
        for where, data in _pieces(rep, msg):
            mv = memoryview(data)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            pos = 0
            for offsets, lengths in view.runs(start + where, len(mv)):
                for off, n in zip(offsets.tolist(), lengths.tolist()):
                    _pwrite_all(self.fd, mv[pos:pos + n], off)
                    pos += n
        return msg.nbytes

    def _read(self, view, rep, msg, start):
        moved = stream = 0
        for where, target, finish in _targets(rep, msg):
            got = _pread_runs(self.fd, view, start + where, target)
            moved += finish(got)
            stream += got
            if got < len(target):
                break
        return moved, stream


def _pieces(rep, msg):
    """``(stream offset, file bytes)`` pieces of a message to write."""
    if rep.native:
        whole = msg.contig()
        if whole is not None:
            for s in range(0, len(whole), CHUNK):
                yield s, whole[s:s + CHUNK]
            return
    per = max(1, CHUNK // max(rep.element_size(msg), 1))
    where = 0
    for first in range(0, msg.count, per):
        data = rep.encode(msg, first, min(per, msg.count - first))
        yield where, data
        where += len(data)


def _targets(rep, msg):
    """``(stream offset, buffer to read into, finish)`` pieces of a message to read;
    ``finish(bytes read)`` stores them and returns the memory bytes stored."""
    if rep.native:
        whole = msg.contig()
        if whole is not None:
            for s in range(0, len(whole), CHUNK):
                yield s, whole[s:s + CHUNK], _same
            return
    size = rep.element_size(msg)
    per = max(1, CHUNK // max(size, 1))
    for first in range(0, msg.count, per):
        count = min(per, msg.count - first)
        buf = bytearray(count * size)
        yield first * size, memoryview(buf), \
            (lambda got, first=first, count=count, buf=buf:
             rep.decode(msg, first, count, buf, got))


def _same(n):
    return n


def _pwrite_all(fd, data, offset) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _pread_into(fd, target, offset) -> int:
    """Fill ``target`` from ``offset``; returns the bytes read (fewer at the end of file)."""
    done = 0
    while done < len(target):
        n = os.preadv(fd, [target[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _pread_runs(fd, view, start, target) -> int:
    """Read the stream bytes ``[start, start + len(target))`` into ``target``;
    returns how many were read before the end of the file."""
    pos = 0
    for offsets, lengths in view.runs(start, len(target)):
        lo = int(offsets[0])
        hi = int(offsets[-1] + lengths[-1])
        data = int(lengths.sum())
        if len(offsets) > 1 and hi - lo <= SIEVE_MAX and \
                hi - lo - data <= SIEVE_HOLE_PER_CALL * (len(offsets) - 1):
            got = _sieve(fd, offsets, lengths, lo, hi, target[pos:pos + data])
            pos += got
            if got < data:
                return pos
            continue
        for off, n in zip(offsets.tolist(), lengths.tolist()):
            got = _pread_into(fd, target[pos:pos + n], off)
            pos += got
            if got < n:
                return pos
    return pos


def _sieve(fd, offsets, lengths, lo, hi, target) -> int:
    """Read file bytes ``[lo, hi)`` once and copy the runs out of them."""
    span = bytearray(hi - lo)
    got = _pread_into(fd, memoryview(span), lo)
    edge = np.zeros(hi - lo + 1, np.int8)
    edge[offsets - lo] = 1
    edge[offsets - lo + lengths] -= 1
    inside = np.cumsum(edge[:got], dtype=np.int8).astype(bool)
    picked = np.frombuffer(span, np.uint8, got)[inside]
    np.frombuffer(target, np.uint8, len(picked))[:] = picked
    return len(picked)
