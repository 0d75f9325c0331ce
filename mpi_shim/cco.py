"""Collective methods of ``Comm`` (blocking, nonblocking, buffer and pickle
forms) on top of the generators in :mod:`.coll`."""
from __future__ import annotations

import numpy as np

from . import coll as G
from .datatype import IN_PLACE, Msg, parse, parse_v, sub
from .exceptions import ERR_ARG, ERR_BUFFER, Exception
from .op import SUM, store, typed
from .request import GenOp, Request, run


def _req(gen):
    return Request._from(GenOp(gen))


def _lock(comm, name):
    locks = comm._impl().locks
    if name not in locks:
        import threading
        locks[name] = threading.Lock()


def _root(c, root):
    G._check_root(c, root)


def _msg_v(spec, size, writable, inplace_ok=False):
    return parse_v(spec, size, writable)


class Coll:
    """Collective communication of an intracommunicator."""

    __slots__ = ()

    # -- barrier / bcast --------------------------------------------------------
    def _g_barrier(self):
        return G.g_barrier(self._impl())

    def Barrier(self):
        run(self._g_barrier())

    def Ibarrier(self):
        return _req(self._g_barrier())

    def barrier(self):
        run(self._g_barrier())

    def ibarrier(self):
        return self.Ibarrier()

    def _g_Bcast(self, buf, root):
        c = self._impl()
        _root(c, root)
        m = parse(buf, writable=c.rank != root)
        d = G._Dst(m)
        if c.rank == root:
            yield from G.g_bcast(c, m.pack(), root)
        else:
            yield from G.g_bcast(c, d.buf, root)
            d.done()

    def Bcast(self, buf, root=0):
        run(self._g_Bcast(buf, root))

    def Ibcast(self, buf, root=0):
        return _req(self._g_Bcast(buf, root))

    def _g_bcast(self, obj, root):
        c = self._impl()
        _root(c, root)
        if c.rank == root:
            yield from G.g_bcast(c, G.pickle.dumps(obj, G.pickle.HIGHEST_PROTOCOL), root)
            return obj
        data = yield from G.g_bcast(c, None, root)
        return G.pickle.loads(data)

    def bcast(self, obj, root=0):
        _lock(self, "bcast")
        return run(self._g_bcast(obj, root))

    def ibcast(self, obj, root=0):
        return _req(self._g_bcast(obj, root))

    # -- reductions ---------------------------------------------------------------
    def _operand(self, sendbuf, recvbuf, use_recv):
        """(numpy operand, result Msg or None, codec)."""
        rm = parse(recvbuf, writable=True) if recvbuf is not None else None
        if sendbuf is IN_PLACE:
            if rm is None:
                raise Exception(ERR_BUFFER, "IN_PLACE needs a receive buffer")
            sm = rm
        else:
            sm = parse(sendbuf)
        x = np.array(typed(sm), copy=True)
        return x, rm, G._Codec(x.dtype, len(x))

    def _g_Reduce(self, sendbuf, recvbuf, op, root):
        c = self._impl()
        _root(c, root)
        x, rm, codec = self._operand(sendbuf, recvbuf if c.rank == root else None, False)
        res = yield from G.g_reduce(c, x, op, root, codec)
        if c.rank == root:
            store(rm, res)

    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0):
        run(self._g_Reduce(sendbuf, recvbuf, op, root))

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root=0):
        return _req(self._g_Reduce(sendbuf, recvbuf, op, root))

    def _g_Allreduce(self, sendbuf, recvbuf, op):
        c = self._impl()
        x, rm, codec = self._operand(sendbuf, recvbuf, True)
        res = yield from G.g_allreduce(c, x, op, codec)
        store(rm, res)

    def Allreduce(self, sendbuf, recvbuf, op=SUM):
        run(self._g_Allreduce(sendbuf, recvbuf, op))

    def Iallreduce(self, sendbuf, recvbuf, op=SUM):
        return _req(self._g_Allreduce(sendbuf, recvbuf, op))

    def _g_Scan(self, sendbuf, recvbuf, op, exclusive):
        c = self._impl()
        x, rm, codec = self._operand(sendbuf, recvbuf, True)
        res = yield from G.g_scan(c, x, op, codec, exclusive)
        if res is not None:
            store(rm, res)

    def Scan(self, sendbuf, recvbuf, op=SUM):
        run(self._g_Scan(sendbuf, recvbuf, op, False))

    def Iscan(self, sendbuf, recvbuf, op=SUM):
        return _req(self._g_Scan(sendbuf, recvbuf, op, False))

    def Exscan(self, sendbuf, recvbuf, op=SUM):
        run(self._g_Scan(sendbuf, recvbuf, op, True))

    def Iexscan(self, sendbuf, recvbuf, op=SUM):
        return _req(self._g_Scan(sendbuf, recvbuf, op, True))

    def _g_Reduce_scatter(self, sendbuf, recvbuf, recvcounts, op):
        c = self._impl()
        rm = parse(recvbuf, writable=True)
        if sendbuf is IN_PLACE:
            full = np.array(typed(Msg(rm.view, sum(recvcounts), rm.dtype, rm.offset)), copy=True)
        else:
            full = np.array(typed(parse(sendbuf)), copy=True)
        codec = G._Codec(full.dtype, len(full))
        res = yield from G.g_allreduce(c, full, op, codec)
        start = sum(recvcounts[:c.rank])
        store(Msg(rm.view, recvcounts[c.rank], rm.dtype, rm.offset),
              res[start:start + recvcounts[c.rank]])

    def _counts_block(self, recvbuf, sendbuf):
        c = self._impl()
        if sendbuf is IN_PLACE:
            rm = parse(recvbuf)
            return [rm.count // c.size] * c.size
        return [parse(recvbuf).count] * c.size

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        run(self._g_Reduce_scatter(sendbuf, recvbuf, self._counts_block(recvbuf, sendbuf), op))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM):
        return _req(self._g_Reduce_scatter(sendbuf, recvbuf,
                                           self._counts_block(recvbuf, sendbuf), op))

    def _rs_counts(self, recvbuf, recvcounts):
        c = self._impl()
        if recvcounts is None:
            return [parse(recvbuf).count] * c.size if False else \
                self.allgather(parse(recvbuf).count)
        return list(recvcounts)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM):
        run(self._g_Reduce_scatter(sendbuf, recvbuf, self._rs_counts(recvbuf, recvcounts), op))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM):
        return _req(self._g_Reduce_scatter(sendbuf, recvbuf,
                                           self._rs_counts(recvbuf, recvcounts), op))

    def _g_reduce(self, obj, op, root):
        c = self._impl()
        _root(c, root)
        return (yield from G.g_reduce(c, obj, op, root, G._Codec()))

    def reduce(self, sendobj, op=SUM, root=0):
        return run(self._g_reduce(sendobj, op, root))

    def allreduce(self, sendobj, op=SUM):
        return run(G.g_allreduce(self._impl(), sendobj, op, G._Codec()))

    def scan(self, sendobj, op=SUM):
        return run(G.g_scan(self._impl(), sendobj, op, G._Codec()))

    def exscan(self, sendobj, op=SUM):
        return run(G.g_scan(self._impl(), sendobj, op, G._Codec(), True))

    # -- gather / scatter ---------------------------------------------------------
    def _g_Gatherv(self, sendbuf, recvbuf, root, vector):
        c = self._impl()
        _root(c, root)
        inplace = sendbuf is IN_PLACE or (sendbuf is None and c.rank == root)
        if c.rank == root:
            rm, counts, displs = parse_v(recvbuf, c.size, True)
            if not vector and inplace is False:
                pass
            sm = None if inplace else parse(sendbuf)
        else:
            rm = counts = displs = None
            sm = parse(sendbuf)
        yield from G.g_gatherv(c, sm, rm, counts, displs, root, inplace)

    def Gather(self, sendbuf, recvbuf, root=0):
        run(self._g_Gatherv(sendbuf, recvbuf, root, False))

    def Igather(self, sendbuf, recvbuf, root=0):
        return _req(self._g_Gatherv(sendbuf, recvbuf, root, False))

    Gatherv, Igatherv = Gather, Igather

    def _g_Scatterv(self, sendbuf, recvbuf, root):
        c = self._impl()
        _root(c, root)
        inplace = recvbuf is IN_PLACE or (recvbuf is None and c.rank == root)
        if c.rank == root:
            sm, counts, displs = parse_v(sendbuf, c.size, False)
            rm = None if inplace else parse(recvbuf, writable=True)
        else:
            sm = counts = displs = None
            rm = parse(recvbuf, writable=True)
        yield from G.g_scatterv(c, sm, counts, displs, rm, root, inplace)

    def Scatter(self, sendbuf, recvbuf, root=0):
        run(self._g_Scatterv(sendbuf, recvbuf, root))

    def Iscatter(self, sendbuf, recvbuf, root=0):
        return _req(self._g_Scatterv(sendbuf, recvbuf, root))

    Scatterv, Iscatterv = Scatter, Iscatter

    def _g_Allgatherv(self, sendbuf, recvbuf):
        c = self._impl()
        inplace = sendbuf is IN_PLACE
        rm, counts, displs = parse_v(recvbuf, c.size, True)
        sm = None if inplace else parse(sendbuf)
        yield from G.g_allgatherv(c, sm, rm, counts, displs, inplace)

    def Allgather(self, sendbuf, recvbuf):
        run(self._g_Allgatherv(sendbuf, recvbuf))

    def Iallgather(self, sendbuf, recvbuf):
        return _req(self._g_Allgatherv(sendbuf, recvbuf))

    Allgatherv, Iallgatherv = Allgather, Iallgather

    def _g_Alltoallv(self, sendbuf, recvbuf):
        c = self._impl()
        rm, rc, rd = parse_v(recvbuf, c.size, True)
        if sendbuf is IN_PLACE:
            copy = Msg(memoryview(bytearray(rm.view)), 0, rm.dtype, 0)
            sm, sc, sd = copy, rc, rd
        else:
            sm, sc, sd = parse_v(sendbuf, c.size, False)
        sparts = [sub(sm, sc[i], sd[i]) for i in range(c.size)]
        rparts = [sub(rm, rc[i], rd[i]) for i in range(c.size)]
        yield from G.g_alltoallw(c, sparts, rparts)

    def Alltoall(self, sendbuf, recvbuf):
        run(self._g_Alltoallv(sendbuf, recvbuf))

    def Ialltoall(self, sendbuf, recvbuf):
        return _req(self._g_Alltoallv(sendbuf, recvbuf))

    Alltoallv, Ialltoallv = Alltoall, Ialltoall

    def _g_Alltoallw(self, sendbuf, recvbuf):
        c = self._impl()

        def parts(spec, writable):
            buf, (counts, displs), types = spec[0], spec[1], spec[2]
            if len(spec) == 4:
                buf, counts, displs, types = spec
            from .datatype import byte_view
            view = byte_view(buf, writable)[0]
            return [Msg(view, counts[i], types[i], displs[i]) for i in range(c.size)]
        rparts = parts(recvbuf, True)
        if sendbuf is IN_PLACE:
            sparts = [Msg(memoryview(bytearray(p.view)), p.count, p.dtype, p.offset)
                      for p in rparts]
        else:
            sparts = parts(sendbuf, False)
        yield from G.g_alltoallw(c, sparts, rparts)

    def Alltoallw(self, sendbuf, recvbuf):
        run(self._g_Alltoallw(sendbuf, recvbuf))

    def Ialltoallw(self, sendbuf, recvbuf):
        return _req(self._g_Alltoallw(sendbuf, recvbuf))

    # -- pickle forms ---------------------------------------------------------------
    def gather(self, sendobj, root=0):
        c = self._impl()
        _root(c, root)
        return run(G.g_gather_obj(c, sendobj, root))

    def scatter(self, sendobj, root=0):
        c = self._impl()
        _root(c, root)
        return run(G.g_scatter_obj(c, sendobj, root))

    def allgather(self, sendobj):
        return run(G.g_allgather_obj(self._impl(), sendobj))

    def alltoall(self, sendobj):
        return run(G.g_alltoall_obj(self._impl(), sendobj))

    def igather(self, sendobj, root=0):
        return _req(G.g_gather_obj(self._impl(), sendobj, root))

    def iscatter(self, sendobj, root=0):
        return _req(G.g_scatter_obj(self._impl(), sendobj, root))

    def iallgather(self, sendobj):
        return _req(G.g_allgather_obj(self._impl(), sendobj))

    def ialltoall(self, sendobj):
        return _req(G.g_alltoall_obj(self._impl(), sendobj))

    def ireduce(self, sendobj, op=SUM, root=0):
        return _req(self._g_reduce(sendobj, op, root))

    def iallreduce(self, sendobj, op=SUM):
        return _req(G.g_allreduce(self._impl(), sendobj, op, G._Codec()))
