"""RMA: put/get (blocking, strided, non-blocking), p/g, put-with-signal, ptr.

Arguments follow shmem4py: ``put(target, source, pe, size=None, ctx=None)``
with numpy arrays; ``size`` counts elements (default: as many as both arrays
hold).  ``target`` of a put / ``source`` of a get must be symmetric (on the
heap); the local side may be any contiguous array of the same dtype.

Completion: to a LOCAL or MAPPED PE every call completes before it returns
(a memmove).  To an AM-mode PE a blocking put copies the source (up to
``COPY_LIMIT`` bytes, else it waits) and returns; the put completes at the
target by the next ``quiet``/``barrier_all``.  ``*_nbi`` calls do not copy:
their buffers must stay untouched until ``quiet``.
"""
from __future__ import annotations

import enum

import numpy as np

from ucxpy import atomics

from . import accel as _accel
from . import heap, runtime
from .ctx import ctx_state
from .errors import DtypeMismatch, InvalidArray

#: AM-mode blocking puts up to this many bytes copy the source and return at once
COPY_LIMIT = 64 << 10


class SIGNAL(enum.IntEnum):
    """How put_signal updates the signal word."""
    SET = 0
    ADD = 1


SIGNAL_SET = SIGNAL.SET
SIGNAL_ADD = SIGNAL.ADD


# -- argument checking ----------------------------------------------------------
def _flat(a, writable: bool, what: str) -> np.ndarray:
    """``a`` as a 1-D C-ordered view (F-ordered arrays are read in memory order)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise InvalidArray(f"{what} array is read-only")
    if not a.flags.c_contiguous:
        if not a.flags.f_contiguous:
            raise InvalidArray(f"{what} array is not contiguous")
        a = a.T
    return a.reshape(-1)


def _pair(target, source, size, tst=1, sst=1, target_writable=True):
    """Validated (flat target, flat source, element count)."""
    t = _flat(target, target_writable, "target")
    s = _flat(source, not target_writable, "source")
    if t.dtype != s.dtype:
        raise DtypeMismatch(f"target dtype {t.dtype} differs from source dtype {s.dtype}")
    if tst < 1 or sst < 1:
        raise ValueError(f"strides must be >= 1 (tst={tst}, sst={sst})")
    tsize = -(-t.size // tst)
    ssize = -(-s.size // sst)
    if size is None:
        size = min(tsize, ssize)
    elif size < 0 or size > tsize or size > ssize:
        raise InvalidArray(f"size {size} exceeds the target ({tsize}) or source "
                           f"({ssize}) element count")
    return t, s, int(size)


def _route(rt, ctx, pe):
    """(context state, Peer) for ``pe`` as numbered by ``ctx``'s team."""
    cst = rt.ctxs.default if ctx is None else ctx_state(rt, ctx)
    if cst.world_team:
        return cst, rt.peer(pe)
    return cst, rt.peers[cst.team.world_pe(pe)]


# -- byte movers -------------------------------------------------------------------
def put_bytes(rt, cst, peer, off: int, src: np.ndarray, nbytes: int, nbi: bool = False) -> None:
    """Copy the first ``nbytes`` of the C-contiguous ``src`` to heap offset
    ``off`` on ``peer``."""
    if peer.base:
        if nbytes:
            atomics.memmove(peer.ptr + off, src, nbytes)
        return
    if not nbytes:
        return
    data = src.view(np.uint8)[:nbytes] if src.ndim == 1 else src.reshape(-1).view(np.uint8)[:nbytes]
    if nbi:
        cst.track(peer.ep.put_nb(data, peer.raddr + off, peer.rkey))
    elif nbytes <= COPY_LIMIT:
        req = peer.ep.put_nb(data.tobytes(), peer.raddr + off, peer.rkey)
        if not req.done:
            cst.track(req)
    else:
        rt.wait_requests([peer.ep.put_nb(data, peer.raddr + off, peer.rkey)], "put")


def get_bytes(rt, cst, peer, off: int, dest: np.ndarray, nbytes: int, nbi: bool = False) -> None:
    """Copy ``nbytes`` from heap offset ``off`` on ``peer`` into ``dest``."""
    if peer.base:
        if nbytes:
            atomics.memmove(dest, peer.ptr + off, nbytes)
        return
    if not nbytes:
        return
    view = dest.view(np.uint8)[:nbytes]
    req = peer.ep.get_nb(view, peer.raddr + off, peer.rkey)
    if nbi:
        cst.track(req)
    else:
        rt.wait_requests([req], "get")


# -- contiguous -----------------------------------------------------------------------
def _fast_peer(rt, target, source, pe):
    """(Peer, heap offset, nbytes) when a plain call may skip argument
    checking: ``target``/``source`` is an array this heap handed out, the
    other side an array of the identical dtype, ``pe`` a direct world PE;
    else None.  A non-contiguous local side makes atomics.memmove raise, and the
    caller then takes the checked path."""
    hit = rt.heap.known.get(id(target))
    if hit is None or hit[0] is not target or type(source) is not np.ndarray \
            or type(target) is not np.ndarray or source.dtype is not target.dtype \
            or type(pe) is not int or pe < 0:
        return None
    try:
        peer = rt.peers[pe]
    except IndexError:
        return None
    if not peer.base:
        return None
    return peer, hit[1], min(target.nbytes, source.nbytes)


def put(target, source, pe: int, size=None, ctx=None) -> None:
    """Copy ``size`` elements of local ``source`` to symmetric ``target`` on
    PE ``pe``.  Returns when ``source`` may be reused."""
    rt = runtime.current
    if rt is not None and size is None and ctx is None:
        fast = _fast_peer(rt, target, source, pe)
        if fast is not None:
            peer, off, nbytes = fast
            try:
                atomics.memmove(peer.ptr + off, source, nbytes)
                return
            except (BufferError, TypeError, ValueError):
                pass
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size)
    nbytes = n * t.itemsize
    put_bytes(rt, cst, peer, rt.heap.offset_of(target, nbytes), s, nbytes)


def get(target, source, pe: int, size=None, ctx=None) -> None:
    """Copy ``size`` elements of symmetric ``source`` on PE ``pe`` into local
    ``target``; returns when the data arrived."""
    rt = runtime.current
    if rt is not None and size is None and ctx is None:
        fast = _fast_peer(rt, source, target, pe)
        if fast is not None:
            peer, off, nbytes = fast
            try:
                atomics.memmove(target, peer.ptr + off, nbytes)
                return
            except (BufferError, TypeError, ValueError):
                pass
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size)
    nbytes = n * t.itemsize
    get_bytes(rt, cst, peer, rt.heap.offset_of(source, nbytes), t, nbytes)


# the plain calls in the data plane (shmem.accel); the functions above serve the rest
put = _accel.call(_accel.PUT, put)
get = _accel.call(_accel.GET, get)


def put_nbi(target, source, pe: int, size=None, ctx=None) -> None:
    """Non-blocking put: complete (and ``source`` reusable) after ``quiet``."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size)
    nbytes = n * t.itemsize
    put_bytes(rt, cst, peer, rt.heap.offset_of(target, nbytes), s, nbytes, nbi=True)


def get_nbi(target, source, pe: int, size=None, ctx=None) -> None:
    """Non-blocking get: ``target`` holds the data after ``quiet``."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size)
    nbytes = n * t.itemsize
    get_bytes(rt, cst, peer, rt.heap.offset_of(source, nbytes), t, nbytes, nbi=True)


# (to a mapped PE these complete at once, as the Python path's do)
put_nbi = _accel.call(_accel.PUT_NBI, put_nbi)
get_nbi = _accel.call(_accel.GET_NBI, get_nbi)


def p(target, value, pe: int, ctx=None) -> None:
    """Put one element ``value`` into ``target[0]`` on PE ``pe``."""
    t = _flat(target, True, "target")
    put(t[:1], np.array([value], dtype=t.dtype), pe, 1, ctx)


def g(source, pe: int, ctx=None):
    """Return element ``source[0]`` of PE ``pe``."""
    s = _flat(source, False, "source")
    out = np.empty(1, s.dtype)
    get(out, s[:1], pe, 1, ctx)
    return out[0]


# -- strided --------------------------------------------------------------------------
def _span(n: int, stride: int) -> int:
    return (n - 1) * stride + 1 if n else 0


def iput(target, source, pe: int, tst: int = 1, sst: int = 1, size=None, ctx=None) -> None:
    """Strided put: ``target[i*tst] = source[i*sst]`` for ``i < size`` on PE ``pe``."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size, tst, sst)
    if not n:
        return
    item = t.itemsize
    off = rt.heap.offset_of(target, _span(n, tst) * item)
    if peer.base:
        remote = np.ndarray((n,), t.dtype, buffer=peer.u8, offset=off, strides=(tst * item,))
        remote[...] = s[::sst][:n]
        return
    if tst == 1:
        put_bytes(rt, cst, peer, off, np.ascontiguousarray(s[::sst][:n]), n * item)
        return
    vals = s[::sst][:n].copy()
    for i in range(n):
        put_bytes(rt, cst, peer, off + i * tst * item, vals[i:i + 1], item)


def iget(target, source, pe: int, tst: int = 1, sst: int = 1, size=None, ctx=None) -> None:
    """Strided get: ``target[i*tst] = source[i*sst]`` (``source`` on PE ``pe``)."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size, tst, sst)
    if not n:
        return
    item = t.itemsize
    span = _span(n, sst)
    off = rt.heap.offset_of(source, span * item)
    if peer.base:
        remote = np.ndarray((n,), t.dtype, buffer=peer.u8, offset=off, strides=(sst * item,))
        t[::tst][:n] = remote
        return
    tmp = np.empty(span, t.dtype)
    get_bytes(rt, cst, peer, off, tmp, span * item)
    t[::tst][:n] = tmp[::sst]


# -- put with signal -------------------------------------------------------------------
def _signal_offset(rt, signal) -> int:
    if not isinstance(signal, np.ndarray) or signal.dtype != np.uint64 or signal.size != 1:
        raise DtypeMismatch("signal must be a one-element uint64 symmetric array "
                            "(shmem.new_signal())")
    return rt.heap.offset_of(signal, 8)


def signal_update(rt, cst, peer, off: int, value: int, sigop) -> None:
    """Apply SIGNAL_SET/SIGNAL_ADD with ``value`` to the signal at ``off`` on ``peer``."""
    value = int(value) & 0xFFFF_FFFF_FFFF_FFFF
    if sigop == SIGNAL_ADD:
        if peer.base:
            atomics.add64(peer.ptr + off, value)
        else:
            cst.track(peer.ep.atomic_post("add", value, peer.raddr + off, peer.rkey, 8))
    elif sigop == SIGNAL_SET:
        if peer.base:
            atomics.store64(peer.ptr + off, value)
        else:
            cst.track(peer.ep.atomic_fetch_nb("swap", value, peer.raddr + off, peer.rkey, 8))
    else:
        raise ValueError(f"unknown signal operation {sigop!r} (SIGNAL_SET or SIGNAL_ADD)")


def put_signal(target, source, pe: int, signal, value: int, sigop, size=None, ctx=None,
               nbi: bool = False) -> None:
    """Put, then update ``signal`` on PE ``pe``: a PE waiting on the signal
    sees the data once it sees the update."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    t, s, n = _pair(target, source, size)
    nbytes = n * t.itemsize
    soff = _signal_offset(rt, signal)
    put_bytes(rt, cst, peer, rt.heap.offset_of(target, nbytes), s, nbytes, nbi)
    # AM mode: ucxpy runs one endpoint's operations in issue order, so the
    # signal lands after the data; MAPPED: the memmove precedes the atomic;
    # RDMA: the put is a one-sided write the signal's active message could
    # overtake, so the signal waits for its delivery (a fence)
    if peer in rt.unordered:
        peer.ep.fence()
    signal_update(rt, cst, peer, soff, value, sigop)


def put_signal_nbi(target, source, pe: int, signal, value: int, sigop, size=None,
                   ctx=None) -> None:
    """Non-blocking :func:`put_signal` (complete after ``quiet``)."""
    put_signal(target, source, pe, signal, value, sigop, size, ctx, nbi=True)


def new_signal():
    """Collectively allocate a symmetric signal word (uint64, zero)."""
    return heap.zeros(1, np.uint64)


def del_signal(signal) -> None:
    """Collectively free a signal from :func:`new_signal`."""
    heap.free(signal)


def signal_fetch(signal) -> int:
    """Atomically read the local ``signal`` word."""
    rt = runtime.get()
    off = _signal_offset(rt, signal)
    return int(atomics.load64(rt.peers[rt.rank].ptr + off))


# -- direct access -----------------------------------------------------------------------
def ptr(target, pe: int):
    """A numpy view of symmetric ``target`` as it lives on PE ``pe`` when
    loads/stores reach it (same host), else None."""
    rt = runtime.get()
    peer = rt.peer(pe)
    if not isinstance(target, np.ndarray):
        raise TypeError(f"target must be a numpy array, not {type(target).__name__}")
    off = rt.heap.offset_of(target, target.nbytes)
    if not peer.base:
        return None
    a = np.ndarray(target.shape, target.dtype, buffer=peer.u8, offset=off,
                   strides=target.strides)
    a.flags.writeable = target.flags.writeable
    return a
