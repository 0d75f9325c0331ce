"""MPI's collective forms over the collective engine.

A communicator is a team of ucxpy's collective engine (:mod:`ucxpy.coll`)
and an intercommunicator a pair of :mod:`ucxpy.intercoll` (``c.local`` its
own group's team, ``c.peers`` the remote group); the engine runs every
algorithm.  What stays here is MPI's: datatype layouts (``Msg``) packed
into and unpacked out of the engine's byte buffers for the v/w forms of
gather, scatter, allgather and alltoall, the checks of roots, and the
agreement on context ids.  :func:`run` drives a generator to completion
for a blocking call and :class:`.ops.GenOp` from completion callbacks for a
nonblocking one.
"""
from __future__ import annotations

from ucxpy import coll as engine
from ucxpy import intercoll as inter

from .msgspec import Msg, sub
from .exceptions import ERR_REVOKED, ERR_ROOT, ERR_TRUNCATE, Exception
from .op import store
from .ops import run  # (comm, dynproc and intercomm take it from here)

ROOT, PROC_NULL = inter.ROOT, inter.IDLE      # (MPI's values: -3, -2)
_EMPTY = b""


def _revoked():
    return Exception(ERR_REVOKED, "the communicator was revoked")


def check_root(c, root):
    if not (0 <= root < c.size):
        raise Exception(ERR_ROOT, f"invalid root {root}")


def check_inter_root(c, root):
    if root not in (ROOT, PROC_NULL) and not (0 <= root < len(c.remote)):
        raise Exception(ERR_ROOT, f"invalid root {root}")


def g_alltoall_obj(c, objs):
    """The engine's alltoall of objects, within the group or between the two."""
    if c.remote is None:
        return (yield from engine.alltoall_obj(c, objs))
    return (yield from inter.alltoall_obj(c, objs))


# -- buffer block helpers -----------------------------------------------------------
class _Dst:
    """Receive target for a message part (staging when non-contiguous)."""
    __slots__ = ("m", "buf", "staged")

    def __init__(self, m: Msg):
        self.m = m
        c = m.contig()
        self.staged = c is None
        self.buf = bytearray(m.nbytes) if c is None else c

    def done(self):
        if self.staged:
            self.m.unpack(self.buf)


def _copy(dst: Msg, src: Msg):
    d = _Dst(dst)
    data = src.pack()
    if len(data) > len(d.buf):
        raise Exception(ERR_TRUNCATE, "message truncated")
    d.buf[:len(data)] = data
    d.done()


def g_gatherv(c, sm, rm, counts, displs, root, inplace):
    """:func:`ucxpy.coll.gather` of packed parts; the root's own part is
    copied here (or left: ``IN_PLACE``)."""
    if c.rank != root:
        yield from engine.gather(c, sm.pack(), None, root)
        return
    dsts = [None if i == root else _Dst(sub(rm, counts[i], displs[i])) for i in range(c.size)]
    if not inplace:
        _copy(sub(rm, counts[root], displs[root]), sm)
    yield from engine.gather(c, _EMPTY, [_EMPTY if d is None else d.buf for d in dsts], root)
    for d in dsts:
        if d is not None:
            d.done()


def g_scatterv(c, sm, counts, displs, rm, root, inplace):
    """:func:`ucxpy.coll.scatter` of packed parts; the root's own part is
    copied here (or left: ``IN_PLACE``)."""
    if c.rank == root:
        parts = [_EMPTY if i == root else sub(sm, counts[i], displs[i]).pack()
                 for i in range(c.size)]
        if not inplace:
            _copy(rm, sub(sm, counts[root], displs[root]))
        yield from engine.scatter(c, parts, bytearray(0), root)
        return
    d = _Dst(rm)
    yield from engine.scatter(c, None, d.buf, root)
    d.done()


def g_allgatherv(c, sm, rm, counts, displs, inplace):
    """:func:`ucxpy.coll.allgather` (the ring) on the parts of ``rm``."""
    rank = c.rank
    parts = [sub(rm, counts[i], displs[i]) for i in range(c.size)]
    if not inplace:
        _copy(parts[rank], sm)
    dsts = [_Dst(p) for p in parts]
    mine = dsts[rank]
    send = mine.buf if not mine.staged else parts[rank].pack()
    yield from engine.allgather(c, send, [d.buf for d in dsts])
    for i, d in enumerate(dsts):
        if i != rank:
            d.done()


def g_alltoallw(c, sparts, rparts):
    """Every rank sends ``sparts[i]`` to peer i and receives ``rparts[i]``:
    :func:`ucxpy.coll.alltoall` of packed parts, this rank's own part
    copied here; an intercommunicator's members exchange with every remote
    member."""
    n = len(c.peers)
    if c.remote is None:
        me = c.rank
        _copy(rparts[me], sparts[me])
        dsts = [None if i == me else _Dst(rparts[i]) for i in range(n)]
        yield from engine.alltoall(c, [_EMPTY if i == me else sparts[i].pack() for i in range(n)],
                                   [_EMPTY if d is None else d.buf for d in dsts])
    else:
        dsts = [_Dst(p) for p in rparts]
        yield from inter.alltoall(c, [p.pack() for p in sparts], [d.buf for d in dsts])
    for d in dsts:
        if d is not None:
            d.done()


# -- intercommunicators: the engine's collectives between two groups, with MPI's
#    datatypes (ucxpy.intercoll; MPI's ROOT and PROC_NULL are its ROOT and IDLE)
leader_swap, g_inter_barrier = inter.leader_swap, inter.barrier
g_inter_bcast, g_inter_bcast_obj = inter.bcast, inter.bcast_obj
g_inter_gather_obj, g_inter_scatter_obj = inter.gather_obj, inter.scatter_obj
g_inter_allgather_obj, g_inter_reduce, g_inter_allreduce = (
    inter.allgather_obj, inter.reduce, inter.allreduce)


def g_inter_gatherv(c, sm, rm, counts, displs, root):
    if root != ROOT:
        return (yield from inter.gather(c, None if sm is None else sm.pack(), None, root))
    dsts = [_Dst(sub(rm, counts[i], displs[i])) for i in range(len(c.remote))]
    yield from inter.gather(c, None, [d.buf for d in dsts], root)
    for d in dsts:
        d.done()


def g_inter_scatterv(c, sm, counts, displs, rm, root):
    if root == ROOT:
        parts = [sub(sm, counts[i], displs[i]).pack() for i in range(len(c.remote))]
        return (yield from inter.scatter(c, parts, None, root))
    d = None if root == PROC_NULL else _Dst(rm)
    yield from inter.scatter(c, None, None if d is None else d.buf, root)
    if d is not None:
        d.done()


def g_inter_allgatherv(c, sm, rm, counts, displs):
    """Each process receives every remote process's block and sends its own."""
    dsts = [_Dst(sub(rm, counts[i], displs[i])) for i in range(len(c.remote))]
    yield from inter.allgather(c, sm.pack(), [d.buf for d in dsts])
    for d in dsts:
        d.done()


def g_inter_reduce_scatter(c, x, op, codec, rm, counts):
    """The other group's reduction of ``x``, scattered by ``counts`` (of the
    local group) over the local group; stored into ``rm`` (a Msg)."""
    store(rm, (yield from inter.reduce_scatter(c, x, op, codec, counts)))


# -- agreement used by communicator creation -------------------------------------------
class _MaxOp:
    name = "MAX"

    def Is_commutative(self):
        return True

    def __call__(self, x, y):
        return max(x, y)


_MAX = _MaxOp()


def agree_max(c, value: int) -> int:
    """Max of ``value`` over every member of ``c`` (both groups when inter)."""
    if c.remote is None:
        return int(run(engine.allreduce(c, value, _MAX, codec=engine.Codec())))
    return int(run(_g_agree_inter(c, value)))


def _g_agree_inter(c, value):
    local = yield from engine.allreduce(c.local, value, _MAX, codec=engine.Codec())
    remote = yield from leader_swap(c, local)
    return max(local, remote)


allreduce_max = agree_max
