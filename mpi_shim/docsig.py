"""Embedded signatures: every function, method and property of the ``MPI``
namespace gets its call signature as the first line of its docstring.

mpi4py's docstrings start with the signature (Cython's ``embedsignature``),
and tools written for mpi4py (its own test_doc, IDE tooltips, ``help()``
readers that strip that line) read the description from the second
paragraph on.  This module computes the line from the Python signature at
import, so the sources keep plain docstrings.
"""
from __future__ import annotations

import sys
import types

_SEEN = "__mpi_shim_sig__"
#: (inspect's names for these: importing inspect costs a rank's start-up
#: 7-11 ms with what it imports, issue 44; it is imported for the rare
#: signature this module cannot read itself)
_EMPTY = object()
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08


def cleandoc(doc: str) -> str:
    """``inspect.cleandoc``: tabs expanded, the indentation common to the
    lines after the first removed, the first line's leading blanks and the
    blank lines at both ends dropped."""
    lines = doc.expandtabs().split("\n")
    margin = sys.maxsize
    for line in lines[1:]:
        content = len(line.lstrip(" "))
        if content:
            margin = min(margin, len(line) - content)
    lines[0] = lines[0].lstrip(" ")
    if margin < sys.maxsize:
        lines[1:] = [line[margin:] for line in lines[1:]]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines)


def _fast_signature(fn):
    """``str(inspect.signature(fn))`` read straight from a plain Python
    function's code object (or the one a wrapper's ``__wrapped__`` names),
    or None where that needs inspect's general machinery (a set
    ``__signature__``, a chain of more than 3 wrappers, a non-string
    annotation).  inspect builds a Parameter object per argument: for the
    500 functions of the namespace that was 14-20 ms of every rank's
    start-up.  The text is the same (tests/test_mpi_unit.py compares them
    all)."""
    for _ in range(4):          # (wrappers: what they wrap, as inspect follows them)
        if isinstance(fn, types.MethodType) or hasattr(fn, "__signature__"):
            return None         # (inspect drops a bound method's first parameter)
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    else:
        return None
    if type(fn) is not types.FunctionType:
        return None
    co = fn.__code__
    ann = fn.__annotations__
    if any(type(a) is not str for a in ann.values()):
        return None
    npos, nkw = co.co_argcount, co.co_kwonlyargcount
    names = co.co_varnames
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    first_default = npos - len(defaults)
    parts = []

    def param(name, prefix="", default=_EMPTY):
        text = prefix + name
        a = ann.get(name)
        if a is not None:
            text += f": {a!r}"
        if default is not _EMPTY:
            text += f" = {default!r}" if a is not None else f"={default!r}"
        return text

    for i in range(npos):
        parts.append(param(names[i], default=defaults[i - first_default]
                           if i >= first_default else _EMPTY))
        if i + 1 == co.co_posonlyargcount:
            parts.append("/")
    at = npos + nkw
    if co.co_flags & _CO_VARARGS:
        parts.append(param(names[at], "*"))
        at += 1
    elif nkw:
        parts.append("*")
    for name in names[npos:npos + nkw]:
        parts.append(param(name, default=kwdefaults.get(name, _EMPTY)))
    if co.co_flags & _CO_VARKEYWORDS:
        parts.append(param(names[at], "**"))
    text = f"({', '.join(parts)})"
    if "return" in ann:
        text += f" -> {ann['return']!r}"
    return text


def _signature_line(name, fn) -> str:
    sig = _fast_signature(fn)
    if sig is None:
        import inspect                      # (deferred on purpose: see _EMPTY)
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
        obj.__doc__ = f"{line}\n\n{cleandoc(doc)}"
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
                cls.__doc__ = cleandoc(cls.__doc__)     # no trailing indentation
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
                        member.__doc__ = f"{key}: property\n\n{cleandoc(prop_doc)}"
                    except AttributeError:
                        pass
            elif isinstance(member, type):
                visit_class(member)

    for key, obj in list(vars(namespace).items()):
        if isinstance(obj, type):
            visit_class(obj)
        elif isinstance(obj, types.FunctionType) and obj.__module__.startswith(prefix):
            _embed(key, obj, _signature_line(key, obj))
