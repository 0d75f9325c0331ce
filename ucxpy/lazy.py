"""Deferred imports of heavy modules (numpy), so that a program pays for
them only when a call needs them.

``np = lazy_import("numpy", globals())`` binds ``np`` to the module itself
when it is already imported, and otherwise to a stand-in.  The first
attribute read on the stand-in, in any module that asked for it, imports the
module and rebinds the name to the real module in every one of those
modules: from then on ``np.ndarray`` costs what it always did.  A module
that uses numpy at its top level still imports it there, so such uses
belong in functions (see mpi_shim's typemap for the pattern).

``python -X importtime -c "from mpi_shim import MPI"`` shows what a start
costs; ``UCXPY_LAZY_TRACE=1`` prints the stack that first loads a deferred
module.
"""
from __future__ import annotations

import importlib
import os
import sys
import types

__all__ = ["lazy_import", "loaded"]


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
    if os.environ.get("UCXPY_LAZY_TRACE"):
        import traceback
        print(f"ucxpy.lazy: importing {name} for", file=sys.stderr)
        traceback.print_stack(limit=8, file=sys.stderr)
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


def loaded(name: str):
    """Module ``name`` if something imported it already, else None: for a
    check such as "is this a numpy array", which no buffer can be while
    numpy is not imported."""
    return sys.modules.get(name)
