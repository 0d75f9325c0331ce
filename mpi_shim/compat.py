"""mpi4py's private helpers that its pure-Python modules (``mpi4py.util``,
``mpi4py.futures``, ``mpi4py.run``) call: communicator contexts for
``util.pkl5``, per-communicator locks, the abort status, type tables."""
from __future__ import annotations

import ctypes
import importlib

from .commlocks import _comm_lock, _comm_lock_table  # noqa: F401 - mpi4py's names
from .engine import ENGINE
from .handle import HANDLE_SIZE, Handle, addressof, handle_of
from .intercomm import local_comm
from .status import Status

_abort = {"status": None}


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
    """Return a private duplicate of ``comm``, a fresh tag, the local intracomm and low_group."""
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
    if isinstance(obj, Handle):
        return handle_of(obj._h)
    if isinstance(obj, Status):
        return _addressof(obj)
    raise TypeError(f"expected an MPI handle object, got {type(obj).__name__}")


def _addressof(obj) -> int:
    """Memory address of the handle of an MPI object (a 64-bit cell)."""
    if isinstance(obj, Handle):
        return addressof(obj)
    if isinstance(obj, Status):
        return ctypes.addressof(ctypes.c_char.from_buffer(obj.tomemory()))
    raise TypeError(f"expected an MPI object, got {type(obj).__name__}")


def _sizeof(obj) -> int:
    """Size in bytes of the handle of an MPI object or class."""
    cls = obj if isinstance(obj, type) else type(obj)
    if issubclass(cls, Handle):
        return HANDLE_SIZE
    if issubclass(cls, Status):
        return Status().tomemory().nbytes
    raise TypeError(f"expected an MPI object or class, got {cls.__name__}")


_ = ENGINE


def _build_capi() -> dict:
    """``MPI.__pyx_capi__``: C entry points of mpi4py's C API, as capsules.

    ``PyMPI<Type>_New(handle) -> object`` and ``PyMPI<Type>_Get(object) ->
    handle *`` for every handle type (``Status`` takes and returns
    ``MPI_Status *``), so C extensions that speak mpi4py's C API can move
    handles in and out of Python objects.  The functions are ctypes callbacks
    into this module; the capsule names carry mpi4py's signatures."""
    raw_new = ctypes.pythonapi.PyCapsule_New
    raw_new.restype = ctypes.py_object
    raw_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def new_capsule(ptr, name, _destructor):
        label = ctypes.create_string_buffer(name)      # the capsule keeps the pointer
        _capi_keep.append(label)
        return raw_new(ptr, ctypes.cast(label, ctypes.c_void_p), None)
    handle_t = ctypes.c_uint64 if HANDLE_SIZE == 8 else ctypes.c_uint32
    specs = [("Datatype", "datatype"), ("Request", "request"), ("Message", "p2p"),
             ("Op", "op"), ("Group", "group"), ("Info", "info"), ("Errhandler", "errhandler"),
             ("Session", "session"), ("Comm", "comm"), ("Win", "win"), ("File", "file")]
    capi, keep = {}, []
    for name, mod in specs:
        cls = getattr(importlib.import_module(f"mpi_shim.{mod}"), name)

        def new(value, cls=cls):
            return cls.fromhandle(int(value))

        def get(obj, cls=cls):
            if not isinstance(obj, cls):
                return 0
            return _addressof(obj)
        newf = ctypes.PYFUNCTYPE(ctypes.py_object, handle_t)(new)
        getf = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(get)
        keep += [newf, getf]
        capi[f"PyMPI{name}_New"] = new_capsule(
            ctypes.cast(newf, ctypes.c_void_p), f"PyObject *(MPI_{name})".encode(), None)
        capi[f"PyMPI{name}_Get"] = new_capsule(
            ctypes.cast(getf, ctypes.c_void_p), f"MPI_{name} *(PyObject *)".encode(), None)

    def new_status(ptr):
        s = Status()
        size = s.tomemory().nbytes
        s.tomemory().cast("B")[:] = (ctypes.c_char * size).from_address(ptr).raw
        return s

    def get_status(obj):
        return _addressof(obj) if isinstance(obj, Status) else 0
    newf = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)(new_status)
    getf = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(get_status)
    keep += [newf, getf]
    capi["PyMPIStatus_New"] = new_capsule(ctypes.cast(newf, ctypes.c_void_p),
                                          b"PyObject *(MPI_Status *)", None)
    capi["PyMPIStatus_Get"] = new_capsule(ctypes.cast(getf, ctypes.c_void_p),
                                          b"MPI_Status *(PyObject *)", None)
    _capi_keep.extend(keep)
    return capi


_capi_keep = []
