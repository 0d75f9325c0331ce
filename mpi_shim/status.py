"""``MPI.Status``: source, tag, error, byte count and cancelled flag."""
from __future__ import annotations

from array import array

from .datatype import UNDEFINED, Datatype
from .exceptions import SUCCESS

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2

_COUNT_LO, _COUNT_HI, _CANCELLED, _SOURCE, _TAG, _ERROR = range(6)


class Status:
    """Fields live in a small int array so ``tomemory()`` can expose them."""

    __slots__ = ("_f",)

    def __init__(self, status=None):
        if status is None:
            self._f = array("i", (0, 0, 0, ANY_SOURCE, ANY_TAG, SUCCESS))
        elif isinstance(status, Status):
            self._f = array("i", status._f)
        else:
            raise TypeError("expected a Status")

    def _set(self, source, tag, count, error=SUCCESS, cancelled=False):
        f = self._f
        f[_SOURCE], f[_TAG], f[_ERROR] = source, tag, error
        f[_COUNT_LO] = count & 0x7FFFFFFF
        f[_COUNT_HI] = count >> 31
        f[_CANCELLED] = int(cancelled)

    def _clear(self):
        self._set(ANY_SOURCE, ANY_TAG, 0)

    def __eq__(self, other):
        return isinstance(other, Status) and self._f == other._f

    def __reduce__(self):
        return (_rebuild, (list(self._f),))

    def __repr__(self):
        return f"<Status source={self.source} tag={self.tag} error={self.error} count={self.count}>"

    # -- accessors --------------------------------------------------------
    def Get_source(self) -> int:
        return self._f[_SOURCE]

    def Set_source(self, source: int) -> None:
        self._f[_SOURCE] = source

    def Get_tag(self) -> int:
        return self._f[_TAG]

    def Set_tag(self, tag: int) -> None:
        self._f[_TAG] = tag

    def Get_error(self) -> int:
        return self._f[_ERROR]

    def Set_error(self, error: int) -> None:
        self._f[_ERROR] = error

    def _nbytes(self) -> int:
        return self._f[_COUNT_LO] | (self._f[_COUNT_HI] << 31)

    def Get_count(self, datatype: Datatype = None) -> int:
        from .datatype import BYTE
        datatype = BYTE if datatype is None else datatype
        n, size = self._nbytes(), datatype.Get_size()
        if size == 0:
            return 0 if n == 0 else UNDEFINED
        return n // size if n % size == 0 else UNDEFINED

    def Get_elements(self, datatype: Datatype) -> int:
        size = datatype.Get_size()
        if size == 0:
            return 0
        n = self._nbytes()
        if datatype.np_dtype is not None and datatype.np_dtype.fields is None and \
                not datatype.predefined:
            return n // datatype.np_dtype.itemsize
        return n // size

    def Set_elements(self, datatype: Datatype, count: int) -> None:
        n = count * datatype.Get_size()
        self._f[_COUNT_LO] = n & 0x7FFFFFFF
        self._f[_COUNT_HI] = n >> 31

    def Is_cancelled(self) -> bool:
        return bool(self._f[_CANCELLED])

    def Set_cancelled(self, flag: bool) -> None:
        self._f[_CANCELLED] = int(bool(flag))

    def tomemory(self) -> memoryview:
        return memoryview(self._f)

    def py2f(self):
        return list(self._f)

    @classmethod
    def f2py(cls, arg):
        return _rebuild(arg)

    source = property(Get_source, Set_source)
    tag = property(Get_tag, Set_tag)
    error = property(Get_error, Set_error)
    count = property(lambda self: self._nbytes(),
                     lambda self, n: Status.Set_elements(self, _byte(), n))
    cancelled = property(Is_cancelled, Set_cancelled)


def _byte():
    from .datatype import BYTE
    return BYTE


def _rebuild(fields):
    s = Status()
    s._f = array("i", fields)
    return s
