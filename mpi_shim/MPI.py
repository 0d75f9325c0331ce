"""``from mpi_shim import MPI``: an mpi4py-compatible ``MPI`` namespace on ucxpy.

Importing this module joins the SPMD job (``ucxpy.init()``, like mpi4py's
``MPI_Init`` at import); ``Finalize`` runs at exit unless called before.
"""
from __future__ import annotations

import atexit
import os
import socket
import time

import ucxpy

from . import datatype as _dt
from . import exceptions as _ex
from .comm import (COMM_NULL, COMM_SELF, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED,
                   COMM_TYPE_RESOURCE_GUIDED, COMM_TYPE_SHARED, COMM_WORLD, Comm,
                   Intercomm, Intracomm, init_predefined)
from .datatype import *  # noqa: F401,F403 - the predefined datatypes
from .datatype import BOTTOM, IN_PLACE, Datatype, UNDEFINED
from .datatype import _datatype_create, _datatype_decode, _typealign, _typecode  # noqa: F401
from .msgspec import (BUFFER_AUTOMATIC, BottomType, BufferAutomaticType,  # noqa: F401
                      InPlaceType)
from .msgspec import acquire as _acquire, address_of as _address_of
from .exceptions import *  # noqa: F401,F403 - error classes
from .exceptions import (Add_error_class, Add_error_code, Add_error_string, Exception,
                         Get_error_class, Get_error_string, SUCCESS)
from .group import CONGRUENT, GROUP_EMPTY, GROUP_NULL, IDENT, SIMILAR, UNEQUAL, Group
from .info import (APPNUM, ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN,
                   HOST, INFO_ENV, INFO_NULL, IO, KEYVAL_INVALID, LASTUSEDCODE,
                   MAX_INFO_KEY, MAX_INFO_VAL, UNIVERSE_SIZE, WIN_BASE, WIN_CREATE_FLAVOR,
                   WIN_DISP_UNIT, WIN_MODEL, WIN_SIZE, WTIME_IS_GLOBAL, Errhandler, Info)
from .info import TAG_UB_KEY as _TAG_UB_KEY
from .op import (BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL,
                 PROD, REPLACE, SUM, Op)
from .p2p import MESSAGE_NO_PROC, MESSAGE_NULL, Message, pickle
from .request import ENGINE, REQUEST_NULL, Grequest, Prequest, Request
from .request import TAG_UB as _TAG_UB_VALUE
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL, Status

ROOT = -3
TAG_UB = _TAG_UB_KEY
MAX_PROCESSOR_NAME = 256
MAX_ERROR_STRING = 512
MAX_OBJECT_NAME = 64
MAX_LIBRARY_VERSION_STRING = 8192
BSEND_OVERHEAD = 0
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
VERSION, SUBVERSION = 4, 1
DISTGRAPH, CART, GRAPH = 3, 1, 2
KEYVAL_INVALID = KEYVAL_INVALID
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1, 2, 4, 8, 16
MODE_RDONLY = MODE_WRONLY = MODE_RDWR = MODE_CREATE = MODE_EXCL = 0
LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
COMM_TYPE_SHARED = COMM_TYPE_SHARED
DATATYPE_NULL = _dt.DATATYPE_NULL
ERRCODES_IGNORE = None
ARGV_NULL = None

_state = {"init": False, "fin": False, "attached": None}


# -- environment ---------------------------------------------------------------------
def Init() -> None:
    _init()


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    _init()
    return THREAD_SINGLE


def Is_initialized() -> bool:
    return _state["init"]


def Is_finalized() -> bool:
    return _state["fin"]


def Finalize() -> None:
    if _state["fin"]:
        return
    _state["fin"] = True
    try:
        ENGINE.world.finalize()
    except ucxpy.UcxpyError as e:
        raise _ex.translate(e) from None


def Query_thread() -> int:
    return THREAD_SINGLE


def Is_thread_main() -> bool:
    return True


def Get_version():
    return (VERSION, SUBVERSION)


def Get_library_version() -> str:
    return f"ucxpy {ucxpy.__version__} (mpi_shim, mpi4py-compatible MPI subset)"


def get_vendor():
    return ("ucxpy", tuple(int(x) for x in ucxpy.__version__.split(".")[:3]))


def Get_processor_name() -> str:
    return socket.gethostname()


_T0 = time.perf_counter()


def Wtime() -> float:
    return time.perf_counter()


def Wtick() -> float:
    return time.get_clock_info("perf_counter").resolution


def Get_hw_resource_info():
    return Info.Create()


def Pcontrol(level: int) -> None:
    pass


def Get_address(location) -> int:
    """Get the address of a location in memory.

    Accepts buffers, DLPack and CUDA-array-interface objects and the buffer constants.
    """
    return _address_of(location)


def Aint_add(base, disp):
    return base + disp


def Aint_diff(a, b):
    return a - b


from .datatype import buffer  # noqa: E402


def Alloc_mem(size: int, info=INFO_NULL) -> buffer:
    return buffer.allocate(size)


def Free_mem(mem) -> None:
    if isinstance(mem, buffer):
        mem.release()


def Attach_buffer(buf) -> None:
    if buf is not BUFFER_AUTOMATIC and buf is not None and _acquire(buf).readonly:
        raise BufferError("Object is not writable.")
    _state["attached"] = buf


def Detach_buffer():
    buf, _state["attached"] = _state["attached"], None
    return buf


def Flush_buffer() -> None:
    pass


def Iflush_buffer():
    return Request()


def Compute_dims(nnodes, dims):
    """Return a balanced distribution of processes per coordinate direction.

    Zero entries of ``dims`` (a sequence, or a number of dimensions) are filled.
    """
    from .constructors import compute_dims
    return compute_dims(nnodes, dims)


def Open_port(info=INFO_NULL):
    raise Exception(_ex.ERR_UNSUPPORTED_OPERATION, "dynamic processes are not supported")


def _comm_lock_table(comm):
    return comm._impl().locks


memory = buffer


def _init():
    if _state["init"]:
        return
    world = ucxpy.init()
    ENGINE.attach(world)
    init_predefined()
    _state["init"] = True
    atexit.register(_atexit)


def _atexit():
    if _state["init"] and not _state["fin"]:
        try:
            Finalize()
        except BaseException:
            pass


from .win import WIN_NULL, Win  # noqa: E402

_init()
