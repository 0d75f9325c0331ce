"""The execution environment: initialization, versions, timers, memory."""
from __future__ import annotations

import atexit
import socket
import threading
import time

import ucxpy

from . import accel, bsend, rc, threads
from .comm import finalize_predefined, init_predefined
from .dynproc import connect_parent
from .engine import ENGINE
from .exceptions import ERR_ARG, ERR_OTHER, Exception, translate
from .info import INFO_NULL, Info
from .msgspec import address_of
from .ops import send_ack
from .ulfm import serve_notices
from .win import trace_epochs

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
VERSION, SUBVERSION = 4, 1
MAX_PROCESSOR_NAME = 256
MAX_LIBRARY_VERSION_STRING = 8192

_state = {"init": False, "fin": False, "level": THREAD_MULTIPLE,
          "main": threading.main_thread().ident}


def _init(required=None):
    if _state["init"]:
        return
    level = rc.thread_level_value() if required is None else required
    world = ucxpy.init()
    ENGINE.attach(world)
    ENGINE.acknowledge_by(send_ack)
    accel.install()                         # (the calls in C: mpi_shim.accel)
    accel.configure(world.worker)
    if world.worker.tr is not None:
        trace_epochs()
    init_predefined()
    _state["level"] = min(max(level, THREAD_SINGLE), THREAD_MULTIPLE)
    if _state["level"] == THREAD_MULTIPLE:
        threads.install()
    _state["init"] = True
    _state["main"] = threading.get_ident()
    serve_notices()          # revoke notices must be served before the first Revoke here
    connect_parent()
    if rc.finalize is not False:
        atexit.register(_atexit)


def _atexit():
    if _state["init"] and not _state["fin"]:
        try:
            Finalize()
        except BaseException:
            pass


def Init() -> None:
    """Initialize the MPI execution environment."""
    if _state["init"]:
        raise Exception(ERR_OTHER, "MPI is already initialized")
    _init()


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Initialize the MPI execution environment with a thread support level."""
    if _state["init"]:
        raise Exception(ERR_OTHER, "MPI is already initialized")
    _init(required)
    return _state["level"]


def Is_initialized() -> bool:
    """Whether ``Init`` has been called."""
    return _state["init"]


def Is_finalized() -> bool:
    """Whether ``Finalize`` has completed."""
    return _state["fin"]


def Finalize() -> None:
    """Terminate the MPI execution environment."""
    if _state["fin"]:
        return
    finalize_predefined()
    _state["fin"] = True
    try:
        ENGINE.world.finalize()
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


def Query_thread() -> int:
    """Return the level of thread support provided."""
    return _state["level"]


def Is_thread_main() -> bool:
    """Whether the calling thread is the one that initialized MPI."""
    return threading.get_ident() == _state["main"]


def Get_version():
    """Return the version of the MPI standard implemented."""
    return (VERSION, SUBVERSION)


def Get_library_version() -> str:
    """Return the version of the MPI library."""
    return (f"ucxpy {ucxpy.__version__} mpi_shim (MPI {VERSION}.{SUBVERSION} on ucxpy; "
            f"transports {','.join(i.name for i in ENGINE.worker.ifaces)})"
            if ENGINE.worker is not None else f"ucxpy {ucxpy.__version__} mpi_shim")


def get_vendor():
    """Information about the underlying MPI implementation: ``(name, version)``."""
    return ("ucxpy", tuple(int(x) for x in (ucxpy.__version__.split(".") + ["0", "0"])[:3]))


def Get_processor_name() -> str:
    """Return the name of the processor."""
    return socket.gethostname()[:MAX_PROCESSOR_NAME]


def Wtime() -> float:
    """Return an elapsed time on the calling processor."""
    return time.perf_counter()


def Wtick() -> float:
    """Return the resolution of ``Wtime``."""
    return time.get_clock_info("perf_counter").resolution


def Pcontrol(level: int) -> None:
    """Control profiling (no profiler is attached: nothing to do)."""
    if not isinstance(level, int):
        raise TypeError("level must be an int")


def Get_hw_resource_info():
    """Hardware resource information (an empty Info)."""
    return Info.Create()


def Get_abi_version():
    """Return the version of the MPI ABI; ``(-1, -1)``: no standard ABI."""
    return (-1, -1)


def Get_abi_info():
    """Return the sizes of MPI_Aint, MPI_Count and MPI_Offset."""
    return Info.Create({"mpi_aint_size": "8", "mpi_count_size": "8", "mpi_offset_size": "8"})


def Get_abi_fortran_info():
    """Return Fortran type information (INFO_NULL: no Fortran bindings)."""
    return INFO_NULL


def Get_address(location) -> int:
    """Get the address of a location in memory.

    Buffers, DLPack and CUDA-array objects, and the buffer constants.
    """
    return address_of(location)


def Aint_add(base: int, disp: int) -> int:
    """Return the sum of a base address and a displacement."""
    return base + disp


def Aint_diff(addr1: int, addr2: int) -> int:
    """Return the difference between two absolute addresses."""
    return addr1 - addr2


def Alloc_mem(size: int, info=None):
    """Allocate memory for message passing and remote memory access."""
    from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
    if size < 0:
        raise Exception(ERR_ARG, f"invalid size {size}")
    return buffer.allocate(size)


def Free_mem(mem) -> None:
    """Free memory allocated with ``Alloc_mem`` (the buffer becomes empty)."""
    from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
    if isinstance(mem, buffer):
        mem.release()


def Attach_buffer(buf) -> None:
    """Attach a user buffer for sending in buffered mode."""
    bsend.attach(None, buf)


def Detach_buffer():
    """Remove an existing attached buffer (waits for buffered messages to leave)."""
    return bsend.detach(None)


def Flush_buffer() -> None:
    """Block until every buffered message has been transmitted."""
    bsend.flush(None)


def Iflush_buffer():
    """Nonblocking ``Flush_buffer``."""
    return bsend.iflush(None)

