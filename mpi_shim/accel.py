"""mpi_shim's hottest calls with their common case in C (``mpi_shim._accel``,
native/mpi_accel.c).

``Comm.Send``/``Recv``/``Isend``/``Irecv``, ``Request.Waitall`` and
``Win.Put``/``Get``/``Flush``/``Fetch_and_op``/``Compare_and_swap`` become
C callables that wrap the Python methods: a call
whose arguments are the plain case (a whole contiguous numpy array,
bytearray or bytes of a predefined type; a rank; a mapped window target) is
done in C, through the same ucxpy calls the Python method makes; any other
call goes to the Python method unchanged, which stays the reference
implementation.  The calls pay their own frame and argument inspection
once, in C, instead of in Python (docs/notes/performance-history.md).

The C path is on when ucxpy's native fast path is (``UCXPY_FASTPATH``, no
tracing): :func:`configure` runs when MPI attaches to the worker.  Without
the extension module (a build without a compiler) nothing changes.
"""
from __future__ import annotations

import functools
import sys

import ucxpy
from ucxpy.buffers import COMPLETED

from . import engine as E
from .comm import CommImpl
from .exceptions import translate
from .handle import Handle
from .op import SUM, Op
from .ops import PostedRecv, RecvOp, SendOp
from .p2p import _SENT, P2P, _recv_ack, _recv_wait
from .request import Request
from .status import ANY_TAG
from .win import FLUSH_PROGRESS_EVERY, Win, atomic_op_codes, flush_progress

try:
    from . import _accel
except ImportError:            # not built: the Python methods serve every call
    _accel = None

#: the calls there are (mpi_accel.c's kinds)
KINDS = ("SEND", "RECV", "PUT", "GET", "FLUSH", "FETCH_AND_OP", "COMPARE_AND_SWAP", "ISEND",
         "IRECV", "WAITALL")
SEND, RECV, PUT, GET, FLUSH, FETCH_AND_OP, COMPARE_AND_SWAP, ISEND, IRECV, WAITALL = (
    tuple(getattr(_accel, k) for k in KINDS) if _accel is not None else range(len(KINDS)))


def wrap(cls, names: dict) -> None:
    """Replace ``cls``'s methods ``names`` (name -> kind) by C callables over
    them (aliases of one function share one callable)."""
    if _accel is None:
        return
    for name, kind in names.items():
        member = cls.__dict__[name]
        fn = member.__func__ if isinstance(member, classmethod) else member
        if isinstance(fn, _accel.accel):
            continue
        fast = functools.update_wrapper(_accel.accel(kind, fn), fn)
        if isinstance(member, classmethod):
            fast = classmethod(fast)
        for alias, other in list(vars(cls).items()):
            if other is member:
                setattr(cls, alias, fast)


def configure(worker) -> None:
    """Give the C calls what they need and switch them on for ``worker``
    (MPI initialization): on with ucxpy's native fast path and no tracing."""
    if _accel is None:
        return
    on = bool(worker.config.fastpath) and worker.tr is None
    _CONFIG.clear()
    _CONFIG.update({
        "enabled": on, "handle": Handle, "comm_impl": CommImpl, "op_type": Op,
        # (None while numpy is not imported: the C side learns the type from
        # the first array it sees, ucxpy.lazy)
        "ndarray": getattr(sys.modules.get("numpy"), "ndarray", None),
        "completed": COMPLETED, "ucxpy_error": ucxpy.UcxpyError,
        "translate": translate, "worker": worker, "recv_wait": _recv_wait,
        "recv_ack": _recv_ack, "flush_progress": flush_progress, "request": Request,
        "recv_op": RecvOp, "posted_recv": PostedRecv, "sent_op": _SENT,
        "send_op": SendOp, "ucxpy_request": ucxpy.Request,
        "post_new": worker._post_new, "post_taken": worker._post_taken,
        "cancel_recv": worker._cancel_recv,
        "wait_op": E.ENGINE.wait,
        "op_codes": atomic_op_codes(_accel.NOOP_BIT), "sum_op": SUM,
        "tag_ub": E.TAG_UB, "mask_tag": E.MASK_TAG, "mask_any_tag": E.MASK_ANY_TAG,
        "seq_mask": E.SEQ_MASK, "user_mask": E.USER_MASK, "any_tag": ANY_TAG,
        "flush_every": FLUSH_PROGRESS_EVERY})
    _accel.configure(_CONFIG)


_CONFIG = {}


def switch(on: bool) -> None:
    """Turn the C paths on or off (off: every call runs its Python method)."""
    if _accel is not None:
        _accel.configure({"enabled": bool(on)})


def enabled() -> bool:
    return _accel is not None and _accel.enabled()


def counts() -> dict:
    """How many calls of each kind the C paths did (for tests and tools)."""
    if _accel is None:
        return {k: 0 for k in KINDS}
    return dict(zip(KINDS, _accel.counts()))


def install() -> None:
    """Put the C callables over the methods (idempotent; MPI initialization
    calls it before THREAD_MULTIPLE's wrappers go around them): the common
    case in C, the methods themselves for the rest."""
    wrap(P2P, {"Send": SEND, "Recv": RECV, "Isend": ISEND, "Irecv": IRECV})
    wrap(Request, {"Waitall": WAITALL})
    wrap(Win, {"Put": PUT, "Get": GET, "Flush": FLUSH, "Fetch_and_op": FETCH_AND_OP,
               "Compare_and_swap": COMPARE_AND_SWAP})
