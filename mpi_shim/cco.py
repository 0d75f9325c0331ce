"""Collective methods of ``Comm``: blocking, nonblocking (``I*``), persistent
(``*_init``), buffer and pickle forms, on intra- and intercommunicators.

Each operation is written once as a generator method (``_g_<Name>``) over the
algorithms in :mod:`.coll`; the blocking call runs it to completion, the
nonblocking call wraps it in a request that advances from ucxpy completion
callbacks, and the persistent call builds a request whose ``Start`` runs a
fresh generator each time.  Argument errors raise before any message leaves,
the same way on every rank.
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import coll as G
from . import shmcoll as S
from .msgspec import IN_PLACE, Msg, parse, sub
from .msgspec import parse_block, parse_v


def _spec(spec, n, writable, vector):
    """``(Msg, counts, displs)`` of a vector form or of ``n`` equal blocks."""
    return (parse_v if vector else parse_block)(spec, n, writable)
import ucxpy
from ucxpy import coll as engine
from ucxpy.schedules import ALLREDUCE_RING_MIN

from .commlocks import _comm_lock
from .engine import ENGINE
from .exceptions import ERR_ARG, ERR_BUFFER, ERR_COMM, ERR_OP, Exception, translate
from .msgspec import _PLAIN_FORMATS, _PLAIN_TYPES, parse_w
from .op import SUM, Op, store, typed
from .ops import GenOp, run
from .request import Request, make_prequest

ROOT, PROC_NULL = G.ROOT, G.PROC_NULL

#: Alltoall blocks up to this size run straight (sends first, then receives,
#: coll.alltoall_now); larger ones post every receive before sending
_ALLTOALL_NOW_MAX = 8192


def _req(gen):
    return Request._from(GenOp(gen))


def _preq(factory):
    return make_prequest(lambda: GenOp(factory()))


#: numpy element kinds a reduction takes as they are (native byte order):
#: the datatype mpi4py infers from such an array is the element itself
_PLAIN = frozenset("bhilqBHILQfdFD?")


def _plain(a) -> bool:
    return type(a) is np.ndarray and a.dtype.char in _PLAIN and a.dtype.isnative \
        and a.flags.c_contiguous


def _operand(sendbuf, recvbuf):
    """(numpy operand, result Msg or None, codec) of a reduction.

    Plain contiguous numpy arrays of one element type (the common case) skip
    the message parser: the operand is a read-only flat view of the send
    buffer (of ``recvbuf`` with ``IN_PLACE``), no copy, and the "Msg" is
    ``recvbuf`` itself, which :func:`.op.store` and the ring allreduce write
    straight into.  The algorithms never write into their operand."""
    if _plain(recvbuf) and recvbuf.flags.writeable:
        if sendbuf is IN_PLACE:
            return _view(recvbuf), recvbuf, engine.Codec(recvbuf.dtype, recvbuf.size)
        if _plain(sendbuf) and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size:
            return _view(sendbuf), recvbuf, engine.Codec(sendbuf.dtype, sendbuf.size)
    elif recvbuf is None and _plain(sendbuf):
        return _view(sendbuf), None, engine.Codec(sendbuf.dtype, sendbuf.size)
    rm = parse(recvbuf, writable=True) if recvbuf is not None else None
    if sendbuf is IN_PLACE:
        if rm is None:
            raise Exception(ERR_BUFFER, "IN_PLACE needs a receive buffer")
        sm = rm
    else:
        sm = parse(sendbuf)
    if rm is not None and sendbuf is not IN_PLACE:
        _same(sm, rm, sm.count)
    x = np.array(typed(sm), copy=True)
    return x, rm, engine.Codec(x.dtype, len(x))


def _alltoall_parts(c, sendbuf, recvbuf, vector=False):
    """``(send Msg, receive Msg, send parts, receive parts)`` of an
    Alltoall(v), one part per peer (``IN_PLACE`` sends a copy of the receive
    buffer)."""
    n = len(c.peers)
    rm, rc, rd = _spec(recvbuf, n, True, vector)
    if sendbuf is IN_PLACE:
        if c.remote is not None:
            raise Exception(ERR_ARG, "IN_PLACE is not valid on an intercommunicator")
        sm, sc, sd = Msg(memoryview(bytearray(rm.view)), 0, rm.dtype, rm.offset), rc, rd
    else:
        sm, sc, sd = _spec(sendbuf, n, False, vector)
    return (sm, rm, [sub(sm, sc[i], sd[i]) for i in range(n)],
            [sub(rm, rc[i], rd[i]) for i in range(n)])


def _team_reduce(c, x, rm, op, root) -> bool:
    """Allreduce (``root`` None) or Reduce of operand ``x`` into result
    message ``rm`` (None off the root) through ``c``'s shared-memory team
    where it takes the call; False: the caller uses messages."""
    if not S.reduces(op, x) or \
            x.nbytes > S.team_max("allreduce" if root is None else "reduce", c.size):
        return False
    t = S.usable(c)
    if t is None:
        return False
    if rm is None:
        S.run(t.reduce, x, None, op.combine_to, root)
        return True
    out = rm.reshape(-1) if type(rm) is np.ndarray else np.empty_like(x)
    S.run(t.allreduce if root is None else t.reduce, x, out, op.combine_to,
          *(() if root is None else (root,)))
    if type(rm) is not np.ndarray:       # (an array got the result in place)
        store(rm, out)
    return True


def _plain_pair(sendbuf, recvbuf, n):
    """``(send bytes, receive bytes)`` (flat byte memoryviews) of an Alltoall
    on two whole contiguous buffers of one predefined type and count that
    split evenly among ``n`` peers, or None for the general parser."""
    plain = (np.ndarray, bytes, bytearray)
    if type(sendbuf) not in plain or type(recvbuf) not in plain:
        return None
    sm, rm = parse(sendbuf), parse(recvbuf, writable=True)
    if not (sm.whole and rm.whole) or sm.dtype != rm.dtype or sm.count != rm.count \
            or sm.count % n:
        return None
    return sm.view, rm.view


def _plain_blocks(sendbuf, recvbuf, n):
    """:func:`_plain_pair` split into the ``n`` blocks, or None."""
    pair = _plain_pair(sendbuf, recvbuf, n)
    if pair is None:
        return None
    sv, rv = pair
    step = len(sv) // n
    return ([sv[i * step:(i + 1) * step] for i in range(n)],
            [rv[i * step:(i + 1) * step] for i in range(n)])


def _view(a):
    x = a.reshape(-1).view()
    x.flags.writeable = False
    return x


def _same(sm, rm, rcount):
    """Reductions combine like with like: one datatype, matching counts."""
    if sm.dtype != rm.dtype:
        raise ValueError("mismatch in send and receive MPI datatypes")
    if sm.count != rcount:
        raise ValueError(f"mismatch in send count {sm.count} and receive count {rcount}")


def _check_op(op):
    if not isinstance(op, Op):
        raise TypeError(f"expected an Op, got {type(op).__name__}")
    if not op:
        raise Exception(ERR_OP, "invalid operation (OP_NULL)")


class Coll:
    """Collective communication (mixin of ``Comm``)."""

    __slots__ = ()

    # -- barrier ---------------------------------------------------------------
    def _g_Barrier(self):
        c = self._impl()
        return G.g_inter_barrier(c) if c.remote is not None else engine.barrier(c)

    def Barrier(self) -> None:
        """Barrier synchronization."""
        c = self._h
        if c is not None and c.remote is None:
            t = c.shm if c.shm and not c.revoked else S.usable(c)
            if t:
                return S.run(t.barrier)
        if c is not None and c.remote is None and ENGINE.worker.tr is None:
            try:
                engine.barrier_now(c)    # the same rounds, straight (ucxpy.coll)
            except ucxpy.UcxpyError as e:
                raise translate(e) from None
            return
        run(self._g_Barrier())

    def Ibarrier(self):
        """Nonblocking barrier synchronization."""
        return _req(self._g_Barrier())

    def Barrier_init(self, info=None):
        """Persistent barrier."""
        self._impl()
        return _preq(self._g_Barrier)

    def barrier(self) -> None:
        """Barrier synchronization."""
        run(self._g_Barrier())

    def ibarrier(self):
        """Nonblocking barrier synchronization."""
        return _req(self._g_Barrier())

    # -- broadcast -----------------------------------------------------------------
    def _g_Bcast(self, buf, root):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            if root == PROC_NULL:
                return (yield from G.g_inter_bcast(c, None, root))
            m = parse(buf, writable=root != ROOT)
            if root == ROOT:
                return (yield from G.g_inter_bcast(c, m.pack(), root))
            d = G._Dst(m)
            yield from G.g_inter_bcast(c, d.buf, root)
            d.done()
            return
        G.check_root(c, root)
        m = parse(buf, writable=c.rank != root)
        if c.rank == root:
            yield from engine.bcast(c, m.pack(), root)
        else:
            d = G._Dst(m)
            yield from engine.bcast(c, d.buf, root)
            d.done()

    def Bcast(self, buf, root: int = 0) -> None:
        """Broadcast data from one process to all other processes."""
        c = self._h
        t = c.shm if c is not None else None
        if t and type(buf) in _PLAIN_TYPES and type(root) is int and 0 <= root < c.size \
                and not c.revoked and ENGINE.worker.tr is None:
            # a formed team and a whole contiguous buffer of a predefined type
            # (what parse checks): its bytes straight through the slots
            mv = memoryview(buf)
            if mv.c_contiguous and (c.rank == root or not mv.readonly) \
                    and mv.nbytes <= t.limits["bcast"] \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                try:
                    return t.bcast(mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B"),
                                   root)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
        if c is not None and c.remote is None:
            G.check_root(c, root)
            m = parse(buf, writable=c.rank != root)
            t = S.usable(c) if m.nbytes <= S.team_max("bcast", c.size) else None
            if t is not None:
                return S.bcast(t, c, m, root)
        if type(buf) in _PLAIN_TYPES and type(root) is int and c is not None \
                and c.remote is None and 0 <= root < c.size and ENGINE.worker.tr is None:
            # a whole contiguous buffer of a predefined type (what parse checks)
            mv = memoryview(buf)
            if mv.nbytes and mv.c_contiguous and (c.rank == root or not mv.readonly) \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                try:
                    engine.bcast_now(c, mv, root)    # the same tree, straight (ucxpy.coll)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                return
        run(self._g_Bcast(buf, root))

    def Ibcast(self, buf, root: int = 0):
        """Nonblocking broadcast."""
        return _req(self._g_Bcast(buf, root))

    def Bcast_init(self, buf, root: int = 0, info=None):
        """Persistent broadcast."""
        self._impl()
        return _preq(lambda: self._g_Bcast(buf, root))

    def _g_bcast(self, obj, root):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            return (yield from G.g_inter_bcast_obj(c, obj, root))
        G.check_root(c, root)
        return (yield from engine.bcast_obj(c, obj, root))

    def bcast(self, obj, root: int = 0):
        """Broadcast a Python object from one process to all other processes."""
        with _comm_lock(self, "bcast"):
            return run(self._g_bcast(obj, root))

    def ibcast(self, obj, root: int = 0):
        """Nonblocking broadcast of a Python object."""
        return _req(self._g_bcast(obj, root))

    # -- reductions ---------------------------------------------------------------
    def _g_Reduce(self, sendbuf, recvbuf, op, root):
        c = self._impl()
        _check_op(op)
        if c.remote is not None:
            G.check_inter_root(c, root)
            if root == PROC_NULL:
                return (yield from G.g_inter_reduce(c, None, op, root, engine.Codec()))
            if root == ROOT:
                rm = parse(recvbuf, writable=True)
                x = typed(rm)
                res = yield from G.g_inter_reduce(c, None, op, root, engine.Codec(x.dtype, len(x)))
                store(rm, res)
                return
            x, _, codec = _operand(sendbuf, None)
            return (yield from G.g_inter_reduce(c, x, op, root, codec))
        G.check_root(c, root)
        x, rm, codec = _operand(sendbuf, recvbuf if c.rank == root else None)
        res = yield from engine.reduce(c, x, op, root, codec)
        if c.rank == root:
            store(rm, res)

    def Reduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> None:
        """Reduce to root."""
        c = self._h
        if c is not None and c.remote is None and isinstance(op, Op):
            _check_op(op)
            G.check_root(c, root)
            x, rm, _ = _operand(sendbuf, recvbuf if c.rank == root else None)
            if _team_reduce(c, x, rm, op, root):
                return
        run(self._g_Reduce(sendbuf, recvbuf, op, root))

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root: int = 0):
        """Nonblocking reduce to root."""
        return _req(self._g_Reduce(sendbuf, recvbuf, op, root))

    def Reduce_init(self, sendbuf, recvbuf, op=SUM, root: int = 0, info=None):
        """Persistent reduce to root."""
        self._impl()
        return _preq(lambda: self._g_Reduce(sendbuf, recvbuf, op, root))

    def _g_Allreduce(self, sendbuf, recvbuf, op):
        c = self._impl()
        _check_op(op)
        if c.remote is not None:
            if sendbuf is IN_PLACE:
                raise Exception(ERR_ARG, "IN_PLACE is not valid on an intercommunicator")
            x, _, codec = _operand(sendbuf, None)
            rm = parse(recvbuf, writable=True)
            res = yield from G.g_inter_allreduce(c, x, op, codec)
            store(rm, res)
            return
        x, rm, codec = _operand(sendbuf, recvbuf)
        out = rm.reshape(-1) if type(rm) is np.ndarray else None
        res = yield from engine.allreduce(c, x, op, out, codec)
        if res is not out:               # (the ring builds the result in recvbuf)
            store(rm, res)

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """Reduce to all processes."""
        c = self._h
        t = c.shm if c is not None else None
        if t and type(recvbuf) is np.ndarray and type(sendbuf) is np.ndarray \
                and type(op) is Op and not c.revoked and ENGINE.worker.tr is None:
            # a formed team and whole contiguous arrays (what _operand checks)
            h = op._h
            if h is not None and h.predefined and h.commute and _plain(recvbuf) \
                    and _plain(sendbuf) and recvbuf.flags.writeable \
                    and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size \
                    and sendbuf.nbytes <= t.limits["allreduce"]:
                try:
                    return t.allreduce(sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1),
                                       recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1),
                                       h.arr if h.ufunc else op.combine_to)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                except TypeError:
                    raise Exception(ERR_OP, f"{h.name} is not defined for "
                                    f"{sendbuf.dtype}") from None
        if c is not None and c.remote is None and isinstance(op, Op):
            _check_op(op)
            x, rm, _ = _operand(sendbuf, recvbuf)
            if _team_reduce(c, x, rm, op, None):
                return
            if rm is recvbuf and type(op) is Op and ENGINE.worker.tr is None \
                    and x.nbytes < ALLREDUCE_RING_MIN:
                # plain arrays, recursive doubling: the same rounds, straight (coll.py)
                try:
                    engine.allreduce_now(c, x, op, recvbuf.reshape(-1))
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                return
        run(self._g_Allreduce(sendbuf, recvbuf, op))

    def Iallreduce(self, sendbuf, recvbuf, op=SUM):
        """Nonblocking reduce to all processes."""
        return _req(self._g_Allreduce(sendbuf, recvbuf, op))

    def Allreduce_init(self, sendbuf, recvbuf, op=SUM, info=None):
        """Persistent reduce to all processes."""
        self._impl()
        return _preq(lambda: self._g_Allreduce(sendbuf, recvbuf, op))

    def _g_Scan(self, sendbuf, recvbuf, op, exclusive):
        c = self._impl()
        if c.remote is not None:
            raise Exception(ERR_COMM, "scans are not defined on intercommunicators")
        _check_op(op)
        x, rm, codec = _operand(sendbuf, recvbuf)
        res = yield from engine.scan(c, x, op, codec, exclusive)
        if res is not None:
            store(rm, res)

    def Scan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Inclusive scan."""
        run(self._g_Scan(sendbuf, recvbuf, op, False))

    def Iscan(self, sendbuf, recvbuf, op=SUM):
        """Nonblocking inclusive scan."""
        return _req(self._g_Scan(sendbuf, recvbuf, op, False))

    def Scan_init(self, sendbuf, recvbuf, op=SUM, info=None):
        """Persistent inclusive scan."""
        self._impl()
        return _preq(lambda: self._g_Scan(sendbuf, recvbuf, op, False))

    def Exscan(self, sendbuf, recvbuf, op=SUM) -> None:
        """Exclusive scan."""
        run(self._g_Scan(sendbuf, recvbuf, op, True))

    def Iexscan(self, sendbuf, recvbuf, op=SUM):
        """Nonblocking exclusive scan."""
        return _req(self._g_Scan(sendbuf, recvbuf, op, True))

    def Exscan_init(self, sendbuf, recvbuf, op=SUM, info=None):
        """Persistent exclusive scan."""
        self._impl()
        return _preq(lambda: self._g_Scan(sendbuf, recvbuf, op, True))

    def _g_Reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, block):
        c = self._impl()
        _check_op(op)
        rm = parse(recvbuf, writable=True)
        n = c.size
        if block:
            counts = [rm.count // n if sendbuf is IN_PLACE else rm.count] * n
        elif recvcounts is None:
            raise Exception(ERR_ARG, "Reduce_scatter needs recvcounts")
        else:
            counts = [int(x) for x in recvcounts]
            if len(counts) != n:
                raise ValueError(f"recvcounts: expected {n} counts, got {len(counts)}")
        if c.remote is not None:
            if sendbuf is IN_PLACE:
                raise Exception(ERR_ARG, "IN_PLACE is not valid on an intercommunicator")
            full = np.array(typed(parse(sendbuf)), copy=True)
            if block:
                counts = [rm.count] * n
            yield from G.g_inter_reduce_scatter(c, full, op, engine.Codec(full.dtype, len(full)),
                                                rm, counts)
            return
        total = sum(counts)
        if not block and rm.count != counts[c.rank] and sendbuf is not IN_PLACE:
            raise ValueError(f"mismatch in receive count {rm.count} and "
                             f"recvcounts[{c.rank}] = {counts[c.rank]}")
        if sendbuf is IN_PLACE:
            if rm.count < total:
                raise ValueError(f"receive buffer holds {rm.count} elements, fewer than the "
                                 f"{total} the receive counts add up to")
            full = np.array(typed(Msg(rm.view, total, rm.dtype, rm.offset)), copy=True)
        else:
            sm = parse(sendbuf)
            _same(sm, rm, total)
            full = np.array(typed(sm), copy=True)
        codec = engine.Codec(full.dtype, len(full))
        res = yield from engine.allreduce(c, full, op, codec=codec)
        start = sum(counts[:c.rank])
        store(Msg(rm.view, counts[c.rank], rm.dtype, rm.offset),
              res[start:start + counts[c.rank]])

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> None:
        """Reduce-scatter (regular, non-vector version)."""
        run(self._g_Reduce_scatter(sendbuf, _rs_block(self, sendbuf, recvbuf), None, op, True))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        """Nonblocking reduce-scatter (regular, non-vector version)."""
        return _req(self._g_Reduce_scatter(sendbuf, _rs_block(self, sendbuf, recvbuf), None,
                                           op, True))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=SUM, info=None):
        """Persistent reduce-scatter (regular, non-vector version)."""
        rb = _rs_block(self, sendbuf, recvbuf)
        return _preq(lambda: self._g_Reduce_scatter(sendbuf, rb, None, op, True))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> None:
        """Reduce-scatter (vector version)."""
        run(self._g_Reduce_scatter(sendbuf, recvbuf, _rs_counts(self, recvbuf, recvcounts),
                                   op, False))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM):
        """Nonblocking reduce-scatter (vector version)."""
        return _req(self._g_Reduce_scatter(sendbuf, recvbuf,
                                           _rs_counts(self, recvbuf, recvcounts), op, False))

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=SUM, info=None):
        """Persistent reduce-scatter (vector version)."""
        counts = _rs_counts(self, recvbuf, recvcounts)
        return _preq(lambda: self._g_Reduce_scatter(sendbuf, recvbuf, counts, op, False))

    def _g_reduce(self, obj, op, root):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            return (yield from G.g_inter_reduce(c, obj, op, root, engine.Codec()))
        G.check_root(c, root)
        return (yield from engine.reduce(c, obj, op, root, engine.Codec()))

    def reduce(self, sendobj, op=SUM, root: int = 0):
        """Reduce Python objects to root."""
        return run(self._g_reduce(sendobj, op, root))

    def ireduce(self, sendobj, op=SUM, root: int = 0):
        """Nonblocking reduce of Python objects to root."""
        return _req(self._g_reduce(sendobj, op, root))

    def _g_allreduce(self, obj, op):
        c = self._impl()
        if c.remote is not None:
            return G.g_inter_allreduce(c, obj, op, engine.Codec())
        return engine.allreduce(c, obj, op, codec=engine.Codec())

    def allreduce(self, sendobj, op=SUM):
        """Reduce Python objects to all processes."""
        return run(self._g_allreduce(sendobj, op))

    def iallreduce(self, sendobj, op=SUM):
        """Nonblocking reduce of Python objects to all processes."""
        return _req(self._g_allreduce(sendobj, op))

    def _g_scan_obj(self, obj, op, exclusive):
        c = self._impl()
        if c.remote is not None:
            raise Exception(ERR_COMM, "scans are not defined on intercommunicators")
        return engine.scan(c, obj, op, engine.Codec(), exclusive)

    def scan(self, sendobj, op=SUM):
        """Inclusive scan of Python objects."""
        return run(self._g_scan_obj(sendobj, op, False))

    def exscan(self, sendobj, op=SUM):
        """Exclusive scan of Python objects."""
        return run(self._g_scan_obj(sendobj, op, True))

    def iscan(self, sendobj, op=SUM):
        """Nonblocking inclusive scan of Python objects."""
        return _req(self._g_scan_obj(sendobj, op, False))

    def iexscan(self, sendobj, op=SUM):
        """Nonblocking exclusive scan of Python objects."""
        return _req(self._g_scan_obj(sendobj, op, True))

    # -- gather / scatter ---------------------------------------------------------
    def _g_Gatherv(self, sendbuf, recvbuf, root, vector=True):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            if root == ROOT:
                rm, counts, displs = _spec(recvbuf, len(c.remote), True, vector)
                return (yield from G.g_inter_gatherv(c, None, rm, counts, displs, root))
            sm = parse(sendbuf) if root != PROC_NULL else None
            return (yield from G.g_inter_gatherv(c, sm, None, None, None, root))
        G.check_root(c, root)
        if c.rank == root:
            inplace = sendbuf is IN_PLACE or sendbuf is None
            rm, counts, displs = _spec(recvbuf, c.size, True, vector)
            sm = None if inplace else parse(sendbuf)
        else:
            inplace = False
            rm = counts = displs = None
            sm = parse(sendbuf)
        yield from G.g_gatherv(c, sm, rm, counts, displs, root, inplace)

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather data to one process from all other processes."""
        run(self._g_Gatherv(sendbuf, recvbuf, root, False))

    def Igather(self, sendbuf, recvbuf, root: int = 0):
        """Nonblocking gather."""
        return _req(self._g_Gatherv(sendbuf, recvbuf, root, False))

    def Gather_init(self, sendbuf, recvbuf, root: int = 0, info=None):
        """Persistent gather."""
        self._impl()
        return _preq(lambda: self._g_Gatherv(sendbuf, recvbuf, root, False))

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather vector data to one process."""
        run(self._g_Gatherv(sendbuf, recvbuf, root))

    def Igatherv(self, sendbuf, recvbuf, root: int = 0):
        """Nonblocking gather of vector data."""
        return _req(self._g_Gatherv(sendbuf, recvbuf, root))

    def Gatherv_init(self, sendbuf, recvbuf, root: int = 0, info=None):
        """Persistent gather of vector data."""
        self._impl()
        return _preq(lambda: self._g_Gatherv(sendbuf, recvbuf, root))

    def _g_Scatterv(self, sendbuf, recvbuf, root, vector=True):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            if root == ROOT:
                sm, counts, displs = _spec(sendbuf, len(c.remote), False, vector)
                return (yield from G.g_inter_scatterv(c, sm, counts, displs, None, root))
            rm = parse(recvbuf, writable=True) if root != PROC_NULL else None
            return (yield from G.g_inter_scatterv(c, None, None, None, rm, root))
        G.check_root(c, root)
        if c.rank == root:
            inplace = recvbuf is IN_PLACE or recvbuf is None
            sm, counts, displs = _spec(sendbuf, c.size, False, vector)
            rm = None if inplace else parse(recvbuf, writable=True)
        else:
            inplace = False
            sm = counts = displs = None
            rm = parse(recvbuf, writable=True)
        yield from G.g_scatterv(c, sm, counts, displs, rm, root, inplace)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Scatter data from one process to all other processes."""
        run(self._g_Scatterv(sendbuf, recvbuf, root, False))

    def Iscatter(self, sendbuf, recvbuf, root: int = 0):
        """Nonblocking scatter."""
        return _req(self._g_Scatterv(sendbuf, recvbuf, root, False))

    def Scatter_init(self, sendbuf, recvbuf, root: int = 0, info=None):
        """Persistent scatter."""
        self._impl()
        return _preq(lambda: self._g_Scatterv(sendbuf, recvbuf, root, False))

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Scatter vector data from one process to all other processes."""
        run(self._g_Scatterv(sendbuf, recvbuf, root))

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0):
        """Nonblocking scatter of vector data."""
        return _req(self._g_Scatterv(sendbuf, recvbuf, root))

    def Scatterv_init(self, sendbuf, recvbuf, root: int = 0, info=None):
        """Persistent scatter of vector data."""
        self._impl()
        return _preq(lambda: self._g_Scatterv(sendbuf, recvbuf, root))

    def _g_Allgatherv(self, sendbuf, recvbuf, vector=True):
        c = self._impl()
        if c.remote is not None:
            if sendbuf is IN_PLACE:
                raise Exception(ERR_ARG, "IN_PLACE is not valid on an intercommunicator")
            rm, counts, displs = _spec(recvbuf, len(c.remote), True, vector)
            return (yield from G.g_inter_allgatherv(c, parse(sendbuf), rm, counts, displs))
        inplace = sendbuf is IN_PLACE
        rm, counts, displs = _spec(recvbuf, c.size, True, vector)
        sm = None if inplace else parse(sendbuf)
        yield from G.g_allgatherv(c, sm, rm, counts, displs, inplace)

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Gather to all processes."""
        c = self._h
        if c is not None and c.remote is None:
            rm, counts, displs = _spec(recvbuf, c.size, True, False)
            parts = [sub(rm, counts[i], displs[i]) for i in range(c.size)]
            # (None sends nothing, leaving this rank's block as it is: in place)
            sm = None if sendbuf is IN_PLACE or sendbuf is None else parse(sendbuf)
            if parts[c.rank].nbytes * c.size <= S.team_max("allgather", c.size):
                t = S.usable(c)
                if t is not None:
                    return S.allgather(t, sm, parts)
        run(self._g_Allgatherv(sendbuf, recvbuf, False))

    def Iallgather(self, sendbuf, recvbuf):
        """Nonblocking gather to all processes."""
        return _req(self._g_Allgatherv(sendbuf, recvbuf, False))

    def Allgather_init(self, sendbuf, recvbuf, info=None):
        """Persistent gather to all processes."""
        self._impl()
        return _preq(lambda: self._g_Allgatherv(sendbuf, recvbuf, False))

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        """Gather vector data to all processes."""
        run(self._g_Allgatherv(sendbuf, recvbuf))

    def Iallgatherv(self, sendbuf, recvbuf):
        """Nonblocking gather of vector data to all processes."""
        return _req(self._g_Allgatherv(sendbuf, recvbuf))

    def Allgatherv_init(self, sendbuf, recvbuf, info=None):
        """Persistent gather of vector data to all processes."""
        self._impl()
        return _preq(lambda: self._g_Allgatherv(sendbuf, recvbuf))

    def _g_Alltoallv(self, sendbuf, recvbuf, vector=True):
        c = self._impl()
        n = len(c.peers)
        if not vector and c.remote is None:
            blocks = _plain_blocks(sendbuf, recvbuf, n)
            if blocks is not None:
                return (yield from engine.alltoall(c, *blocks))
        _sm, _rm, sparts, rparts = _alltoall_parts(c, sendbuf, recvbuf, vector)
        yield from G.g_alltoallw(c, sparts, rparts)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """All to all scatter/gather."""
        c = self._h
        t = c.shm if c is not None else None
        if t and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray \
                and _plain(sendbuf) and _plain(recvbuf) and recvbuf.flags.writeable \
                and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size \
                and not sendbuf.size % c.size \
                and sendbuf.nbytes <= t.limits["alltoall"] \
                and not c.revoked and ENGINE.worker.tr is None:
            # a formed team and whole arrays (what _plain_pair checks)
            return S.run(t.alltoall, sendbuf.reshape(-1).view(np.uint8),
                         recvbuf.reshape(-1).view(np.uint8))
        if c is not None and c.remote is None:
            pair = _plain_pair(sendbuf, recvbuf, c.size)
            if pair is not None:
                total = len(pair[1])
            else:
                _sm, _rm, sparts, rparts = _alltoall_parts(c, sendbuf, recvbuf)
                total = sum(p.nbytes for p in rparts)
            if total <= S.team_max("alltoall", c.size):
                t = S.usable(c)
                if t is not None:
                    if pair is None:
                        return S.alltoall(t, sparts, rparts)
                    # whole buffers: straight between the user's memory and the slots
                    return S.run(t.alltoall, np.frombuffer(pair[0], np.uint8),
                                 np.frombuffer(pair[1], np.uint8))
            if pair is not None and ENGINE.worker.tr is None \
                    and total // c.size <= _ALLTOALL_NOW_MAX:
                step = total // c.size
                try:                             # the same messages, straight (coll.py)
                    engine.alltoall_now(c, [pair[0][i * step:(i + 1) * step] for i in range(c.size)],
                                   [pair[1][i * step:(i + 1) * step] for i in range(c.size)])
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                return
        run(self._g_Alltoallv(sendbuf, recvbuf, False))

    def Ialltoall(self, sendbuf, recvbuf):
        """Nonblocking all to all scatter/gather."""
        return _req(self._g_Alltoallv(sendbuf, recvbuf, False))

    def Alltoall_init(self, sendbuf, recvbuf, info=None):
        """Persistent all to all scatter/gather."""
        self._impl()
        return _preq(lambda: self._g_Alltoallv(sendbuf, recvbuf, False))

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """All to all scatter/gather of vector data."""
        run(self._g_Alltoallv(sendbuf, recvbuf))

    def Ialltoallv(self, sendbuf, recvbuf):
        """Nonblocking all to all scatter/gather of vector data."""
        return _req(self._g_Alltoallv(sendbuf, recvbuf))

    def Alltoallv_init(self, sendbuf, recvbuf, info=None):
        """Persistent all to all scatter/gather of vector data."""
        self._impl()
        return _preq(lambda: self._g_Alltoallv(sendbuf, recvbuf))

    def _g_Alltoallw(self, sendbuf, recvbuf):
        c = self._impl()
        n = len(c.peers)
        rparts = parse_w(recvbuf, n, True)
        if sendbuf is IN_PLACE:
            if c.remote is not None:
                raise Exception(ERR_ARG, "IN_PLACE is not valid on an intercommunicator")
            sparts = [Msg(memoryview(bytearray(p.view)), p.count, p.dtype, p.offset)
                      for p in rparts]
        else:
            sparts = parse_w(sendbuf, n, False)
        yield from G.g_alltoallw(c, sparts, rparts)

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        """Generalized all-to-all communication (per-peer datatypes)."""
        run(self._g_Alltoallw(sendbuf, recvbuf))

    def Ialltoallw(self, sendbuf, recvbuf):
        """Nonblocking generalized all-to-all communication."""
        return _req(self._g_Alltoallw(sendbuf, recvbuf))

    def Alltoallw_init(self, sendbuf, recvbuf, info=None):
        """Persistent generalized all-to-all communication."""
        self._impl()
        return _preq(lambda: self._g_Alltoallw(sendbuf, recvbuf))

    # -- pickle forms ---------------------------------------------------------------
    def _g_gather(self, obj, root):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            return G.g_inter_gather_obj(c, obj, root)
        G.check_root(c, root)
        return engine.gather_obj(c, obj, root)

    def _g_scatter(self, objs, root):
        c = self._impl()
        if c.remote is not None:
            G.check_inter_root(c, root)
            return G.g_inter_scatter_obj(c, objs, root)
        G.check_root(c, root)
        return engine.scatter_obj(c, objs, root)

    def _g_allgather(self, obj):
        c = self._impl()
        return G.g_inter_allgather_obj(c, obj) if c.remote is not None else \
            engine.allgather_obj(c, obj)

    def _g_alltoall(self, objs):
        return G.g_alltoall_obj(self._impl(), objs)

    def gather(self, sendobj, root: int = 0):
        """Gather Python objects to root."""
        return run(self._g_gather(sendobj, root))

    def scatter(self, sendobj, root: int = 0):
        """Scatter Python objects from root."""
        return run(self._g_scatter(sendobj, root))

    def allgather(self, sendobj):
        """Gather Python objects to all processes."""
        return run(self._g_allgather(sendobj))

    def alltoall(self, sendobj):
        """All to all exchange of Python objects."""
        return run(self._g_alltoall(sendobj))

    def igather(self, sendobj, root: int = 0):
        """Nonblocking gather of Python objects."""
        return _req(self._g_gather(sendobj, root))

    def iscatter(self, sendobj, root: int = 0):
        """Nonblocking scatter of Python objects."""
        return _req(self._g_scatter(sendobj, root))

    def iallgather(self, sendobj):
        """Nonblocking gather of Python objects to all processes."""
        return _req(self._g_allgather(sendobj))

    def ialltoall(self, sendobj):
        """Nonblocking all to all exchange of Python objects."""
        return _req(self._g_alltoall(sendobj))


def _rs_block(comm, sendbuf, recvbuf):
    return recvbuf


def _rs_counts(comm, recvbuf, recvcounts):
    c = comm._impl()
    if recvcounts is None:
        if c.remote is not None:
            raise Exception(ERR_ARG, "Reduce_scatter on an intercommunicator needs recvcounts")
        return comm.allgather(parse(recvbuf).count)
    return list(recvcounts)
