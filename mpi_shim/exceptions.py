"""MPI error classes and :class:`Exception` (mpi4py's ``MPI.Exception``).

ucxpy errors are translated at the API boundary by :func:`translate`, so user
code only ever sees ``MPI.Exception`` with a standard error class.
"""
from __future__ import annotations

import builtins

import ucxpy

SUCCESS = 0
_CLASSES = """ERR_BUFFER ERR_COUNT ERR_TYPE ERR_TAG ERR_COMM ERR_RANK ERR_REQUEST ERR_ROOT
ERR_GROUP ERR_OP ERR_TOPOLOGY ERR_DIMS ERR_ARG ERR_UNKNOWN ERR_TRUNCATE ERR_OTHER ERR_INTERN
ERR_IN_STATUS ERR_PENDING ERR_ACCESS ERR_AMODE ERR_ASSERT ERR_BAD_FILE ERR_BASE
ERR_CONVERSION ERR_DISP ERR_DUP_DATAREP ERR_FILE_EXISTS ERR_FILE_IN_USE ERR_FILE ERR_INFO_KEY
ERR_INFO_NOKEY ERR_INFO_VALUE ERR_INFO ERR_IO ERR_KEYVAL ERR_LOCKTYPE ERR_NAME ERR_NO_MEM
ERR_NOT_SAME ERR_NO_SPACE ERR_NO_SUCH_FILE ERR_PORT ERR_QUOTA ERR_READ_ONLY ERR_RMA_CONFLICT
ERR_RMA_SYNC ERR_SERVICE ERR_SIZE ERR_SPAWN ERR_UNSUPPORTED_DATAREP ERR_UNSUPPORTED_OPERATION
ERR_WIN ERR_RMA_RANGE ERR_RMA_ATTACH ERR_RMA_SHARED ERR_RMA_FLAVOR ERR_SESSION
ERR_PROC_ABORTED ERR_VALUE_TOO_LARGE ERR_ERRHANDLER ERR_PROC_FAILED ERR_PROC_FAILED_PENDING
ERR_REVOKED ERR_ABI""".split()
ERR_CLASS = {name: i + 1 for i, name in enumerate(_CLASSES)}
globals().update(ERR_CLASS)
ERR_LASTCODE = len(_CLASSES) + 64
_STRINGS = {SUCCESS: "MPI_SUCCESS: no errors"}
_STRINGS.update({v: f"MPI_{k}" for k, v in ERR_CLASS.items()})
_user_classes = {}        # Add_error_class / Add_error_code
__all__ = ["SUCCESS", "ERR_LASTCODE", "Exception", "Get_error_class", "Get_error_string",
           "Add_error_class", "Add_error_code", "Add_error_string", "Remove_error_class",
           "Remove_error_code", "Remove_error_string"] + list(ERR_CLASS)


class Exception(builtins.RuntimeError):       # noqa: A001 - mpi4py's name
    """An MPI error: ``Get_error_class()``, ``Get_error_code()``,
    ``Get_error_string()``; compares equal to its error code."""

    def __init__(self, ierr: int = SUCCESS, message: str = ""):
        if not isinstance(ierr, int):
            raise TypeError("error code must be an int")
        self.ierr = ierr
        self.message = message
        super().__init__(ierr)

    def __eq__(self, other):
        if isinstance(other, Exception):
            return self.ierr == other.ierr
        return self.ierr == other

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.ierr)

    def __bool__(self):
        return self.ierr != SUCCESS

    def __int__(self):
        return self.ierr

    def __repr__(self):
        return f"MPI.Exception({self.ierr})"

    def __str__(self):
        s = Get_error_string(self.ierr)
        return f"{s}: {self.message}" if self.message else s

    def Get_error_code(self) -> int:
        return self.ierr

    def Get_error_class(self) -> int:
        return Get_error_class(self.ierr)

    def Get_error_string(self) -> str:
        return Get_error_string(self.ierr)

    error_code = property(Get_error_code)
    error_class = property(Get_error_class)
    error_string = property(Get_error_string)


def Get_error_class(errorcode: int) -> int:
    if errorcode in _user_classes:
        return _user_classes[errorcode]
    if 0 <= errorcode <= len(_CLASSES):
        return errorcode
    raise Exception(ERR_ARG, f"invalid error code {errorcode}")


def Get_error_string(errorcode: int) -> str:
    try:
        return _STRINGS[errorcode]
    except KeyError:
        raise Exception(ERR_ARG, f"invalid error code {errorcode}") from None


_next_code = [ERR_LASTCODE + 1]


def Add_error_class() -> int:
    c = _next_code[0]
    _next_code[0] += 1
    _user_classes[c] = c
    _STRINGS[c] = ""
    return c


def Add_error_code(errorclass: int) -> int:
    c = _next_code[0]
    _next_code[0] += 1
    _user_classes[c] = errorclass
    _STRINGS[c] = ""
    return c


def Add_error_string(errorcode: int, string: str) -> None:
    _STRINGS[errorcode] = string


def last_used_code() -> int:
    """The largest error code or class in use (the LASTUSEDCODE attribute)."""
    return _next_code[0] - 1


def Remove_error_class(errorclass):
    _user_classes.pop(errorclass, None)


Remove_error_code = Remove_error_class


def Remove_error_string(errorcode):
    _STRINGS.pop(errorcode, None)


def translate(e: BaseException) -> Exception:
    """The MPI.Exception standing for a ucxpy (or Python) error."""
    if isinstance(e, Exception):
        return e
    if isinstance(e, ucxpy.TruncationError):
        cls = ERR_TRUNCATE
    elif isinstance(e, ucxpy.InvalidRank):
        cls = ERR_RANK
    elif isinstance(e, ucxpy.InvalidBuffer):
        cls = ERR_BUFFER
    elif isinstance(e, ucxpy.RemoteAccessError):
        cls = ERR_RMA_RANGE
    elif isinstance(e, ucxpy.PeerFailure):
        cls = ERR_PROC_FAILED
    elif isinstance(e, ucxpy.ConnectionLost):
        cls = ERR_PROC_ABORTED
    else:
        cls = ERR_OTHER
    exc = Exception(cls, str(e))
    exc.__cause__ = e
    return exc
