"""Collectives on teams: ucxpy's collective engine (:mod:`ucxpy.coll`) on
the team's members (a :class:`.team.TeamState` is an engine team).

Theory of operation
-------------------
Each collective call takes the next tag of its team
(``0x5E << 56 | slot << 48 | sequence << 16``, see TeamState.next_tag); the
low bits number the algorithm's rounds, and receives name their source,
so concurrent collectives on different teams, and successive ones on one
team, never match each other's messages.  Data moves from the sender's local
buffer into the receiver's, so no symmetric scratch space, no entry barrier,
and no pSync arrays are needed; each call returns once this PE's part is
done (its ``target`` complete, its ``source`` reusable).  The engine's
generators post each round; :func:`_run` waits for the round through the
runtime (which reports failed peers) and resumes them.

Members on one host form a shared-memory team (:class:`ucxpy.shmteam.ShmTeam`,
through :func:`ucxpy.coll.form_shm_team`) at their team's second collective,
and from then on broadcast, fcollect, alltoall and reduce go through it up to
the sizes of :func:`ucxpy.schedules.team_max`, as mpi_shim's blocking
collectives do (every choice depends only on what is the same on every
member: the call, the team, the size).

==============  ===================================================  ==========
collective      algorithm (ucxpy.coll)                               rounds
==============  ===================================================  ==========
broadcast       binomial tree from the root                          log2 N
fcollect        ring (each block travels N-1 hops)                   N-1
collect         fcollect of the sizes, then the ring with offsets    N
alltoall(s)     every pair at once (receives posted first)           1
reduce          recursive doubling (the N - 2**k extra PEs fold in   log2 N + 2
                first), Rabenseifner or a ring for large arrays:
                every PE gets the same bits
==============  ===================================================  ==========
"""
from __future__ import annotations

import enum

import numpy as np

from . import runtime
from .errors import DtypeMismatch, InvalidArray, InvalidPE
from .rma import _flat
from .team import run_rounds, team_state
from ucxpy import coll as engine


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


# -- helpers ---------------------------------------------------------------------------
def _u8(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _pair(target, source, what):
    t = _flat(target, True, "target")
    s = _flat(source, False, "source")
    if t.dtype != s.dtype:
        raise DtypeMismatch(f"{what}: target dtype {t.dtype} differs from source dtype {s.dtype}")
    rt = runtime.get()
    rt.heap.offset_of(target, 0)
    rt.heap.offset_of(source, 0)
    return rt, t, s


_run = run_rounds


def _shm(ts, what=None, nbytes: int = 0):
    """``ts``'s shared-memory team when it takes collective ``what`` of
    ``nbytes`` (None: one it never takes).  Every collective calls this, so
    members count the same calls; the team forms at the second (collective;
    None on every member when one cannot join)."""
    t = ts.shm
    if t is None:
        ts.shm_calls += 1
        if ts.shm_calls < 2:
            return None
        t = ts.shm = engine.form_shm_team(ts) or False
    if not t or what is None or nbytes > t.limits[what]:
        return None
    return t


def ring_allgather(ts, buf: np.ndarray, offsets) -> None:
    """Ring allgather: block i is ``buf[offsets[i]:offsets[i+1]]``, this PE's
    block already in place."""
    blocks = [buf[offsets[i]:offsets[i + 1]] for i in range(ts.n)]
    _run(ts, engine.allgather(ts, blocks[ts.me], blocks), "collect")


def allreduce_local(ts, buf: np.ndarray, op) -> None:
    """In-place allreduce of the 1-D array ``buf`` over team ``ts``."""
    _run(ts, engine.allreduce(ts, buf, _reduce_fn(op, buf.dtype), buf), "reduce")


def _reduce_fn(op, dtype):
    """The engine's op for ``op`` on ``dtype``; raises for what cannot be reduced."""
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
    return engine.NumpyOp(name, fn)


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
    team = _shm(ts, "bcast", buf.nbytes)
    if team is not None:
        team.bcast(buf, root)
        return
    _run(ts, engine.bcast(ts, buf, root), "broadcast")


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
    team = _shm(ts, "allgather", b * ts.n)
    if team is not None:
        team.allgather(buf[ts.me * b:(ts.me + 1) * b], buf[:b * ts.n])
        return
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
    _shm(ts)
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


def _alltoall(ts, send, recv, block: int) -> None:
    """Block j of ``send`` goes to team PE j, block i of ``recv`` comes from PE i."""
    team = _shm(ts, "alltoall", block * ts.n)
    if team is not None:
        team.alltoall(send[:block * ts.n], recv[:block * ts.n])
        return
    cut = range(0, ts.n * block, block) if block else [0] * ts.n
    _run(ts, engine.alltoall(ts, [send[o:o + block] for o in cut],
                             [recv[o:o + block] for o in cut]), "alltoall")


def alltoall(target, source, size=None, team=None) -> None:
    """Send block j of ``source`` (``size`` elements) to team PE j; block i of
    ``target`` receives PE i's."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "alltoall")
    size = _a2a_size(t, s, size, ts.n)
    _alltoall(ts, _u8(s), _u8(t), size * t.itemsize)


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
    _alltoall(ts, _u8(send), _u8(recv), size * t.itemsize)
    t[::tst][:total] = recv


def reduce(target, source, op=OP_SUM, size=None, team=None) -> None:
    """``target[:size]`` on every team PE = the reduction by ``op`` of every
    team PE's ``source[:size]`` (OP_AND/OR/XOR/MAX/MIN/SUM/PROD)."""
    ts = team_state(team)
    rt, t, s = _pair(target, source, "reduce")
    fn = _reduce_fn(op, t.dtype)
    if size is None:
        size = min(t.size, s.size)
    elif not 0 <= size <= min(t.size, s.size):
        raise InvalidArray(f"size {size} exceeds the target ({t.size}) or source ({s.size})")
    out = np.empty(size, t.dtype)
    team = _shm(ts, "allreduce", out.nbytes)
    if team is not None:
        team.allreduce(np.ascontiguousarray(s[:size]), out, fn.combine_to)
    else:
        _run(ts, engine.allreduce(ts, s[:size], fn, out), "reduce")
    t[:size] = out


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
