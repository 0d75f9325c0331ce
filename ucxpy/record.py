"""Plain record classes: the part of :mod:`dataclasses` the core uses.

``@record`` (``@record(frozen=True)``) on a class with annotated fields
gives it an ``__init__`` taking the fields in order (with their defaults;
``field(default_factory=...)`` for mutable ones), ``__repr__``, ``__eq__``
and, when frozen, ``__hash__`` and no assignment.  :func:`fields` and
:func:`replace` work as their :mod:`dataclasses` namesakes do.

Why not :mod:`dataclasses`: importing it imports :mod:`inspect` (and
``ast``, ``dis``, ``tokenize``), 7-11 ms of every rank's start here, which a
16-rank job on 2 cores pays 16 times over (issue 44).  What is generated is
the same kind of code: ``__init__`` is compiled once per class.
"""
from __future__ import annotations

__all__ = ["record", "field", "fields", "replace", "FrozenError"]

_MISSING = object()


class FrozenError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    """One field: ``name``, ``default`` (or ``factory``), ``metadata``, and
    whether it is in ``repr`` and in comparisons."""

    __slots__ = ("name", "default", "factory", "metadata", "repr", "compare")

    def __init__(self, default=_MISSING, factory=None, metadata=None, repr=True,
                 compare=True):
        self.name = ""
        self.default, self.factory = default, factory
        self.metadata = dict(metadata or {})
        self.repr, self.compare = repr, compare

    def __repr__(self):
        return f"Field({self.name!r})"


def field(default=_MISSING, *, default_factory=None, metadata=None, repr=True,
          compare=True) -> Field:
    """A field with more than a default (as :func:`dataclasses.field`)."""
    return Field(default, default_factory, metadata, repr, compare)


def fields(obj) -> tuple:
    """The :class:`Field` objects of a record class or instance, in order."""
    return tuple(obj.__record_fields__.values())


def replace(obj, **changes):
    """A copy of record ``obj`` with ``changes``."""
    kw = {name: getattr(obj, name) for name in obj.__record_fields__}
    for name in changes:
        if name not in kw:
            raise TypeError(f"{type(obj).__name__} has no field {name!r}")
    kw.update(changes)
    return type(obj)(**kw)


def _frozen_setattr(self, name, value):
    raise FrozenError(f"cannot assign to field {name!r}")


def _frozen_delattr(self, name):
    raise FrozenError(f"cannot delete field {name!r}")


def record(cls=None, *, frozen: bool = False):
    """Make ``cls`` a record (see the module docstring)."""
    def wrap(cls):
        flds: dict = {}
        for base in reversed(cls.__mro__[1:]):
            flds.update(getattr(base, "__record_fields__", {}))
        for name in cls.__dict__.get("__annotations__", {}):
            value = cls.__dict__.get(name, _MISSING)
            f = value if isinstance(value, Field) else Field(value)
            f.name = name
            flds[name] = f
            if isinstance(value, Field):
                if f.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, f.default)
        cls.__record_fields__ = flds
        ns = {"_MISSING": _MISSING, "_set": object.__setattr__}
        args, body = [], []
        for f in flds.values():
            if f.factory is not None:
                ns[f"_f_{f.name}"] = f.factory
                args.append(f"{f.name}=_MISSING")
                body.append(f"    if {f.name} is _MISSING: {f.name} = _f_{f.name}()")
            elif f.default is not _MISSING:
                ns[f"_d_{f.name}"] = f.default
                args.append(f"{f.name}=_d_{f.name}")
            else:
                args.append(f.name)
            body.append(f"    _set(self, {f.name!r}, {f.name})" if frozen
                        else f"    self.{f.name} = {f.name}")
        if "__post_init__" in cls.__dict__:
            body.append("    self.__post_init__()")
        src = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
        exec(src, ns)
        init = ns["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = init
        shown = [f.name for f in flds.values() if f.repr]
        compared = tuple(f.name for f in flds.values() if f.compare)

        def __repr__(self):
            return f"{type(self).__qualname__}(" + ", ".join(
                f"{n}={getattr(self, n)!r}" for n in shown) + ")"

        def __eq__(self, other):
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in compared)

        cls.__repr__, cls.__eq__ = __repr__, __eq__
        if frozen:
            def __hash__(self):
                return hash(tuple(getattr(self, n) for n in compared))
            cls.__hash__ = __hash__
            cls.__setattr__, cls.__delattr__ = _frozen_setattr, _frozen_delattr
        else:
            cls.__hash__ = None             # (mutable and compared by value, as dataclasses)
        return cls
    return wrap if cls is None else wrap(cls)
