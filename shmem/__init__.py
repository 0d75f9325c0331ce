"""OpenSHMEM 1.5 for Python on ucxpy, shaped like shmem4py.

::

    import shmem
    shmem.init()
    me, n = shmem.my_pe(), shmem.n_pes()
    dst = shmem.zeros(4, dtype="i8")            # symmetric array on the heap
    shmem.put(dst, np.full(4, me, "i8"), (me + 1) % n)
    shmem.barrier_all()
    shmem.finalize()

Launch with ``ucxpy-run -n N python prog.py`` or ``mpiexec -n N python prog.py``.
Configuration: ``UCXPY_SHMEM_HEAP_SIZE`` (or ``SHMEM_SYMMETRIC_SIZE``,
default 64M) sizes the symmetric heap; ``UCXPY_SHMEM_PROGRESS_THREAD=n``
keeps the worker progress thread off even when some PE is reached in AM mode,
``y`` starts it even on a host with more PEs than CPUs, where ``auto`` does
not (see ``shmem.runtime``).  Errors are in :mod:`shmem.errors`.
"""
from __future__ import annotations

import enum as _enum
import os as _os
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional as _Optional

from . import runtime as _runtime
from .amo import (AMO, AMO_ADD, AMO_AND, AMO_INC, AMO_OR, AMO_SET, AMO_XOR, atomic_add,
                  atomic_and, atomic_compare_swap, atomic_compare_swap_nbi, atomic_fetch,
                  atomic_fetch_add, atomic_fetch_add_nbi, atomic_fetch_and,
                  atomic_fetch_and_nbi, atomic_fetch_inc, atomic_fetch_inc_nbi,
                  atomic_fetch_nbi, atomic_fetch_op, atomic_fetch_op_nbi, atomic_fetch_or,
                  atomic_fetch_or_nbi, atomic_fetch_xor, atomic_fetch_xor_nbi, atomic_inc,
                  atomic_op, atomic_or, atomic_set, atomic_swap, atomic_swap_nbi, atomic_xor)
from .coll import (OP, OP_AND, OP_MAX, OP_MIN, OP_OR, OP_PROD, OP_SUM, OP_XOR, alltoall,
                   alltoalls, and_reduce, broadcast, collect, fcollect, max_reduce,
                   min_reduce, or_reduce, prod_reduce, reduce, sum_reduce, xor_reduce)
from .ctx import (CTX, CTX_DEFAULT, CTX_INVALID, CTX_NOSTORE, CTX_PRIVATE, CTX_SERIALIZED,
                  Ctx, ctx_create, ctx_destroy, ctx_get_team)
from .errors import (DtypeMismatch, InvalidArray, InvalidContext, InvalidFree, InvalidPE,
                     InvalidTeam, NotInitialized, NotSymmetric, ShmemError,
                     SymmetricHeapExhausted)
from .heap import (MALLOC, MALLOC_ATOMICS_REMOTE, MALLOC_SIGNAL_REMOTE, addr_accessible,
                   alloc, array, del_array, empty, free, fromalloc, full, new_array, ones,
                   zeros)
from .lock import Lock, clear_lock, del_lock, new_lock, set_lock, test_lock
from .rma import (SIGNAL, SIGNAL_ADD, SIGNAL_SET, del_signal, g, get, get_nbi, iget, iput,
                  new_signal, p, ptr, put, put_nbi, put_signal, put_signal_nbi, signal_fetch)
from .sync import (CMP, CMP_EQ, CMP_GE, CMP_GT, CMP_LE, CMP_LT, CMP_NE, barrier_all, fence,
                   quiet, signal_wait_until, sync, sync_all, test, test_all, test_all_vector,
                   test_any, test_any_vector, test_some, test_some_vector, wait_until,
                   wait_until_all, wait_until_all_vector, wait_until_any,
                   wait_until_any_vector, wait_until_some, wait_until_some_vector)
from .team import (TEAM_INVALID, TEAM_SHARED, TEAM_WORLD, Team, team_create_ctx,
                   team_destroy, team_get_config, team_my_pe, team_n_pes, team_split_2d,
                   team_split_strided, team_sync, team_translate_pe)

from ucxpy.atomics import ffi    # shmem4py names its cffi handle shmem.ffi

MAJOR_VERSION = 1
MINOR_VERSION = 5
VENDOR_STRING = "ucxpy-shmem"
MAX_NAME_LEN = 256


class THREAD(_enum.IntEnum):
    """Thread support levels."""
    SINGLE = 0
    FUNNELED = 1
    SERIALIZED = 2
    MULTIPLE = 3


THREAD_SINGLE, THREAD_FUNNELED = THREAD.SINGLE, THREAD.FUNNELED
THREAD_SERIALIZED, THREAD_MULTIPLE = THREAD.SERIALIZED, THREAD.MULTIPLE
#: calls must be serialized by the application (the worker is not re-entrant)
_PROVIDED = THREAD_SERIALIZED
_provided = THREAD_SINGLE


def init(heap_size: _Optional[int] = None) -> None:
    """Join the job and map the symmetric heap.  Collective; idempotent."""
    global _provided
    _runtime.init(heap_size)
    _provided = max(_provided, THREAD_SINGLE)


def init_thread(requested: THREAD = THREAD_MULTIPLE) -> THREAD:
    """:func:`init`, returning the thread level provided (at most SERIALIZED)."""
    global _provided
    init()
    _provided = THREAD(min(int(requested), int(_PROVIDED)))
    return _provided


def query_thread() -> THREAD:
    return _provided


def finalize() -> None:
    """Complete outstanding operations, wait for every PE, release resources."""
    _runtime.finalize()


def initialized() -> bool:
    return _runtime.current is not None


def global_exit(status: int = 0) -> None:
    """Stop every PE of the job with exit ``status``."""
    rt = _runtime.current
    if rt is not None:
        try:
            rt.world.bootstrap.abort(f"shmem.global_exit({status})", status or 1)
        finally:
            _os._exit(status)
    raise SystemExit(status)


def my_pe() -> int:
    """This PE's number in TEAM_WORLD."""
    return _runtime.get().rank


def n_pes() -> int:
    """Number of PEs in the job."""
    return _runtime.get().size


def pe_accessible(pe: int) -> bool:
    return 0 <= pe < _runtime.get().size


def info_get_version():
    """``(major, minor)`` of the OpenSHMEM specification implemented."""
    return (MAJOR_VERSION, MINOR_VERSION)


def info_get_name() -> str:
    return VENDOR_STRING


def pcontrol(level: int = 1) -> None:
    """Profiling control: accepted and ignored."""


def heap_info() -> dict:
    """Size, bytes free and per-PE access mode of the symmetric heap."""
    rt = _runtime.get()
    return {"size": rt.heap.size, "free": rt.heap.allocator.free_bytes(),
            "modes": [peer.mode for peer in rt.peers]}


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and type(v) is not type(_os)]
