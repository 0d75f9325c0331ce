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
from ucxpy.schedules import allreduce_algorithm, binomial_tree, recursive_doubling

from .datatype import Msg, sub
from .engine import ENGINE, FULL
from .exceptions import ERR_ROOT, ERR_TRUNCATE, Exception

ROOT, PROC_NULL = -3, -2


# -- transport helpers ----------------------------------------------------------
def _revoked():
    from .exceptions import ERR_REVOKED
    return Exception(ERR_REVOKED, "the communicator was revoked")


def _snd(c, dst, data, tag):
    if c.revoked:
        raise _revoked()
    return c.eps[dst].tag_send_nb(data, tag)


def _rcv(c, src, buf, tag):
    if c.revoked:                # a revoke between two rounds: do not wait for the next
        raise _revoked()
    return ENGINE.worker.tag_recv_nb(buf, tag, FULL, c.peers[src])


def _rcv_any(c, src, tag):
    if c.revoked:
        raise _revoked()
    return ENGINE.recv_anysize(c.peers[src], tag)


def _dumps(obj):
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def obj_send_req(wid, tag, obj):
    """Send a pickled object to process ``wid`` (a ucxpy request)."""
    return ENGINE.ep(wid).tag_send_nb(_dumps(obj), tag)


def obj_recv_req(wid, tag):
    """Receive a pickle of any size from ``wid`` (request result: the bytes)."""
    return ENGINE.recv_anysize(wid, tag)


class Codec:
    """How reduction operands travel: numpy arrays of a fixed size, or pickles."""

    __slots__ = ("dtype", "count")

    def __init__(self, dtype=None, count=0):
        self.dtype, self.count = dtype, count

    def enc(self, x):
        return memoryview(np.ascontiguousarray(x)).cast("B") if self.dtype is not None \
            else _dumps(x)

    def recv(self, c, src, tag):
        if self.dtype is None:
            return _rcv_any(c, src, tag), None
        buf = bytearray(self.count * self.dtype.itemsize)
        return _rcv(c, src, buf, tag), buf

    def dec(self, req, buf):
        if self.dtype is None:
            return pickle.loads(req.result)
        return np.frombuffer(buf, self.dtype)


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


# -- blocking small collectives, run directly -------------------------------------
# A blocking collective on small plain buffers runs the same schedule as its
# generator below (same rounds, tags and bytes, so ranks on either path
# interoperate) as straight-line code: each round is one eager send, which the
# shm lane pushes natively, and one blocking receive, which ucxpy's native fast
# path usually takes at once; no generator, request list or completion scan.
# The callers (cco.py) choose this only without tracing, whose spans the
# generators record.

_PLANS = {}


def _plan(kind, *key):
    """A cached schedule (plans are immutable and depend on ranks only)."""
    k = (kind,) + key
    p = _PLANS.get(k)
    if p is None:
        p = _PLANS[k] = (recursive_doubling if kind == "rd" else binomial_tree)(*key)
    return p


def _send_now(c, dst, data, tag):
    """One round's send: None once the transport has the bytes (an eager
    frame), else the request to wait for before ``data`` may change."""
    r = c.eps[dst].tag_send_nb(data, tag)
    return None if r.done and r.exc is None else r


def _wait_now(r) -> None:
    if not r.done:
        ENGINE.wait_until(lambda: r.done)
    if r.exc is not None:
        raise r.exc


def _recv_now(c, src, buf, tag) -> None:
    """One round's blocking receive into ``buf``: ucxpy's native fast path
    first, else a posted receive waited for (polling the fast path)."""
    w = ENGINE.worker
    wid = c.peers[src]
    if w.tag_try_recv(buf, tag, FULL, wid) is None:
        r = w.tag_recv_nb(buf, tag, FULL, wid)
        if not r.done:
            ENGINE.wait_until(lambda: r.done, fast=w.recv_poller(r))
        if r.exc is not None:
            raise r.exc


_EMPTY = bytearray(0)


def barrier_now(c) -> None:
    """:func:`ucxpy.coll.barrier`, blocking."""
    if c.revoked:
        raise _revoked()
    tag, n, rank = c.coll_tag(), c.size, c.rank
    dist, rnd = 1, 0
    while dist < n:
        s = _send_now(c, (rank + dist) % n, b"", tag | rnd)
        _recv_now(c, (rank - dist) % n, _EMPTY, tag | rnd)
        if s is not None:
            _wait_now(s)
        dist, rnd = dist * 2, rnd + 1


def bcast_now(c, data, root) -> None:
    """:func:`g_bcast` of a buffer (the root's bytes, or where the others
    receive them), blocking."""
    if c.revoked:
        raise _revoked()
    tag = c.coll_tag()
    parent, children = _plan("tree", c.rank, c.size, root)
    if parent is not None:
        _recv_now(c, parent, data, tag)
    pending = None
    for child in children:
        s = _send_now(c, child, data, tag)
        if s is not None:
            pending = pending or []
            pending.append(s)
    if pending:
        for s in pending:
            _wait_now(s)


def allreduce_now(c, x, op, out) -> None:
    """:func:`ucxpy.coll.allreduce_rd` of flat numpy ``x`` into ``out``
    (``x`` may be ``out``: IN_PLACE), blocking; the caller checked that
    :func:`allreduce_algorithm` picks recursive doubling for it."""
    if c.revoked:
        raise _revoked()
    tag, rank = c.coll_tag(), c.rank
    plan = _plan("rd", rank, c.size)
    other = np.empty_like(out)
    combine = op.combine_to
    acc = x
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":                # sit out; the result comes back
            s = _send_now(c, peer, acc, tag)
            if s is not None:
                _wait_now(s)              # (out may be x itself)
            _recv_now(c, peer, out, tag | 0xFF)
            return
        _recv_now(c, peer, other, tag)
        combine(other, acc, out)
        acc = out
    for rnd, peer in enumerate(plan.partners, 1):
        s = _send_now(c, peer, acc, tag | rnd)
        _recv_now(c, peer, other, tag | rnd)
        if s is not None:
            _wait_now(s)                  # before out, which it may send, changes
        if peer < rank:
            combine(other, acc, out)
        else:
            combine(acc, other, out)
        acc = out
    if plan.unfold is not None:           # ("send", peer): the result to the folded rank
        s = _send_now(c, plan.unfold[1], acc, tag | 0xFF)
        if s is not None:
            _wait_now(s)
    elif acc is not out:                  # a group of one
        out[...] = acc


def alltoall_now(c, sblocks, rblocks) -> None:
    """:func:`ucxpy.coll.alltoall` on small blocks, blocking: every send first
    (eager frames), then each receive in the generator's order."""
    if c.revoked:
        raise _revoked()
    tag, n, me = c.coll_tag(), c.size, c.rank
    rblocks[me][:] = sblocks[me]
    pending = None
    for k in range(1, n):
        i = (me + k) % n
        s = _send_now(c, i, sblocks[i], tag)
        if s is not None:
            pending = pending or []
            pending.append(s)
    for k in range(1, n):
        i = (me - k) % n
        _recv_now(c, i, rblocks[i], tag)
    if pending:
        for s in pending:
            _wait_now(s)


# -- intracommunicator generators ------------------------------------------------
def g_bcast(c, data, root, tag=None):
    """Binomial tree.  ``data``: writable bytes (buffer: the engine's
    :func:`ucxpy.coll.bcast`) or None (pickle: root passes the bytes,
    others receive any size).  Returns the bytes."""
    if data is not None:
        return (yield from engine.bcast(c, data, root, tag))
    tag = c.coll_tag() if tag is None else tag
    parent, children = binomial_tree(c.rank, c.size, root)
    if parent is not None:
        r = _rcv_any(c, parent, tag)
        yield [r]
        data = r.result
    if children:
        yield [_snd(c, child, data, tag) for child in children]
    return data


def g_bcast_obj(c, obj, root):
    data = yield from g_bcast(c, _dumps(obj) if c.rank == root else None, root)
    return obj if c.rank == root else pickle.loads(data)


def g_bcast_val(c, val, root, codec):
    """Broadcast a reduction value (array of the codec's shape, or any object)."""
    if codec.dtype is None:
        return (yield from g_bcast_obj(c, val, root))
    if c.rank == root:
        yield from g_bcast(c, codec.enc(val), root)
        return val
    buf = bytearray(codec.count * codec.dtype.itemsize)
    yield from g_bcast(c, buf, root)
    return np.frombuffer(buf, codec.dtype)


def _combine(op, codec, left, right):
    return op(left, right) if codec.dtype is None else op.combine(left, right, None)


def g_reduce(c, x, op, root, codec):
    """Binomial-tree reduce; returns the result at root, None elsewhere."""
    tag, n = c.coll_tag(), c.size
    commute = op.Is_commutative() and op.name not in ("REPLACE", "NO_OP")
    tree_root = root if commute else 0
    vr = (c.rank - tree_root) % n
    acc = x
    mask = 1
    while mask < n:
        if vr & mask == 0:
            child = vr | mask
            if child < n:
                r, buf = codec.recv(c, (child + tree_root) % n, tag)
                yield [r]
                acc = _combine(op, codec, acc, codec.dec(r, buf))
        else:
            yield [_snd(c, ((vr & ~mask) + tree_root) % n, codec.enc(acc), tag)]
            acc = None
            break
        mask <<= 1
    if tree_root != root:
        if c.rank == tree_root:
            yield [_snd(c, root, codec.enc(acc), tag | 1)]
            acc = None
        elif c.rank == root:
            r, buf = codec.recv(c, tree_root, tag | 1)
            yield [r]
            acc = codec.dec(r, buf)
    return acc


def _commutes(op) -> bool:
    return op.Is_commutative() and op.name not in ("REPLACE", "NO_OP")


def g_allreduce(c, x, op, codec, out=None):
    """Recursive doubling, or the ring for large arrays and commutative ops
    (:func:`ucxpy.schedules.allreduce_algorithm` decides).  ``out``: where
    the ring may build the result (a flat array like ``x``), else its own."""
    if codec.dtype is not None:
        algo = allreduce_algorithm(x.nbytes, len(x), c.size, _commutes(op))
        if algo == "ring":
            return (yield from engine.allreduce_ring(c, x, op, out))
        if algo == "halving_doubling":
            return (yield from engine.allreduce_hd(c, x, op, out))
    return (yield from g_allreduce_rd(c, x, op, codec, out))


def g_allreduce_rd(c, x, op, codec, out=None):
    """Recursive doubling; ranks beyond the largest power of two fold first.
    With ``out`` (buffer operands), built there in place
    (:func:`ucxpy.coll.allreduce_rd`, the same rounds, tags and operand
    order)."""
    if out is not None and codec.dtype is not None:
        return (yield from engine.allreduce_rd(c, x, op, out))
    tag, rank = c.coll_tag(), c.rank
    plan = recursive_doubling(rank, c.size)
    acc = x
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":
            yield [_snd(c, peer, codec.enc(acc), tag)]
        else:
            r, buf = codec.recv(c, peer, tag)
            yield [r]
            acc = _combine(op, codec, codec.dec(r, buf), acc)
    for rnd, peer in enumerate(plan.partners, 1):
        r, buf = codec.recv(c, peer, tag | rnd)
        yield [_snd(c, peer, codec.enc(acc), tag | rnd), r]
        other = codec.dec(r, buf)
        acc = _combine(op, codec, other, acc) if peer < rank else \
            _combine(op, codec, acc, other)
    if plan.unfold is not None:
        kind, peer = plan.unfold
        if kind == "send":
            yield [_snd(c, peer, codec.enc(acc), tag | 0xFF)]
        else:
            r, buf = codec.recv(c, peer, tag | 0xFF)
            yield [r]
            acc = codec.dec(r, buf)
    return acc


def g_scan(c, x, op, codec, exclusive=False):
    """Recursive-doubling (ex)scan; exscan returns None at rank 0."""
    tag, n, rank = c.coll_tag(), c.size, c.rank
    partial = x
    result = None if exclusive else x
    mask, rnd = 1, 0
    while mask < n:
        dst = rank ^ mask
        if dst < n:
            r, buf = codec.recv(c, dst, tag | rnd)
            yield [_snd(c, dst, codec.enc(partial), tag | rnd), r]
            other = codec.dec(r, buf)
            if rank > dst:
                partial = _combine(op, codec, other, partial)
                result = other if result is None else _combine(op, codec, other, result)
            else:
                partial = _combine(op, codec, partial, other)
        mask, rnd = mask * 2, rnd + 1
    return result


def g_gather_obj(c, obj, root):
    tag = c.coll_tag()
    if c.rank != root:
        yield [_snd(c, root, _dumps(obj), tag)]
        return None
    reqs = {i: _rcv_any(c, i, tag) for i in range(c.size) if i != root}
    yield list(reqs.values())
    return [obj if i == root else pickle.loads(reqs[i].result) for i in range(c.size)]


def _seq_of(objs, n, what):
    if objs is None:
        return [None] * n
    objs = list(objs)
    if len(objs) != n:
        raise ValueError(f"{what}: expected a sequence of {n} objects, got {len(objs)}")
    return objs


def g_scatter_obj(c, objs, root):
    tag = c.coll_tag()
    if c.rank == root:
        objs = _seq_of(objs, c.size, "scatter")
        yield [_snd(c, i, _dumps(objs[i]), tag) for i in range(c.size) if i != root]
        return objs[root]
    r = _rcv_any(c, root, tag)
    yield [r]
    return pickle.loads(r.result)


def g_allgather_obj(c, obj):
    """Ring: each step forwards the pickle received in the step before."""
    tag, n, rank = c.coll_tag(), c.size, c.rank
    blocks = [None] * n
    blocks[rank] = _dumps(obj)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        r = _rcv_any(c, left, tag | (s & 0xFF))
        yield [_snd(c, right, blocks[(rank - s) % n], tag | (s & 0xFF)), r]
        blocks[(rank - s - 1) % n] = r.result
    return [obj if i == rank else pickle.loads(b) for i, b in enumerate(blocks)]


def g_alltoall_obj(c, objs):
    tag, n = c.coll_tag(), len(c.peers)
    objs = _seq_of(objs, n, "alltoall")
    inter = c.remote is not None
    me = None if inter else c.rank
    reqs = {i: _rcv_any(c, i, tag) for i in range(n) if i != me}
    sends = [_snd(c, i, _dumps(objs[i]), tag) for i in range(n) if i != me]
    yield list(reqs.values()) + sends
    return [objs[i] if i == me else pickle.loads(reqs[i].result) for i in range(n)]


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
    tag = c.coll_tag()
    if c.rank != root:
        yield [_snd(c, root, sm.pack(), tag)]
        return
    dsts, reqs = [], []
    for i in range(c.size):
        part = sub(rm, counts[i], displs[i])
        if i == root:
            if not inplace:
                _copy(part, sm)
            continue
        d = _Dst(part)
        dsts.append(d)
        reqs.append(_rcv(c, i, d.buf, tag))
    yield reqs
    for d in dsts:
        d.done()


def g_scatterv(c, sm, counts, displs, rm, root, inplace):
    tag = c.coll_tag()
    if c.rank == root:
        sends = []
        for i in range(c.size):
            part = sub(sm, counts[i], displs[i])
            if i == root:
                if not inplace:
                    _copy(rm, part)
            else:
                sends.append(_snd(c, i, part.pack(), tag))
        yield sends
        return
    d = _Dst(rm)
    yield [_rcv(c, root, d.buf, tag)]
    d.done()


def g_allgatherv(c, sm, rm, counts, displs, inplace):
    """Ring allgather on blocks of ``rm``."""
    tag, n, rank = c.coll_tag(), c.size, c.rank
    parts = [sub(rm, counts[i], displs[i]) for i in range(n)]
    if not inplace:
        _copy(parts[rank], sm)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        out = parts[(rank - s) % n].pack()
        d = _Dst(parts[(rank - s - 1) % n])
        yield [_snd(c, right, out, tag | (s & 0xFF)), _rcv(c, left, d.buf, tag | (s & 0xFF))]
        d.done()


def g_alltoallw(c, sparts, rparts):
    """Every rank sends ``sparts[i]`` to peer i and receives ``rparts[i]``
    (peers: the remote group of an intercommunicator)."""
    tag, n = c.coll_tag(), len(c.peers)
    me = None if c.remote is not None else c.rank
    if me is not None:
        _copy(rparts[me], sparts[me])
    dsts, reqs = [], []
    order = range(n) if me is None else [(me - k) % n for k in range(1, n)]
    for i in order:
        d = _Dst(rparts[i])
        dsts.append(d)
        reqs.append(_rcv(c, i, d.buf, tag))
    order = range(n) if me is None else [(me + k) % n for k in range(1, n)]
    for i in order:
        reqs.append(_snd(c, i, sparts[i].pack(), tag))
    yield reqs
    for d in dsts:
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
        out = pickle.loads(r.result)
    return (yield from g_bcast_obj(c.local, out, 0))


def g_inter_barrier(c):
    tag = c.coll_tag()
    yield from engine.barrier(c.local)
    if c.rank == 0:
        r = _rcv(c, 0, bytearray(0), tag)
        yield [_snd(c, 0, b"", tag), r]
    yield from g_bcast(c.local, bytearray(0), 0)


def g_inter_bcast(c, data, root):
    """``data``: bytes at ROOT, a writable buffer (or None: pickle) at receivers."""
    tag = c.coll_tag()
    if root == ROOT:
        yield [_snd(c, 0, data, tag)]
        return data
    if root == PROC_NULL:
        return None
    if c.rank == 0:
        if data is None:
            r = _rcv_any(c, root, tag)
            yield [r]
            data = r.result
        else:
            yield [_rcv(c, root, data, tag)]
    return (yield from g_bcast(c.local, data, 0))


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
    return [pickle.loads(r.result) for r in reqs]


def g_inter_scatter_obj(c, objs, root):
    tag = c.coll_tag()
    if root == PROC_NULL:
        return None
    if root == ROOT:
        objs = _seq_of(objs, len(c.remote), "scatter")
        yield [_snd(c, i, _dumps(objs[i]), tag) for i in range(len(c.remote))]
        return None
    r = _rcv_any(c, root, tag)
    yield [r]
    return pickle.loads(r.result)


def g_inter_allgather_obj(c, obj):
    tag = c.coll_tag()
    data = _dumps(obj)
    reqs = [_rcv_any(c, i, tag) for i in range(len(c.remote))]
    yield reqs + [_snd(c, i, data, tag) for i in range(len(c.remote))]
    return [pickle.loads(r.result) for r in reqs]


def g_inter_reduce(c, x, op, root, codec):
    """The non-root group reduces to its leader, which sends to the root."""
    tag = c.coll_tag()
    if root == PROC_NULL:
        return None
    if root == ROOT:
        r, buf = codec.recv(c, 0, tag)
        yield [r]
        return codec.dec(r, buf)
    acc = yield from g_reduce(c.local, x, op, 0, codec)
    if c.rank == 0:
        yield [_snd(c, root, codec.enc(acc), tag)]
    return None


def g_inter_allreduce(c, x, op, codec):
    """Each group reduces to its leader; the leaders swap; each group gets
    the other group's result."""
    tag = c.coll_tag()
    acc = yield from g_reduce(c.local, x, op, 0, codec)
    res = None
    if c.rank == 0:
        r, buf = codec.recv(c, 0, tag)
        yield [_snd(c, 0, codec.enc(acc), tag), r]
        res = codec.dec(r, buf)
    return (yield from g_bcast_val(c.local, res, 0, codec))


def g_inter_reduce_scatter(c, x, op, codec, rm, counts):
    """The other group's reduction of ``x``, scattered by ``counts`` (of the
    local group) over the local group; stored into ``rm`` (a Msg)."""
    from .op import store
    tag = c.coll_tag()
    acc = yield from g_reduce(c.local, x, op, 0, codec)
    total = sum(counts)
    res = None
    if c.rank == 0:
        rc = Codec(codec.dtype, total)
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
        return int(run(g_allreduce(c, value, _MAX, Codec())))
    return int(run(_g_agree_inter(c, value)))


def _g_agree_inter(c, value):
    local = yield from g_allreduce(c.local, value, _MAX, Codec())
    remote = yield from leader_swap(c, local)
    return max(local, remote)


allreduce_max = agree_max
