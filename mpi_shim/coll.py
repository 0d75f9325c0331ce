"""Collectives as generators over ucxpy requests.

Each algorithm is a generator that posts sends/receives and yields the list
of ucxpy requests it needs before going on; :func:`.request.run` drives it to
completion for the blocking call and :class:`.request.GenOp` from completion
callbacks for the nonblocking one (so ``Ibarrier`` etc. progress whenever the
process progresses).  Every call takes the communicator's next collective
tag base (kind COLL, context id, 23-bit sequence number); the low 8 bits
number the rounds.

Algorithms: dissemination barrier; binomial-tree bcast and reduce (rooted at
rank 0 then forwarded for non-commutative operations); recursive doubling
allreduce (non-power-of-two ranks fold into a neighbour) and scan/exscan;
ring allgather; gather/scatter/alltoall post every message at once.
"""
from __future__ import annotations

import pickle

import numpy as np

from .datatype import Msg, sub
from .exceptions import ERR_ROOT, ERR_TRUNCATE, Exception
from .request import ENGINE, FULL, run
from ucxpy.schedules import binomial_tree, recursive_doubling


# -- transport helpers ----------------------------------------------------------
def _snd(c, dst, data, tag):
    return c.eps[dst].tag_send_nb(data, tag)


def _rcv(c, src, buf, tag):
    return c.worker.tag_recv_nb(buf, tag, FULL, c.ranks[src])


def _rcv_any(c, src, tag):
    return ENGINE.recv_anysize(c.ranks[src], tag)


class _Codec:
    """How reduction operands travel: numpy arrays of a fixed size, or pickles."""

    def __init__(self, dtype=None, count=0):
        self.dtype, self.count = dtype, count

    def enc(self, x):
        return memoryview(np.ascontiguousarray(x)).cast("B") if self.dtype is not None \
            else pickle.dumps(x, pickle.HIGHEST_PROTOCOL)

    def recv(self, c, src, tag):
        if self.dtype is None:
            return _rcv_any(c, src, tag), None
        buf = bytearray(self.count * self.dtype.itemsize)
        return _rcv(c, src, buf, tag), buf

    def dec(self, req, buf):
        if self.dtype is None:
            return pickle.loads(req.result)
        return np.frombuffer(buf, self.dtype)


def _check_root(c, root):
    if not (0 <= root < c.size):
        raise Exception(ERR_ROOT, f"invalid root {root}")


# -- generators -------------------------------------------------------------------
def g_barrier(c):
    tag, n = c.coll_tag(), c.size
    dist, rnd = 1, 0
    while dist < n:
        r = _rcv(c, (c.rank - dist) % n, bytearray(0), tag | rnd)
        yield [_snd(c, (c.rank + dist) % n, b"", tag | rnd), r]
        dist, rnd = dist * 2, rnd + 1


def g_bcast(c, data, root, tag=None):
    """Binomial tree.  ``data``: writable bytes (buffer) or None (pickle:
    root passes the bytes, others receive any size).  Returns the bytes."""
    tag = c.coll_tag() if tag is None else tag
    parent, children = binomial_tree(c.rank, c.size, root)
    if parent is not None:
        if data is None:
            r = _rcv_any(c, parent, tag)
            yield [r]
            data = r.result
        else:
            yield [_rcv(c, parent, data, tag)]
    if children:
        yield [_snd(c, child, data, tag) for child in children]
    return data


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
                acc = op(acc, codec.dec(r, buf)) if codec.dtype is None else \
                    op.combine(acc, codec.dec(r, buf), None)
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


def _combine(op, codec, left, right):
    return op(left, right) if codec.dtype is None else op.combine(left, right, None)


def g_allreduce(c, x, op, codec):
    """Recursive doubling; ranks beyond the largest power of two fold first."""
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
        yield [_snd(c, root, pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), tag)]
        return None
    reqs = {i: _rcv_any(c, i, tag) for i in range(c.size) if i != root}
    yield list(reqs.values())
    return [obj if i == root else pickle.loads(reqs[i].result) for i in range(c.size)]


def g_scatter_obj(c, objs, root):
    tag = c.coll_tag()
    if c.rank == root:
        if objs is None or len(objs) != c.size:
            raise ValueError(f"scatter needs a sequence of {c.size} objects at the root")
        objs = list(objs)
        yield [_snd(c, i, pickle.dumps(objs[i], pickle.HIGHEST_PROTOCOL), tag)
               for i in range(c.size) if i != root]
        return objs[root]
    r = _rcv_any(c, root, tag)
    yield [r]
    return pickle.loads(r.result)


def g_allgather_obj(c, obj):
    """Ring: each step forwards the pickle received in the step before."""
    tag, n, rank = c.coll_tag(), c.size, c.rank
    blocks = [None] * n
    blocks[rank] = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        r = _rcv_any(c, left, tag | (s & 0xFF))
        yield [_snd(c, right, blocks[(rank - s) % n], tag | (s & 0xFF)), r]
        blocks[(rank - s - 1) % n] = r.result
    return [obj if i == rank else pickle.loads(b) for i, b in enumerate(blocks)]


def g_alltoall_obj(c, objs):
    tag, n = c.coll_tag(), c.size
    if objs is None or len(objs) != n:
        raise ValueError(f"alltoall needs a sequence of {n} objects")
    objs = list(objs)
    reqs = {i: _rcv_any(c, i, tag) for i in range(n) if i != c.rank}
    sends = [_snd(c, i, pickle.dumps(objs[i], pickle.HIGHEST_PROTOCOL), tag)
             for i in range(n) if i != c.rank]
    yield list(reqs.values()) + sends
    return [objs[i] if i == c.rank else pickle.loads(reqs[i].result) for i in range(n)]


# -- buffer block helpers -----------------------------------------------------------
def _src_bytes(m: Msg):
    return m.pack()


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
        yield [_snd(c, root, _src_bytes(sm), tag)]
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
                sends.append(_snd(c, i, _src_bytes(part), tag))
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
    """Every rank sends ``sparts[i]`` to rank i and receives ``rparts[i]``."""
    tag, n, rank = c.coll_tag(), c.size, c.rank
    _copy(rparts[rank], sparts[rank])
    dsts, reqs = [], []
    for k in range(1, n):
        i = (rank - k) % n
        d = _Dst(rparts[i])
        dsts.append(d)
        reqs.append(_rcv(c, i, d.buf, tag))
    for k in range(1, n):
        i = (rank + k) % n
        reqs.append(_snd(c, i, sparts[i].pack(), tag))
    yield reqs
    for d in dsts:
        d.done()


def allreduce_max(c, value: int) -> int:
    """Blocking max of one int over ``c`` (used to agree on context ids)."""
    return int(run(g_allreduce(c, value, _MAX, _Codec())))


class _MaxOp:
    name = "MAX"

    def Is_commutative(self):
        return True

    def __call__(self, x, y):
        return max(x, y)


_MAX = _MaxOp()
