"""``MPI.Info``, ``MPI.Errhandler`` and attribute key values."""
from __future__ import annotations

from .exceptions import ERR_ARG, ERR_INFO_KEY, ERR_INFO_NOKEY, Exception

MAX_INFO_KEY = 255
MAX_INFO_VAL = 1024


class Info:
    """A string-to-string dictionary handed to creation calls."""

    __slots__ = ("_d", "__weakref__")

    def __init__(self, info=None):
        self._d = None if info is None else (None if info._d is None else info._d)

    @classmethod
    def Create(cls, items=None):
        i = cls()
        i._d = {}
        if items:
            for k, v in (items.items() if isinstance(items, dict) else items):
                i.Set(k, v)
        return i

    def __eq__(self, other):
        if not isinstance(other, Info):
            return NotImplemented
        return self._d is other._d

    def __hash__(self):
        return id(self._d)

    def __bool__(self):
        return self._d is not None

    def _check(self):
        if self._d is None:
            raise Exception(ERR_ARG, "invalid info (INFO_NULL)")
        return self._d

    def Free(self):
        self._d = None

    def Dup(self):
        return Info.Create(dict(self._check()))

    def Set(self, key, value):
        if len(key) > MAX_INFO_KEY:
            raise Exception(ERR_INFO_KEY, "info key too long")
        self._check()[key] = str(value)

    def Get(self, key, maxlen=-1):
        v = self._check().get(key)
        return v

    def Delete(self, key):
        d = self._check()
        if key not in d:
            raise Exception(ERR_INFO_NOKEY, f"no info key {key!r}")
        del d[key]

    def Get_nkeys(self):
        return len(self._check())

    def Get_nthkey(self, n):
        return list(self._check())[n]

    # Python mapping protocol, as mpi4py offers
    def __len__(self):
        return 0 if self._d is None else len(self._d)

    def __contains__(self, key):
        return self._d is not None and key in self._d

    def __iter__(self):
        return iter(() if self._d is None else list(self._d))

    def __getitem__(self, key):
        v = self.Get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __setitem__(self, key, value):
        self.Set(key, value)

    def __delitem__(self, key):
        if key not in self:
            raise KeyError(key)
        self.Delete(key)

    def get(self, key, default=None):
        return default if self._d is None else self._d.get(key, default)

    def keys(self):
        return list(self)

    def values(self):
        return [self._d[k] for k in self]

    def items(self):
        return [(k, self._d[k]) for k in self]

    def update(self, other=(), **kw):
        for k, v in (dict(other, **kw)).items():
            self.Set(k, v)

    def pop(self, key, *default):
        if key in self:
            v = self._d[key]
            del self._d[key]
            return v
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self):
        if not self:
            raise KeyError("empty")
        return self._d.popitem()

    def copy(self):
        return self.Dup()

    def clear(self):
        if self._d is not None:
            self._d.clear()

    def tomemory(self):
        return memoryview(b"")

    def __reduce__(self):
        if self._d is None:
            return (Info, ())
        return (Info.Create, (dict(self._d),))


INFO_NULL = Info()
INFO_ENV = Info.Create({"command": "python", "thread_level": "MPI_THREAD_SINGLE"})


class Errhandler:
    __slots__ = ("name", "__weakref__")

    def __init__(self, errhandler=None):
        self.name = None if errhandler is None else errhandler.name

    def __eq__(self, other):
        return isinstance(other, Errhandler) and self.name == other.name

    def __hash__(self):
        return hash(self.name)

    def __bool__(self):
        return self.name is not None

    def Free(self):
        self.name = None


def _eh(name):
    e = Errhandler()
    e.name = name
    return e


ERRHANDLER_NULL = Errhandler()
ERRORS_RETURN = _eh("ERRORS_RETURN")
ERRORS_ARE_FATAL = _eh("ERRORS_ARE_FATAL")
ERRORS_ABORT = _eh("ERRORS_ABORT")

# attribute keyvals
KEYVAL_INVALID = -1
TAG_UB_KEY, HOST, IO, WTIME_IS_GLOBAL, UNIVERSE_SIZE, APPNUM, LASTUSEDCODE = range(1, 8)
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = range(10, 15)
_next_keyval = [100]


def new_keyval():
    _next_keyval[0] += 1
    return _next_keyval[0]
