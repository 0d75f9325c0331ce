"""Collectives between two groups (an MPI intercommunicator's), part of the
collective engine (:mod:`ucxpy.coll`).

Theory of operation
-------------------
A *pair* is seen from one member of one group.  It is any object with

* ``local``: a team (:mod:`ucxpy.coll`'s protocol) of this member's own
  group, on which the phases inside a group run;
* ``rank``: this member's rank in its group;
* ``eps`` and ``peers``: the endpoints and worker ids of the *other*
  group's members, by their rank there;
* ``worker``, ``coll_tag()``, ``check()``: as a team's.  Both groups call
  their collectives in the same order, so ``coll_tag()`` agrees across them.

mpi_shim's intercommunicators are pairs as they are; :class:`Pair` is a
plain one.

A rooted collective names its root the way MPI does: :data:`ROOT` at the
root itself, :data:`IDLE` at the other members of the root's group (they
take no part), and the root's rank in the other group at every member of
the receiving group.

Two kinds of algorithm: those that reduce or broadcast inside each group
go through the two groups' leaders (rank 0 of each): barrier, broadcast,
the reductions and :func:`leader_swap`; the data-moving ones post every
message between the groups at once: gather, scatter, allgather and
all-to-all, of buffers and of objects.  Buffers are writable byte buffers
(sends: anything with the buffer protocol); objects travel as pickles and
are received whatever their size.  Like :mod:`ucxpy.coll`'s, every
algorithm is a generator driven by :func:`ucxpy.coll.run` or
:class:`ucxpy.coll.CollRequest`.
"""
from __future__ import annotations

import pickle

from .lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import coll
from .coll import Codec, post_recv, post_recv_any, post_send

__all__ = ["ROOT", "IDLE", "Pair", "leader_swap", "barrier", "bcast", "bcast_obj", "gather",
           "scatter", "allgather", "alltoall", "gather_obj", "scatter_obj", "allgather_obj",
           "alltoall_obj", "reduce", "allreduce", "reduce_scatter"]

#: the root's own ``root``, and that of the other members of its group
ROOT, IDLE = -3, -2


class Pair:
    """A plain pair: this member's own group as a :class:`ucxpy.coll.Team`
    (its members' endpoints ``local_eps``, this member at ``rank``, tags of
    ``local_id``) and the endpoints of the other group's members
    (``remote_eps``).  ``pair_id`` is the same at every member of both
    groups; ``local_id`` is the same within a group and differs between the
    two; all of them differ from those of other teams running collectives
    at the same time (0..0xFFFF, as :class:`ucxpy.coll.Team`'s)."""

    def __init__(self, worker, local_eps, remote_eps, rank: int, pair_id: int, local_id: int):
        self.local = coll.Team(worker, local_eps, rank, local_id)
        tags = coll.Team(worker, remote_eps, 0, pair_id)        # (the pair's tag space)
        self.worker, self.rank = worker, rank
        self.eps, self.peers = tags.eps, tags.peers
        self.coll_tag, self.check = tags.coll_tag, self.local.check
        self.wait_until = worker.wait_until


def leader_swap(p, obj):
    """Every member gets the other group's leader's ``obj`` (the leaders
    exchange, then broadcast in their groups)."""
    tag = p.coll_tag()
    out = None
    if p.rank == 0:
        r = post_recv_any(p, 0, tag)
        yield [post_send(p, 0, coll._dumps(obj), tag), r]
        out = pickle.loads(r.buf)
    return (yield from coll.bcast_obj(p.local, out, 0))


def barrier(p):
    """Each group's barrier, an empty swap of the leaders, each group's
    broadcast of it."""
    tag = p.coll_tag()
    yield from coll.barrier(p.local)
    if p.rank == 0:
        r = post_recv(p, 0, bytearray(0), tag)
        yield [post_send(p, 0, b"", tag), r]
    yield from coll.bcast(p.local, bytearray(0), 0)


def bcast(p, data, root: int):
    """``data``: the bytes at the root; at the receiving group a writable
    buffer, or None (of any size).  The root sends to the other group's
    leader, which broadcasts.  Returns the bytes (None at :data:`IDLE`)."""
    tag = p.coll_tag()
    if root == ROOT:
        yield [post_send(p, 0, data, tag)]
        return data
    if root == IDLE:
        return None
    if p.rank == 0:
        data = yield from coll.recv_round(p, root, data, tag)
    return (yield from coll.bcast(p.local, data, 0))


def bcast_obj(p, obj, root: int):
    """:func:`bcast` of a Python object (None at the root's group)."""
    if root == ROOT:
        yield from bcast(p, coll._dumps(obj), root)
        return None
    data = yield from bcast(p, None, root)
    return None if root == IDLE else pickle.loads(data)


def gather(p, data, parts, root: int):
    """The root receives member ``i``'s bytes into ``parts[i]`` (one per
    member of the other group); every member of that group sends ``data``."""
    tag = p.coll_tag()
    if root == IDLE:
        return
    if root != ROOT:
        yield [post_send(p, root, data, tag)]
        return
    yield [post_recv(p, i, buf, tag) for i, buf in enumerate(parts)]


def scatter(p, parts, buf, root: int):
    """The root sends ``parts[i]`` to member ``i`` of the other group, each
    of which receives into ``buf``."""
    tag = p.coll_tag()
    if root == IDLE:
        return
    if root == ROOT:
        yield [post_send(p, i, part, tag) for i, part in enumerate(parts)]
        return
    yield [post_recv(p, root, buf, tag)]


def allgather(p, data, parts):
    """Every member sends ``data`` to every member of the other group and
    receives member ``i``'s into ``parts[i]``: :func:`alltoall` of one
    buffer."""
    yield from alltoall(p, [data] * len(p.eps), parts)


def alltoall(p, sends, recvs):
    """Member ``i`` of the other group gets ``sends[i]``; its message to
    this member lands in ``recvs[i]``."""
    tag = p.coll_tag()
    reqs = [post_recv(p, i, buf, tag) for i, buf in enumerate(recvs)]
    reqs += [post_send(p, i, data, tag) for i, data in enumerate(sends)]
    yield reqs


def gather_obj(p, obj, root: int):
    """:func:`gather` of objects: the list of the other group's at the root."""
    tag = p.coll_tag()
    if root == IDLE:
        return None
    if root != ROOT:
        yield [post_send(p, root, coll._dumps(obj), tag)]
        return None
    reqs = [post_recv_any(p, i, tag) for i in range(len(p.eps))]
    yield reqs
    return [pickle.loads(r.buf) for r in reqs]


def scatter_obj(p, objs, root: int):
    """:func:`scatter` of objects (one per member of the other group)."""
    tag = p.coll_tag()
    if root == IDLE:
        return None
    if root == ROOT:
        objs = coll.seq_of(objs, len(p.eps), "scatter")
        yield [post_send(p, i, coll._dumps(objs[i]), tag) for i in range(len(p.eps))]
        return None
    r = post_recv_any(p, root, tag)
    yield [r]
    return pickle.loads(r.buf)


def allgather_obj(p, obj):
    """:func:`allgather` of objects: the other group's, in rank order."""
    tag = p.coll_tag()
    data = coll._dumps(obj)
    n = len(p.eps)
    reqs = [post_recv_any(p, i, tag) for i in range(n)]
    yield reqs + [post_send(p, i, data, tag) for i in range(n)]
    return [pickle.loads(r.buf) for r in reqs]


def alltoall_obj(p, objs):
    """:func:`alltoall` of objects (one per member of the other group)."""
    tag, n = p.coll_tag(), len(p.eps)
    objs = coll.seq_of(objs, n, "alltoall")
    reqs = [post_recv_any(p, i, tag) for i in range(n)]
    yield reqs + [post_send(p, i, coll._dumps(objs[i]), tag) for i in range(n)]
    return [pickle.loads(r.buf) for r in reqs]


def reduce(p, x, op, root: int, codec: Codec):
    """The other group's reduction of its ``x`` at the root: that group
    reduces to its leader (:func:`ucxpy.coll.reduce`), which sends it on.
    Returns it at the root (None elsewhere)."""
    tag = p.coll_tag()
    if root == IDLE:
        return None
    if root == ROOT:
        r, buf = codec.recv(p, 0, tag)
        yield [r]
        return codec.dec(r, buf)
    acc = yield from coll.reduce(p.local, x, op, 0, codec)
    if p.rank == 0:
        yield [post_send(p, root, codec.enc(acc), tag)]
    return None


def allreduce(p, x, op, codec: Codec):
    """Every member gets the other group's reduction: each group reduces to
    its leader, the leaders swap, each broadcasts what it got."""
    tag = p.coll_tag()
    acc = yield from coll.reduce(p.local, x, op, 0, codec)
    res = None
    if p.rank == 0:
        r, buf = codec.recv(p, 0, tag)
        yield [post_send(p, 0, codec.enc(acc), tag), r]
        res = codec.dec(r, buf)
    return (yield from coll.bcast_value(p.local, res, 0, codec))


def reduce_scatter(p, x, op, codec: Codec, counts):
    """The other group's reduction of its ``x`` (arrays of ``codec.dtype``),
    scattered over this group by ``counts`` (elements per member, in rank
    order): returns this member's block."""
    tag = p.coll_tag()
    acc = yield from coll.reduce(p.local, x, op, 0, codec)
    res = None
    if p.rank == 0:
        rc = Codec(codec.dtype, sum(counts))
        r, buf = rc.recv(p, 0, tag)
        yield [post_send(p, 0, codec.enc(acc), tag), r]
        res = rc.dec(r, buf)
    loc = p.local
    stag = loc.coll_tag()
    mine = counts[loc.rank]
    if loc.rank == 0:
        sends, off = [], 0
        for i, n in enumerate(counts):
            if i:
                block = np.ascontiguousarray(res[off:off + n])
                sends.append(post_send(loc, i, memoryview(block).cast("B"), stag))
            off += n
        if sends:
            yield sends
        return res[:mine]
    buf = bytearray(mine * np.dtype(codec.dtype).itemsize)
    yield [post_recv(loc, 0, buf, stag)]
    return np.frombuffer(buf, codec.dtype)
