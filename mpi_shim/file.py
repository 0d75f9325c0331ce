"""Parallel I/O (``MPI.File``).

Not implemented yet: ``File.Open`` raises ``MPI.Exception`` with
``ERR_UNSUPPORTED_OPERATION`` at the call.
"""
from __future__ import annotations

from .exceptions import ERR_FILE, ERR_UNSUPPORTED_OPERATION, Exception
from .handle import Handle, register_family

__all__ = ["File", "FILE_NULL", "MODE_RDONLY", "MODE_WRONLY", "MODE_RDWR", "MODE_CREATE",
           "MODE_EXCL", "MODE_DELETE_ON_CLOSE", "MODE_UNIQUE_OPEN", "MODE_SEQUENTIAL",
           "MODE_APPEND", "SEEK_SET", "SEEK_CUR", "SEEK_END", "DISPLACEMENT_CURRENT",
           "DISP_CUR", "MAX_DATAREP_STRING", "Register_datarep"]

MODE_CREATE, MODE_RDONLY, MODE_WRONLY, MODE_RDWR = 1, 2, 4, 8
MODE_DELETE_ON_CLOSE, MODE_UNIQUE_OPEN, MODE_EXCL, MODE_APPEND, MODE_SEQUENTIAL = \
    16, 32, 64, 128, 256
SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
DISPLACEMENT_CURRENT = DISP_CUR = -54278278
MAX_DATAREP_STRING = 128


class File(Handle):
    """File I/O context."""

    __slots__ = ()

    def _impl(self):
        if self._h is None:
            raise Exception(ERR_FILE, "invalid file (FILE_NULL)")
        return self._h

    @classmethod
    def Open(cls, comm, filename, amode=MODE_RDONLY, info=None):
        """Open a file."""
        raise Exception(ERR_UNSUPPORTED_OPERATION, "MPI-IO is not implemented yet")

    @classmethod
    def Delete(cls, filename, info=None):
        """Delete a file."""
        raise Exception(ERR_UNSUPPORTED_OPERATION, "MPI-IO is not implemented yet")


def Register_datarep(datarep, read_fn, write_fn, extent_fn):
    """Register user-defined data representations."""
    raise Exception(ERR_UNSUPPORTED_OPERATION, "user data representations are not supported")


FILE_NULL = File._constant(None)
register_family(File)
