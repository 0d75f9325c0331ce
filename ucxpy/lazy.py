"""Deferred imports of heavy modules (numpy), so that a program pays for
them only when a call needs them.

``np = lazy_import("numpy", globals())`` binds ``np`` to the module itself
when it is already imported, and otherwise to a stand-in.  The first
attribute read on the stand-in, in any module that asked for it, imports the
module and rebinds the name to the real module in every one of those
modules: from then on ``np.ndarray`` costs what it always did.  A module
that uses numpy at its top level still imports it there, so such uses
belong in functions (see mpi_shim's typemap for the pattern).

:func:`logger` is ``logging.getLogger`` without importing :mod:`logging`
(3-5 ms of a start) until a message is logged: the core logs only what goes
wrong.

``python -X importtime -c "from mpi_shim import MPI"`` shows what a start
costs; tests/test_imports.py keeps numpy and pyzmq out of a first MPI
program.
"""
from __future__ import annotations

import importlib
import sys
import types

__all__ = ["lazy_import", "logger"]


class _Deferred(types.ModuleType):
    """The stand-in: a module object whose attributes are the real module's."""

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)      # (copy, pickle and help look for these)
        return getattr(_load(self), attr)

    def __repr__(self) -> str:
        return f"<deferred module {self.__name__!r}>"


#: name -> (stand-in, [(globals, bound name), ...])
_PENDING: dict = {}


def _load(stub: _Deferred) -> types.ModuleType:
    name = stub.__name__
    mod = importlib.import_module(name)
    entry = _PENDING.pop(name, None)
    if entry is not None:
        for g, key in entry[1]:
            if g.get(key) is stub:
                g[key] = mod
    return mod


def lazy_import(name: str, globals_: dict, as_: str = "np"):
    """Module ``name`` as ``globals_[as_]`` will hold it: the module when it
    is imported already, else a stand-in that imports it on first use."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    entry = _PENDING.get(name)
    if entry is None:
        entry = _PENDING[name] = (_Deferred(name), [])
    entry[1].append((globals_, as_))
    return entry[0]


class _Logger:
    """``logging.getLogger(name)``, looked up (and :mod:`logging` imported)
    on each use: the core's log calls are on paths where something went
    wrong, never per message."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        import logging                  # (deferred on purpose: see logger)
        return getattr(logging.getLogger(self.name), attr)

    def __repr__(self) -> str:
        return f"<logger {self.name!r} (deferred)>"


def logger(name: str) -> _Logger:
    """The logger called ``name``, without importing :mod:`logging` now."""
    return _Logger(name)
