"""The data access calls of ``MPI.File`` (MPI 4.1, section 14.4), and how
File methods report errors.

Three positionings (explicit offsets, the individual file pointer, the
shared file pointer) times three kinds of call: blocking (independent or
collective ``_all``/``_ordered``), nonblocking (``I*``: the data moves before
the call returns its completed request) and split collective
(``*_begin`` moves the data, ``*_end`` reports it).  The data movement
itself is :meth:`.FileImpl.transfer`.

Errors: a File method's ``MPI.Exception`` goes through the file's error
handler before it is raised (:func:`reporting`); ``FILE_NULL`` holds the
handler that new files start with and that failed opens use.
"""
from __future__ import annotations

import functools

import ucxpy

from .errhandler import ERRORS_RETURN_IMPL, _abort
from .exceptions import ERR_IO, SUCCESS, Exception, translate
from .ops import DoneOp
from .request import Request
from .status import ANY_SOURCE, ANY_TAG


class NullFileState:
    """Where FILE_NULL keeps its error handler (the default of new files);
    ``handle`` is FILE_NULL itself, which mpi_shim.file sets when it makes
    it (a handler called for it gets that handle)."""

    errhandler = ERRORS_RETURN_IMPL
    handle = None


NULL_STATE = NullFileState()


def run_errhandler(file, exc, call_only=False) -> None:
    """Apply the error handler of ``file`` to ``exc`` (raise it unless ``call_only``)."""
    impl = file._h if file is not None else None
    state = impl if impl is not None and not impl.closed else NULL_STATE
    handler = state.errhandler
    code = exc.Get_error_code()
    if handler.fn is not None:
        handler.fn(file if impl is not None else _file_null(), code)
    elif handler is not ERRORS_RETURN_IMPL and not (call_only and code == SUCCESS):
        _abort(file, exc)
    if not call_only:
        raise exc


def reporting(method):
    """Route the MPI errors of a File method through the file's error handler."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            run_errhandler(_file_null() if self is None or isinstance(self, type) else self, exc)
        except ucxpy.UcxpyError as e:
            run_errhandler(_file_null() if self is None or isinstance(self, type) else self,
                           translate(e))
    return call


def _file_null():
    return NULL_STATE.handle


def _fill(status, nbytes: int) -> None:
    if status is not None:
        status._set(ANY_SOURCE, ANY_TAG, nbytes)


class FileDataAccess:
    """The data access methods of ``MPI.File`` (see the module docstring)."""

    __slots__ = ()

    def _blocking(self, reading, pointer, buf, status, offset=None) -> None:
        _fill(status, self._impl().transfer(reading, pointer, buf, offset))

    def _nonblocking(self, reading, pointer, buf, offset=None):
        moved = self._impl().transfer(reading, pointer, buf, offset)
        return Request._from(DoneOp(ANY_SOURCE, ANY_TAG, moved))

    def _begin(self, name, reading, pointer, buf, offset=None) -> None:
        impl = self._impl()
        if impl.split is not None:
            raise Exception(ERR_IO, f"a split collective ({impl.split[0]}_begin) is already "
                                    f"active on this file")
        impl.split = (name, None)
        try:
            impl.split = (name, impl.transfer(reading, pointer, buf, offset))
        except BaseException:
            impl.split = None
            raise

    def _end(self, name, status) -> None:
        impl = self._impl()
        if impl.split is None or impl.split[0] != name:
            active = f"{impl.split[0]}_begin is active" if impl.split else "none is active"
            raise Exception(ERR_IO, f"{name}_end without {name}_begin ({active})")
        moved = impl.split[1]
        impl.split = None
        _fill(status, moved)

    # -- explicit offsets -------------------------------------------------------------------------
    @reporting
    def Read_at(self, offset: int, buf, status=None) -> None:
        """Read using explicit offset.

        The offset counts etypes of the view; the status holds the bytes read.
        """
        self._blocking(True, "explicit", buf, status, offset)

    @reporting
    def Read_at_all(self, offset: int, buf, status=None) -> None:
        """Collective read using explicit offset.

        Collective form of Read_at.
        """
        self._blocking(True, "explicit", buf, status, offset)

    @reporting
    def Write_at(self, offset: int, buf, status=None) -> None:
        """Write using explicit offset.

        The offset counts etypes of the view; the status holds the bytes written.
        """
        self._blocking(False, "explicit", buf, status, offset)

    @reporting
    def Write_at_all(self, offset: int, buf, status=None) -> None:
        """Collective write using explicit offset.

        Collective form of Write_at.
        """
        self._blocking(False, "explicit", buf, status, offset)

    @reporting
    def Iread_at(self, offset: int, buf):
        """Nonblocking read using explicit offset.

        The data is read before the call returns its request.
        """
        return self._nonblocking(True, "explicit", buf, offset)

    @reporting
    def Iread_at_all(self, offset: int, buf):
        """Nonblocking collective read using explicit offset.

        The data is read before the call returns its request.
        """
        return self._nonblocking(True, "explicit", buf, offset)

    @reporting
    def Iwrite_at(self, offset: int, buf):
        """Nonblocking write using explicit offset.

        The data is written before the call returns its request.
        """
        return self._nonblocking(False, "explicit", buf, offset)

    @reporting
    def Iwrite_at_all(self, offset: int, buf):
        """Nonblocking collective write using explicit offset.

        The data is written before the call returns its request.
        """
        return self._nonblocking(False, "explicit", buf, offset)

    @reporting
    def Read_at_all_begin(self, offset: int, buf) -> None:
        """Start a split collective read using explicit offset.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Read_at_all", True, "explicit", buf, offset)

    @reporting
    def Read_at_all_end(self, buf, status=None) -> None:
        """Complete a split collective read using explicit offset.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Read_at_all", status)

    @reporting
    def Write_at_all_begin(self, offset: int, buf) -> None:
        """Start a split collective write using explicit offset.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Write_at_all", False, "explicit", buf, offset)

    @reporting
    def Write_at_all_end(self, buf, status=None) -> None:
        """Complete a split collective write using explicit offset.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Write_at_all", status)

    # -- individual file pointers -------------------------------------------------------------------
    @reporting
    def Read(self, buf, status=None) -> None:
        """Read using individual file pointer.

        The pointer advances by the etypes read.
        """
        self._blocking(True, "individual", buf, status)

    @reporting
    def Read_all(self, buf, status=None) -> None:
        """Collective read using individual file pointer.

        Collective form of Read.
        """
        self._blocking(True, "individual", buf, status)

    @reporting
    def Write(self, buf, status=None) -> None:
        """Write using individual file pointer.

        The pointer advances by the etypes written.
        """
        self._blocking(False, "individual", buf, status)

    @reporting
    def Write_all(self, buf, status=None) -> None:
        """Collective write using individual file pointer.

        Collective form of Write.
        """
        self._blocking(False, "individual", buf, status)

    @reporting
    def Iread(self, buf):
        """Nonblocking read using individual file pointer.

        The data is read before the call returns its request.
        """
        return self._nonblocking(True, "individual", buf)

    @reporting
    def Iread_all(self, buf):
        """Nonblocking collective read using individual file pointer.

        The data is read before the call returns its request.
        """
        return self._nonblocking(True, "individual", buf)

    @reporting
    def Iwrite(self, buf):
        """Nonblocking write using individual file pointer.

        The data is written before the call returns its request.
        """
        return self._nonblocking(False, "individual", buf)

    @reporting
    def Iwrite_all(self, buf):
        """Nonblocking collective write using individual file pointer.

        The data is written before the call returns its request.
        """
        return self._nonblocking(False, "individual", buf)

    @reporting
    def Read_all_begin(self, buf) -> None:
        """Start a split collective read using individual file pointer.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Read_all", True, "individual", buf)

    @reporting
    def Read_all_end(self, buf, status=None) -> None:
        """Complete a split collective read using individual file pointer.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Read_all", status)

    @reporting
    def Write_all_begin(self, buf) -> None:
        """Start a split collective write using individual file pointer.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Write_all", False, "individual", buf)

    @reporting
    def Write_all_end(self, buf, status=None) -> None:
        """Complete a split collective write using individual file pointer.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Write_all", status)

    # -- shared file pointer ------------------------------------------------------------------------
    @reporting
    def Read_shared(self, buf, status=None) -> None:
        """Read using shared file pointer.

        Concurrent callers read disjoint parts, in some order.
        """
        self._blocking(True, "shared", buf, status)

    @reporting
    def Write_shared(self, buf, status=None) -> None:
        """Write using shared file pointer.

        Concurrent callers write disjoint parts, in some order.
        """
        self._blocking(False, "shared", buf, status)

    @reporting
    def Iread_shared(self, buf):
        """Nonblocking read using shared file pointer.

        The data is read before the call returns its request.
        """
        return self._nonblocking(True, "shared", buf)

    @reporting
    def Iwrite_shared(self, buf):
        """Nonblocking write using shared file pointer.

        The data is written before the call returns its request.
        """
        return self._nonblocking(False, "shared", buf)

    @reporting
    def Read_ordered(self, buf, status=None) -> None:
        """Collective read using shared file pointer.

        Collective; the members read consecutive parts in rank order.
        """
        self._blocking(True, "ordered", buf, status)

    @reporting
    def Write_ordered(self, buf, status=None) -> None:
        """Collective write using shared file pointer.

        Collective; the members write consecutive parts in rank order.
        """
        self._blocking(False, "ordered", buf, status)

    @reporting
    def Read_ordered_begin(self, buf) -> None:
        """Start a split collective read using shared file pointer.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Read_ordered", True, "ordered", buf)

    @reporting
    def Read_ordered_end(self, buf, status=None) -> None:
        """Complete a split collective read using shared file pointer.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Read_ordered", status)

    @reporting
    def Write_ordered_begin(self, buf) -> None:
        """Start a split collective write using shared file pointer.

        Raises MPI.Exception (ERR_IO) while another split collective is active.
        """
        self._begin("Write_ordered", False, "ordered", buf)

    @reporting
    def Write_ordered_end(self, buf, status=None) -> None:
        """Complete a split collective write using shared file pointer.

        Raises MPI.Exception (ERR_IO) without the matching begin call.
        """
        self._end("Write_ordered", status)

