"""Message Passing Interface, on ucxpy (mpi4py-compatible ``MPI`` namespace).

Importing this module joins the SPMD job (``ucxpy.init()``, like mpi4py's
``MPI_Init`` at import); ``Finalize`` runs at exit unless called before.
"""
from __future__ import annotations

from .attr import (APPNUM, HOST, IO, KEYVAL_INVALID, LASTUSEDCODE, TAG_UB_KEY as TAG_UB,
                   UNIVERSE_SIZE, WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT, WIN_MODEL,
                   WIN_SIZE, WTIME_IS_GLOBAL)
from .bsend import BSEND_OVERHEAD
from .comm import (COMM_NULL, COMM_SELF, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED,
                   COMM_TYPE_RESOURCE_GUIDED, COMM_TYPE_SHARED, COMM_WORLD, Comm, Intracomm)
from .compat import (_addressof, _comm_lock, _comm_lock_table, _commctx_inter,
                     _commctx_intra, _handleof, _set_abort_status, _sizeof)
from .datatype import *  # noqa: F401,F403 - the predefined datatypes and their helpers
from .datatype import UNDEFINED, Datatype
from .msgspec import BOTTOM, IN_PLACE
from .datatype import _datatype_create, _datatype_decode, _typealign, _typecode  # noqa: F401
from .msgspec import BUFFER_AUTOMATIC, BottomType, BufferAutomaticType, InPlaceType
from .dynproc import MAX_PORT_NAME
from .dynproc import close_port as Close_port
from .dynproc import lookup_name as Lookup_name
from .dynproc import open_port as Open_port
from .dynproc import publish_name as Publish_name
from .dynproc import unpublish_name as Unpublish_name
from .env import (MAX_LIBRARY_VERSION_STRING, MAX_PROCESSOR_NAME, SUBVERSION, THREAD_FUNNELED,
                  THREAD_MULTIPLE, THREAD_SERIALIZED, THREAD_SINGLE, VERSION, Aint_add,
                  Aint_diff, Alloc_mem, Attach_buffer, Detach_buffer, Finalize, Flush_buffer,
                  Free_mem, Get_abi_fortran_info, Get_address, Get_abi_info, Get_abi_version,
                  Get_hw_resource_info, Get_library_version, Get_processor_name, Get_version,
                  Iflush_buffer, Init, Init_thread, Is_finalized, Is_initialized,
                  Is_thread_main, Pcontrol, Query_thread, Wtick, Wtime, _init, get_vendor)
from .errhandler import (ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN,
                         Errhandler)
from .exceptions import *  # noqa: F401,F403 - error classes
from .exceptions import (Add_error_class, Add_error_code, Add_error_string, Exception,
                         Get_error_class, Get_error_string, Remove_error_class,
                         Remove_error_code, Remove_error_string, SUCCESS)
from .group import CONGRUENT, GROUP_EMPTY, GROUP_NULL, IDENT, SIMILAR, UNEQUAL, Group
from .info import INFO_ENV, INFO_NULL, MAX_INFO_KEY, MAX_INFO_VAL, Info
from .intercomm import Intercomm
from .op import (BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL,
                 PROD, REPLACE, SUM, Op)
from .p2p import MESSAGE_NO_PROC, MESSAGE_NULL, Message
from .pickling import Pickle, pickle
from .request import REQUEST_NULL, Grequest, Prequest, Request
from .session import SESSION_NULL, Session
from .status import ANY_SOURCE, ANY_TAG, F_ERROR, F_SOURCE, F_STATUS_SIZE, F_TAG, PROC_NULL, Status
from .topo import (CART, DIST_GRAPH, GRAPH, UNWEIGHTED, WEIGHTS_EMPTY, Cartcomm, Compute_dims,
                   Distgraphcomm, Graphcomm, Topocomm)

ROOT = -3
MAX_ERROR_STRING = 512
MAX_OBJECT_NAME = 128
MAX_PSET_NAME_LEN = 256
MAX_STRINGTAG_LEN = 256
ERRCODES_IGNORE = None
ARGV_NULL = None

from .rc import initialize as _initialize  # noqa: E402

if _initialize:
    _init()

from .win import (LOCK_EXCLUSIVE, LOCK_SHARED, MODE_NOCHECK, MODE_NOPRECEDE,  # noqa: E402
                  MODE_NOPUT, MODE_NOSTORE, MODE_NOSUCCEED, WIN_FLAVOR,
                  WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_CREATE, WIN_FLAVOR_DYNAMIC,
                  WIN_FLAVOR_SHARED, WIN_NULL, WIN_SEPARATE, WIN_UNIFIED, Win)
from .file import *  # noqa: E402,F401,F403 - MPI.File and its constants
from .handle import name_constants as _name_constants  # noqa: E402

_name_constants(globals())
from .compat import _build_capi  # noqa: E402
__pyx_capi__ = _build_capi()
del _build_capi
from .docsig import embed_signatures as _embed_signatures  # noqa: E402
_embed_signatures(__import__(__name__, fromlist=["*"]))
del _embed_signatures
del annotations


def __getattr__(name):
    # MPI.buffer (alias MPI.memory) is a numpy array subclass: its module is
    # imported on first use, so that a program that never asks for it does
    # not import numpy (ucxpy.lazy)
    if name in ("buffer", "memory"):
        # (MPI's namespace holds no helper module: mpi4py's test_doc walks it)
        # deferred: .memory imports numpy (start-up, issue 44)
        import types
        from .docsig import embed_signatures
        from .memory import buffer
        embed_signatures(types.SimpleNamespace(buffer=buffer))
        globals().update(buffer=buffer, memory=buffer)
        return buffer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"buffer", "memory"})
