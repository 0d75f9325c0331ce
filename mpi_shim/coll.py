"""Collective algorithms as generators over ucxpy requests.

Each algorithm posts sends and receives and yields the list of ucxpy
requests it needs before going on; :func:`run` drives it to completion for
a blocking call and :class:`.ops.GenOp` from completion callbacks for a
nonblocking one (so ``Ibarrier`` and friends progress whenever the process
progresses).  Every call takes the communicator's next collective tag base
(kind, context id, 23-bit sequence number); the low 8 bits number rounds.

``c`` is a :class:`.comm.CommImpl`; ranks are ranks of ``c.peers`` (the
group itself for an intracommunicator, the remote group for an
intercommunicator, whose local phases run on ``c.local``).  A communicator
is a team of ucxpy's collective engine (:mod:`ucxpy.coll`), which runs the
buffer algorithms: barrier, broadcast of buffers, the allreduce schedules
on arrays, alltoall of blocks.  What is MPI's stays here: pickled objects,
datatypes (``Msg``), intercommunicators, user operations through codecs.

Intracommunicator algorithms: dissemination barrier; binomial-tree
broadcast and reduce (rooted at rank 0 then forwarded for non-commutative
operations); recursive-doubling allreduce (non-power-of-two sizes fold into
a neighbour) and scan/exscan; ring allgather; gather, scatter and alltoall
post every message at once.  Intercommunicator forms go through the two
groups' leaders (barrier, bcast, reductions) or post every message between
the groups directly (gather, scatter, allgather, alltoall).
"""
from __future__ import annotations

import pickle

import numpy as np

from ucxpy import coll as engine

from .datatype import Msg, sub
from .exceptions import ERR_ROOT, ERR_TRUNCATE, Exception

ROOT, PROC_NULL = -3, -2
_EMPTY = b""


# -- one round's messages: the engine's (a communicator is a team; its check()
#    raises ERR_REVOKED, so a revoke between two rounds does not wait for the next)
_snd, _rcv, _rcv_any = engine.post_send, engine.post_recv, engine.post_recv_any
_dumps = engine._dumps


def _revoked():
    from .exceptions import ERR_REVOKED
    return Exception(ERR_REVOKED, "the communicator was revoked")


def check_root(c, root):
    if not (0 <= root < c.size):
        raise Exception(ERR_ROOT, f"invalid root {root}")


def check_inter_root(c, root):
    if root not in (ROOT, PROC_NULL) and not (0 <= root < len(c.remote)):
        raise Exception(ERR_ROOT, f"invalid root {root}")


def run(gen):
    """Run a collective generator to completion, blocking."""
    from .ops import run as _run
    return _run(gen)


def g_alltoall_obj(c, objs):
    """The engine's :func:`ucxpy.coll.alltoall_obj`; an intercommunicator's
    members send to every remote member and receive from each."""
    if c.remote is None:
        return (yield from engine.alltoall_obj(c, objs))
    tag, n = c.coll_tag(), len(c.peers)
    objs = engine.seq_of(objs, n, "alltoall")
    reqs = [_rcv_any(c, i, tag) for i in range(n)]
    sends = [_snd(c, i, _dumps(objs[i]), tag) for i in range(n)]
    yield reqs + sends
    return [pickle.loads(r.buf) for r in reqs]


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
        tag = c.coll_tag()
        dsts = [_Dst(p) for p in rparts]
        reqs = [_rcv(c, i, d.buf, tag) for i, d in enumerate(dsts)]
        reqs += [_snd(c, i, sparts[i].pack(), tag) for i in range(n)]
        yield reqs
    for d in dsts:
        if d is not None:
            d.done()


# -- intercommunicator generators -----------------------------------------------
def leader_swap(c, obj):
    """Every member gets the remote leader's ``obj`` (leaders exchange, then
    broadcast in their group)."""
    tag = c.coll_tag()
    out = None
    if c.rank == 0:
        r = _rcv_any(c, 0, tag)
        yield [_snd(c, 0, _dumps(obj), tag), r]
        out = pickle.loads(r.buf)
    return (yield from engine.bcast_obj(c.local, out, 0))


def g_inter_barrier(c):
    tag = c.coll_tag()
    yield from engine.barrier(c.local)
    if c.rank == 0:
        r = _rcv(c, 0, bytearray(0), tag)
        yield [_snd(c, 0, b"", tag), r]
    yield from engine.bcast(c.local, bytearray(0), 0)


def g_inter_bcast(c, data, root):
    """``data``: bytes at ROOT, a writable buffer (or None: pickle) at receivers."""
    tag = c.coll_tag()
    if root == ROOT:
        yield [_snd(c, 0, data, tag)]
        return data
    if root == PROC_NULL:
        return None
    if c.rank == 0:
        data = yield from engine.recv_round(c, root, data, tag)
    return (yield from engine.bcast(c.local, data, 0))


def g_inter_bcast_obj(c, obj, root):
    if root == ROOT:
        yield from g_inter_bcast(c, _dumps(obj), root)
        return None
    data = yield from g_inter_bcast(c, None, root)
    return None if root == PROC_NULL else pickle.loads(data)


def g_inter_gatherv(c, sm, rm, counts, displs, root):
    tag = c.coll_tag()
    if root == PROC_NULL:
        return
    if root != ROOT:
        yield [_snd(c, root, sm.pack(), tag)]
        return
    dsts, reqs = [], []
    for i in range(len(c.remote)):
        d = _Dst(sub(rm, counts[i], displs[i]))
        dsts.append(d)
        reqs.append(_rcv(c, i, d.buf, tag))
    yield reqs
    for d in dsts:
        d.done()


def g_inter_scatterv(c, sm, counts, displs, rm, root):
    tag = c.coll_tag()
    if root == PROC_NULL:
        return
    if root == ROOT:
        yield [_snd(c, i, sub(sm, counts[i], displs[i]).pack(), tag)
               for i in range(len(c.remote))]
        return
    d = _Dst(rm)
    yield [_rcv(c, root, d.buf, tag)]
    d.done()


def g_inter_allgatherv(c, sm, rm, counts, displs):
    """Each process receives every remote process's block and sends its own."""
    tag = c.coll_tag()
    data = sm.pack()
    dsts, reqs = [], []
    for i in range(len(c.remote)):
        d = _Dst(sub(rm, counts[i], displs[i]))
        dsts.append(d)
        reqs.append(_rcv(c, i, d.buf, tag))
    reqs.extend(_snd(c, i, data, tag) for i in range(len(c.remote)))
    yield reqs
    for d in dsts:
        d.done()


def g_inter_gather_obj(c, obj, root):
    tag = c.coll_tag()
    if root == PROC_NULL:
        return None
    if root != ROOT:
        yield [_snd(c, root, _dumps(obj), tag)]
        return None
    reqs = [_rcv_any(c, i, tag) for i in range(len(c.remote))]
    yield reqs
    return [pickle.loads(r.buf) for r in reqs]


def g_inter_scatter_obj(c, objs, root):
    tag = c.coll_tag()
    if root == PROC_NULL:
        return None
    if root == ROOT:
        objs = engine.seq_of(objs, len(c.remote), "scatter")
        yield [_snd(c, i, _dumps(objs[i]), tag) for i in range(len(c.remote))]
        return None
    r = _rcv_any(c, root, tag)
    yield [r]
    return pickle.loads(r.buf)


def g_inter_allgather_obj(c, obj):
    tag = c.coll_tag()
    data = _dumps(obj)
    reqs = [_rcv_any(c, i, tag) for i in range(len(c.remote))]
    yield reqs + [_snd(c, i, data, tag) for i in range(len(c.remote))]
    return [pickle.loads(r.buf) for r in reqs]


def g_inter_reduce(c, x, op, root, codec):
    """The non-root group reduces to its leader, which sends to the root."""
    tag = c.coll_tag()
    if root == PROC_NULL:
        return None
    if root == ROOT:
        r, buf = codec.recv(c, 0, tag)
        yield [r]
        return codec.dec(r, buf)
    acc = yield from engine.reduce(c.local, x, op, 0, codec)
    if c.rank == 0:
        yield [_snd(c, root, codec.enc(acc), tag)]
    return None


def g_inter_allreduce(c, x, op, codec):
    """Each group reduces to its leader; the leaders swap; each group gets
    the other group's result."""
    tag = c.coll_tag()
    acc = yield from engine.reduce(c.local, x, op, 0, codec)
    res = None
    if c.rank == 0:
        r, buf = codec.recv(c, 0, tag)
        yield [_snd(c, 0, codec.enc(acc), tag), r]
        res = codec.dec(r, buf)
    return (yield from engine.bcast_value(c.local, res, 0, codec))


def g_inter_reduce_scatter(c, x, op, codec, rm, counts):
    """The other group's reduction of ``x``, scattered by ``counts`` (of the
    local group) over the local group; stored into ``rm`` (a Msg)."""
    from .op import store
    tag = c.coll_tag()
    acc = yield from engine.reduce(c.local, x, op, 0, codec)
    total = sum(counts)
    res = None
    if c.rank == 0:
        rc = engine.Codec(codec.dtype, total)
        r, buf = rc.recv(c, 0, tag)
        yield [_snd(c, 0, codec.enc(acc), tag), r]
        res = rc.dec(r, buf)
    loc = c.local
    stag = loc.coll_tag()
    start = sum(counts[:loc.rank])
    mine = counts[loc.rank]
    if loc.rank == 0:
        sends, off = [], 0
        for i, n in enumerate(counts):
            if i:
                sends.append(_snd(loc, i, memoryview(np.ascontiguousarray(res[off:off + n])).cast("B"),
                                  stag))
            off += n
        if sends:
            yield sends
        store(rm, res[:mine])
        return
    buf = bytearray(mine * codec.dtype.itemsize)
    yield [_rcv(loc, 0, buf, stag)]
    store(rm, np.frombuffer(buf, codec.dtype))
    _ = start


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
