"""Communicators: groups of processes with a private communication context.

Every communicator owns a *context id*, agreed collectively as the maximum
of the members' next free id, so its point-to-point and collective traffic
carry distinct ucxpy tags (layout in :mod:`.engine`) and never match traffic
of another communicator.  Communicators created by one ``Split`` share the
id: their members are disjoint.

A :class:`CommImpl` holds the local group (wids, see :mod:`.engine`), and
for an intercommunicator the remote group; ``peers``/``eps`` are the group
that ranks in point-to-point calls refer to (the local group of an
intracommunicator, the remote group of an intercommunicator).  The Python
classes follow mpi4py: ``Comm`` > ``Intracomm`` > ``Topocomm`` >
``Cartcomm``/``Graphcomm``/``Distgraphcomm``, and ``Comm`` > ``Intercomm``.
"""
from __future__ import annotations

import os
import sys
import weakref
import zlib

from ucxpy.coll import barrier

from . import attr, bsend, shmcoll
from .cco import Coll
from .coll import _revoked, agree_max, g_inter_barrier, run
from .engine import CTX_BITS, CTX_SHIFT, ENGINE, KIND_CGRP, KIND_COLL, KIND_LOCAL, TAG_UB
from .errhandler import ERRORS_RETURN_IMPL, Errhandler, errhandler_of, raise_in, set_abort
from .exceptions import (ERR_ARG, ERR_COMM, ERR_GROUP, ERR_KEYVAL, ERR_OTHER, ERR_REVOKED,
                         ERR_TAG, ERR_UNSUPPORTED_OPERATION, Exception, last_used_code)
from .group import CONGRUENT, IDENT, SIMILAR, UNDEFINED, UNEQUAL, Group
from .handle import Handle, impl_of, register_family
from .info import INFO_NULL, Info
from .p2p import P2P
from .request import Request

COMM_TYPE_SHARED = 1
COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = 2, 3, 4
from .attr import APPNUM, HOST, IO, LASTUSEDCODE, TAG_UB_KEY, UNIVERSE_SIZE, WTIME_IS_GLOBAL  # noqa: E402
_state = {"next_ctx": 2}
_KIND_CLASS = {}        # impl kind -> natural Python class (filled below)


#: the topology kinds (MPI.CART, MPI.GRAPH, MPI.DIST_GRAPH; .topo re-exports them)
CART, GRAPH, DIST_GRAPH = 1, 2, 3


class _Provided(dict):
    def __missing__(self, name):
        raise RuntimeError(f"mpi_shim: {name} is provided by a module not imported yet "
                           "(use mpi_shim.MPI)")


#: what the communicator kinds built on this module (.intercomm, .topo,
#: .dynproc, .ulfm) provide to the methods here that make or use them, by
#: name: they import this module and register at their import (provide),
#: so none of them is imported from here
_IMPL = _Provided()


def provide(**functions) -> None:
    """Register the implementations of this module's facade methods."""
    _IMPL.update(functions)


class CommImpl:
    """Shared state of one communicator."""

    __slots__ = ("ctx", "kind", "group", "rank", "size", "remote", "peers", "eps", "srcmap",
                 "local", "p2p", "coll", "coll_seq", "ssend_seq", "name", "info", "attrs",
                 "errhandler", "topo", "freed", "predefined", "revoked", "locks", "acked",
                 "ft_seq", "shm", "shm_calls",
                 "_hid", "__weakref__")

    def __init__(self, ctx, group, remote=None, kind=None, name="", coll_kind=KIND_COLL):
        self.ctx = ctx
        self.group = tuple(group)
        self.size = len(self.group)
        self.rank = self.group.index(ENGINE.me) if ENGINE.me in self.group else UNDEFINED
        self.remote = None if remote is None else tuple(remote)
        self.kind = kind or ("intra" if remote is None else "inter")
        self.peers = self.group if remote is None else self.remote
        self.eps = [ENGINE.ep(w) for w in self.peers]
        self.srcmap = {w: i for i, w in enumerate(self.peers)}
        self.local = None
        self.p2p = ctx << CTX_SHIFT
        self.coll = coll_kind | (ctx << CTX_SHIFT)
        self.coll_seq = 0
        self.ssend_seq = 0
        self.name = name
        self.info = {}
        self.attrs = {}
        self.errhandler = ERRORS_RETURN_IMPL
        self.topo = None
        self.freed = self.predefined = self.revoked = False
        self.locks = {}
        self.acked = frozenset()
        self.ft_seq = 0                      # agreements (ULFM) started on this communicator
        self.shm = None                      # its shared-memory team (shmcoll.team), False: none
        self.shm_calls = 0
        if remote is not None:
            # the local group's own collectives (phases of intercommunicator
            # collectives): same context, another traffic kind
            self.local = CommImpl(ctx, group, coll_kind=KIND_LOCAL)
        ENGINE.comms.setdefault(ctx, weakref.WeakSet()).add(self)

    @property
    def rsize(self) -> int:
        return len(self.remote) if self.remote is not None else self.size

    # -- a team of ucxpy's collective engine (ucxpy.coll) --
    @property
    def worker(self):
        return ENGINE.worker

    @property
    def wait_until(self):
        return ENGINE.wait_until             # (lets other threads in: THREAD_MULTIPLE)

    def check(self) -> None:
        """Raise ERR_REVOKED once revoked (before every collective round)."""
        if self.revoked:
            raise _revoked()

    def coll_tag(self) -> int:
        """Base tag of the next collective (all members call in one order)."""
        self.coll_seq = (self.coll_seq + 1) & 0x7FFFFF
        return self.coll | (self.coll_seq << 8)

    def source_rank(self, wid) -> int:
        return self.srcmap.get(wid, wid)


def next_ctx_value() -> int:
    return _state["next_ctx"]


def claim_ctx(ctx: int) -> int:
    """Record that context id ``ctx`` is taken here; returns it."""
    if ctx >= 1 << CTX_BITS:
        raise Exception(ERR_OTHER, "out of communicator context ids")
    _state["next_ctx"] = max(_state["next_ctx"], ctx + 1)
    return ctx


def new_ctx(c: CommImpl) -> int:
    """A context id free at every member of ``c`` (both groups when inter)."""
    return claim_ctx(agree_max(c, _state["next_ctx"]))


def _natural(impl):
    return _KIND_CLASS[impl.kind] if impl is not None else None


class Comm(Handle, P2P, Coll):
    """Communication context."""

    __slots__ = ()
    _KINDS = ("intra", "inter", "cart", "graph", "dist_graph")

    @classmethod
    def _accepts(cls, impl) -> bool:
        return impl is None or impl.kind in cls._KINDS

    @classmethod
    def fromhandle(cls, handle: int):
        """Communicator referring to integer ``handle``."""
        impl = impl_of(handle)
        nat = _natural(impl)
        return (nat if nat is not None and issubclass(nat, cls) else cls)._wrap(impl)

    @classmethod
    def _new(cls, impl):
        """Python object for ``impl`` (None: COMM_NULL).

        Of class ``cls`` (a subclass of the caller's, as mpi4py's
        constructors keep) when it accepts ``impl``'s kind, else of the
        kind's natural class.
        """
        if impl is None or cls._accepts(impl):
            return cls._wrap(impl)
        return _natural(impl)._wrap(impl)

    def _impl_any(self) -> CommImpl:
        """The communicator, revoked or not (queries, fault tolerance, Free)."""
        c = self._h
        if c is None:
            raise Exception(ERR_COMM, "invalid communicator (COMM_NULL)")
        return c

    def _impl(self) -> CommImpl:
        """The communicator for communicating: raises ERR_REVOKED once revoked."""
        c = self._h
        if c is None:
            raise Exception(ERR_COMM, "invalid communicator (COMM_NULL)")
        if c.revoked:
            raise Exception(ERR_REVOKED, "the communicator was revoked")
        return c

    @property
    def _c(self):
        return self._h

    def _source_rank(self, wid) -> int:
        return self._h.srcmap.get(wid, wid)

    def __repr__(self):
        return f"<{type(self).__name__} {self.Get_name()}>"

    # -- basic queries ---------------------------------------------------------
    def Get_size(self) -> int:
        """Return the number of processes in the (local) group."""
        return self._impl_any().size

    def Get_rank(self) -> int:
        """Return the rank of this process in the (local) group."""
        return self._impl_any().rank

    size = property(Get_size, doc="Number of processes in the (local) group.")
    rank = property(Get_rank, doc="Rank of this process in the (local) group.")

    def Get_group(self) -> Group:
        """Access the (local) group of the communicator."""
        return Group._of(self._impl_any().group)

    group = property(Get_group, doc="Group of the communicator.")

    def Get_name(self) -> str:
        """Get the print name of the communicator."""
        return "MPI_COMM_NULL" if self._h is None else self._h.name

    def Set_name(self, name: str) -> None:
        """Set the print name of the communicator."""
        self._impl_any().name = str(name)

    name = property(Get_name, Set_name, doc="Print name of the communicator.")

    def Is_inter(self) -> bool:
        """Test whether the communicator is an intercommunicator."""
        return self._impl_any().kind == "inter"

    def Is_intra(self) -> bool:
        """Test whether the communicator is an intracommunicator."""
        return self._impl_any().kind != "inter"

    is_inter = property(Is_inter, doc="Whether the communicator is an intercommunicator.")
    is_intra = property(Is_intra, doc="Whether the communicator is an intracommunicator.")

    def Get_topology(self) -> int:
        """Return the kind of topology attached to the communicator."""
        return {"cart": CART, "graph": GRAPH, "dist_graph": DIST_GRAPH}.get(
            self._impl_any().kind, UNDEFINED)

    topology = property(Get_topology, doc="Kind of topology (UNDEFINED when none).")
    is_topo = property(lambda self: self.Get_topology() != UNDEFINED,
                       doc="Whether the communicator has a topology.")

    def Compare(self, comm) -> int:
        """Compare two communicators (IDENT, CONGRUENT, SIMILAR or UNEQUAL)."""
        a, b = self._impl_any(), comm._impl_any()
        if a is b:
            return IDENT
        if a.kind == "inter" or b.kind == "inter":
            if (a.kind == "inter") != (b.kind == "inter"):
                return UNEQUAL
            if a.group == b.group and a.remote == b.remote:
                return CONGRUENT
            same = sorted(a.group) == sorted(b.group) and sorted(a.remote) == sorted(b.remote)
            return SIMILAR if same else UNEQUAL
        if a.group == b.group:
            return CONGRUENT
        return SIMILAR if sorted(a.group) == sorted(b.group) else UNEQUAL

    # -- info --------------------------------------------------------------
    def Get_info(self) -> Info:
        """Return the current hints of the communicator."""
        return Info.Create(dict(self._impl_any().info))

    def Set_info(self, info: Info) -> None:
        """Set new hints for the communicator."""
        c = self._impl_any()
        if info:
            c.info.update(info.items())

    info = property(Get_info, Set_info, doc="Hints of the communicator.")

    # -- error handling ---------------------------------------------------------
    def Get_errhandler(self) -> Errhandler:
        """Get the error handler of the communicator."""
        return errhandler_of(self._impl_any().errhandler)

    def Set_errhandler(self, errhandler: Errhandler) -> None:
        """Set the error handler of the communicator."""
        c = self._impl_any()
        c.errhandler = Errhandler._checked(errhandler, "comm")

    def Call_errhandler(self, errorcode: int) -> None:
        """Call the error handler installed on the communicator."""
        raise_in(self, Exception(errorcode), call_only=True)

    @classmethod
    def Create_errhandler(cls, errhandler_fn) -> Errhandler:
        """Create a new error handler for communicators."""
        return Errhandler._create(errhandler_fn, "comm")

    def Abort(self, errorcode: int = 0):
        """Terminate the MPI execution environment."""
        try:
            sys.stderr.flush()
            sys.stdout.flush()
        except Exception:
            pass
        try:
            ENGINE.world.abort(f"MPI_Abort(errorcode={errorcode})")
        finally:
            os._exit(errorcode if 0 < errorcode < 256 else 1)

    # -- attributes ---------------------------------------------------------------
    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False) -> int:
        """Create a new attribute key for communicators."""
        return attr.create_keyval("comm", copy_fn, delete_fn, nopython)

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        """Free an attribute key for communicators."""
        return attr.free_keyval("comm", keyval)

    def Get_attr(self, keyval: int):
        """Retrieve the attribute value cached under ``keyval``."""
        c = self._impl_any()
        if keyval == TAG_UB_KEY:
            return TAG_UB
        if keyval == IO:
            return c.rank if c.rank != UNDEFINED else -2
        if keyval == WTIME_IS_GLOBAL:
            return 0
        if keyval == HOST:
            return -2
        if keyval == UNIVERSE_SIZE:
            universe_size = _IMPL["universe_size"]
            return universe_size()
        if keyval == APPNUM:
            appnum = _IMPL["appnum"]
            return appnum()
        if keyval == LASTUSEDCODE:
            return last_used_code()
        return attr.get_attr("comm", c.attrs, keyval)

    def Set_attr(self, keyval: int, attrval) -> None:
        """Store an attribute value under ``keyval``."""
        attr.set_attr("comm", self, self._impl_any().attrs, keyval, attrval)

    def Delete_attr(self, keyval: int) -> None:
        """Delete the attribute value cached under ``keyval``."""
        attr.delete_attr("comm", self, self._impl_any().attrs, keyval)

    # -- creation -------------------------------------------------------------------
    def _derive(self, c: CommImpl, new: CommImpl, info=None):
        """Finish a communicator derived from ``c``: error handler, hints."""
        new.errhandler = c.errhandler
        if info is not None and info != INFO_NULL and info:
            new.info.update(info.items())
        return new

    def Dup(self, info: Info = None):
        """Duplicate the communicator (with its attributes and topology)."""
        c = self._impl()
        new = CommImpl(new_ctx(c), c.group, c.remote, c.kind)
        new.topo = c.topo
        new.attrs = attr.copy_attrs(self, c.attrs)
        self._derive(c, new, info)
        if info is None or info == INFO_NULL:
            new.info.update(c.info)
        return type(self)._new(new)

    def Dup_with_info(self, info: Info):
        """Duplicate the communicator with new hints."""
        return self.Dup(info)

    def Idup(self, info: Info = None):
        """Nonblocking duplicate: returns ``(comm, request)``."""
        return self.Dup(info), Request._done_request()

    def Idup_with_info(self, info: Info):
        """Nonblocking duplicate with new hints: returns ``(comm, request)``."""
        return self.Idup(info)

    def Clone(self):
        """Clone an existing communicator (same as ``Dup``)."""
        return self.Dup()

    def Free(self) -> None:
        """Free the communicator (its attributes are deleted first)."""
        c = self._impl_any()
        if c.predefined:
            raise Exception(ERR_COMM, "cannot free a predefined communicator")
        attr.delete_all(self, c.attrs)
        c.freed = True
        self._h = None
        shmcoll.release(c)
        forget_parent = _IMPL["forget_parent"]
        forget_parent(c)

    def _release(self) -> None:
        c = self._h
        attr.delete_all(self, c.attrs)
        c.freed = True
        shmcoll.release(c)
        forget_parent = _IMPL["forget_parent"]
        forget_parent(c)

    def Disconnect(self) -> None:
        """Disconnect from a communicator (waits for pending traffic, then frees it)."""
        c = self._impl()
        if c.predefined:
            raise Exception(ERR_COMM, "cannot disconnect a predefined communicator")
        run(barrier(c) if c.kind != "inter" else g_inter_barrier(c))
        self.Free()

    def Create(self, group: Group):
        """Create a communicator from a subgroup (collective over this communicator)."""
        c = self._impl()
        if c.kind == "inter":
            inter_create = _IMPL["inter_create"]
            return inter_create(self, group)
        members = group._check()
        ctx = new_ctx(c)
        if ENGINE.me not in members:
            return type(self)._new(None) if type(self)._accepts(None) else Intracomm()
        return type(self)._new(self._derive(c, CommImpl(ctx, members)))

    def Create_group(self, group: Group, tag: int = 0):
        """Create a communicator from a group (collective over the group only)."""
        c = self._impl()
        members = group._check()
        if ENGINE.me not in members:
            raise Exception(ERR_GROUP, "calling process is not in the group")
        if not (0 <= tag <= TAG_UB):
            raise Exception(ERR_TAG, f"invalid tag {tag}")
        tmp = CommImpl(0, members, coll_kind=KIND_CGRP | (c.ctx << CTX_SHIFT))
        tmp.coll_seq = tag & 0x3FFFFF
        return type(self)._new(self._derive(c, CommImpl(new_ctx(tmp), members)))

    def Split(self, color: int = 0, key: int = 0):
        """Split the communicator by color and key."""
        c = self._impl()
        if c.kind == "inter":
            inter_split = _IMPL["inter_split"]
            return inter_split(self, color, key)
        ctx = new_ctx(c)
        table = self.allgather((color, key))
        if color == UNDEFINED:
            return type(self)._new(None)
        if color < 0:
            raise Exception(ERR_ARG, f"invalid color {color}")
        members = sorted((k, r) for r, (col, k) in enumerate(table) if col == color)
        return type(self)._new(self._derive(c, CommImpl(ctx, [c.group[r] for _, r in members])))

    def Split_type(self, split_type: int, key: int = 0, info: Info = INFO_NULL):
        """Split the communicator by type (shared memory, hardware guided ...)."""
        c = self._impl()
        valid = split_type in (COMM_TYPE_SHARED, COMM_TYPE_HW_UNGUIDED)
        if split_type == COMM_TYPE_HW_GUIDED:
            valid = bool(info) and info.Get("mpi_hw_resource_type") == "mpi_shared_memory"
        elif split_type == COMM_TYPE_RESOURCE_GUIDED:
            valid = bool(info) and info.Get("mpi_hw_resource_type") == "mpi_shared_memory"
        elif split_type not in (UNDEFINED, COMM_TYPE_SHARED, COMM_TYPE_HW_UNGUIDED):
            raise Exception(ERR_ARG, f"unknown split type {split_type}")
        host = ENGINE.worker.address.host_id
        if c.kind == "inter":
            local_comm = _IMPL["local_comm"]
            base = local_comm(self)
        else:
            base = self
        hosts = base.allgather(host if valid else None)
        if split_type == COMM_TYPE_HW_UNGUIDED:
            # one level below the whole (the host): none when that is the whole
            if len(set(hosts)) <= 1:
                base.Split(UNDEFINED, key)
                return Intracomm()
        if not valid:
            base.Split(UNDEFINED, key)
            return Intracomm()
        new = base.Split(hosts.index(host), key)
        if split_type == COMM_TYPE_HW_UNGUIDED:
            if info is not None and info != INFO_NULL:
                info.Set("mpi_hw_resource_type", "mpi_shared_memory")
            if new:
                new.Set_info(Info.Create({"mpi_hw_resource_type": "mpi_shared_memory"}))
        return new

    @classmethod
    def Get_parent(cls):
        """Return the parent intercommunicator of a spawned process (or COMM_NULL)."""
        get_parent = _IMPL["get_parent"]
        return get_parent()

    @classmethod
    def Join(cls, fd: int):
        """Interconnect two processes connected by a socket."""
        join = _IMPL["join"]
        return join(fd)

    # -- bsend buffers -------------------------------------------------------
    def Attach_buffer(self, buf) -> None:
        """Attach a buffer used by this communicator's buffered sends."""
        bsend.attach(self._impl(), buf)

    def Detach_buffer(self):
        """Detach this communicator's buffer (waits for its messages to leave)."""
        return bsend.detach(self._impl())

    def Flush_buffer(self) -> None:
        """Wait until every buffered send of this communicator has left."""
        bsend.flush(self._impl())

    def Iflush_buffer(self):
        """Nonblocking ``Flush_buffer``."""
        return bsend.iflush(self._impl())

    # -- fault tolerance (ULFM) ---------------------------------------------------
    def Revoke(self) -> None:
        """Revoke the communicator: pending and future communication on it fails."""
        revoke = _IMPL["revoke"]
        revoke(self._impl_any())

    def Is_revoked(self) -> bool:
        """Whether the communicator has been revoked."""
        return self._impl_any().revoked

    def Get_failed(self) -> Group:
        """Group of the processes of the communicator known to have failed."""
        get_failed = _IMPL["get_failed"]
        return get_failed(self._impl_any())

    def Ack_failed(self, num_to_ack=None) -> int:
        """Acknowledge failures; returns the number of acknowledged failed processes."""
        ack_failed = _IMPL["ack_failed"]
        return ack_failed(self._impl_any(), num_to_ack)

    def Agree(self, flag: int) -> int:
        """Agree on a flag (bitwise AND) among the surviving processes."""
        agree = _IMPL["agree"]
        return agree(self, flag)

    def Iagree(self, flag):
        """Nonblocking ``Agree``; ``flag`` is a one-element integer buffer."""
        iagree = _IMPL["iagree"]
        return iagree(self, flag)

    def Shrink(self):
        """Create a communicator of the surviving processes."""
        shrink = _IMPL["shrink"]
        return shrink(self)

    def Ishrink(self):
        """Nonblocking ``Shrink``: returns ``(comm, request)``."""
        return self.Shrink(), Request._done_request()

    # -- partitioned point-to-point -------------------------------------------------
    def Psend_init(self, buf, partitions: int, dest: int, tag: int = 0, info=INFO_NULL):
        """Create a partitioned send request."""
        from .part import psend_init     # deferred: .part loads at the first partitioned call
        return psend_init(self, buf, partitions, dest, tag)

    def Precv_init(self, buf, partitions: int, source: int = -1, tag: int = -1,
                   info=INFO_NULL):
        """Create a partitioned receive request."""
        from .part import precv_init     # deferred: .part loads at the first partitioned call
        return precv_init(self, buf, partitions, source, tag)


class Intracomm(Comm):
    """Intracommunicator."""

    __slots__ = ()
    _KINDS = ("intra", "cart", "graph", "dist_graph")

    def Create_intercomm(self, local_leader: int, peer_comm, remote_leader: int,
                         tag: int = 0):
        """Create an intercommunicator with the group of ``remote_leader`` (collective)."""
        create_intercomm = _IMPL["create_intercomm"]
        return create_intercomm(self, local_leader, peer_comm, remote_leader, tag)

    @classmethod
    def Create_from_group(cls, group: Group, stringtag: str = "org.mpi4py",
                          info: Info = INFO_NULL, errhandler=None):
        """Create a communicator from a group (collective over the group, no parent)."""
        members = group._check()
        if ENGINE.me not in members:
            raise Exception(ERR_GROUP, "calling process is not in the group")
        tmp = CommImpl(0, members, coll_kind=KIND_CGRP)
        tmp.coll_seq = _string_tag(stringtag)
        new = CommImpl(new_ctx(tmp), members)
        if errhandler is not None:
            new.errhandler = Errhandler._checked(errhandler, "comm")
        if info:
            new.info.update(info.items())
        return cls._wrap(new)

    # topologies (see .topo)
    def Create_cart(self, dims, periods=None, reorder: bool = False):
        """Create a communicator with Cartesian topology."""
        create_cart = _IMPL["create_cart"]
        return create_cart(self, dims, periods, reorder)

    def Create_graph(self, index, edges, reorder: bool = False):
        """Create a communicator with graph topology."""
        create_graph = _IMPL["create_graph"]
        return create_graph(self, index, edges, reorder)

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None,
                                   destweights=None, info=INFO_NULL, reorder: bool = False):
        """Create a distributed graph communicator from each process's neighbors."""
        create_dist_graph_adjacent = _IMPL["create_dist_graph_adjacent"]
        return create_dist_graph_adjacent(self, sources, destinations, sourceweights,
                                          destweights, reorder)

    def Create_dist_graph(self, sources, degrees, destinations, weights=None,
                          info=INFO_NULL, reorder: bool = False):
        """Create a distributed graph communicator from arbitrary edge lists."""
        create_dist_graph = _IMPL["create_dist_graph"]
        return create_dist_graph(self, sources, degrees, destinations, weights, reorder)

    def Cart_map(self, dims, periods=None) -> int:
        """Return an optimal placement of the calling process on a Cartesian topology."""
        cart_map = _IMPL["cart_map"]
        return cart_map(self, dims, periods)

    def Graph_map(self, index, edges) -> int:
        """Return an optimal placement of the calling process on a graph topology."""
        graph_map = _IMPL["graph_map"]
        return graph_map(self, index, edges)

    # dynamic processes (see .dynproc)
    def Spawn(self, command, args=None, maxprocs: int = 1, info=INFO_NULL, root: int = 0,
              errcodes=None):
        """Spawn instances of a single MPI application."""
        spawn = _IMPL["spawn"]
        return spawn(self, [command], [args], [maxprocs], [info], root, errcodes)

    def Spawn_multiple(self, command, args=None, maxprocs=None, info=INFO_NULL,
                       root: int = 0, errcodes=None):
        """Spawn instances of multiple MPI applications."""
        spawn_multiple = _IMPL["spawn_multiple"]
        return spawn_multiple(self, command, args, maxprocs, info, root, errcodes)

    def Accept(self, port_name: str, info=INFO_NULL, root: int = 0):
        """Accept a request to form a new intercommunicator."""
        accept = _IMPL["accept"]
        return accept(self, port_name, root)

    def Connect(self, port_name: str, info=INFO_NULL, root: int = 0):
        """Request a connection to a server to form a new intercommunicator."""
        connect = _IMPL["connect"]
        return connect(self, port_name, root)


def _string_tag(s: str) -> int:
    return zlib.crc32(s.encode()) & 0x3FFFFF


COMM_NULL = Comm._constant(None)
COMM_WORLD = Intracomm._constant(None)
# ERRORS_ARE_FATAL ends the job through the world communicator (errhandler
# does not import this module)
set_abort(lambda code: COMM_WORLD.Abort(code))
COMM_SELF = Intracomm._constant(None)


def init_predefined():
    """Create COMM_WORLD (context 0) and COMM_SELF (context 1)."""
    w = ENGINE.world
    world = CommImpl(0, range(w.size), name="MPI_COMM_WORLD")
    me = CommImpl(1, [w.rank], name="MPI_COMM_SELF")
    for c in (world, me):
        c.predefined = True
        c.errhandler = ERRORS_RETURN_IMPL
    COMM_WORLD._h = world
    COMM_SELF._h = me


def finalize_predefined():
    """MPI_Finalize: delete COMM_SELF's attributes first (newest first), then WORLD's."""
    for comm in (COMM_SELF, COMM_WORLD):
        c = comm._h
        if c is not None:
            attr.delete_all(comm, c.attrs)


def register_kind(kind, cls):
    _KIND_CLASS[kind] = cls


register_kind("intra", Intracomm)
register_family(Comm)
