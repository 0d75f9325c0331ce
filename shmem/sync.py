"""Ordering, completion, barriers, and point-to-point synchronization.

* ``fence``: puts/AMOs to one PE are delivered in issue order.  LOCAL and
  MAPPED operations are complete when issued; ucxpy executes AM-mode
  operations on one endpoint in issue order.  So fence only validates ``ctx``.
* ``quiet``: waits for the context's AM-mode operations in flight.
* ``barrier_all`` = quiet every context + dissemination sync over
  TEAM_WORLD; ``sync_all``/``sync(team)`` = the sync alone.
* ``wait_until*`` poll local symmetric memory, progressing the worker (AM
  peers' writes arrive through it) and backing off (see runtime.wait).
"""
from __future__ import annotations

import enum
import operator

import numpy as np

import ucxpy
from ucxpy import atomics

from . import accel as _accel
from . import runtime
from .ctx import ctx_state
from .errors import DtypeMismatch, InvalidArray
from .rma import _signal_offset
from .team import team_state


class CMP(enum.IntEnum):
    """Comparison operators of wait_until / test."""
    EQ = 1
    NE = 2
    GT = 3
    LE = 4
    LT = 5
    GE = 6


CMP_EQ, CMP_NE, CMP_GT, CMP_LE, CMP_LT, CMP_GE = (CMP.EQ, CMP.NE, CMP.GT, CMP.LE,
                                                  CMP.LT, CMP.GE)

_CMP_NAMES = {"==": CMP_EQ, "!=": CMP_NE, ">": CMP_GT, "<=": CMP_LE, "<": CMP_LT,
              ">=": CMP_GE, "eq": CMP_EQ, "ne": CMP_NE, "gt": CMP_GT, "le": CMP_LE,
              "lt": CMP_LT, "ge": CMP_GE}
_SCALAR = {CMP_EQ: operator.eq, CMP_NE: operator.ne, CMP_GT: operator.gt,
           CMP_LE: operator.le, CMP_LT: operator.lt, CMP_GE: operator.ge}
_VECTOR = {CMP_EQ: np.equal, CMP_NE: np.not_equal, CMP_GT: np.greater,
           CMP_LE: np.less_equal, CMP_LT: np.less, CMP_GE: np.greater_equal}


def _cmp(cmp) -> CMP:
    if isinstance(cmp, str):
        c = _CMP_NAMES.get(cmp.strip().lower())
        if c is not None:
            return c
    else:
        try:
            return CMP(cmp)
        except ValueError:
            pass
    raise ValueError(f"unknown comparison {cmp!r}: one of CMP_EQ..CMP_GE or "
                     "'==', '!=', '>', '<=', '<', '>=' (or eq/ne/gt/le/lt/ge)")


# -- completion and barriers ---------------------------------------------------------
def fence(ctx=None) -> None:
    """Order puts/AMOs issued before it to each PE ahead of those issued after."""
    rt = runtime.get()
    ucxpy.trace.mark(rt.worker, "shmem", "fence")
    ctx_state(rt, ctx)
    # one endpoint's active messages arrive in issue order and mapped stores
    # are immediate; one-sided writes of an RDMA lane are ordered by nothing
    # but their completion (delivery complete)
    for peer in rt.unordered:
        peer.ep.fence()


def quiet(ctx=None) -> None:
    """Complete every put, AMO and nbi operation issued on ``ctx`` (default context)."""
    rt = runtime.get()
    with ucxpy.trace.span(rt.worker, "shmem", "quiet"):
        ctx_state(rt, ctx).quiet(rt)


# nothing in flight on the default context: done in the data plane (shmem.accel)
quiet = _accel.call(_accel.QUIET, quiet)


def barrier_all() -> None:
    """Complete all outstanding operations, then wait for every PE."""
    rt = runtime.get()
    with ucxpy.trace.span(rt.worker, "shmem", "barrier_all"):
        rt.ctxs.quiet_all()
        rt.teams.world.sync()


def sync_all() -> None:
    """Wait for every PE (no completion of RMA implied)."""
    rt = runtime.get()
    with ucxpy.trace.span(rt.worker, "shmem", "sync_all"):
        rt.teams.world.sync()


def sync(team=None) -> None:
    """Wait for every PE of ``team`` (default TEAM_WORLD)."""
    runtime.get()
    team_state(team).sync()


# -- point-to-point -------------------------------------------------------------------
def _ivars(rt, ivars, what="ivars") -> np.ndarray:
    if not isinstance(ivars, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(ivars).__name__}")
    if ivars.dtype.kind not in "iu":
        raise DtypeMismatch(f"{what} must have an integer dtype, not {ivars.dtype}")
    if not (ivars.flags.c_contiguous or ivars.flags.f_contiguous):
        raise InvalidArray(f"{what} array is not contiguous")
    rt.heap.offset_of(ivars, ivars.nbytes)
    return (ivars if ivars.flags.c_contiguous else ivars.T).reshape(-1)


def _value(value, dtype):
    return np.array(value).astype(dtype)[()]


def _active(status, n):
    if status is None:
        return np.arange(n)
    st = np.asarray(status).reshape(-1)
    if st.size < n:
        raise InvalidArray(f"status has {st.size} entries for {n} ivars")
    return np.flatnonzero(st[:n] == 0)


def _values(values, n, dtype):
    v = np.asarray(values).astype(dtype).reshape(-1)
    if v.size < n:
        raise InvalidArray(f"values has {v.size} entries for {n} ivars")
    return v[:n]


def _done(rt):
    if atomics.available:
        atomics.fence_acquire()   # later reads see what the writer stored first


def wait_until(ivar, cmp, value) -> None:
    """Block until ``ivar cmp value`` holds for the one-element symmetric ``ivar``."""
    rt = runtime.get()
    v = _ivars(rt, ivar, "ivar")
    if v.size != 1:
        raise InvalidArray(f"ivar must have exactly one element, not {v.size}")
    fn, val = _SCALAR[_cmp(cmp)], _value(value, v.dtype)
    rt.wait(lambda: fn(v[0], val), "wait_until")
    _done(rt)


def _all(v, idx, fn, val):
    return bool(fn(v[idx], val).all())


def _any(v, idx, fn, val):
    hit = np.flatnonzero(fn(v[idx], val if np.ndim(val) == 0 else val[idx]))
    return int(idx[hit[0]]) if hit.size else None


def _some(v, idx, fn, val):
    hit = np.flatnonzero(fn(v[idx], val if np.ndim(val) == 0 else val[idx]))
    return [int(i) for i in idx[hit]]


def _wait(kind, ivars, cmp, values, status, vector):
    rt = runtime.get()
    v = _ivars(rt, ivars)
    idx = _active(status, v.size)
    fn = _VECTOR[_cmp(cmp)]
    val = _values(values, v.size, v.dtype) if vector else _value(values, v.dtype)
    if kind == "all":
        if vector:
            val = val[idx]
        rt.wait(lambda: _all(v, idx, fn, val), "wait_until_all")
        _done(rt)
        return None
    if not idx.size:
        return None if kind == "any" else []
    found = []
    probe = _any if kind == "any" else _some

    def cond():
        r = probe(v, idx, fn, val)
        if r is None or r == []:
            return False
        found.append(r)
        return True
    rt.wait(cond, f"wait_until_{kind}")
    _done(rt)
    return found[0]


def wait_until_all(ivars, cmp, value, status=None) -> None:
    """Block until every ivar not excluded by ``status`` satisfies the test."""
    return _wait("all", ivars, cmp, value, status, False)


def wait_until_any(ivars, cmp, value, status=None):
    """Block until some ivar satisfies the test; return its index (None if
    ``status`` excludes all)."""
    return _wait("any", ivars, cmp, value, status, False)


def wait_until_some(ivars, cmp, value, status=None) -> list:
    """Block until at least one ivar satisfies the test; return all indices that do."""
    return _wait("some", ivars, cmp, value, status, False)


def wait_until_all_vector(ivars, cmp, values, status=None) -> None:
    return _wait("all", ivars, cmp, values, status, True)


def wait_until_any_vector(ivars, cmp, values, status=None):
    return _wait("any", ivars, cmp, values, status, True)


def wait_until_some_vector(ivars, cmp, values, status=None) -> list:
    return _wait("some", ivars, cmp, values, status, True)


def _test(kind, ivars, cmp, values, status, vector):
    rt = runtime.get()
    rt.worker.progress()
    v = _ivars(rt, ivars)
    idx = _active(status, v.size)
    fn = _VECTOR[_cmp(cmp)]
    val = _values(values, v.size, v.dtype) if vector else _value(values, v.dtype)
    if kind == "all":
        return _all(v, idx, fn, val[idx] if vector else val)
    if not idx.size:
        return None if kind == "any" else []
    return (_any if kind == "any" else _some)(v, idx, fn, val)


def test(ivar, cmp, value) -> bool:
    """True if ``ivar cmp value`` holds now (progresses the worker once)."""
    rt = runtime.get()
    rt.worker.progress()
    v = _ivars(rt, ivar, "ivar")
    if v.size != 1:
        raise InvalidArray(f"ivar must have exactly one element, not {v.size}")
    return bool(_SCALAR[_cmp(cmp)](v[0], _value(value, v.dtype)))


def test_all(ivars, cmp, value, status=None) -> bool:
    return _test("all", ivars, cmp, value, status, False)


def test_any(ivars, cmp, value, status=None):
    return _test("any", ivars, cmp, value, status, False)


def test_some(ivars, cmp, value, status=None) -> list:
    return _test("some", ivars, cmp, value, status, False)


def test_all_vector(ivars, cmp, values, status=None) -> bool:
    return _test("all", ivars, cmp, values, status, True)


def test_any_vector(ivars, cmp, values, status=None):
    return _test("any", ivars, cmp, values, status, True)


def test_some_vector(ivars, cmp, values, status=None) -> list:
    return _test("some", ivars, cmp, values, status, True)


def signal_wait_until(signal, cmp, value) -> int:
    """Block until the local signal word satisfies ``signal cmp value``;
    return its value."""
    rt = runtime.get()
    p = rt.peers[rt.rank].ptr + _signal_offset(rt, signal)
    fn, val = _SCALAR[_cmp(cmp)], int(value) & 0xFFFF_FFFF_FFFF_FFFF
    seen = []

    def cond():
        s = atomics.load64(p)
        if fn(s, val):
            seen.append(s)
            return True
        return False
    rt.wait(cond, "signal_wait_until")
    return int(seen[0])
