"""Every exception the OpenSHMEM layer raises.

All derive from :class:`ShmemError` (itself a :class:`ucxpy.UcxpyError`), and
also from the builtin exception a Python user would expect (``ValueError``
for a bad argument, ``TypeError`` for a bad dtype, ...), so both
``except shmem.ShmemError`` and ``except ValueError`` work.
"""
from __future__ import annotations

from ucxpy.errors import InvalidRank, UcxpyError


class ShmemError(UcxpyError):
    """Base class of OpenSHMEM errors."""


class NotInitialized(ShmemError, RuntimeError):
    """An OpenSHMEM routine was called before ``init()`` or after ``finalize()``."""


class InvalidPE(ShmemError, InvalidRank):
    """A PE number is out of range for the team or context used."""


class NotSymmetric(ShmemError, ValueError):
    """An array that must be symmetric does not lie on the symmetric heap."""


class InvalidArray(ShmemError, ValueError):
    """An array is not usable here: not contiguous, read-only, or wrong size."""


class DtypeMismatch(ShmemError, TypeError):
    """Source and target arrays (or fetch and target) have different dtypes,
    or the dtype is not supported by the operation (e.g. bitwise AMO on floats)."""


class InvalidFree(ShmemError, KeyError):
    """``free()`` of memory that is not a live symmetric allocation (double free)."""

    def __str__(self) -> str:       # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SymmetricHeapExhausted(ShmemError, MemoryError):
    """The symmetric heap has no free block large enough.  Raise its size with
    ``UCXPY_SHMEM_HEAP_SIZE`` (or ``SHMEM_SYMMETRIC_SIZE``)."""


class InvalidTeam(ShmemError, RuntimeError):
    """Operation on ``TEAM_INVALID``, a destroyed team, or a team this PE is not in."""


class InvalidContext(ShmemError, RuntimeError):
    """Operation on ``CTX_INVALID`` or a destroyed context."""
