"""mpi4py's private helpers that its pure-Python modules (``mpi4py.util``,
``mpi4py.futures``, ``mpi4py.run``) call: communicator contexts for
``util.pkl5``, per-communicator locks, the abort status, type tables."""
from __future__ import annotations

import threading

from .engine import ENGINE

_abort = {"status": None}
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


def _commctx_intra(comm):
    """A private duplicate of intracommunicator ``comm`` and a fresh tag."""
    c = comm._impl()
    ctx = c.locks.get("_commctx")
    if ctx is None:
        dup = comm.Dup()
        ctx = c.locks["_commctx"] = [dup, 0]
    ctx[1] = (ctx[1] + 1) % (1 << 20)
    return ctx[0], ctx[1]


def _commctx_inter(comm):
    """``(duplicate intercomm, tag, local intracomm, low_group)`` of ``comm``."""
    from .intercomm import local_comm
    c = comm._impl()
    ctx = c.locks.get("_commctx")
    if ctx is None:
        dup = comm.Dup()
        local = local_comm(dup).Dup()
        low = bool(dup.Merge(False).Get_rank() < local.Get_size()) if False else \
            c.group[0] < c.remote[0]
        ctx = c.locks["_commctx"] = [dup, 0, local, low]
    ctx[1] = (ctx[1] + 1) % (1 << 20)
    return ctx[0], ctx[1], ctx[2], ctx[3]


def _set_abort_status(status) -> None:
    """Remember the exit status an abort at exit uses (``mpi4py.run``)."""
    _abort["status"] = status


def _handleof(obj) -> int:
    """The integer handle of an MPI object."""
    from .handle import Handle, handle_of
    from .status import Status
    if isinstance(obj, Handle):
        return handle_of(obj._h)
    if isinstance(obj, Status):
        return _addressof(obj)
    raise TypeError(f"expected an MPI handle object, got {type(obj).__name__}")


def _addressof(obj) -> int:
    """Memory address of the handle of an MPI object (a 64-bit cell)."""
    from .handle import Handle, addressof
    from .status import Status
    if isinstance(obj, Handle):
        return addressof(obj)
    if isinstance(obj, Status):
        import ctypes
        return ctypes.addressof(ctypes.c_char.from_buffer(obj.tomemory()))
    raise TypeError(f"expected an MPI object, got {type(obj).__name__}")


def _sizeof(obj) -> int:
    """Size in bytes of the handle of an MPI object or class."""
    from .handle import HANDLE_SIZE, Handle
    from .status import Status
    cls = obj if isinstance(obj, type) else type(obj)
    if issubclass(cls, Handle):
        return HANDLE_SIZE
    if issubclass(cls, Status):
        return Status().tomemory().nbytes
    raise TypeError(f"expected an MPI object or class, got {cls.__name__}")


_ = ENGINE
