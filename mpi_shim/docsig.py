"""Embedded signatures: every function, method and property of the ``MPI``
namespace gets its call signature as the first line of its docstring.

mpi4py's docstrings start with the signature (Cython's ``embedsignature``),
and tools written for mpi4py (its own test_doc, IDE tooltips, ``help()``
readers that strip that line) read the description from the second
paragraph on.  This module computes the line from the Python signature at
import, so the sources keep plain docstrings.
"""
from __future__ import annotations

import inspect
import types

_SEEN = "__mpi_shim_sig__"


def _signature_line(name, fn) -> str:
    try:
        sig = str(inspect.signature(fn))
    except (TypeError, ValueError):
        sig = "(...)"
    return f"{name}{sig}"


def _embed(name, obj, line):
    doc = obj.__doc__
    if not doc or getattr(obj, _SEEN, False):
        return
    try:
        obj.__doc__ = f"{line}\n\n{inspect.cleandoc(doc)}"
        setattr(obj, _SEEN, True)
    except (AttributeError, TypeError):
        pass


def embed_signatures(namespace, prefix="mpi_shim") -> None:
    """Prefix the docstrings reachable from ``namespace`` (a module) with signatures."""
    seen = set()

    def visit_class(cls):
        if id(cls) in seen or not cls.__module__.startswith(prefix):
            return
        seen.add(id(cls))
        if cls.__doc__ and "\n" in cls.__doc__ and not cls.__doc__.startswith("\n"):
            try:
                cls.__doc__ = inspect.cleandoc(cls.__doc__)     # no trailing indentation
            except (AttributeError, TypeError):
                pass
        for key, member in list(vars(cls).items()):
            if isinstance(member, (classmethod, staticmethod)):
                fn = member.__func__
                _embed(key, fn, _signature_line(key, fn))
            elif isinstance(member, types.FunctionType) or (
                    callable(member) and not isinstance(member, type)
                    and getattr(member, "__wrapped__", None) is not None):
                # (a wrapper such as threads' serialized method: its own __doc__)
                _embed(key, member, _signature_line(key, member))
            elif isinstance(member, property):
                prop_doc = member.__doc__
                if prop_doc and not prop_doc.startswith(f"{key}:"):
                    try:
                        member.__doc__ = f"{key}: property\n\n{inspect.cleandoc(prop_doc)}"
                    except AttributeError:
                        pass
            elif isinstance(member, type):
                visit_class(member)

    for key, obj in list(vars(namespace).items()):
        if isinstance(obj, type):
            visit_class(obj)
        elif isinstance(obj, types.FunctionType) and obj.__module__.startswith(prefix):
            _embed(key, obj, _signature_line(key, obj))
