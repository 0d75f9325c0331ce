"""Per-communicator named locks (mpi4py's ``_comm_lock``, which its
``mpi4py.util`` modules and the lowercase collectives take): a module of
their own, below the collectives that use them."""
from __future__ import annotations

import threading

_lock_guard = threading.Lock()


def _comm_lock_table(comm) -> dict:
    """The table of named locks of ``comm``."""
    c = comm._impl()
    table = c.locks.get("_pylocks")
    if table is None:
        with _lock_guard:
            table = c.locks.setdefault("_pylocks", {})
    return table


def _comm_lock(comm, key=None):
    """A lock of ``comm`` named ``key`` (created on first use)."""
    table = _comm_lock_table(comm)
    lock = table.get(key)
    if lock is None:
        with _lock_guard:
            lock = table.setdefault(key, threading.Lock())
    return lock
