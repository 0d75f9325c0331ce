"""Virtual topologies and neighborhood collectives.

A topology is attached to an intracommunicator (``CommImpl.topo``): a
Cartesian grid, a graph given by (index, edges) at every process, or a
distributed graph where each process knows its own in- and out-edges.
Ranks are never reordered (``reorder`` is accepted and ignored, which MPI
allows).

Neighborhood collectives send block ``k`` to ``outedges[k]`` and receive
block ``j`` from ``inedges[j]``.  On a Cartesian grid a neighbor may appear
more than once (periodic dimensions of size 1 or 2), so each message
carries the index of the receive slot it fills: what leaves in direction
+1 of dimension d arrives in the receiver's slot for direction -1.  On
(distributed) graphs repeated edges pair up in edge order, which MPI's
non-overtaking rule gives.
"""
from __future__ import annotations

import math

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from ucxpy import coll as engine

from . import coll as G
from .comm import provide as _provide
from .comm import CART, DIST_GRAPH, GRAPH, CommImpl, Intracomm, new_ctx, register_kind
from .msgspec import parse, sub
from .msgspec import parse_block, parse_v, parse_w
from .engine import ENGINE
from .exceptions import ERR_ARG, ERR_DIMS, ERR_RANK, ERR_TOPOLOGY, Exception
from .group import UNDEFINED
from .ops import GenOp, run
from .request import Request, make_prequest

PROC_NULL = -2


class _Weights:
    """``MPI.UNWEIGHTED`` / ``MPI.WEIGHTS_EMPTY`` markers."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


UNWEIGHTED = _Weights("UNWEIGHTED")
WEIGHTS_EMPTY = _Weights("WEIGHTS_EMPTY")


# -- topology descriptions -----------------------------------------------------------
class CartTopo:
    __slots__ = ("dims", "periods")

    def __init__(self, dims, periods):
        self.dims, self.periods = list(dims), [int(bool(p)) for p in periods]

    def coords(self, rank):
        out = []
        for d in reversed(self.dims):
            out.append(rank % d)
            rank //= d
        return out[::-1]

    def rank_of(self, coords):
        if len(coords) != len(self.dims):
            raise Exception(ERR_ARG, f"expected {len(self.dims)} coordinates")
        r = 0
        for c, d, p in zip(coords, self.dims, self.periods):
            if not p and not (0 <= c < d):
                return PROC_NULL
            r = r * d + (c % d)
        return r

    def shift(self, rank, direction, disp):
        if not (0 <= direction < len(self.dims)):
            raise Exception(ERR_ARG, f"invalid direction {direction}")
        me = self.coords(rank)

        def moved(k):
            c = list(me)
            c[direction] += k
            return self.rank_of(c)
        return moved(-disp), moved(disp)

    def edges(self, rank):
        out = []
        for d in range(len(self.dims)):
            src, dst = self.shift(rank, d, 1)
            out += [src, dst]
        return out, list(out)


class GraphTopo:
    __slots__ = ("index", "edges")

    def __init__(self, index, edges):
        self.index, self.edges = list(index), list(edges)

    def neighbors(self, rank):
        lo = self.index[rank - 1] if rank else 0
        return self.edges[lo:self.index[rank]]

    def edges_of(self, rank):
        n = self.neighbors(rank)
        return n, list(n)


class DistGraphTopo:
    __slots__ = ("sources", "dests", "sweights", "dweights", "weighted")

    def __init__(self, sources, dests, sweights, dweights, weighted):
        self.sources, self.dests = list(sources), list(dests)
        self.sweights, self.dweights, self.weighted = sweights, dweights, weighted


def in_out_edges(c: CommImpl):
    t = c.topo
    if isinstance(t, CartTopo):
        return t.edges(c.rank)
    if isinstance(t, GraphTopo):
        return t.edges_of(c.rank)
    if isinstance(t, DistGraphTopo):
        return list(t.sources), list(t.dests)
    raise Exception(ERR_TOPOLOGY, "communicator has no topology")


# -- creation ---------------------------------------------------------------------------
def Compute_dims(nnodes: int, dims):
    """Return a balanced distribution of processes per coordinate direction."""
    if isinstance(dims, int):
        dims = [0] * dims
    dims = [int(d) for d in dims]
    if nnodes < 0:
        raise Exception(ERR_ARG, f"invalid number of nodes {nnodes}")
    if any(d < 0 for d in dims):
        raise Exception(ERR_DIMS, "negative value in dims")
    fixed = math.prod(d for d in dims if d > 0)
    free = [i for i, d in enumerate(dims) if d == 0]
    if nnodes == 0:
        if free:
            raise Exception(ERR_DIMS, "cannot partition 0 nodes over free dimensions")
        return dims
    if fixed == 0 or nnodes % fixed:
        raise Exception(ERR_DIMS, f"cannot partition {nnodes} nodes as requested")
    rest = nnodes // fixed
    if not free:
        if rest != 1:
            raise Exception(ERR_DIMS, f"cannot partition {nnodes} nodes as requested")
        return dims
    # prime factors, largest first, each to the currently smallest free dim
    factors, n, p = [], rest, 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    vals = [1] * len(free)
    for f in sorted(factors, reverse=True):
        i = vals.index(min(vals))
        vals[i] *= f
    vals.sort(reverse=True)
    for i, v in zip(free, vals):
        dims[i] = v
    return dims


def _periods(dims, periods):
    if periods is None:
        return [False] * len(dims)
    if isinstance(periods, bool) or isinstance(periods, int):
        return [bool(periods)] * len(dims)
    periods = list(periods)
    if len(periods) != len(dims):
        raise ValueError(f"periods: expected {len(dims)} values, got {len(periods)}")
    return periods


def _topo_comm(parent, c: CommImpl, n: int, topo, kind):
    """Communicator over the first ``n`` ranks of ``c`` carrying ``topo``."""
    ctx = new_ctx(c)
    if c.rank >= n:
        return Intracomm()
    new = CommImpl(ctx, c.group[:n], kind=kind)
    new.topo = topo
    new.errhandler = c.errhandler
    return _KIND_CLASS[kind]._wrap(new)


def create_cart(comm, dims, periods, reorder):
    c = comm._impl()
    dims = [int(d) for d in dims]
    periods = _periods(dims, periods)
    if any(d <= 0 for d in dims):
        raise Exception(ERR_DIMS, "dimensions must be positive")
    n = math.prod(dims)
    if n > c.size:
        raise Exception(ERR_ARG, f"size of the communicator ({c.size}) is smaller than the "
                                 f"size of the Cartesian topology ({n})")
    return _topo_comm(comm, c, n, CartTopo(dims, periods), "cart")


def cart_map(comm, dims, periods):
    c = comm._impl()
    dims = [int(d) for d in dims]
    _periods(dims, periods)
    n = math.prod(dims)
    if n > c.size:
        raise Exception(ERR_ARG, "topology is larger than the communicator")
    return c.rank if c.rank < n else UNDEFINED


def _graph_args(index, edges):
    index, edges = [int(i) for i in index], [int(e) for e in edges]
    if index and index[0] == 0:
        index = index[1:]
    if any(b < a for a, b in zip([0] + index, index)) or (index and index[-1] != len(edges)):
        raise Exception(ERR_ARG, "invalid graph index")
    return index, edges


def create_graph(comm, index, edges, reorder):
    c = comm._impl()
    index, edges = _graph_args(index, edges)
    n = len(index)
    if n > c.size:
        raise Exception(ERR_ARG, "graph is larger than the communicator")
    if any(not (0 <= e < n) for e in edges):
        raise Exception(ERR_RANK, "graph edge out of range")
    return _topo_comm(comm, c, n, GraphTopo(index, edges), "graph")


def graph_map(comm, index, edges):
    c = comm._impl()
    index, edges = _graph_args(index, edges)
    return c.rank if c.rank < len(index) else UNDEFINED


def _weights(w, n, what):
    """(list or None, weighted?) from a weights argument."""
    if w is None or w is UNWEIGHTED:
        return None, False
    if w is WEIGHTS_EMPTY:
        if n:
            raise ValueError(f"{what}: WEIGHTS_EMPTY with {n} edges")
        return [], True
    w = [int(x) for x in w]
    if len(w) != n:
        raise ValueError(f"{what}: expected {n} weights, got {len(w)}")
    return w, True


def _ranks(c, lst):
    out = [int(r) for r in (lst or [])]
    for r in out:
        if not (0 <= r < c.size):
            raise Exception(ERR_RANK, f"invalid rank {r} in the graph")
    return out


def create_dist_graph_adjacent(comm, sources, destinations, sourceweights, destweights,
                               reorder):
    c = comm._impl()
    src, dst = _ranks(c, sources), _ranks(c, destinations)
    sw, w1 = _weights(sourceweights, len(src), "sourceweights")
    dw, w2 = _weights(destweights, len(dst), "destweights")
    topo = DistGraphTopo(src, dst, sw, dw, w1 or w2)
    if (w1 or w2) and (sw is None or dw is None):
        topo.sweights = sw if sw is not None else [1] * len(src)
        topo.dweights = dw if dw is not None else [1] * len(dst)
    return _topo_comm(comm, c, c.size, topo, "dist_graph")


def create_dist_graph(comm, sources, degrees, destinations, weights, reorder):
    c = comm._impl()
    src, deg, dst = _ranks(c, sources), [int(d) for d in degrees], _ranks(c, destinations)
    if len(deg) != len(src) or sum(deg) != len(dst):
        raise ValueError("degrees do not match the sources and destinations")
    w, weighted = _weights(weights, len(dst), "weights")
    edges, k = [], 0
    for s, d in zip(src, deg):
        for j in range(d):
            edges.append((s, dst[k], w[k] if w is not None else 1))
            k += 1
    everyone = comm.allgather((edges, weighted))
    weighted = any(flag for _, flag in everyone)
    me = c.rank
    ins = [(s, wt) for lst, _ in everyone for (s, d, wt) in lst if d == me]
    outs = [(d, wt) for lst, _ in everyone for (s, d, wt) in lst if s == me]
    topo = DistGraphTopo([s for s, _ in ins], [d for d, _ in outs],
                         [wt for _, wt in ins] if weighted else None,
                         [wt for _, wt in outs] if weighted else None, weighted)
    return _topo_comm(comm, c, c.size, topo, "dist_graph")


# -- neighborhood collectives -------------------------------------------------------------
def _slot_tags(c, ins, outs):
    """Round index of each receive slot and of each send (see the module docstring)."""
    if isinstance(c.topo, CartTopo):
        return list(range(len(ins))), [k ^ 1 for k in range(len(outs))]
    return [0] * len(ins), [0] * len(outs)


def _edges(lst):
    """MPI's edge list as the engine's (PROC_NULL: no edge, None)."""
    return [None if r == PROC_NULL else r for r in lst]


def g_neighbor(c, sparts, rparts):
    """Send ``sparts[k]`` to ``outedges[k]``, receive ``rparts[j]`` from
    ``inedges[j]``: the engine's sparse exchange of packed parts."""
    ins, outs = in_out_edges(c)
    rt, st = _slot_tags(c, ins, outs)
    dsts = [None if src == PROC_NULL else G._Dst(rparts[j]) for j, src in enumerate(ins)]
    sends = [None if dst == PROC_NULL else sparts[k].pack() for k, dst in enumerate(outs)]
    yield from engine.neighbor(c, _edges(ins), _edges(outs), sends,
                               [None if d is None else d.buf for d in dsts], rt, st)
    for d in dsts:
        if d is not None:
            d.done()


def g_neighbor_obj(c, objs, gather):
    """Neighbourhood allgather (``gather``: ``objs`` is this rank's object,
    sent to every out-neighbour) or alltoall of objects."""
    ins, outs = in_out_edges(c)
    rt, st = _slot_tags(c, ins, outs)
    if gather:
        objs = [objs] * len(outs)
    else:
        objs = list(objs) if objs is not None else [None] * len(outs)
        if len(objs) != len(outs):
            raise ValueError(f"expected {len(outs)} objects, got {len(objs)}")
    return (yield from engine.neighbor_obj(c, _edges(ins), _edges(outs), objs, rt, st))


class Topocomm(Intracomm):
    """Topology intracommunicator."""

    __slots__ = ()
    _KINDS = ("cart", "graph", "dist_graph")

    @property
    def degrees(self):
        """Number of incoming and outgoing neighbors."""
        ins, outs = in_out_edges(self._impl())
        return len(ins), len(outs)

    indegree = property(lambda self: self.degrees[0], doc="Number of incoming neighbors.")
    outdegree = property(lambda self: self.degrees[1], doc="Number of outgoing neighbors.")

    @property
    def inoutedges(self):
        """Incoming and outgoing neighbors."""
        return in_out_edges(self._impl())

    inedges = property(lambda self: self.inoutedges[0], doc="Incoming neighbors.")
    outedges = property(lambda self: self.inoutedges[1], doc="Outgoing neighbors.")

    # -- buffer forms ---------------------------------------------------------------
    def _g_nbr_allgather(self, sendbuf, recvbuf, vector):
        c = self._impl()
        ins, outs = in_out_edges(c)
        sm = parse(sendbuf)
        rm, counts, displs = (parse_v if vector else parse_block)(recvbuf, len(ins), True)
        rparts = [sub(rm, counts[j], displs[j]) for j in range(len(ins))]
        return g_neighbor(c, [sm] * len(outs), rparts)

    def _g_nbr_alltoall(self, sendbuf, recvbuf, vector=True):
        c = self._impl()
        ins, outs = in_out_edges(c)
        parser = parse_v if vector else parse_block
        sm, sc, sd = parser(sendbuf, len(outs), False)
        rm, rc, rd = parser(recvbuf, len(ins), True)
        return g_neighbor(c, [sub(sm, sc[k], sd[k]) for k in range(len(outs))],
                          [sub(rm, rc[j], rd[j]) for j in range(len(ins))])

    def _g_nbr_alltoallw(self, sendbuf, recvbuf):
        c = self._impl()
        ins, outs = in_out_edges(c)
        return g_neighbor(c, parse_w(sendbuf, len(outs), False), parse_w(recvbuf, len(ins), True))

    def Neighbor_allgather(self, sendbuf, recvbuf) -> None:
        """Neighbor gather to all processes."""
        run(self._g_nbr_allgather(sendbuf, recvbuf, False))

    def Neighbor_allgatherv(self, sendbuf, recvbuf) -> None:
        """Neighbor gather of vector data to all processes."""
        run(self._g_nbr_allgather(sendbuf, recvbuf, True))

    def Neighbor_alltoall(self, sendbuf, recvbuf) -> None:
        """Neighbor all-to-all."""
        run(self._g_nbr_alltoall(sendbuf, recvbuf, False))

    def Neighbor_alltoallv(self, sendbuf, recvbuf) -> None:
        """Neighbor all-to-all of vector data."""
        run(self._g_nbr_alltoall(sendbuf, recvbuf))

    def Neighbor_alltoallw(self, sendbuf, recvbuf) -> None:
        """Neighbor all-to-all with per-neighbor datatypes."""
        run(self._g_nbr_alltoallw(sendbuf, recvbuf))

    def Ineighbor_allgather(self, sendbuf, recvbuf):
        """Nonblocking neighbor gather to all processes."""
        return _req(self._g_nbr_allgather(sendbuf, recvbuf, False))

    def Ineighbor_allgatherv(self, sendbuf, recvbuf):
        """Nonblocking neighbor gather of vector data."""
        return _req(self._g_nbr_allgather(sendbuf, recvbuf, True))

    def Ineighbor_alltoall(self, sendbuf, recvbuf):
        """Nonblocking neighbor all-to-all."""
        return _req(self._g_nbr_alltoall(sendbuf, recvbuf, False))

    def Ineighbor_alltoallv(self, sendbuf, recvbuf):
        """Nonblocking neighbor all-to-all of vector data."""
        return _req(self._g_nbr_alltoall(sendbuf, recvbuf))

    def Ineighbor_alltoallw(self, sendbuf, recvbuf):
        """Nonblocking neighbor all-to-all with per-neighbor datatypes."""
        return _req(self._g_nbr_alltoallw(sendbuf, recvbuf))

    def Neighbor_allgather_init(self, sendbuf, recvbuf, info=None):
        """Persistent neighbor gather to all processes."""
        return _preq(lambda: self._g_nbr_allgather(sendbuf, recvbuf, False))

    def Neighbor_allgatherv_init(self, sendbuf, recvbuf, info=None):
        """Persistent neighbor gather of vector data."""
        return _preq(lambda: self._g_nbr_allgather(sendbuf, recvbuf, True))

    def Neighbor_alltoall_init(self, sendbuf, recvbuf, info=None):
        """Persistent neighbor all-to-all."""
        return _preq(lambda: self._g_nbr_alltoall(sendbuf, recvbuf, False))

    def Neighbor_alltoallv_init(self, sendbuf, recvbuf, info=None):
        """Persistent neighbor all-to-all of vector data."""
        return _preq(lambda: self._g_nbr_alltoall(sendbuf, recvbuf))

    def Neighbor_alltoallw_init(self, sendbuf, recvbuf, info=None):
        """Persistent neighbor all-to-all with per-neighbor datatypes."""
        return _preq(lambda: self._g_nbr_alltoallw(sendbuf, recvbuf))

    # -- pickle forms ------------------------------------------------------------------
    def neighbor_allgather(self, sendobj):
        """Neighbor gather of Python objects."""
        return run(g_neighbor_obj(self._impl(), sendobj, True))

    def neighbor_alltoall(self, sendobj):
        """Neighbor all-to-all of Python objects."""
        return run(g_neighbor_obj(self._impl(), sendobj, False))

    def ineighbor_allgather(self, sendobj):
        """Nonblocking neighbor gather of Python objects."""
        return _req(g_neighbor_obj(self._impl(), sendobj, True))

    def ineighbor_alltoall(self, sendobj):
        """Nonblocking neighbor all-to-all of Python objects."""
        return _req(g_neighbor_obj(self._impl(), sendobj, False))


def _req(gen):
    return Request._from(GenOp(gen))


def _preq(factory):
    return make_prequest(lambda: GenOp(factory()))


class Cartcomm(Topocomm):
    """Cartesian topology intracommunicator."""

    __slots__ = ()
    _KINDS = ("cart",)

    def _t(self) -> CartTopo:
        return self._impl().topo

    def Get_dim(self) -> int:
        """Return the number of dimensions."""
        return len(self._t().dims)

    dim = property(Get_dim, doc="Number of dimensions.")
    ndim = property(Get_dim, doc="Number of dimensions.")

    def Get_topo(self):
        """Return ``(dims, periods, coords)`` of this process."""
        t, c = self._t(), self._impl()
        return list(t.dims), list(t.periods), t.coords(c.rank)

    topo = property(Get_topo, doc="Topology information.")
    dims = property(lambda self: list(self._t().dims), doc="Dimensions.")
    periods = property(lambda self: list(self._t().periods), doc="Periodicity.")
    coords = property(lambda self: self._t().coords(self._impl().rank), doc="Coordinates.")

    def Get_cart_rank(self, coords) -> int:
        """Translate Cartesian coordinates to a rank."""
        r = self._t().rank_of([int(x) for x in coords])
        if r == PROC_NULL:
            raise Exception(ERR_ARG, f"coordinates {list(coords)} are out of range")
        return r

    def Get_coords(self, rank: int):
        """Translate a rank to Cartesian coordinates."""
        c = self._impl()
        if not (0 <= rank < c.size):
            raise Exception(ERR_RANK, f"invalid rank {rank}")
        return self._t().coords(rank)

    def Shift(self, direction: int, disp: int):
        """Return ``(source, dest)`` ranks for a shift along ``direction``."""
        return self._t().shift(self._impl().rank, direction, disp)

    def Sub(self, remain_dims):
        """Cartesian subgrid keeping the dimensions where ``remain_dims`` is true."""
        c, t = self._impl(), self._t()
        keep = [bool(x) for x in remain_dims]
        if len(keep) != len(t.dims):
            raise Exception(ERR_ARG, f"expected {len(t.dims)} flags")
        me = t.coords(c.rank)
        color = 0
        for k, d, x in zip(keep, t.dims, me):
            if not k:
                color = color * d + x
        ctx = new_ctx(c)
        table = self.allgather(color)
        members = [c.group[r] for r in range(c.size) if table[r] == color]
        new = CommImpl(ctx, members, kind="cart")
        new.topo = CartTopo([d for d, k in zip(t.dims, keep) if k],
                            [p for p, k in zip(t.periods, keep) if k])
        new.errhandler = c.errhandler
        return Cartcomm._wrap(new)


class Graphcomm(Topocomm):
    """General graph topology intracommunicator."""

    __slots__ = ()
    _KINDS = ("graph",)

    def _t(self) -> GraphTopo:
        return self._impl().topo

    def Get_dims(self):
        """Return ``(nnodes, nedges)``."""
        t = self._t()
        return len(t.index), len(t.edges)

    dims = property(Get_dims, doc="Number of nodes and edges.")
    nnodes = property(lambda self: self.Get_dims()[0], doc="Number of nodes.")
    nedges = property(lambda self: self.Get_dims()[1], doc="Number of edges.")

    def Get_topo(self):
        """Return ``(index, edges)``."""
        t = self._t()
        return list(t.index), list(t.edges)

    topo = property(Get_topo, doc="Topology information.")
    index = property(lambda self: list(self._t().index), doc="Index.")
    edges = property(lambda self: list(self._t().edges), doc="Edges.")

    def Get_neighbors_count(self, rank: int) -> int:
        """Return the number of neighbors of ``rank``."""
        return len(self.Get_neighbors(rank))

    def Get_neighbors(self, rank: int):
        """Return the neighbors of ``rank``."""
        t = self._t()
        if not (0 <= rank < len(t.index)):
            raise Exception(ERR_RANK, f"invalid rank {rank}")
        return list(t.neighbors(rank))

    nneighbors = property(lambda self: self.Get_neighbors_count(self._impl().rank),
                          doc="Number of neighbors.")
    neighbors = property(lambda self: self.Get_neighbors(self._impl().rank),
                         doc="Neighbors.")


class Distgraphcomm(Topocomm):
    """Distributed graph topology intracommunicator."""

    __slots__ = ()
    _KINDS = ("dist_graph",)

    def Get_dist_neighbors_count(self):
        """Return ``(indegree, outdegree, weighted)``."""
        t = self._impl().topo
        return len(t.sources), len(t.dests), bool(t.weighted)

    def Get_dist_neighbors(self):
        """Return ``(sources, destinations, weights)`` (weights None when unweighted)."""
        t = self._impl().topo
        w = (list(t.sweights), list(t.dweights)) if t.weighted else None
        return list(t.sources), list(t.dests), w


_KIND_CLASS = {"cart": Cartcomm, "graph": Graphcomm, "dist_graph": Distgraphcomm}
for _k, _cls in _KIND_CLASS.items():
    register_kind(_k, _cls)
_ = (np, ENGINE)


# the communicator's methods that make these (.comm does not import this module)
_provide(cart_map=cart_map, create_cart=create_cart, create_dist_graph=create_dist_graph,
         create_dist_graph_adjacent=create_dist_graph_adjacent, create_graph=create_graph,
         graph_map=graph_map)
