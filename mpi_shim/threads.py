"""``THREAD_MULTIPLE``: one lock around the MPI library, released while waiting.

When MPI initializes with ``THREAD_MULTIPLE`` (mpi4py's default request),
every public method of the MPI object classes takes the engine's re-entrant
lock for its duration, so concurrent calls from several threads never
interleave inside ucxpy or mpi_shim state (tag matching, request
bookkeeping, collective sequence numbers).  A blocking call does not hold
the lock while it waits: :meth:`.engine.Engine.wait_until` releases it
between progress passes and around its naps, so another thread's send can
satisfy a receive the first thread blocks in.  At lower thread levels
nothing is wrapped and the calls pay nothing.
"""
from __future__ import annotations

import importlib

from ucxpy.progress_thread import serialized

from .engine import ENGINE

#: classes whose public methods touch the worker or shared MPI state
_CLASSES = ("comm:Comm", "comm:Intracomm", "intercomm:Intercomm", "topo:Topocomm",
            "topo:Cartcomm", "topo:Graphcomm", "topo:Distgraphcomm", "request:Request",
            "request:Prequest", "request:Grequest", "p2p:Message", "win:Win", "file:File",
            "session:Session", "fileaccess:FileDataAccess")
_installed = {"done": False}


def _wrap(fn, lock):
    # one C vectorcall (ucxpy.progress_thread.serialized): acquire, call,
    # release; it shows fn's name, docstring and __wrapped__ itself (what
    # functools.update_wrapper copied cost 3-5 ms of every rank's start)
    return serialized(fn, lock)


def _lock_class(cls, lock) -> None:
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, classmethod):
            setattr(cls, name, classmethod(_wrap(member.__func__, lock)))
        elif isinstance(member, staticmethod):
            setattr(cls, name, staticmethod(_wrap(member.__func__, lock)))
        elif callable(member) and not isinstance(member, type):
            setattr(cls, name, _wrap(member, lock))


def install() -> None:
    """Wrap the API for concurrent callers (idempotent)."""
    if _installed["done"]:
        return
    _installed["done"] = True
    ENGINE.enable_threads()
    mixins = {}
    for spec in _CLASSES:
        mod, name = spec.split(":")
        cls = getattr(importlib.import_module(f"mpi_shim.{mod}"), name)
        _lock_class(cls, ENGINE.lock)
        for base in cls.__mro__[1:]:            # the P2P / Coll mixins of Comm
            if base.__module__.startswith("mpi_shim.") and base.__name__ in ("P2P", "Coll"):
                mixins[base] = True
    for base in mixins:
        _lock_class(base, ENGINE.lock)
