"""Sessions (MPI 4.0): ``Session.Init``, process sets, groups from psets."""
from __future__ import annotations

from . import bsend
from .errhandler import ERRORS_RETURN_IMPL, Errhandler, errhandler_of, raise_in
from .group import Group, pset_members
from .exceptions import ERR_ARG, ERR_SESSION, Exception
from .handle import Handle, register_family
from .info import INFO_NULL, Info

PSETS = ("mpi://WORLD", "mpi://SELF")


class SessionImpl:
    __slots__ = ("info", "errhandler", "finalized", "locks", "predefined", "_hid",
                 "__weakref__")

    def __init__(self, info, errhandler):
        self.info = dict(info.items()) if info else {}
        self.errhandler = errhandler
        self.finalized = False
        self.locks = {}
        self.predefined = False


class Session(Handle):
    """Session context."""

    __slots__ = ()

    @classmethod
    def Init(cls, info=INFO_NULL, errhandler=None):
        """Create a new session."""
        eh = ERRORS_RETURN_IMPL if errhandler is None else Errhandler._checked(errhandler,
                                                                                "session")
        return cls._wrap(SessionImpl(info, eh))

    def _impl(self) -> SessionImpl:
        if self._h is None:
            raise Exception(ERR_SESSION, "invalid session (SESSION_NULL)")
        return self._h

    def Finalize(self) -> None:
        """Finalize the session."""
        self._impl().finalized = True
        self._h = None

    def Get_num_psets(self, info=INFO_NULL) -> int:
        """Number of available process sets."""
        self._impl()
        return len(PSETS)

    def Get_nth_pset(self, n: int, info=INFO_NULL) -> str:
        """Name of the ``n``-th process set."""
        self._impl()
        if not (0 <= n < len(PSETS)):
            raise Exception(ERR_ARG, f"invalid process set index {n}")
        return PSETS[n]

    def Get_info(self) -> Info:
        """Hints of the session."""
        return Info.Create(dict(self._impl().info, thread_level="MPI_THREAD_MULTIPLE"))

    def Get_pset_info(self, pset_name: str) -> Info:
        """Hints of a process set (its size as ``mpi_size``)."""
        return Info.Create({"mpi_size": str(len(pset_members(self, pset_name)))})

    def Create_group(self, pset_name: str):
        """Create a group from a process set."""
        return Group.Create_from_session_pset(self, pset_name)

    def Get_errhandler(self):
        """Get the error handler of the session."""
        return errhandler_of(self._impl().errhandler)

    def Set_errhandler(self, errhandler) -> None:
        """Set the error handler of the session."""
        self._impl().errhandler = Errhandler._checked(errhandler, "session")

    def Call_errhandler(self, errorcode: int) -> None:
        """Call the error handler installed on the session."""
        raise_in(self, Exception(errorcode), call_only=True)

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        """Create a new error handler for sessions."""
        return Errhandler._create(errhandler_fn, "session")

    def Attach_buffer(self, buf) -> None:
        """Attach a buffer for the session's buffered sends."""
        bsend.attach(self._impl(), buf)

    def Detach_buffer(self):
        """Detach the session's buffer."""
        return bsend.detach(self._impl())

    def Flush_buffer(self) -> None:
        """Wait until the session's buffered sends have left."""
        bsend.flush(self._impl())

    def Iflush_buffer(self):
        """Nonblocking ``Flush_buffer``."""
        return bsend.iflush(self._impl())


SESSION_NULL = Session._constant(None)
register_family(Session)
