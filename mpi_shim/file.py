"""Parallel I/O: ``MPI.File`` (MPI 4.1, chapter 14).

Every member of a communicator opens the file with POSIX calls of its own;
data moves with ``pread``/``pwrite`` at explicit offsets through the view
(:mod:`.fileview`, :mod:`.datarep`, :mod:`.fileimpl`), and the shared file
pointer lives in memory of rank 0 (:mod:`.sharedfp`).  Collective calls are
independent I/O plus the agreement MPI asks for; nonblocking calls move
their data before they return a (completed) request; split collectives
move it in ``*_begin`` and report it in ``*_end``.

Errors raise ``MPI.Exception`` after the file's error handler has run
(files start with the handler of ``FILE_NULL``, ``ERRORS_RETURN`` unless
changed; failures of ``Open`` and ``Delete`` use ``FILE_NULL``'s).  Bad
arguments raise TypeError/ValueError/BufferError as elsewhere in mpi4py.
"""
from __future__ import annotations

import builtins
import operator
import os

from . import datarep as _datarep
from .comm import Intracomm
from .datatype import BYTE, Datatype, _committed, _reference
from .errhandler import Errhandler, errhandler_of
from .exceptions import ERR_ARG, ERR_BAD_FILE, ERR_COMM, ERR_FILE, ERR_NOT_SAME, Exception
from .fileaccess import NULL_STATE, FileDataAccess, reporting, run_errhandler
from .fileimpl import (MODE_APPEND, MODE_CREATE, MODE_DELETE_ON_CLOSE, MODE_EXCL, MODE_RDONLY,
                       MODE_RDWR, MODE_SEQUENTIAL, MODE_UNIQUE_OPEN, MODE_WRONLY, FileImpl,
                       os_error)
from .fileview import FileView
from .handle import Handle, register_family
from .info import Info

__all__ = ["File", "FILE_NULL", "MODE_RDONLY", "MODE_WRONLY", "MODE_RDWR", "MODE_CREATE",
           "MODE_EXCL", "MODE_DELETE_ON_CLOSE", "MODE_UNIQUE_OPEN", "MODE_SEQUENTIAL",
           "MODE_APPEND", "SEEK_SET", "SEEK_CUR", "SEEK_END", "DISPLACEMENT_CURRENT",
           "DISP_CUR", "MAX_DATAREP_STRING", "Register_datarep"]

SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
DISPLACEMENT_CURRENT = DISP_CUR = -54278278
MAX_DATAREP_STRING = _datarep.MAX_DATAREP_STRING


def _index(value, what: str) -> int:
    value = operator.index(value)
    if value < 0:
        raise Exception(ERR_ARG, f"invalid {what} {value}")
    return value


def _hold(datatype) -> Datatype:
    """A reference to a committed datatype that a view keeps."""
    impl = _committed(datatype)
    if not impl.predefined:
        impl.refs += 1
    return Datatype._wrap(impl)


def _drop(datatype) -> None:
    impl = datatype._h
    if impl is not None and not impl.predefined:
        impl.release(Datatype._wrap)


def _path(filename):
    try:
        return os.fspath(filename)
    except TypeError:
        raise TypeError(f"expected a str, bytes or os.PathLike file name, got "
                        f"{type(filename).__name__}") from None


def _hints(info) -> dict:
    if info is None or not info:
        return {}
    if not isinstance(info, Info):
        raise TypeError(f"expected an Info, got {type(info).__name__}")
    return dict(info.items())


class File(FileDataAccess, Handle):
    """File I/O context."""

    __slots__ = ()

    def _impl(self) -> FileImpl:
        impl = self._h
        if impl is None or impl.closed:
            raise Exception(ERR_FILE, "invalid file (FILE_NULL or closed)")
        return impl

    def __reduce__(self):
        if self._h is not None:
            raise ValueError("cannot serialize an open file")
        return super().__reduce__()

    def _release(self) -> None:
        if not self._h.closed:
            self.Close()

    # -- opening and closing ------------------------------------------------------------
    @classmethod
    @reporting
    def Open(cls, comm, filename, amode=MODE_RDONLY, info=None):
        """Open a file.

        Collective over the intracommunicator ``comm``; raises MPI.Exception
        (ERR_AMODE, ERR_NO_SUCH_FILE, ERR_FILE_EXISTS, ERR_ACCESS ...) at every
        member when any member fails.
        """
        if not isinstance(comm, Intracomm):
            raise TypeError(f"expected an Intracomm, got {type(comm).__name__}")
        if not comm:
            raise Exception(ERR_COMM, "invalid communicator (COMM_NULL)")
        path, amode = _path(filename), operator.index(amode)
        hints = _hints(info)
        view = FileView(0, BYTE, BYTE, _datarep.representation("native"))
        impl = FileImpl.open(comm, path, amode, hints, NULL_STATE.errhandler, view)
        return cls._wrap(impl)

    @reporting
    def Close(self) -> None:
        """Close a file.

        Collective; a file opened with MODE_DELETE_ON_CLOSE is deleted once
        every member has closed it.
        """
        impl = self._impl()
        view = impl.view
        try:
            impl.close()
        finally:
            _drop(view.etype)
            _drop(view.filetype)
            self._h = None

    @classmethod
    @reporting
    def Delete(cls, filename, info=None) -> None:
        """Delete a file.

        Raises MPI.Exception (ERR_NO_SUCH_FILE when it does not exist,
        ERR_BAD_FILE for a directory, ERR_ACCESS ...).
        """
        path = _path(filename)
        _hints(info)
        if os.path.isdir(path):
            raise Exception(ERR_BAD_FILE, f"{os.fsdecode(path)!r} is a directory")
        try:
            os.unlink(path)
        except OSError as e:
            raise os_error(e, f"cannot delete {os.fsdecode(path)!r}") from None

    # -- size ----------------------------------------------------------------------------------
    @reporting
    def Set_size(self, size: int) -> None:
        """Set the file size.

        Collective; truncates or extends the file to ``size`` bytes.
        """
        self._impl().resize(operator.index(size), preallocate=False)

    @reporting
    def Preallocate(self, size: int) -> None:
        """Preallocate storage space for a file.

        Collective; the file grows to at least ``size`` bytes, never shrinks.
        """
        self._impl().resize(operator.index(size), preallocate=True)

    @reporting
    def Get_size(self) -> int:
        """Return the file size.

        The size is in bytes.
        """
        return self._impl().size()

    size = property(Get_size, doc="Size (in bytes).")

    @reporting
    def Sync(self) -> None:
        """Causes all previous writes to be transferred to the storage device.

        Collective; this process's writes reach the storage device.
        """
        self._impl().sync()

    # -- queries -----------------------------------------------------------------------------
    @reporting
    def Get_amode(self) -> int:
        """Return the file access mode.

        The mode the file was opened with.
        """
        return self._impl().amode

    amode = property(Get_amode, doc="Access mode.")

    @reporting
    def Get_group(self):
        """Access the group of processes that opened the file.

        Returns a new group (free it with Group.Free).
        """
        return self._impl().comm.Get_group()

    group = property(Get_group, doc="Group.")
    group_size = property(lambda self: self._impl().comm.Get_size(), doc="Group size.")
    group_rank = property(lambda self: self._impl().rank, doc="Group rank.")

    @reporting
    def Set_info(self, info) -> None:
        """Set new values for the hints associated with a file.

        Collective; the hints are added to those in effect.
        """
        self._impl().hints.update(_hints(info))

    @reporting
    def Get_info(self):
        """Return the current hints for a file.

        Returns a new Info object holding the hints in effect.
        """
        impl = self._impl()
        return Info.Create(dict(impl.hints, filename=os.fsdecode(impl.path)))

    info = property(Get_info, Set_info, doc="Info hints.")

    @reporting
    def Set_atomicity(self, flag: bool) -> None:
        """Set the atomicity mode.

        Collective; in atomic mode each access locks the bytes it touches.
        """
        self._impl().atomic = bool(flag)

    @reporting
    def Get_atomicity(self) -> bool:
        """Return the atomicity mode.

        False unless Set_atomicity(True) was called.
        """
        return self._impl().atomic

    atomicity = property(Get_atomicity, Set_atomicity, doc="Atomicity mode.")

    @reporting
    def Get_type_extent(self, datatype) -> int:
        """Return the extent of datatype in the file.

        The extent in the view's data representation.
        """
        return self._impl().view.rep.file_extent(datatype)

    # -- views -------------------------------------------------------------------------------
    @reporting
    def Set_view(self, disp=0, etype=BYTE, filetype=None, datarep="native", info=None) -> None:
        """Set the file view.

        Collective; resets both file pointers.  Raises MPI.Exception (ERR_ARG,
        ERR_TYPE, ERR_UNSUPPORTED_DATAREP ...) at every member when any fails.
        """
        impl = self._impl()
        error = view = None
        try:
            view = self._new_view(impl, disp, etype, filetype, datarep)
            impl.hints.update(_hints(info))
        except builtins.Exception as e:
            error = e
        agreed = impl.comm.allgather(
            (view.esize, view.rep.name) if error is None else
            (None, (error.Get_error_code(), error.message) if isinstance(error, Exception)
             else (ERR_ARG, repr(error))))
        failed = next((r for r, (esize, _) in enumerate(agreed) if esize is None), None)
        if error is None and failed is None and len(set(agreed)) > 1:
            error = Exception(ERR_NOT_SAME, "the members set views with different etype "
                                            "sizes or data representations")
        if error is None and failed is not None:
            error = Exception(agreed[failed][1][0],
                              f"on rank {failed} of the file's group: {agreed[failed][1][1]}")
        if error is not None:
            if view is not None:
                _drop(view.etype)
                _drop(view.filetype)
            raise error
        impl.shared.update(lambda _current: 0, entered=True)      # the allgather above
        old, impl.view, impl.position = impl.view, view, 0
        _drop(old.etype)
        _drop(old.filetype)

    @staticmethod
    def _new_view(impl, disp, etype, filetype, datarep) -> FileView:
        disp = operator.index(disp)
        if disp == DISPLACEMENT_CURRENT:
            if not impl.amode & MODE_SEQUENTIAL:
                raise Exception(ERR_ARG, "DISPLACEMENT_CURRENT needs MODE_SEQUENTIAL")
            disp = impl.view.byte_offset(impl.shared.get())
        elif disp < 0:
            raise Exception(ERR_ARG, f"invalid view displacement {disp}")
        if filetype is None:
            filetype = etype
        rep = _datarep.representation(datarep)
        et = _hold(etype)
        try:
            ft = _hold(filetype)
        except BaseException:
            _drop(et)
            raise
        try:
            rep.check_view(et, ft)
            return FileView(disp, et, ft, rep)
        except BaseException:
            _drop(et)
            _drop(ft)
            raise

    @reporting
    def Get_view(self):
        """Return the file view.

        Returns ``(disp, etype, filetype, datarep)``; free derived types.
        """
        view = self._impl().view
        return (view.disp, _reference(view.etype._h), _reference(view.filetype._h),
                view.rep.name)

    # -- file pointers -------------------------------------------------------------------------
    def _seek_target(self, impl, current, offset, whence) -> int:
        offset = operator.index(offset)
        if whence == SEEK_SET:
            new = offset
        elif whence == SEEK_CUR:
            new = current + offset
        elif whence == SEEK_END:
            new = impl.view.end_offset(impl.size()) + offset
        else:
            raise Exception(ERR_ARG, f"invalid whence {whence}")
        if new < 0:
            raise Exception(ERR_ARG, f"the file pointer would move to {new}, before the view")
        return new

    @reporting
    def Seek(self, offset: int, whence=SEEK_SET) -> None:
        """Update the individual file pointer.

        Offsets count etypes of the view; raises MPI.Exception (ERR_ARG) for a
        negative result or an unknown whence.
        """
        impl = self._impl()
        impl.check_not_sequential("individual file pointers")
        impl.position = self._seek_target(impl, impl.position, offset, whence)

    @reporting
    def Get_position(self) -> int:
        """Return the current position of the individual file pointer.

        The position counts etypes of the view.
        """
        impl = self._impl()
        impl.check_not_sequential("individual file pointers")
        return impl.position

    @reporting
    def Seek_shared(self, offset: int, whence=SEEK_SET) -> None:
        """Update the shared file pointer.

        Collective; every member passes the same offset and whence.
        """
        impl = self._impl()
        impl.check_not_sequential("seeks of the shared file pointer")
        offset = operator.index(offset)
        if whence not in (SEEK_SET, SEEK_CUR, SEEK_END):
            raise Exception(ERR_ARG, f"invalid whence {whence}")
        impl.shared.update(lambda current: self._seek_target(impl, current, offset, whence))

    @reporting
    def Get_position_shared(self) -> int:
        """Return the current position of the shared file pointer.

        The position counts etypes of the view.
        """
        impl = self._impl()
        impl.check_not_sequential("queries of the shared file pointer")
        return impl.shared.get()

    @reporting
    def Get_byte_offset(self, offset: int) -> int:
        """Return the absolute byte position in the file.

        Converts an offset in etypes of the view to bytes from the start of the file.
        """
        impl = self._impl()
        impl.check_not_sequential("view offsets")
        return impl.view.byte_offset(_index(offset, "offset"))

    # -- error handling ---------------------------------------------------------------------------
    def _state(self):
        return NULL_STATE if self._h is None else self._impl()

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        """Create a new error handler for files.

        The handler is called as ``errhandler_fn(file, errorcode)``.
        """
        return Errhandler._create(errhandler_fn, "file")

    @reporting
    def Get_errhandler(self):
        """Get the error handler for a file.

        On FILE_NULL: the handler new files start with.
        """
        return errhandler_of(self._state().errhandler)

    @reporting
    def Set_errhandler(self, errhandler) -> None:
        """Set the error handler for a file.

        On FILE_NULL: the handler of files opened afterwards and of failed opens.
        """
        self._state().errhandler = Errhandler._checked(errhandler, "file")

    @reporting
    def Call_errhandler(self, errorcode: int) -> None:
        """Call the error handler installed on a file.

        Does not raise for ERRORS_RETURN and user handlers.
        """
        self._state()
        run_errhandler(self, Exception(errorcode), call_only=True)


@reporting
def _register(_self, datarep, read_fn, write_fn, extent_fn):
    _datarep.register(datarep, read_fn, write_fn, extent_fn)


def Register_datarep(datarep, read_fn, write_fn, extent_fn) -> None:
    """Register user-defined data representations.

    ``read_fn``/``write_fn`` (None: copy bytes as they are) are called as
    ``fn(userbuf, datatype, count, filebuf, position)``; raises MPI.Exception
    (ERR_DUP_DATAREP) for a name in use.
    """
    _register(None, datarep, read_fn, write_fn, extent_fn)


FILE_NULL = File._constant(None)
NULL_STATE.handle = FILE_NULL        # (what a handler called for FILE_NULL gets)
register_family(File)
