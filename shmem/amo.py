"""Atomic memory operations on one element of a symmetric array.

Standard AMOs (fetch_inc/inc, fetch_add/add, compare_swap) take 32/64-bit
integers; bitwise ones (fetch_and/or/xor, and/or/xor) unsigned 32/64-bit
(signed are accepted too); fetch/set/swap also float32/float64, carried as
their bit patterns.  LOCAL/MAPPED PEs use native atomics on the mapped heap;
AM-mode PEs ucxpy atomics, which the target applies with the same native
atomics, so both paths may hit one word concurrently.

Non-fetching AMOs to AM-mode PEs complete at the next ``quiet``; fetching
ones complete before they return (``*_nbi`` forms: at ``quiet``) and give
the old value as a Python int or float, as shmem4py's do.
"""
from __future__ import annotations

import enum
import struct

import numpy as np

from ucxpy import atomics

from . import accel as _accel
from . import runtime
from .errors import DtypeMismatch, InvalidArray
from .rma import _route

class AMO(str, enum.Enum):
    """Operation names for atomic_op / atomic_fetch_op."""
    SET = "set"
    INC = "inc"
    ADD = "add"
    AND = "and"
    OR = "or"
    XOR = "xor"

    def __str__(self):
        return self.value

    __format__ = str.__format__


AMO_SET, AMO_INC, AMO_ADD = AMO.SET, AMO.INC, AMO.ADD
AMO_AND, AMO_OR, AMO_XOR = AMO.AND, AMO.OR, AMO.XOR


class _Kind:
    """How one dtype travels through 4/8-byte atomics."""

    __slots__ = ("dtype", "size", "is_float", "mask", "to_raw", "from_raw")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.size = dtype.itemsize
        self.is_float = dtype.kind == "f"
        self.mask = (1 << (8 * self.size)) - 1
        raw = struct.Struct("<I" if self.size == 4 else "<Q")
        typed = struct.Struct("<" + {"i4": "i", "i8": "q", "u4": "I", "u8": "Q",
                                     "f4": "f", "f8": "d"}[f"{dtype.kind}{self.size}"])
        mask = self.mask
        if self.is_float:
            self.to_raw = lambda v: raw.unpack(typed.pack(float(v)))[0]
        else:
            self.to_raw = lambda v: int(v) & mask
        # a Python int or float, as shmem4py's (cffi's) fetching AMOs return
        self.from_raw = lambda r: typed.unpack(raw.pack(r & mask))[0]


_KINDS = {}


def _kind(dtype: np.dtype, op: str) -> _Kind:
    k = _KINDS.get(dtype)
    if k is None:
        if dtype.kind not in "iuf" or dtype.itemsize not in (4, 8) or not dtype.isnative:
            raise DtypeMismatch(f"atomics need a 32/64-bit integer or float dtype, not {dtype}")
        k = _KINDS[dtype] = _Kind(dtype)
    if k.is_float and op not in ("fetch", "set", "swap"):
        raise DtypeMismatch(f"atomic {op} is not defined for floating point dtype {dtype}")
    return k


def _target(rt, target, op):
    if not isinstance(target, np.ndarray):
        raise TypeError(f"AMO target must be a numpy array, not {type(target).__name__}")
    if target.size != 1:
        raise InvalidArray(f"AMO target must have exactly one element, not {target.size}")
    k = _kind(target.dtype, op)
    return k, rt.heap.offset_of(target, k.size)


def _load(peer, off, size) -> int:
    p = peer.ptr + off
    return atomics.load64(p) if size == 8 else atomics.load32(p)


def _direct(peer, off, k, op, raw, cmp_raw):
    """Native atomic on a LOCAL/MAPPED heap word; returns the old raw value."""
    p = peer.ptr + off
    if k.size == 8:
        if op == "add":
            return atomics.fetch_add64(p, raw)
        if op == "swap":
            return atomics.swap64(p, raw)
        if op == "cswap":
            return atomics.cswap64(p, cmp_raw, raw)
        if op == "and":
            return atomics.fetch_and64(p, raw)
        if op == "or":
            return atomics.fetch_or64(p, raw)
        return atomics.fetch_xor64(p, raw)
    if op == "add":
        return atomics.fetch_add32(p, raw)
    if op == "swap":
        return atomics.swap32(p, raw)
    if op == "cswap":
        return atomics.cswap32(p, cmp_raw, raw)
    if op == "and":
        return atomics.fetch_and32(p, raw)
    if op == "or":
        return atomics.fetch_or32(p, raw)
    return atomics.fetch_xor32(p, raw)


def _amo(target, pe, ctx, op, value=0, cond=0, fetch=True, name=None, out=None):
    """Core of every AMO.  ``op`` in fetch/add/and/or/xor/swap/cswap;
    ``fetch=False`` may skip waiting for the result; ``out`` (a local
    one-element array) receives the result at quiet instead (nbi forms)."""
    rt = runtime.get()
    cst, peer = _route(rt, ctx, pe)
    k, off = _target(rt, target, name or op)
    raw = k.to_raw(value) if op != "fetch" else 0
    if peer.base:
        if op == "fetch":
            old = _load(peer, off, k.size)
        else:
            old = _direct(peer, off, k, op, raw, k.to_raw(cond) if op == "cswap" else 0)
        if out is not None:
            out[...] = k.from_raw(old)
            return None
        return k.from_raw(old) if fetch else None
    raddr = peer.raddr + off
    if op == "fetch":
        op, raw = "or", 0
    if not fetch and out is None and op in ("add", "and", "or", "xor"):
        cst.track(peer.ep.atomic_post(op, raw, raddr, peer.rkey, k.size))
        return None
    req = peer.ep.atomic_fetch_nb(op, raw, raddr, peer.rkey, k.size,
                                  k.to_raw(cond) if op == "cswap" else 0)
    if out is not None:
        req.add_done_callback(lambda r: r.exc is None and out.__setitem__(
            Ellipsis, k.from_raw(r.result)))
        cst.track(req)
        return None
    if not fetch:
        cst.track(req)
        return None
    rt.wait_requests([req], f"atomic {op}")
    return k.from_raw(req.result)


def _fetch_out(fetch, target):
    if not isinstance(fetch, np.ndarray) or fetch.size != 1:
        raise InvalidArray("fetch must be a one-element numpy array")
    if fetch.dtype != target.dtype:
        raise DtypeMismatch(f"fetch dtype {fetch.dtype} differs from target dtype {target.dtype}")
    if not fetch.flags.writeable:
        raise InvalidArray("fetch array is read-only")
    return fetch.reshape(())


# -- blocking -------------------------------------------------------------------------
def atomic_fetch(source, pe, ctx=None):
    """Atomically read ``source`` on PE ``pe``."""
    return _amo(source, pe, ctx, "fetch")


def atomic_set(target, value, pe, ctx=None) -> None:
    """Atomically write ``value`` into ``target`` on PE ``pe``."""
    _amo(target, pe, ctx, "swap", value, fetch=False, name="set")


def atomic_swap(target, value, pe, ctx=None):
    """Write ``value``; return the previous value."""
    return _amo(target, pe, ctx, "swap", value)


def atomic_compare_swap(target, cond, value, pe, ctx=None):
    """Write ``value`` if ``target == cond``; return the previous value."""
    return _amo(target, pe, ctx, "cswap", value, cond, name="compare_swap")


def atomic_fetch_inc(target, pe, ctx=None):
    return _amo(target, pe, ctx, "add", 1, name="fetch_inc")


def atomic_inc(target, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "add", 1, fetch=False, name="inc")


def atomic_fetch_add(target, value, pe, ctx=None):
    return _amo(target, pe, ctx, "add", value, name="fetch_add")


def atomic_add(target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "add", value, fetch=False)


def atomic_fetch_and(target, value, pe, ctx=None):
    return _amo(target, pe, ctx, "and", value, name="fetch_and")


def atomic_and(target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "and", value, fetch=False)


def atomic_fetch_or(target, value, pe, ctx=None):
    return _amo(target, pe, ctx, "or", value, name="fetch_or")


def atomic_or(target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "or", value, fetch=False)


def atomic_fetch_xor(target, value, pe, ctx=None):
    return _amo(target, pe, ctx, "xor", value, name="fetch_xor")


def atomic_xor(target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "xor", value, fetch=False)


# -- non-blocking fetching forms (result in ``fetch`` after quiet) --------------------------
def atomic_fetch_nbi(fetch, source, pe, ctx=None) -> None:
    _amo(source, pe, ctx, "fetch", out=_fetch_out(fetch, source))


def atomic_swap_nbi(fetch, target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "swap", value, out=_fetch_out(fetch, target))


def atomic_compare_swap_nbi(fetch, target, cond, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "cswap", value, cond, name="compare_swap",
         out=_fetch_out(fetch, target))


def atomic_fetch_inc_nbi(fetch, target, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "add", 1, name="fetch_inc", out=_fetch_out(fetch, target))


def atomic_fetch_add_nbi(fetch, target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "add", value, name="fetch_add", out=_fetch_out(fetch, target))


def atomic_fetch_and_nbi(fetch, target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "and", value, name="fetch_and", out=_fetch_out(fetch, target))


def atomic_fetch_or_nbi(fetch, target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "or", value, name="fetch_or", out=_fetch_out(fetch, target))


def atomic_fetch_xor_nbi(fetch, target, value, pe, ctx=None) -> None:
    _amo(target, pe, ctx, "xor", value, name="fetch_xor", out=_fetch_out(fetch, target))


# the plain calls in the data plane (shmem.accel); the functions above serve the rest
atomic_fetch = _accel.call(_accel.FETCH, atomic_fetch)
atomic_set = _accel.call(_accel.SET, atomic_set)
atomic_swap = _accel.call(_accel.SWAP, atomic_swap)
atomic_compare_swap = _accel.call(_accel.COMPARE_SWAP, atomic_compare_swap)
atomic_fetch_inc = _accel.call(_accel.FETCH_INC, atomic_fetch_inc)
atomic_inc = _accel.call(_accel.INC, atomic_inc)
atomic_fetch_add = _accel.call(_accel.FETCH_ADD, atomic_fetch_add)
atomic_add = _accel.call(_accel.ADD, atomic_add)
atomic_fetch_and = _accel.call(_accel.FETCH_AND, atomic_fetch_and)
atomic_and = _accel.call(_accel.AND, atomic_and)
atomic_fetch_or = _accel.call(_accel.FETCH_OR, atomic_fetch_or)
atomic_or = _accel.call(_accel.OR, atomic_or)
atomic_fetch_xor = _accel.call(_accel.FETCH_XOR, atomic_fetch_xor)
atomic_xor = _accel.call(_accel.XOR, atomic_xor)


# -- by operation name ----------------------------------------------------------------------
_OPS = {"set": "swap", "inc": "add", "add": "add", "and": "and", "or": "or", "xor": "xor"}


def _op_of(op) -> str:
    name = str(op.value if isinstance(op, AMO) else op).lower()
    if name not in _OPS:
        raise ValueError(f"unknown AMO {op!r}; one of {', '.join(_OPS)}")
    return name


def atomic_op(target, value, op, pe, ctx=None) -> None:
    """Non-fetching AMO named by ``op`` (AMO_SET/INC/ADD/AND/OR/XOR)."""
    name = _op_of(op)
    _amo(target, pe, ctx, _OPS[name], 1 if name == "inc" else value, fetch=False, name=name)


def atomic_fetch_op(target, value, op, pe, ctx=None):
    """Fetching AMO named by ``op``; returns the previous value."""
    name = _op_of(op)
    fname = "swap" if name == "set" else f"fetch_{name}"
    return _amo(target, pe, ctx, _OPS[name], 1 if name == "inc" else value, name=fname)


def atomic_fetch_op_nbi(fetch, target, value, op, pe, ctx=None) -> None:
    name = _op_of(op)
    fname = "swap" if name == "set" else f"fetch_{name}"
    _amo(target, pe, ctx, _OPS[name], 1 if name == "inc" else value, name=fname,
         out=_fetch_out(fetch, target))
