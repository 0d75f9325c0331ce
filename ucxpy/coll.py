"""The collective engine: one set of collective algorithms under every layer
(UCC's place in UCX's world).  mpi_shim, shmem and the torch backend
(:mod:`ucxpy.torch`) all run their buffer collectives here.

Theory of operation
-------------------
A *team* is any object with

* ``rank``, ``size``: this process's index and the team's size;
* ``eps``: the :class:`~ucxpy.endpoint.Endpoint` of every member, by team
  rank (its own included), and ``peers``: their worker ids;
* ``worker``: the :class:`~ucxpy.worker.Worker` they are connected to;
* ``coll_tag()``: the base tag of the team's next collective (every member
  calls its collectives in the same order, so the members agree on it); the
  low 8 bits are left zero, for the rounds of one collective;
* ``check()``: raises if the team may no longer communicate (a revoked MPI
  communicator); called before every round;
* ``wait_until(cond, timeout=None, fast=None, on_events=False)``: how a
  blocking collective waits (the worker's, or a layer's that also lets
  other threads in).

mpi_shim's communicators are teams as they are; :class:`Team` is a plain one
for layers that have none (the torch backend, tests).

An algorithm is a generator: it posts the sends and receives of one round
and yields the list of their requests, and is resumed once all of them
completed (an exception of one of them is thrown into it).  :func:`run`
drives a generator to its end, blocking in ``worker.wait_until``;
:class:`CollRequest` drives it from the requests' completion callbacks, so a
nonblocking collective moves whenever the process progresses.

Data are flat numpy arrays (any dtype numpy has; a layer with other element
types, such as bfloat16, passes a numpy view of the same item size) or
writable byte buffers; the ``*_obj`` collectives move Python objects
(pickles, received whatever their size: :meth:`ucxpy.Worker.tag_recv_any_nb`).
Reductions call ``op.combine_to(a, b, out)``: ``out = a (op) b``
elementwise, ``a`` holding the lower ranks' contributions, so an operation
that does not commute (``op.commutative`` false) still sees rank order where
the algorithm keeps it; reductions of values that may be objects take a
:class:`Codec` and call ``op(a, b)`` on objects.  :data:`NUMPY_OPS` are the
usual ones over numpy.

Blocking collectives of small buffers also have straight-line forms
(``*_now``: the same rounds, tags and bytes as the generators, so members on
either path interoperate): one eager send and one receive per round, which
the native fast paths usually take at once.

The algorithms (their schedules are :mod:`ucxpy.schedules`, pure rank
arithmetic): dissemination barrier; binomial-tree broadcast and reduce;
allreduce by recursive doubling below ``ALLREDUCE_RING_MIN`` bytes, by
Rabenseifner's halving/doubling or a ring above it
(:func:`ucxpy.schedules.allreduce_algorithm`); ring allgather and
reduce-scatter; gather, scatter, all-to-all and the sparse (neighbourhood)
exchanges post every message at once.
Large reductions receive into scratch buffers reused from call to call
(:data:`SCRATCH`).

Members on one host can also form a shared-memory team
(:func:`form_shm_team`, a ``ucxpy.shmteam.ShmTeam``): blocking
collectives through slots every member maps, which the layers choose up to
the sizes of :func:`ucxpy.schedules.team_max`.
"""
from __future__ import annotations

import itertools
import pickle
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .schedules import (allreduce_algorithm, binomial_tree, block_bounds, halving_doubling,
                        recursive_doubling, ring_allreduce)
from .errors import TruncationError
from .tag import ANY_SIZE, FULL_MASK, RESERVED_TAG_BASE, RecvRequest

__all__ = ["Team", "run", "round_error", "CollRequest", "Codec", "post_send", "post_recv",
           "post_recv_any", "recv_round", "NUMPY_OPS", "SCRATCH", "barrier", "bcast",
           "bcast_obj", "bcast_value", "reduce", "allreduce", "allreduce_ring", "allreduce_hd",
           "allreduce_rd", "allreduce_values", "scan", "allgather", "reduce_scatter", "gather",
           "scatter", "alltoall", "alltoallv", "neighbor", "neighbor_obj", "gather_obj",
           "scatter_obj", "allgather_obj", "alltoall_obj", "agree", "form_shm_team",
           "barrier_now", "bcast_now", "allreduce_now", "alltoall_now"]


class Team:
    """A plain team: endpoints to every member and a private tag space.

    ``team_id`` (0..0xFFFF) must be the same at every member and differ
    between teams that run collectives at the same time; the tags are
    ucxpy's reserved ones (:data:`ucxpy.tag.RESERVED_TAG_BASE`), so they
    never meet an application's."""

    def __init__(self, worker, eps, rank: int, team_id: int = 0):
        if not 0 <= team_id <= 0xFFFF:
            raise ValueError(f"team_id {team_id} outside 0..0xFFFF")
        if not 0 <= rank < len(eps):
            raise ValueError(f"rank {rank} outside a team of {len(eps)}")
        self.worker = worker
        self.eps = list(eps)
        self.peers = [ep.remote_id for ep in self.eps]
        self.rank, self.size = rank, len(self.eps)
        self.base = RESERVED_TAG_BASE | (0xFE << 48) | (team_id << 32)
        self.seq = 0
        self.failed: Optional[BaseException] = None
        self.wait_until = worker.wait_until

    def coll_tag(self) -> int:
        """The base tag of the team's next collective: a sequence number in
        the team's tag space, the low 8 bits zero (for the rounds)."""
        self.seq = (self.seq + 1) & 0xFFFFFF
        return self.base | (self.seq << 8)

    def check(self) -> None:
        """Raise ``failed`` once something set it (the team may no longer
        communicate)."""
        if self.failed is not None:
            raise self.failed


# -- drivers --------------------------------------------------------------------------
def run(team, gen, timeout: Optional[float] = None):
    """Run a collective generator to completion, blocking; its result."""
    wait = team.wait_until
    try:
        reqs = gen.send(None)
        while True:
            if not all(r.done for r in reqs):
                wait(lambda: all(r.done for r in reqs), timeout, on_events=True)
            exc = round_error(reqs)
            reqs = gen.throw(exc) if exc is not None else gen.send(None)
    except StopIteration as e:
        return e.value


def round_error(reqs) -> Optional[BaseException]:
    """The error a completed round ends with: its first request's that
    failed, or a :class:`~ucxpy.errors.TruncationError` for a receive that
    got fewer bytes than its buffer holds.  A collective's buffers are
    filled whole (MPI's rule: what each member sends is what its peer
    receives), so a short message means the members called different
    collectives or sizes, and is an error everywhere instead of a result
    with stale bytes in it."""
    for r in reqs:
        if r.exc is not None:
            return r.exc
        if type(r) is RecvRequest and r.capacity != ANY_SIZE and r.result.length != r.capacity:
            return _short(r.result.length, r.capacity, r.result.source)
    return None


def _short(n: int, capacity: int, source) -> TruncationError:
    return TruncationError(f"collective: a message of {n} bytes from worker {source} for a "
                           f"buffer of {capacity} (the members called different collectives "
                           f"or sizes)", n, capacity)


class CollRequest:
    """A nonblocking collective: the generator resumed from completion
    callbacks once all the requests of its round completed.  ``done``,
    ``exc``, ``result`` like a :class:`ucxpy.Request`; ``wait()`` progresses
    the worker until done.  Errors raised before the first message (bad
    arguments) surface at construction.  ``on_start()``, if given, runs once
    the first round is posted, before anything waits (a layer names the
    algorithm then, while the generator shows which one runs)."""

    __slots__ = ("worker", "gen", "done", "exc", "result", "left", "reqs", "callbacks")

    def __init__(self, worker, gen, on_start=None):
        self.worker, self.gen = worker, gen
        self.done, self.exc, self.result = False, None, None
        self.left, self.reqs, self.callbacks = 0, (), []
        try:
            first = gen.send(None)
        except StopIteration as e:
            self._finish(e.value, None)
            return
        if on_start is not None:
            on_start()
        self._step(first)

    def _step(self, reqs=None):
        gen = self.gen
        try:
            if reqs is None:
                exc = round_error(self.reqs)
                reqs = gen.throw(exc) if exc is not None else gen.send(None)
            while True:
                pending = [r for r in reqs if not r.done]
                if pending:
                    self.reqs, self.left = reqs, len(pending)
                    for r in pending:
                        r.add_done_callback(self._one)
                    return
                exc = round_error(reqs)
                reqs = gen.throw(exc) if exc is not None else gen.send(None)
        except StopIteration as e:
            self._finish(e.value, None)
        except BaseException as e:      # reported by wait()
            self._finish(None, e)

    def _one(self, _r):
        self.left -= 1
        if self.left == 0:
            self._step()

    def _finish(self, result, exc):
        self.result, self.exc, self.done = result, exc, True
        self.reqs, self.gen = (), None
        cbs, self.callbacks = self.callbacks, []
        for cb in cbs:
            cb(self)

    def add_done_callback(self, fn) -> None:
        """``fn(self)`` once done (at once if it is)."""
        if self.done:
            fn(self)
        else:
            self.callbacks.append(fn)

    def wait(self, timeout: Optional[float] = None):
        if not self.done:
            self.worker.wait_until(lambda: self.done, timeout, "collective", on_events=True)
        if self.exc is not None:
            raise self.exc
        return self.result


# -- reductions over numpy ---------------------------------------------------------
class NumpyOp:
    """``combine_to(a, b, out)`` by a numpy ufunc (``out`` may be ``a`` or
    ``b``), given as the ufunc or as its name in numpy (looked up on first
    use, so that the table below does not import numpy: ucxpy.lazy)."""

    __slots__ = ("name", "_ufunc", "commutative")

    def __init__(self, name, ufunc, commutative=True):
        self.name, self._ufunc, self.commutative = name, ufunc, commutative

    @property
    def ufunc(self):
        fn = self._ufunc
        if type(fn) is str:
            fn = self._ufunc = getattr(np, fn)
        return fn

    def combine_to(self, a, b, out) -> None:
        self.ufunc(a, b, out=out)

    def __repr__(self):
        return f"NumpyOp({self.name})"


#: The usual reductions over numpy, by name (``sum``, ``prod``, ``min``, ``max``,
#: the bitwise and the logical ones): :class:`NumpyOp` objects for ``op``
NUMPY_OPS = {name: NumpyOp(name, fn) for name, fn in (
    ("sum", "add"), ("prod", "multiply"), ("min", "minimum"), ("max", "maximum"),
    ("band", "bitwise_and"), ("bor", "bitwise_or"), ("bxor", "bitwise_xor"),
    ("land", "logical_and"), ("lor", "logical_or"), ("lxor", "logical_xor"))}


class ScratchPool:
    """Receive buffers of the large reductions, reused from call to call.

    A fresh multi-megabyte numpy array is mapped anew by the allocator and
    page-faults on first touch (about a microsecond per 4 KiB page), which
    costs more than the reduction itself; MPICH keeps its temporaries warm
    the same way.  A buffer goes back to the pool only once no transfer can
    still write into it (a collective that fails keeps its buffer).

    A take gets the smallest kept buffer that fits; the pool keeps the
    largest buffers given back, up to ``KEEP`` of them and ``TOTAL_KEPT``
    bytes, so a program's small collectives never push out the buffer of
    its large ones (a 64 MiB allreduce at 2 ranks after a run of small
    collectives otherwise faulted in a new 32 MiB every call: 3-4 ms of 13),
    and what it holds stays bounded."""

    KEEP = 4                 # buffers kept
    MAX_KEPT = 32 << 20      # larger ones are not kept
    TOTAL_KEPT = 64 << 20    # bytes kept at most

    def __init__(self):
        self.free = []       # largest first

    def take(self, nbytes: int) -> np.ndarray:
        free = self.free
        for i in range(len(free) - 1, -1, -1):      # (the smallest that fits)
            if len(free[i]) >= nbytes:
                return free.pop(i)
        return np.empty(max(nbytes, 1), np.uint8)

    def give(self, buf: np.ndarray) -> None:
        if len(buf) > self.MAX_KEPT:
            return
        free = self.free
        free.append(buf)
        free.sort(key=len, reverse=True)
        total = sum(map(len, free))
        while len(free) > self.KEEP or total > self.TOTAL_KEPT:
            total -= len(free.pop())


#: The receive buffers of the large reductions, reused from call to call
#: (a :class:`ScratchPool`: ``take(nbytes)``, ``give(buf)``)
SCRATCH = ScratchPool()


# -- one round's messages (also for layers composing their own algorithms) ----------
def post_send(t, dst, data, tag):
    """One round's send to member ``dst`` (after ``t.check()``)."""
    t.check()
    return t.eps[dst].tag_send_nb(data, tag)


def post_recv(t, src, buf, tag):
    """One round's receive from member ``src`` into ``buf`` (after ``t.check()``)."""
    t.check()                # (a failed team between two rounds: do not wait for the next)
    return t.worker.tag_recv_nb(buf, tag, FULL_MASK, t.peers[src])


def post_recv_any(t, src, tag):
    """One round's receive of any size from member ``src`` (the bytes: the
    request's ``buf`` once done)."""
    t.check()
    return t.worker.tag_recv_any_nb(tag, FULL_MASK, t.peers[src])


def recv_round(t, src, data, tag):
    """A round of one receive from member ``src``: into ``data``, or (None)
    of any size; returns the bytes."""
    if data is None:
        r = post_recv_any(t, src, tag)
        yield [r]
        return r.buf
    yield [post_recv(t, src, data, tag)]
    return data


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def _bytes(a) -> memoryview:
    return memoryview(a).cast("B")


# -- algorithms ------------------------------------------------------------------------
def barrier(t):
    """Dissemination barrier: ceil(log2 n) rounds of empty messages."""
    tag, n = t.coll_tag(), t.size
    dist, rnd = 1, 0
    while dist < n:
        r = post_recv(t, (t.rank - dist) % n, bytearray(0), tag | rnd)
        yield [post_send(t, (t.rank + dist) % n, b"", tag | rnd), r]
        dist, rnd = dist * 2, rnd + 1


def bcast(t, data, root: int, tag: Optional[int] = None):
    """Binomial tree: ``data`` (writable bytes at every rank but the root)
    becomes the root's; None at the others receives the root's bytes
    whatever their size.  Returns the bytes."""
    tag = t.coll_tag() if tag is None else tag
    parent, children = binomial_tree(t.rank, t.size, root)
    if parent is not None:
        data = yield from recv_round(t, parent, data, tag)
    if children:
        yield [post_send(t, child, data, tag) for child in children]
    return data


class Codec:
    """How reduction operands travel: numpy arrays of a fixed ``dtype`` and
    ``count``, or (``dtype`` None) pickles of any Python values."""

    __slots__ = ("dtype", "count")

    def __init__(self, dtype=None, count=0):
        self.dtype, self.count = dtype, count

    @classmethod
    def of(cls, x) -> "Codec":
        return cls(x.dtype, len(x))

    def enc(self, x):
        return _bytes(np.ascontiguousarray(x)) if self.dtype is not None else _dumps(x)

    def recv(self, t, src, tag):
        if self.dtype is None:
            return post_recv_any(t, src, tag), None
        buf = bytearray(self.count * self.dtype.itemsize)
        return post_recv(t, src, buf, tag), buf

    def dec(self, req, buf):
        if self.dtype is None:
            return pickle.loads(req.buf)
        return np.frombuffer(buf, self.dtype)

    def combine(self, op, left, right):
        """``left (op) right``: ``op(left, right)`` on objects, a new array by
        ``op.combine_to`` on arrays."""
        if self.dtype is None:
            return op(left, right)
        out = np.empty(len(left), self.dtype)
        op.combine_to(left, right, out)
        return out


def reduce(t, x, op, root: int, codec: Optional[Codec] = None, out=None):
    """Binomial-tree reduce; the result at the root (in ``out`` when given),
    None elsewhere.  A non-commutative ``op`` (``op.commutative`` false) is
    reduced in rank order on a tree rooted at rank 0, which forwards the
    result to ``root``.  ``codec``: the operands' form (default: arrays
    like ``x``)."""
    codec = codec or Codec.of(x)
    tag, n = t.coll_tag(), t.size
    tree_root = root if op.commutative else 0
    vr = (t.rank - tree_root) % n
    acc = x
    mask = 1
    while mask < n:
        if vr & mask == 0:
            child = vr | mask
            if child < n:
                r, buf = codec.recv(t, (child + tree_root) % n, tag)
                yield [r]
                acc = codec.combine(op, acc, codec.dec(r, buf))
        else:
            yield [post_send(t, ((vr & ~mask) + tree_root) % n, codec.enc(acc), tag)]
            acc = None
            break
        mask <<= 1
    if tree_root != root:
        if t.rank == tree_root:
            yield [post_send(t, root, codec.enc(acc), tag | 1)]
            acc = None
        elif t.rank == root:
            r, buf = codec.recv(t, tree_root, tag | 1)
            yield [r]
            acc = codec.dec(r, buf)
    if acc is not None and out is not None:
        out[...] = acc
        acc = out
    return acc


def allreduce(t, x, op, out=None, codec: Optional[Codec] = None):
    """Allreduce: for arrays (``codec`` None or of a dtype), recursive
    doubling, or Rabenseifner or the ring for large arrays and commutative
    ops (:func:`ucxpy.schedules.allreduce_algorithm` decides), built in
    ``out`` (which may be ``x``: in place) or a new array; for objects
    (``codec.dtype`` None), recursive doubling of pickles.  Returns the
    result."""
    if codec is not None and codec.dtype is None:
        return (yield from allreduce_values(t, x, op, codec))
    out = out if out is not None else np.empty_like(x)
    algo = allreduce_algorithm(x.nbytes, len(x), t.size, op.commutative)
    if algo == "ring":
        return (yield from allreduce_ring(t, x, op, out))
    if algo == "halving_doubling":
        return (yield from allreduce_hd(t, x, op, out))
    return (yield from allreduce_rd(t, x, op, out))


def allreduce_values(t, x, op, codec: Codec):
    """Recursive doubling of values in ``codec``'s form (objects, or arrays
    combined into new ones); ranks beyond the largest power of two fold
    first.  The same rounds, tags and operand order as :func:`allreduce_rd`."""
    tag, rank = t.coll_tag(), t.rank
    plan = recursive_doubling(rank, t.size)
    acc = x
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":
            yield [post_send(t, peer, codec.enc(acc), tag)]
        else:
            r, buf = codec.recv(t, peer, tag)
            yield [r]
            acc = codec.combine(op, codec.dec(r, buf), acc)
    for rnd, peer in enumerate(plan.partners, 1):
        r, buf = codec.recv(t, peer, tag | rnd)
        yield [post_send(t, peer, codec.enc(acc), tag | rnd), r]
        other = codec.dec(r, buf)
        acc = codec.combine(op, other, acc) if peer < rank else codec.combine(op, acc, other)
    if plan.unfold is not None:
        kind, peer = plan.unfold
        if kind == "send":
            yield [post_send(t, peer, codec.enc(acc), tag | 0xFF)]
        else:
            r, buf = codec.recv(t, peer, tag | 0xFF)
            yield [r]
            acc = codec.dec(r, buf)
    return acc


def scan(t, x, op, codec: Codec, exclusive: bool = False):
    """Recursive-doubling (ex)scan of values in ``codec``'s form; exscan
    returns None at rank 0."""
    tag, n, rank = t.coll_tag(), t.size, t.rank
    partial = x
    result = None if exclusive else x
    mask, rnd = 1, 0
    while mask < n:
        dst = rank ^ mask
        if dst < n:
            r, buf = codec.recv(t, dst, tag | rnd)
            yield [post_send(t, dst, codec.enc(partial), tag | rnd), r]
            other = codec.dec(r, buf)
            if rank > dst:
                partial = codec.combine(op, other, partial)
                result = other if result is None else codec.combine(op, other, result)
            else:
                partial = codec.combine(op, partial, other)
        mask, rnd = mask * 2, rnd + 1
    return result


def bcast_obj(t, obj, root: int):
    """The root's ``obj`` at every member (its pickle down the tree)."""
    data = yield from bcast(t, _dumps(obj) if t.rank == root else None, root)
    return obj if t.rank == root else pickle.loads(data)


def bcast_value(t, val, root: int, codec: Codec):
    """Broadcast a reduction value (an array of ``codec``'s shape, or any
    object)."""
    if codec.dtype is None:
        return (yield from bcast_obj(t, val, root))
    if t.rank == root:
        yield from bcast(t, codec.enc(val), root)
        return val
    buf = bytearray(codec.count * codec.dtype.itemsize)
    yield from bcast(t, buf, root)
    return np.frombuffer(buf, codec.dtype)


def seq_of(objs, n, what):
    """``objs`` as a list of ``n`` (None: n Nones); ValueError otherwise."""
    if objs is None:
        return [None] * n
    objs = list(objs)
    if len(objs) != n:
        raise ValueError(f"{what}: expected a sequence of {n} objects, got {len(objs)}")
    return objs


def gather_obj(t, obj, root: int):
    """Every member's ``obj``, by rank, at the root (None elsewhere)."""
    tag = t.coll_tag()
    if t.rank != root:
        yield [post_send(t, root, _dumps(obj), tag)]
        return None
    reqs = {i: post_recv_any(t, i, tag) for i in range(t.size) if i != root}
    if reqs:
        yield list(reqs.values())
    return [obj if i == root else pickle.loads(reqs[i].buf) for i in range(t.size)]


def scatter_obj(t, objs, root: int):
    """The root's ``objs[i]`` at member i."""
    tag = t.coll_tag()
    if t.rank == root:
        objs = seq_of(objs, t.size, "scatter")
        sends = [post_send(t, i, _dumps(objs[i]), tag) for i in range(t.size) if i != root]
        if sends:
            yield sends
        return objs[root]
    r = post_recv_any(t, root, tag)
    yield [r]
    return pickle.loads(r.buf)


def alltoall_obj(t, objs):
    """Member i's ``objs[j]`` at member j, as element i."""
    tag, n, me = t.coll_tag(), t.size, t.rank
    objs = seq_of(objs, n, "alltoall")
    reqs = {i: post_recv_any(t, i, tag) for i in range(n) if i != me}
    sends = [post_send(t, i, _dumps(objs[i]), tag) for i in range(n) if i != me]
    if reqs:
        yield list(reqs.values()) + sends
    return [objs[i] if i == me else pickle.loads(reqs[i].buf) for i in range(n)]


def allreduce_ring(t, x, op, out=None):
    """Ring reduce-scatter then ring allgather on ``n`` blocks, built in
    ``out`` (``x`` itself may be ``out``: in place).  No full copy of
    ``x``: the first step sends this rank's own block straight from ``x``,
    each received block is combined with ``x``'s into ``out``, and the
    allgather overwrites the rest."""
    tag, n = t.coll_tag(), t.size
    plan = ring_allreduce(t.rank, n)
    acc = out if out is not None else np.empty_like(x)
    if n == 1:
        return _copied(x, acc)
    bounds = block_bounds(len(acc), n)
    item = acc.dtype.itemsize
    raw = SCRATCH.take(max(hi - lo for lo, hi in bounds) * item)
    k = 0
    for sb, rb in plan.reduce_scatter:
        lo, hi = bounds[rb]
        buf = raw[:(hi - lo) * item]
        r = post_recv(t, plan.left, memoryview(buf), tag | (k & 0xFF))
        slo, shi = bounds[sb]
        src = x if k == 0 else acc
        yield [post_send(t, plan.right, _bytes(src[slo:shi]), tag | (k & 0xFF)), r]
        op.combine_to(buf.view(acc.dtype), x[lo:hi], acc[lo:hi])
        k += 1
    SCRATCH.give(raw)
    for sb, rb in plan.allgather:
        lo, hi = bounds[rb]
        r = post_recv(t, plan.left, _bytes(acc[lo:hi]), tag | (k & 0xFF))
        slo, shi = bounds[sb]
        yield [post_send(t, plan.right, _bytes(acc[slo:shi]), tag | (k & 0xFF)), r]
        k += 1
    return acc


def allreduce_hd(t, x, op, out=None):
    """Rabenseifner (:func:`ucxpy.schedules.halving_doubling`): recursive
    halving reduce-scatter, then recursive doubling allgather, built in
    ``out`` (``x`` may be ``out``: in place).  Like the ring, the first
    round sends straight from ``x``, each received part goes to reused
    scratch and is combined into ``out``, and the allgather receives in
    place; a rank beyond the power of two hands over its vector and gets the
    result back."""
    tag = t.coll_tag()
    plan = halving_doubling(t.rank, t.size)
    acc = out if out is not None else np.empty_like(x)
    if t.size == 1:
        return _copied(x, acc)
    whole = _bytes(acc)
    if plan.fold is not None and plan.fold[0] == "send":
        yield [post_send(t, plan.fold[1], _bytes(x), tag)]
        yield [post_recv(t, plan.fold[1], whole, tag | 0xFF)]
        return acc
    item = acc.dtype.itemsize
    raw = SCRATCH.take(x.nbytes)
    src = x
    if plan.fold is not None:
        buf = raw[:x.nbytes]
        yield [post_recv(t, plan.fold[1], memoryview(buf), tag)]
        op.combine_to(buf.view(acc.dtype), x, acc)
        src = acc
    bounds = block_bounds(len(acc), plan.nblocks)
    rnd = 0
    for peer, send, keep in plan.reduce_scatter:
        rnd += 1
        klo, khi = bounds[keep[0]][0], bounds[keep[1] - 1][1]
        slo, shi = bounds[send[0]][0], bounds[send[1] - 1][1]
        buf = raw[:(khi - klo) * item]
        r = post_recv(t, peer, memoryview(buf), tag | rnd)
        yield [post_send(t, peer, _bytes(src[slo:shi]), tag | rnd), r]
        op.combine_to(buf.view(acc.dtype), src[klo:khi], acc[klo:khi])
        src = acc
    SCRATCH.give(raw)
    for peer, send, recv in plan.allgather:
        rnd += 1
        rlo, rhi = bounds[recv[0]][0], bounds[recv[1] - 1][1]
        slo, shi = bounds[send[0]][0], bounds[send[1] - 1][1]
        r = post_recv(t, peer, whole[rlo * item:rhi * item], tag | rnd)
        yield [post_send(t, peer, whole[slo * item:shi * item], tag | rnd), r]
    if plan.unfold is not None:
        yield [post_send(t, plan.unfold[1], whole, tag | 0xFF)]
    return acc


def allreduce_rd(t, x, op, out):
    """Recursive doubling with the result built in ``out`` (a flat array like
    ``x``; ``x`` may be ``out`` itself): each round receives into one reused
    scratch buffer and combines into ``out`` in place, lower ranks' values
    first, so a medium-sized reduction allocates (and page-faults) nothing
    per round.  Ranks beyond the largest power of two fold into a
    neighbour first and get the result back."""
    tag, rank = t.coll_tag(), t.rank
    plan = recursive_doubling(rank, t.size)
    raw = SCRATCH.take(x.nbytes)
    buf = raw[:x.nbytes]
    other = buf.view(x.dtype)
    acc = x
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":
            yield [post_send(t, peer, _bytes(acc), tag)]
        else:
            yield [post_recv(t, peer, memoryview(buf), tag)]
            op.combine_to(other, acc, out)
            acc = out
    for rnd, peer in enumerate(plan.partners, 1):
        r = post_recv(t, peer, memoryview(buf), tag | rnd)
        yield [post_send(t, peer, _bytes(acc), tag | rnd), r]
        if peer < rank:
            op.combine_to(other, acc, out)
        else:
            op.combine_to(acc, other, out)
        acc = out
    if plan.unfold is not None:
        kind, peer = plan.unfold
        if kind == "send":
            yield [post_send(t, peer, _bytes(acc), tag | 0xFF)]
        else:
            yield [post_recv(t, peer, _bytes(out), tag | 0xFF)]
            acc = out
    SCRATCH.give(raw)
    if acc is not out:              # (one rank: nothing was combined)
        out[...] = acc
    return out


def allgather(t, send, recv_blocks):
    """Ring allgather: ``recv_blocks[i]`` (writable byte buffers) becomes
    rank i's ``send``; n - 1 rounds, each passing one block to the right."""
    tag, n, rank = t.coll_tag(), t.size, t.rank
    mine = recv_blocks[rank]
    if _bytes(mine).nbytes != _bytes(send).nbytes:
        raise ValueError("allgather: this rank's block and its input differ in size")
    if not _same(mine, send):
        _bytes(mine)[:] = _bytes(send)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        out = recv_blocks[(rank - s) % n]
        into = recv_blocks[(rank - s - 1) % n]
        yield [post_send(t, right, out, tag | (s & 0xFF)), post_recv(t, left, into, tag | (s & 0xFF))]
    return recv_blocks


def reduce_scatter(t, blocks, op, out):
    """Ring reduce-scatter: ``out`` (a flat array) becomes the reduction over
    all ranks of their ``blocks[rank]`` (``blocks``: n flat arrays of
    ``out``'s dtype and length).  n - 1 rounds; each passes a partial sum to
    the right and adds its own block to the one it receives."""
    tag, n, rank = t.coll_tag(), t.size, t.rank
    if n == 1:
        out[...] = blocks[0]
        return out
    raw = SCRATCH.take(out.nbytes * 2)
    acc = [raw[:out.nbytes].view(out.dtype), raw[out.nbytes:2 * out.nbytes].view(out.dtype)]
    right, left = (rank + 1) % n, (rank - 1) % n
    # step s sends the partial sum of block (rank - s - 1) and receives that of
    # block (rank - s - 2); the last received partial is our own block's
    cur = blocks[(rank - 1) % n]
    for s in range(n - 1):
        b = (rank - s - 2) % n
        into = acc[s & 1]
        r = post_recv(t, left, _bytes(into), tag | (s & 0xFF))
        yield [post_send(t, right, _bytes(cur), tag | (s & 0xFF)), r]
        dst = out if s == n - 2 else into
        op.combine_to(into, blocks[b], dst)
        cur = dst
    SCRATCH.give(raw)
    return out


def gather(t, send, recv_blocks, root: int):
    """Every rank's ``send`` into ``recv_blocks[rank]`` at the root (None
    elsewhere); all messages at once."""
    tag = t.coll_tag()
    if t.rank != root:
        yield [post_send(t, root, send, tag)]
        return None
    if not _same(recv_blocks[root], send):
        _bytes(recv_blocks[root])[:] = _bytes(send)
    reqs = [post_recv(t, i, recv_blocks[i], tag) for i in range(t.size) if i != root]
    if reqs:
        yield reqs
    return recv_blocks


def scatter(t, send_blocks, recv, root: int):
    """The root's ``send_blocks[i]`` into rank i's ``recv``; all at once."""
    tag = t.coll_tag()
    if t.rank != root:
        yield [post_recv(t, root, recv, tag)]
        return recv
    if not _same(recv, send_blocks[root]):
        _bytes(recv)[:] = _bytes(send_blocks[root])
    reqs = [post_send(t, i, send_blocks[i], tag) for i in range(t.size) if i != root]
    if reqs:
        yield reqs
    return recv


def alltoall(t, send_blocks, recv_blocks):
    """Rank i's ``send_blocks[j]`` into rank j's ``recv_blocks[i]`` (byte
    buffers of any sizes, empty ones included): every receive posted, then
    every send, nearest peers first."""
    tag, n, me = t.coll_tag(), t.size, t.rank
    if _bytes(recv_blocks[me]).nbytes != _bytes(send_blocks[me]).nbytes:
        raise ValueError("alltoall: this rank's own blocks differ in size")
    if not _same(recv_blocks[me], send_blocks[me]):
        _bytes(recv_blocks[me])[:] = _bytes(send_blocks[me])
    reqs = [post_recv(t, i, recv_blocks[i], tag) for i in [(me - k) % n for k in range(1, n)]]
    reqs += [post_send(t, i, send_blocks[i], tag) for i in [(me + k) % n for k in range(1, n)]]
    if reqs:
        yield reqs
    return recv_blocks


def alltoallv(t, send, send_counts, recv, recv_counts):
    """:func:`alltoall` of contiguous parts: rank i sends ``send`` cut by
    ``send_counts`` (bytes, in rank order), receives into ``recv`` cut by
    ``recv_counts``."""
    sv, rv = _bytes(send), _bytes(recv)
    if sum(send_counts) > sv.nbytes or sum(recv_counts) > rv.nbytes:
        raise ValueError("alltoallv: the counts exceed the buffers")
    so = [0, *itertools.accumulate(send_counts)]
    ro = [0, *itertools.accumulate(recv_counts)]
    return (yield from alltoall(t, [sv[so[i]:so[i + 1]] for i in range(t.size)],
                                [rv[ro[i]:ro[i + 1]] for i in range(t.size)]))


def neighbor(t, ins, outs, sends, recvs, in_rounds=None, out_rounds=None):
    """Sparse exchange (a topology's neighbourhood collective): receive
    from member ``ins[j]`` into ``recvs[j]`` and send ``sends[k]`` to member
    ``outs[k]``, all at once; a None member is no edge.  ``in_rounds`` and
    ``out_rounds`` (default 0) number each edge's message in the tag's low
    bits, so that two edges between the same members stay apart (a send's
    round must be its receiver's)."""
    tag = t.coll_tag()
    reqs = [post_recv(t, src, recvs[j], tag | (in_rounds[j] if in_rounds else 0))
            for j, src in enumerate(ins) if src is not None]
    reqs += [post_send(t, dst, sends[k], tag | (out_rounds[k] if out_rounds else 0))
             for k, dst in enumerate(outs) if dst is not None]
    yield reqs


def neighbor_obj(t, ins, outs, objs, in_rounds=None, out_rounds=None):
    """:func:`neighbor` of Python objects (``objs[k]`` to ``outs[k]``); the
    list of the objects received from ``ins`` (None for no edge)."""
    tag = t.coll_tag()
    recvs = {j: post_recv_any(t, src, tag | (in_rounds[j] if in_rounds else 0))
             for j, src in enumerate(ins) if src is not None}
    sends = [post_send(t, dst, _dumps(objs[k]), tag | (out_rounds[k] if out_rounds else 0))
             for k, dst in enumerate(outs) if dst is not None]
    yield list(recvs.values()) + sends
    return [pickle.loads(recvs[j].buf) if j in recvs else None for j in range(len(ins))]


def allgather_obj(t, obj):
    """Every member's ``obj``, by rank.  Ring: each step forwards the pickle
    received in the step before."""
    tag, n, rank = t.coll_tag(), t.size, t.rank
    blocks = [None] * n
    blocks[rank] = _dumps(obj)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        r = post_recv_any(t, left, tag | (s & 0xFF))
        yield [post_send(t, right, blocks[(rank - s) % n], tag | (s & 0xFF)), r]
        blocks[(rank - s - 1) % n] = r.buf
    return [obj if i == rank else pickle.loads(b) for i, b in enumerate(blocks)]


def form_shm_team(t, wait=None):
    """The team's ``ucxpy.shmteam.ShmTeam`` (collective: every member
    calls it, blocking), or None on every member when one cannot join (not
    one host, no shared-memory transport, ``UCXPY_SHM_COLL=n``)."""
    from .shmteam import ShmTeam    # deferred: shmem never forms one (its start-up, issue 44)
    return ShmTeam.create(t.worker, t.rank, t.eps,
                          lambda obj: run(t, allgather_obj(t, obj)), wait=wait)


# -- blocking small collectives, straight-line ---------------------------------------
# A blocking collective on small plain buffers runs the same schedule as its
# generator above (same rounds, tags and bytes, so ranks on either path
# interoperate) as straight-line code: each round is one eager send, which the
# shm lane pushes natively, and one blocking receive, which ucxpy's native fast
# path usually takes at once; no generator, request list or completion scan.
# The layers choose this only without tracing (mpi_shim's spans are the
# generators').

_PLANS = {}


def _plan(kind, *key):
    """A cached schedule (plans are immutable and depend on ranks only)."""
    k = (kind,) + key
    p = _PLANS.get(k)
    if p is None:
        p = _PLANS[k] = (recursive_doubling if kind == "rd" else binomial_tree)(*key)
    return p


def _send_now(t, dst, data, tag):
    """One round's send: None once the transport has the bytes (an eager
    frame), else the request to wait for before ``data`` may change."""
    r = t.eps[dst].tag_send_nb(data, tag)
    return None if r.done and r.exc is None else r


def _wait_now(t, r) -> None:
    if not r.done:
        t.wait_until(lambda: r.done)
    if r.exc is not None:
        raise r.exc


def _recv_now(t, src, buf, tag) -> None:
    """One round's blocking receive into ``buf``: ucxpy's native fast path
    first, else a posted receive waited for (polling the fast path)."""
    w = t.worker
    wid = t.peers[src]
    info = w.tag_try_recv(buf, tag, FULL_MASK, wid)
    if info is None:
        r = w.tag_recv_nb(buf, tag, FULL_MASK, wid)
        if not r.done:
            t.wait_until(lambda: r.done, fast=w.recv_poller(r))
        if r.exc is not None:
            raise r.exc
        info = r.result
    nb = len(buf) if type(buf) is bytearray or type(buf) is bytes else getattr(buf, "nbytes", None)
    if nb is None:
        nb = len(buf)
    if info.length != nb:
        raise _short(info.length, nb, wid)


_EMPTY = bytearray(0)


def barrier_now(t) -> None:
    """:func:`barrier`, blocking."""
    t.check()
    tag, n, rank = t.coll_tag(), t.size, t.rank
    dist, rnd = 1, 0
    while dist < n:
        s = _send_now(t, (rank + dist) % n, b"", tag | rnd)
        _recv_now(t, (rank - dist) % n, _EMPTY, tag | rnd)
        if s is not None:
            _wait_now(t, s)
        dist, rnd = dist * 2, rnd + 1


def bcast_now(t, data, root) -> None:
    """:func:`bcast` of a buffer (the root's bytes, or where the others
    receive them), blocking."""
    t.check()
    tag = t.coll_tag()
    parent, children = _plan("tree", t.rank, t.size, root)
    if parent is not None:
        _recv_now(t, parent, data, tag)
    pending = None
    for child in children:
        s = _send_now(t, child, data, tag)
        if s is not None:
            pending = pending or []
            pending.append(s)
    if pending:
        for s in pending:
            _wait_now(t, s)


def allreduce_now(t, x, op, out) -> None:
    """:func:`allreduce_rd` of flat numpy ``x`` into ``out``
    (``x`` may be ``out``: IN_PLACE), blocking; the caller checked that
    :func:`~ucxpy.schedules.allreduce_algorithm` picks recursive doubling for it."""
    t.check()
    tag, rank = t.coll_tag(), t.rank
    plan = _plan("rd", rank, t.size)
    other = np.empty_like(out)
    combine = op.combine_to
    acc = x
    if plan.fold is not None:
        kind, peer = plan.fold
        if kind == "send":                # sit out; the result comes back
            s = _send_now(t, peer, acc, tag)
            if s is not None:
                _wait_now(t, s)              # (out may be x itself)
            _recv_now(t, peer, out, tag | 0xFF)
            return
        _recv_now(t, peer, other, tag)
        combine(other, acc, out)
        acc = out
    for rnd, peer in enumerate(plan.partners, 1):
        s = _send_now(t, peer, acc, tag | rnd)
        _recv_now(t, peer, other, tag | rnd)
        if s is not None:
            _wait_now(t, s)                  # before out, which it may send, changes
        if peer < rank:
            combine(other, acc, out)
        else:
            combine(acc, other, out)
        acc = out
    if plan.unfold is not None:           # ("send", peer): the result to the folded rank
        s = _send_now(t, plan.unfold[1], acc, tag | 0xFF)
        if s is not None:
            _wait_now(t, s)
    elif acc is not out:                  # a group of one
        out[...] = acc


def alltoall_now(t, sblocks, rblocks) -> None:
    """:func:`alltoall` on small blocks, blocking: every send first
    (eager frames), then each receive in the generator's order."""
    t.check()
    tag, n, me = t.coll_tag(), t.size, t.rank
    rblocks[me][:] = sblocks[me]
    pending = None
    for k in range(1, n):
        i = (me + k) % n
        s = _send_now(t, i, sblocks[i], tag)
        if s is not None:
            pending = pending or []
            pending.append(s)
    for k in range(1, n):
        i = (me - k) % n
        _recv_now(t, i, rblocks[i], tag)
    if pending:
        for s in pending:
            _wait_now(t, s)


def _copied(x, out):
    """``out`` holding ``x`` (a group of one)."""
    if out is not x:
        out[...] = x
    return out


def _same(a, b) -> bool:
    """Do two buffers start at the same address (in place)?"""
    try:
        return np.frombuffer(a, np.uint8).__array_interface__["data"][0] == \
            np.frombuffer(b, np.uint8).__array_interface__["data"][0]
    except (TypeError, ValueError):
        return False


# -- fault-tolerant agreement ------------------------------------------------------------
def agree(t, value, combine, tag: int, failed=()):
    """Agreement among the members that survive (ULFM's ``MPIX_Comm_agree``):
    every live member gets ``combine`` folded over the live members'
    ``value`` and the set of members known failed (ranks of ``t``).

    The coordinator is the lowest member not known failed.  Each member
    sends it its value and the failures it knows; it combines, then sends
    the result and every failure it learnt back.  A member whose send to or
    receive from the coordinator fails takes the coordinator as failed and
    goes to the next live one, with the same contribution: ``tag`` is one
    per agreement whatever the coordinator (the layer's own sequence, not
    ``coll_tag()``: survivors may have run different numbers of collectives
    before they noticed a failure), so a message that reached a member
    before it became coordinator waits in its unexpected queue.  Works on a
    team whose ``check()`` raises (a revoked communicator): it posts its
    messages directly.  Returns ``(combined value, failed ranks)``."""
    failed = set(failed)
    me, n = t.rank, len(t.eps)
    worker = t.worker
    while True:
        alive = [r for r in range(n) if r not in failed]
        coord = alive[0]
        if me == coord:
            acc = value
            for r in alive[1:]:
                req = worker.tag_recv_any_nb(tag, FULL_MASK, t.peers[r])
                try:
                    yield [req]
                except BaseException:
                    failed.add(r)
                    continue
                if req.exc is not None:
                    failed.add(r)
                    continue
                v, theirs = pickle.loads(req.buf)
                acc = combine(acc, v)
                failed |= set(theirs)
            result = _dumps((acc, sorted(failed)))
            sends = []
            for r in alive[1:]:
                if r not in failed:
                    try:
                        sends.append(t.eps[r].tag_send_nb(result, tag | (1 << 30)))
                    except BaseException:
                        failed.add(r)
            for s in sends:
                try:
                    yield [s]
                except BaseException:
                    pass
            return acc, failed
        try:
            yield [t.eps[coord].tag_send_nb(_dumps((value, sorted(failed))), tag)]
            req = worker.tag_recv_any_nb(tag | (1 << 30), FULL_MASK, t.peers[coord])
            yield [req]
            if req.exc is not None:
                raise req.exc
        except BaseException:
            failed.add(coord)           # the coordinator died: the next live one takes over
            continue
        acc, theirs = pickle.loads(req.buf)
        return acc, set(theirs) | failed
