"""``MPI.Status``: source, tag, error, received byte count and cancelled flag.

Counts are kept in bytes; ``Get_count`` divides by the datatype's size and
``Get_elements``/``Set_elements`` convert to and from *basic* elements of
the datatype's type map (``UNDEFINED`` where MPI says: bytes that are not a
whole number of elements, or end inside a basic element).
"""
from __future__ import annotations

import operator
from array import array

from .datatype import BYTE, UNDEFINED, Datatype
from .exceptions import ERR_COUNT, SUCCESS, Exception

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2

# field order of MPICH's MPI_Status (so F_SOURCE/F_TAG/F_ERROR index py2f()'s list)
_COUNT_LO, _COUNT_HI, _SOURCE, _TAG, _ERROR, _CANCELLED = range(6)
F_SOURCE, F_TAG, F_ERROR, F_STATUS_SIZE = _SOURCE, _TAG, _ERROR, 5
_CANCEL_BIT = 1 << 30


class Status:
    """Status object.

    Fields live in a small int array so that ``tomemory()`` can expose them."""

    __slots__ = ("_f", "__weakref__")

    def __init__(self, status=None):
        if status is None:
            self._f = array("i", (0, 0, ANY_SOURCE, ANY_TAG, SUCCESS, 0))
        elif isinstance(status, Status):
            self._f = array("i", status._f)
        else:
            raise TypeError("expected a Status")

    def _set(self, source, tag, count, error=SUCCESS, cancelled=False):
        f = self._f
        f[_SOURCE], f[_TAG], f[_ERROR] = source, tag, error
        self._set_nbytes(count)
        f[_CANCELLED] = int(cancelled)

    def _clear(self):
        self._set(ANY_SOURCE, ANY_TAG, 0)

    def _nbytes(self) -> int:
        return self._f[_COUNT_LO] | (self._f[_COUNT_HI] << 31)

    def _set_nbytes(self, n: int) -> None:
        self._f[_COUNT_LO] = n & 0x7FFFFFFF
        self._f[_COUNT_HI] = n >> 31

    def __eq__(self, other):
        return isinstance(other, Status) and self._f == other._f

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __reduce__(self):
        return (_rebuild_as, (type(self), list(self._f)))

    def __repr__(self):
        return (f"<Status source={self.source} tag={self.tag} error={self.error} "
                f"count={self.count}>")

    # -- fields -------------------------------------------------------------------------
    def Get_source(self) -> int:
        """Get message source.

        ANY_SOURCE until a receive fills the status.
        """
        return self._f[_SOURCE]

    def Set_source(self, source: int) -> None:
        """Set message source.

        The value is stored as given.
        """
        self._f[_SOURCE] = source

    def Get_tag(self) -> int:
        """Get message tag.

        ANY_TAG until a receive fills the status.
        """
        return self._f[_TAG]

    def Set_tag(self, tag: int) -> None:
        """Set message tag.

        The value is stored as given.
        """
        self._f[_TAG] = tag

    def Get_error(self) -> int:
        """Get message error.

        SUCCESS unless the operation failed.
        """
        return self._f[_ERROR]

    def Set_error(self, error: int) -> None:
        """Set message error.

        The value is stored as given.
        """
        self._f[_ERROR] = error

    # -- counts ---------------------------------------------------------------------------
    def Get_count(self, datatype: Datatype = None) -> int:
        """Get the number of *top level* elements.

        UNDEFINED when the received bytes are not a whole number of elements.
        """
        tm = _typemap(datatype)
        n, size = self._nbytes(), tm.size
        if size == 0:
            return 0 if n == 0 else UNDEFINED
        return n // size if n % size == 0 else UNDEFINED

    def Get_elements(self, datatype: Datatype) -> int:
        """Get the number of basic elements in a datatype.

        UNDEFINED when the received bytes end inside a basic element.
        """
        tm = _typemap(datatype)
        n, size = self._nbytes(), tm.size
        if size == 0:
            return 0 if n == 0 else UNDEFINED
        full, rest = divmod(n, size)
        part = tm.elements_in(rest)
        return UNDEFINED if part is None else full * tm.nelements + part

    def Set_elements(self, datatype: Datatype, count: int) -> None:
        """Set the number of elements in a status.

        The count is in basic elements; raises MPI.Exception (ERR_COUNT) when negative.
        """
        tm = _typemap(datatype)
        count = operator.index(count)
        if count < 0:
            raise Exception(ERR_COUNT, f"invalid count {count}")
        per = tm.nelements
        self._set_nbytes((count // per) * tm.size + tm.bytes_of(count % per) if per else 0)

    def Is_cancelled(self) -> bool:
        """Test to see if a request was cancelled.

        False unless the request the status belongs to was cancelled.
        """
        return bool(self._f[_CANCELLED])

    def Set_cancelled(self, flag: bool) -> None:
        """Set the cancelled state associated with a status.

        Only generalized requests should need this.
        """
        self._f[_CANCELLED] = int(bool(flag))

    # -- conversions -----------------------------------------------------------------------
    def tomemory(self) -> memoryview:
        """Return the memory of the status fields.

        Writing to it changes the status.
        """
        return memoryview(self._f)

    def py2f(self) -> list:
        """Convert the status to a Fortran status (a list of ints).

        Status.f2py() converts back; F_SOURCE, F_TAG and F_ERROR index it.
        """
        f = self._f
        hi = f[_COUNT_HI] | (_CANCEL_BIT if f[_CANCELLED] else 0)
        return [f[_COUNT_LO], hi, f[_SOURCE], f[_TAG], f[_ERROR]]

    @classmethod
    def f2py(cls, arg) -> "Status":
        """Convert a Fortran status (a list of ints) to a status.

        The inverse of Status.py2f().
        """
        return _rebuild(arg)

    @property
    def source(self) -> int:
        """Message source.

        Same as Get_source() and Set_source().
        """
        return self.Get_source()

    @source.setter
    def source(self, value: int) -> None:
        self.Set_source(value)

    @property
    def tag(self) -> int:
        """Message tag.

        Same as Get_tag() and Set_tag().
        """
        return self.Get_tag()

    @tag.setter
    def tag(self, value: int) -> None:
        self.Set_tag(value)

    @property
    def error(self) -> int:
        """Message error.

        Same as Get_error() and Set_error().
        """
        return self.Get_error()

    @error.setter
    def error(self, value: int) -> None:
        self.Set_error(value)

    @property
    def count(self) -> int:
        """Byte count.

        Same as Get_count(BYTE); setting it sets the byte count.
        """
        return self._nbytes()

    @count.setter
    def count(self, value: int) -> None:
        self.Set_elements(BYTE, value)

    @property
    def cancelled(self) -> bool:
        """Cancelled state.

        Same as Is_cancelled() and Set_cancelled().
        """
        return self.Is_cancelled()

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self.Set_cancelled(value)


def _typemap(datatype):
    """The type map of a status query's datatype (BYTE when None)."""
    if datatype is None:
        datatype = BYTE
    if not isinstance(datatype, Datatype):
        raise TypeError(f"expected a Datatype, not {type(datatype).__name__}")
    return datatype._impl().typemap


def _rebuild(fields):
    fields = list(fields)
    if len(fields) == F_STATUS_SIZE:          # a Fortran status (py2f)
        hi = fields[_COUNT_HI]
        fields = [fields[0], hi & ~_CANCEL_BIT, fields[2], fields[3], fields[4],
                  int(bool(hi & _CANCEL_BIT))]
    return _rebuild_as(Status, fields)


def _rebuild_as(cls, fields):
    s = cls.__new__(cls)
    s._f = array("i", fields)
    return s
