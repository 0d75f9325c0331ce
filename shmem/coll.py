"""Collectives on teams, over ucxpy tagged messages in a reserved tag space.

Theory of operation
-------------------
Each collective call takes the next tag of its team
(``0x5E << 56 | slot << 48 | sequence << 16``, see TeamState.next_tag); the
low 16 bits number the algorithm's steps, and receives name their source,
so concurrent collectives on different teams, and successive ones on one
team, never match each other's messages.  Data moves from the sender's local
buffer into the receiver's, so no symmetric scratch space, no entry barrier,
and no pSync arrays are needed; each call returns once this PE's part is
done (its ``target`` complete, its ``source`` reusable).

==============  ===================================================  ==========
collective      algorithm                                            rounds
==============  ===================================================  ==========
broadcast       binomial tree from the root                          log2 N
fcollect        ring (each block travels N-1 hops)                   N-1
collect         fcollect of the sizes, then the ring with offsets    N
alltoall(s)     every pair at once (receives posted first)           1
reduce          recursive doubling; the N - 2**k extra PEs fold in   log2 N + 2
                first and get the result last.  Partners combine
                (lower op higher), so every PE gets the same bits
==============  ===================================================  ==========
"""
from __future__ import annotations

import enum

import numpy as np

from . import runtime
from .errors import DtypeMismatch, InvalidArray, InvalidPE
from .rma import _flat
from .team import team_state
from ucxpy.schedules import binomial_tree, recursive_doubling
from ucxpy.tag import FULL_MASK


class OP(str, enum.Enum):
    """Reduction operators."""
    AND = "and"
    OR = "or"
    XOR = "xor"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    PROD = "prod"

    def __str__(self):
        return self.value

    __format__ = str.__format__


OP_AND, OP_OR, OP_XOR, OP_MAX = OP.AND, OP.OR, OP.XOR, OP.MAX
OP_MIN, OP_SUM, OP_PROD = OP.MIN, OP.SUM, OP.PROD

_UFUNC = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
          "max": np.maximum, "min": np.minimum, "sum": np.add, "prod": np.multiply}


# -- message helpers ------------------------------------------------------------------
def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _send(rt, pe, buf, tag):
    return rt.world.eps[pe].tag_send_nb(buf, tag)


def _recv(rt, pe, buf, tag):
    return rt.worker.tag_recv_nb(buf, tag, FULL_MASK, pe)


def _pair(target, source, what):
    t = _flat(target, True, "target")
    s = _flat(source, False, "source")
    if t.dtype != s.dtype:
        raise DtypeMismatch(f"{what}: target dtype {t.dtype} differs from source dtype {s.dtype}")
    rt = runtime.get()
    rt.heap.offset_of(target, 0)
    rt.heap.offset_of(source, 0)
    return rt, t, s


# -- internal algorithms on local buffers --------------------------------------------------
def bcast_local(ts, buf: np.ndarray, root: int) -> None:
    """Binomial-tree broadcast of ``buf`` (uint8, filled on the root)."""
    rt, n = ts.rt, ts.n
    tag = ts.next_tag()
    if n == 1 or not buf.nbytes:
        return
    parent, children = binomial_tree(ts.me, n, root)
    if parent is not None:
        rt.wait_requests([_recv(rt, ts.pes[parent], buf, tag)], "broadcast")
    rt.wait_requests([_send(rt, ts.pes[child], buf, tag) for child in children], "broadcast")


def ring_allgather(ts, buf: np.ndarray, offsets) -> None:
    """Ring allgather: block i is ``buf[offsets[i]:offsets[i+1]]``, this PE's
    block already in place."""
    rt, n, me = ts.rt, ts.n, ts.me
    tag = ts.next_tag()
    if n == 1:
        return
    right, left = ts.pes[(me + 1) % n], ts.pes[(me - 1) % n]
    for step in range(n - 1):
        si, ri = (me - step) % n, (me - step - 1) % n
        rq = _recv(rt, left, buf[offsets[ri]:offsets[ri + 1]], tag | (step + 1))
        sq = _send(rt, right, buf[offsets[si]:offsets[si + 1]], tag | (step + 1))
        rt.wait_requests([rq, sq], "collect")


def alltoall_local(ts, send: np.ndarray, recv: np.ndarray, block: int) -> None:
    """Block j of ``send`` goes to team PE j, block i of ``recv`` comes from PE i."""
    rt, n, me = ts.rt, ts.n, ts.me
    tag = ts.next_tag()
    recv[me * block:(me + 1) * block] = send[me * block:(me + 1) * block]
    if n == 1 or not block:
        return
    reqs = [_recv(rt, ts.pes[(me - s) % n], recv[((me - s) % n) * block:][:block], tag)
            for s in range(1, n)]
    reqs += [_send(rt, ts.pes[(me + s) % n], send[((me + s) % n) * block:][:block], tag)
             for s in range(1, n)]
    rt.wait_requests(reqs, "alltoall")


def allreduce_local(ts, buf: np.ndarray, op) -> None:
    """In-place allreduce of the 1-D array ``buf`` over team ``ts``
    (recursive doubling, see :func:`ucxpy.schedules.recursive_doubling`)."""
    fn = _reduce_fn(op, buf.dtype)
    rt, n, me, pes = ts.rt, ts.n, ts.me, ts.pes
    tag = ts.next_tag()
    if n == 1 or not buf.size:
        return
    plan = recursive_doubling(me, n)
    tmp = np.empty_like(buf)
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":
            rt.wait_requests([_send(rt, pes[peer], buf, tag | 1)], "reduce")
        else:
            rt.wait_requests([_recv(rt, pes[peer], tmp, tag | 1)], "reduce")
            fn(tmp, buf, out=buf)
    for step, peer in enumerate(plan.partners, 2):
        rt.wait_requests([_recv(rt, pes[peer], tmp, tag | step),
                          _send(rt, pes[peer], buf, tag | step)], "reduce")
        if peer < me:
            fn(tmp, buf, out=buf)
        else:
            fn(buf, tmp, out=buf)
    last = 2 + (n.bit_length() - 1)
    if plan.unfold is not None:
        kind, peer = plan.unfold
        if kind == "send":
            rt.wait_requests([_send(rt, pes[peer], buf, tag | last)], "reduce")
        else:
            rt.wait_requests([_recv(rt, pes[peer], buf, tag | last)], "reduce")


def _reduce_fn(op, dtype):
    name = str(op.value if isinstance(op, OP) else op).lower()
    fn = _UFUNC.get(name)
    if fn is None:
        raise ValueError(f"unknown reduction {op!r}; one of {', '.join(_UFUNC)}")
    if name in ("and", "or", "xor") and dtype.kind not in "iu":
        raise DtypeMismatch(f"bitwise reduction {name} needs an integer dtype, not {dtype}")
    if name in ("max", "min") and dtype.kind == "c":
        raise DtypeMismatch(f"{name} reduction is not defined for complex dtype {dtype}")
    if dtype.kind not in "iufc":
        raise DtypeMismatch(f"cannot reduce dtype {dtype}")
    return fn


# -- public collectives -----------------------------------------------------------------
def broadcast(target, source, root: int, size=None, team=None) -> None:
    """Copy ``size`` elements of ``source`` on team PE ``root`` into
    ``target`` on every team PE (the root included)."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "broadcast")
    if not 0 <= root < ts.n:
        raise InvalidPE(f"broadcast root {root} is out of range for a team of {ts.n} PEs")
    if size is None:
        size = min(t.size, s.size)
    elif not 0 <= size <= min(t.size, s.size):
        raise InvalidArray(f"size {size} exceeds the target ({t.size}) or source ({s.size})")
    buf = _u8(t)[:size * t.itemsize]
    if ts.me == root:
        buf[:] = _u8(s)[:buf.size]
    bcast_local(ts, buf, root)


def fcollect(target, source, size=None, team=None) -> None:
    """Concatenate ``size`` elements from every team PE into ``target``, in team order."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "fcollect")
    size = s.size if size is None else size
    if size < 0 or size > s.size or size * ts.n > t.size:
        raise InvalidArray(f"fcollect of {size} elements from {ts.n} PEs does not fit "
                           f"target ({t.size}) / source ({s.size})")
    b = size * t.itemsize
    buf = _u8(t)
    buf[ts.me * b:(ts.me + 1) * b] = _u8(s)[:b]
    ring_allgather(ts, buf, [i * b for i in range(ts.n + 1)])


def collect(target, source, size=None, team=None) -> None:
    """Concatenate a possibly different ``size`` from each team PE into
    ``target``, in team order."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "collect")
    size = s.size if size is None else size
    if not 0 <= size <= s.size:
        raise InvalidArray(f"collect size {size} exceeds the source ({s.size})")
    sizes = np.zeros(ts.n, np.int64)
    sizes[ts.me] = size
    ring_allgather(ts, _u8(sizes), [i * 8 for i in range(ts.n + 1)])
    offs = np.concatenate(([0], np.cumsum(sizes))) * t.itemsize
    if offs[-1] > t.nbytes:
        raise InvalidArray(f"collect of {int(offs[-1])} bytes does not fit target ({t.nbytes})")
    buf = _u8(t)
    buf[offs[ts.me]:offs[ts.me + 1]] = _u8(s)[:size * t.itemsize]
    ring_allgather(ts, buf, [int(o) for o in offs])


def _a2a_size(t, s, size, n, tst=1, sst=1):
    tsize, ssize = -(-t.size // tst), -(-s.size // sst)
    if size is None:
        size, rest = divmod(min(tsize, ssize), n)
        if rest:
            raise InvalidArray(f"alltoall: {min(tsize, ssize)} elements do not split evenly "
                               f"over {n} PEs; pass size=")
    elif size < 0 or size * n > tsize or size * n > ssize:
        raise InvalidArray(f"alltoall of {size} elements per PE over {n} PEs does not fit "
                           f"target ({tsize}) / source ({ssize})")
    return size


def alltoall(target, source, size=None, team=None) -> None:
    """Send block j of ``source`` (``size`` elements) to team PE j; block i of
    ``target`` receives PE i's."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "alltoall")
    size = _a2a_size(t, s, size, ts.n)
    b = size * t.itemsize
    alltoall_local(ts, _u8(s), _u8(t), b)


def alltoalls(target, source, tst: int = 1, sst: int = 1, size=None, team=None) -> None:
    """Strided alltoall: element k for PE j is ``source[(j*size+k)*sst]``,
    stored at ``target[(i*size+k)*tst]`` on PE j for the sender i."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "alltoalls")
    if tst < 1 or sst < 1:
        raise ValueError(f"strides must be >= 1 (tst={tst}, sst={sst})")
    size = _a2a_size(t, s, size, ts.n, tst, sst)
    total = size * ts.n
    send = np.ascontiguousarray(s[::sst][:total])
    recv = np.empty(total, t.dtype)
    alltoall_local(ts, _u8(send), _u8(recv), size * t.itemsize)
    t[::tst][:total] = recv


def reduce(target, source, op=OP_SUM, size=None, team=None) -> None:
    """``target[:size]`` on every team PE = the reduction by ``op`` of every
    team PE's ``source[:size]`` (OP_AND/OR/XOR/MAX/MIN/SUM/PROD)."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "reduce")
    _reduce_fn(op, t.dtype)
    if size is None:
        size = min(t.size, s.size)
    elif not 0 <= size <= min(t.size, s.size):
        raise InvalidArray(f"size {size} exceeds the target ({t.size}) or source ({s.size})")
    buf = s[:size].copy()
    allreduce_local(ts, buf, op)
    t[:size] = buf


def and_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_AND, size, team)


def or_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_OR, size, team)


def xor_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_XOR, size, team)


def max_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_MAX, size, team)


def min_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_MIN, size, team)


def sum_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_SUM, size, team)


def prod_reduce(target, source, size=None, team=None) -> None:
    reduce(target, source, OP_PROD, size, team)
