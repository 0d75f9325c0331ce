"""MPI error classes, codes and strings, and ``MPI.Exception``.

Predefined error classes use the numbering MPICH uses (so codes read the
same in logs next to an MPICH run); the fault-tolerance classes (ULFM) and
``ERR_ABI`` follow.  ``Add_error_class``/``Add_error_code`` hand out values
above ``ERR_LASTCODE``; the ``LASTUSEDCODE`` attribute is the largest in use.
ucxpy errors are translated at the API boundary by :func:`translate`, so
user code only ever sees ``MPI.Exception`` with a standard error class.
"""
from __future__ import annotations

import builtins
import sys

import ucxpy

SUCCESS = 0
_CLASSES = {
    "ERR_BUFFER": (1, "Invalid buffer pointer"),
    "ERR_COUNT": (2, "Invalid count"),
    "ERR_TYPE": (3, "Invalid datatype"),
    "ERR_TAG": (4, "Invalid tag"),
    "ERR_COMM": (5, "Invalid communicator"),
    "ERR_RANK": (6, "Invalid rank"),
    "ERR_ROOT": (7, "Invalid root"),
    "ERR_GROUP": (8, "Invalid group"),
    "ERR_OP": (9, "Invalid MPI_Op"),
    "ERR_TOPOLOGY": (10, "Invalid topology"),
    "ERR_DIMS": (11, "Invalid dimension argument"),
    "ERR_ARG": (12, "Invalid argument"),
    "ERR_UNKNOWN": (13, "Unknown error"),
    "ERR_TRUNCATE": (14, "Message truncated"),
    "ERR_OTHER": (15, "Other MPI error"),
    "ERR_INTERN": (16, "Internal MPI error"),
    "ERR_IN_STATUS": (17, "See the MPI_ERROR field in MPI_Status for the error code"),
    "ERR_PENDING": (18, "Pending request (no error)"),
    "ERR_REQUEST": (19, "Invalid MPI_Request"),
    "ERR_ACCESS": (20, "Access denied to file"),
    "ERR_AMODE": (21, "Invalid amode value in MPI_File_open"),
    "ERR_BAD_FILE": (22, "Invalid file name"),
    "ERR_CONVERSION": (23, "An error occurred in a user-defined data conversion function"),
    "ERR_DUP_DATAREP": (24, "The requested datarep name has already been specified"),
    "ERR_FILE_EXISTS": (25, "File exists"),
    "ERR_FILE_IN_USE": (26, "File in use by some process"),
    "ERR_FILE": (27, "Invalid MPI_File"),
    "ERR_INFO": (28, "Invalid MPI_Info"),
    "ERR_INFO_KEY": (29, "Invalid key for MPI_Info"),
    "ERR_INFO_VALUE": (30, "Invalid MPI_Info value"),
    "ERR_INFO_NOKEY": (31, "MPI_Info key is not defined"),
    "ERR_IO": (32, "Other I/O error"),
    "ERR_NAME": (33, "Invalid service name (see MPI_Publish_name)"),
    "ERR_NO_MEM": (34, "Unable to allocate memory for MPI_Alloc_mem"),
    "ERR_NOT_SAME": (35, "Inconsistent arguments to collective routine"),
    "ERR_NO_SPACE": (36, "Not enough space for file"),
    "ERR_NO_SUCH_FILE": (37, "File does not exist"),
    "ERR_PORT": (38, "Invalid port"),
    "ERR_QUOTA": (39, "Quota exceeded for files"),
    "ERR_READ_ONLY": (40, "Read-only file or filesystem name"),
    "ERR_SERVICE": (41, "Attempt to lookup an unknown service name"),
    "ERR_SPAWN": (42, "Error in spawn call"),
    "ERR_UNSUPPORTED_DATAREP": (43, "Unsupported datarep passed to MPI_File_set_view"),
    "ERR_UNSUPPORTED_OPERATION": (44, "Operation not supported"),
    "ERR_WIN": (45, "Invalid MPI_Win"),
    "ERR_BASE": (46, "Invalid base address"),
    "ERR_LOCKTYPE": (47, "Invalid lock type"),
    "ERR_KEYVAL": (48, "Invalid keyval"),
    "ERR_RMA_CONFLICT": (49, "Conflicting accesses to window"),
    "ERR_RMA_SYNC": (50, "Wrong synchronization of RMA calls"),
    "ERR_SIZE": (51, "Invalid size argument"),
    "ERR_DISP": (52, "Invalid displacement argument"),
    "ERR_ASSERT": (53, "Invalid assert argument"),
    "ERR_RMA_RANGE": (55, "Target memory is not part of the window"),
    "ERR_RMA_ATTACH": (56, "Memory cannot be attached"),
    "ERR_RMA_SHARED": (57, "Memory cannot be shared"),
    "ERR_RMA_FLAVOR": (58, "Passed window has incorrect flavor for called function"),
    "ERR_SESSION": (75, "Invalid session"),
    "ERR_PROC_ABORTED": (76, "Operation failed because a remote process has aborted"),
    "ERR_VALUE_TOO_LARGE": (77, "Value is too large to store"),
    "ERR_ERRHANDLER": (80, "Invalid errhandler"),
    "ERR_PROC_FAILED": (81, "Process failed"),
    "ERR_PROC_FAILED_PENDING": (82, "Operation pending on a failed process"),
    "ERR_REVOKED": (83, "Communication object revoked"),
    "ERR_ABI": (84, "Error in the MPI ABI"),
}
ERR_CLASS = {name: code for name, (code, _) in _CLASSES.items()}
globals().update(ERR_CLASS)
ERR_LASTCODE = 127

_PREDEFINED = {code: text for code, text in _CLASSES.values()}
_PREDEFINED[SUCCESS] = "No MPI error"
_user_classes = set()       # Add_error_class
_user_codes = {}            # Add_error_code: code -> class
_user_strings = {}          # Add_error_string
_next_code = [ERR_LASTCODE + 1]

__all__ = ["SUCCESS", "ERR_LASTCODE", "Exception", "Get_error_class", "Get_error_string",
           "Add_error_class", "Add_error_code", "Add_error_string", "Remove_error_class",
           "Remove_error_code", "Remove_error_string"] + list(ERR_CLASS)


def _known(code: int) -> bool:
    return code in _PREDEFINED or code in _user_classes or code in _user_codes


class Exception(builtins.RuntimeError):       # noqa: A001 - mpi4py's name
    """Exception class."""

    def __init__(self, ierr: int = SUCCESS, message: str = ""):
        if not isinstance(ierr, int):
            raise TypeError("error code must be an int")
        if ierr < SUCCESS:
            ierr = ERR_UNKNOWN
        self.ierr = ierr
        self.message = message
        super().__init__(ierr)

    def __eq__(self, other):
        return self.ierr == _code(other)

    def __ne__(self, other):
        return self.ierr != _code(other)

    def __lt__(self, other):
        return self.ierr < _code(other)

    def __le__(self, other):
        return self.ierr <= _code(other)

    def __gt__(self, other):
        return self.ierr > _code(other)

    def __ge__(self, other):
        return self.ierr >= _code(other)

    def __hash__(self):
        return hash(self.ierr)

    def __bool__(self):
        return self.ierr != SUCCESS

    def __int__(self):
        return self.ierr

    def __repr__(self):
        return f"MPI.Exception({self.ierr})"

    def __str__(self):
        try:
            s = Get_error_string(self.ierr)
        except Exception:
            s = f"MPI error {self.ierr}"
        return f"{s}: {self.message}" if self.message else s

    def Get_error_code(self) -> int:
        """Error code."""
        return self.ierr

    def Get_error_class(self) -> int:
        """Error class."""
        return Get_error_class(self.ierr)

    def Get_error_string(self) -> str:
        """Error string."""
        return Get_error_string(self.ierr)

    error_code = property(Get_error_code, doc="Error code.")
    error_class = property(Get_error_class, doc="Error class.")
    error_string = property(Get_error_string, doc="Error string.")


def _code(other):
    if isinstance(other, Exception):
        return other.ierr
    if isinstance(other, int):
        return other
    return NotImplemented


def Get_error_class(errorcode: int) -> int:
    """Convert an error code into an error class."""
    if errorcode in _user_codes:
        return _user_codes[errorcode]
    if errorcode in _PREDEFINED or errorcode in _user_classes:
        return errorcode
    if errorcode > ERR_LASTCODE or errorcode < 0:
        return ERR_UNKNOWN
    raise Exception(ERR_ARG, f"invalid error code {errorcode}")


def Get_error_string(errorcode: int) -> str:
    """Return the error string for a given error class or error code."""
    if errorcode in _user_strings:
        return _user_strings[errorcode]
    if errorcode in _PREDEFINED:
        return _PREDEFINED[errorcode]
    if errorcode in _user_classes or errorcode in _user_codes:
        return ""
    if errorcode > ERR_LASTCODE:
        return f"Unknown error code {errorcode}"
    raise Exception(ERR_ARG, f"invalid error code {errorcode}")


def Add_error_class() -> int:
    """Add an error class to the known error classes."""
    c = _next_code[0]
    _next_code[0] += 1
    _user_classes.add(c)
    return c


def Add_error_code(errorclass: int) -> int:
    """Add an error code to an error class."""
    if errorclass not in _PREDEFINED and errorclass not in _user_classes:
        raise Exception(ERR_ARG, f"invalid error class {errorclass}")
    c = _next_code[0]
    _next_code[0] += 1
    _user_codes[c] = errorclass
    return c


def Add_error_string(errorcode: int, string: str) -> None:
    """Associate an error string with an error class or error code."""
    if errorcode not in _user_classes and errorcode not in _user_codes:
        raise Exception(ERR_ARG, f"error code {errorcode} is not user-defined")
    _user_strings[errorcode] = str(string)


def last_used_code() -> int:
    """The largest error code or class in use (the LASTUSEDCODE attribute)."""
    return _next_code[0] - 1


def Remove_error_class(errorclass: int) -> None:
    """Remove an error class (it must have no codes and no string left)."""
    if errorclass not in _user_classes:
        raise Exception(ERR_ARG, f"error class {errorclass} is not user-defined")
    if errorclass in _user_strings or errorclass in _user_codes.values():
        raise Exception(ERR_ARG, f"error class {errorclass} still has codes or a string")
    _user_classes.discard(errorclass)


def Remove_error_code(errorcode: int) -> None:
    """Remove an error code (its string must be removed first)."""
    if errorcode not in _user_codes:
        raise Exception(ERR_ARG, f"error code {errorcode} is not user-defined")
    if errorcode in _user_strings:
        raise Exception(ERR_ARG, f"error code {errorcode} still has a string")
    del _user_codes[errorcode]


def Remove_error_string(errorcode: int) -> None:
    """Remove the string of a user-defined error class or code."""
    if errorcode not in _user_classes and errorcode not in _user_codes:
        raise Exception(ERR_ARG, f"error code {errorcode} is not user-defined")
    _user_strings.pop(errorcode, None)


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
        cls = ERR_PROC_FAILED
    elif isinstance(e, ucxpy.TimeoutError):
        cls = ERR_OTHER
    else:
        cls = ERR_OTHER
    exc = Exception(cls, str(e))
    exc.__cause__ = e
    return exc


def user_call(fn, *args, **kwargs):
    """Run a user callback (of a generalized request, an attribute, ...).
    What it raises is printed with its traceback and turned into
    ``MPI.Exception`` (its own class for an MPI.Exception, ERR_OTHER
    otherwise)."""
    try:
        return fn(*args, **kwargs)
    except BaseException as e:
        import traceback                    # (deferred on purpose: only a failing callback)
        sys.stderr.write("Traceback (most recent call last):\n")
        traceback.print_tb(e.__traceback__, file=sys.stderr)
        sys.stderr.write("".join(traceback.format_exception_only(type(e), e)))
        sys.stderr.flush()
        if isinstance(e, Exception):
            raise Exception(e.Get_error_class(), str(e)) from None
        raise Exception(ERR_OTHER, f"{type(e).__name__}: {e}") from None
