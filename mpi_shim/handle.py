"""The base of every MPI object handle (``Comm``, ``Datatype``, ``Request`` ...).

mpi4py's object model, which the handle classes share:

* A Python handle object refers to an *implementation object* (``_h``), or
  to nothing: the class's null handle (``COMM_NULL``, ``DATATYPE_NULL`` ...).
  Objects are equal when they refer to the same implementation object;
  they are falsy when null, unhashable and unordered.
* ``Class(other)`` is a new Python object referring to ``other``'s object
  (``TypeError`` unless ``other`` belongs to the class's family).
* ``handle`` (read-only) is an integer naming the implementation object in
  this process; ``Class.fromhandle(h)``, ``toint()``/``fromint()`` and
  ``py2f()``/``f2py()`` convert both ways.
* Module constants (``COMM_WORLD``, ``INT``, ``SUM`` ...) are flagged
  *constant*: copy and pickle return the constant itself and ``free()``
  leaves them alone.  ``free()`` on any other object releases the object
  (unless it is predefined) and makes the handle null; it is safe to call
  twice.
"""
from __future__ import annotations

import ctypes
import itertools
import weakref

_registry = weakref.WeakValueDictionary()     # handle int -> implementation object
_strong = {}                                  # handle int -> impl that cannot be weakly held
_next = itertools.count(1)


def handle_of(impl) -> int:
    """The integer handle of an implementation object (0 for None)."""
    if impl is None:
        return 0
    h = getattr(impl, "_hid", None)
    if h is None:
        h = next(_next)
        try:
            impl._hid = h
            _registry[h] = impl
        except (AttributeError, TypeError):
            # slot-less or not weakly referencable: key the object itself
            h = _strong_handle(impl)
    return h


def _strong_handle(impl) -> int:
    for h, o in _strong.items():
        if o is impl:
            return h
    h = next(_next)
    _strong[h] = impl
    return h


def impl_of(h: int):
    """The implementation object of integer handle ``h`` (None if unknown or 0)."""
    if not h:
        return None
    impl = _registry.get(h)
    return impl if impl is not None else _strong.get(h)


_FAMILIES = set()          # root classes: Comm, Datatype, Request ...
_family_cache = {}


def register_family(cls) -> None:
    """Declare ``cls`` the root of a handle family: ``Family(obj)`` accepts
    any handle of the family, and handles compare equal only within it."""
    _FAMILIES.add(cls)
    _family_cache.clear()


def family_of(cls) -> type:
    """The family root of handle class ``cls`` (``cls`` itself if none)."""
    fam = _family_cache.get(cls)
    if fam is None:
        fam = next((c for c in cls.__mro__ if c in _FAMILIES), cls)
        _family_cache[cls] = fam
    return fam


class Handle:
    """Common behaviour of MPI handle objects (see the module docstring)."""

    __slots__ = ("_h", "_const", "__weakref__")

    def __new__(cls, obj=None):
        self = object.__new__(cls)
        self._const = False
        if obj is None:
            self._h = None
        elif isinstance(obj, family_of(cls)) and cls._accepts(obj._h):
            self._h = obj._h
        else:
            raise TypeError(f"expected {cls._kind()}, got {type(obj).__name__}")
        return self

    @classmethod
    def _kind(cls) -> str:
        return family_of(cls).__name__

    @classmethod
    def _accepts(cls, impl) -> bool:
        """Whether a handle of this class may refer to ``impl`` (subclasses narrow it)."""
        return True

    @classmethod
    def _wrap(cls, impl):
        obj = object.__new__(cls)
        obj._h = impl
        obj._const = False
        return obj

    @classmethod
    def _constant(cls, impl):
        obj = cls._wrap(impl)
        obj._const = True
        return obj

    def __eq__(self, other):
        cls, other_cls = type(self), type(other)
        if other_cls is not cls and (not isinstance(other, Handle) or
                                     family_of(cls) is not family_of(other_cls)):
            return NotImplemented
        if _cells:
            _sync(self)
            _sync(other)
        return self._h is other._h

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __bool__(self):
        if _cells:
            _sync(self)
        return self._h is not None

    def __copy__(self):
        return self if self._const else type(self)._wrap(self._h)

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        if self._const:
            name = _constant_names.get(id(self))
            if name is not None:
                return name
        if self._h is None:
            return (type(self), ())
        const = _impl_constants.get(id(self._h))
        if const is not None:
            return (type(self), (const,))
        raise ValueError(f"cannot serialize {type(self).__name__} handle")

    @property
    def handle(self) -> int:
        """Integer handle of the object in this process."""
        return handle_of(self._h)

    @classmethod
    def fromhandle(cls, handle: int):
        """Object of this class referring to integer ``handle``."""
        return cls._wrap(impl_of(handle))

    def toint(self) -> int:
        """Translate the object to an integer handle."""
        return handle_of(self._h)

    @classmethod
    def fromint(cls, arg: int):
        """Object of this class from an integer handle."""
        return cls.fromhandle(arg)

    def py2f(self) -> int:
        """Translate the object to a Fortran integer handle."""
        return handle_of(self._h)

    @classmethod
    def f2py(cls, arg: int):
        """Object of this class from a Fortran integer handle."""
        return cls.fromhandle(arg)

    def free(self) -> None:
        """Release the object unless it is a constant; the handle becomes null."""
        if self._const or self._h is None:
            return
        impl = self._h
        if not getattr(impl, "predefined", False):
            self._release()
        self._h = None

    def _release(self) -> None:
        """Free the implementation object (what ``Free`` does); subclasses override."""


_constant_names = {}     # id(constant object) -> its module-level name
_impl_constants = {}     # id(implementation of a constant) -> the constant


def name_constants(namespace: dict) -> None:
    """Let pickle find the constants of ``namespace`` by name.

    Call it once the module's constants exist; constants made later call it again.
    """
    for name, obj in namespace.items():
        if isinstance(obj, Handle) and obj._const and not name.startswith("_"):
            _constant_names.setdefault(id(obj), name)
            if obj._h is not None:
                _impl_constants.setdefault(id(obj._h), obj)


# -- handle cells: C-level access to a handle (``MPI._addressof``) --------------
#: id(handle object) -> (weakref to it, ctypes cell holding its handle integer)
_cells = {}
HANDLE_SIZE = ctypes.sizeof(ctypes.c_uint64)


def _sync(obj) -> None:
    """Follow a write made through the object's cell (``MPI._addressof``)."""
    entry = _cells.get(id(obj))
    if entry is not None and entry[0]() is obj:
        value = entry[1].value
        if value != handle_of(obj._h):
            obj._h = impl_of(value)


def addressof(obj) -> int:
    """Address of a 64-bit cell holding ``obj``'s handle; writing another
    handle value there makes ``obj`` refer to that object."""
    entry = _cells.get(id(obj))
    if entry is None or entry[0]() is not obj:
        cell = ctypes.c_uint64(handle_of(obj._h))
        key = id(obj)
        _cells[key] = entry = (weakref.ref(obj, lambda _r, key=key: _cells.pop(key, None)),
                               cell)
    else:
        _sync(obj)
        entry[1].value = handle_of(obj._h)
    return ctypes.addressof(entry[1])
