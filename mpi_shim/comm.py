"""Communicators: contexts, groups, creation and teardown.

Every communicator owns a *context id* (agreed collectively as the maximum
of the members' next free id), so its point-to-point and collective
traffic carry distinct ucxpy tags (see the layout in :mod:`.request`) and
never match traffic of another communicator.  Communicators created by one
``Split`` share the id: their members are disjoint.
"""
from __future__ import annotations

from .cco import Coll
from .coll import allreduce_max
from .exceptions import (ERR_ARG, ERR_COMM, ERR_GROUP, ERR_KEYVAL, ERR_OTHER,
                         ERR_UNSUPPORTED_OPERATION, Exception)
from .group import CONGRUENT, IDENT, SIMILAR, UNDEFINED, UNEQUAL, Group
from .info import (ERRORS_ARE_FATAL, ERRORS_RETURN, INFO_NULL, APPNUM, HOST, IO,
                   LASTUSEDCODE, TAG_UB_KEY, UNIVERSE_SIZE, WTIME_IS_GLOBAL, Errhandler,
                   Info, new_keyval)
from .p2p import P2P
from .request import CTX_BITS, CTX_SHIFT, ENGINE, KIND_COLL, TAG_UB, Request

COMM_TYPE_SHARED = 1
COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED = 2, 3, 4
KIND_CGRP = 3 << 60
_state = {"next_ctx": 2}
_keyvals = {}          # keyval -> (copy_fn, delete_fn, nopython)


class CommImpl:
    """Shared state of one communicator handle."""

    def __init__(self, ctx, ranks, name=""):
        self.ctx = ctx
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.w2c = {w: i for i, w in enumerate(self.ranks)}
        me = ENGINE.world.rank
        self.rank = self.w2c.get(me, UNDEFINED)
        self.eps = [ENGINE.eps[w] for w in self.ranks]
        self.worker = ENGINE.worker
        self.p2p = ctx << CTX_SHIFT
        self.coll = KIND_COLL | (ctx << CTX_SHIFT)
        self.coll_seq = 0
        self.ssend_seq = 0
        self.name = name
        self.info = {}
        self.attrs = {}
        self.errhandler = ERRORS_ARE_FATAL if False else ERRORS_RETURN
        self.topo = None
        self.freed = False
        self.locks = {}

    def coll_tag(self) -> int:
        """Base tag of the next collective (all members call in one order)."""
        self.coll_seq = (self.coll_seq + 1) & 0x7FFFFF
        return self.coll | (self.coll_seq << 8)


def _new_ctx(parent: CommImpl) -> int:
    ctx = allreduce_max(parent, _state["next_ctx"])
    if ctx >= 1 << CTX_BITS:
        raise Exception(ERR_OTHER, "out of communicator context ids")
    _state["next_ctx"] = ctx + 1
    return ctx


class Comm(P2P, Coll):
    """Communication context (``MPI.Comm``)."""

    __slots__ = ("_c", "__weakref__")

    def __init__(self, comm=None):
        if comm is None:
            self._c = None
        elif isinstance(comm, Comm):
            self._c = comm._c
        else:
            raise TypeError("expected a Comm")

    @classmethod
    def _wrap(cls, impl):
        c = cls.__new__(cls)
        c._c = impl
        return c

    def _impl(self) -> CommImpl:
        c = self._c
        if c is None:
            raise Exception(ERR_COMM, "invalid communicator (COMM_NULL)")
        return c

    def _rank_of_world(self, w):
        return self._c.w2c.get(w, w)

    def __eq__(self, other):
        if not isinstance(other, Comm):
            return NotImplemented
        return self._c is other._c

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return id(self._c)

    def __bool__(self):
        return self._c is not None

    def __repr__(self):
        return f"<{type(self).__name__} {self.Get_name()}>"

    def __reduce__(self):
        for name in ("COMM_NULL", "COMM_WORLD", "COMM_SELF"):
            if self is globals().get(name):
                return name
        if self._c is None:
            return (type(self), ())
        for name in ("COMM_WORLD", "COMM_SELF"):
            if self._c is globals()[name]._c:
                return (_predefined_copy, (type(self), name))
        raise ValueError("cannot pickle a communicator")

    # -- basic queries -----------------------------------------------------------
    def Get_size(self) -> int:
        return self._impl().size

    def Get_rank(self) -> int:
        return self._impl().rank

    size = property(Get_size)
    rank = property(Get_rank)

    def Get_group(self) -> Group:
        return Group._of(self._impl().ranks)

    group = property(Get_group)

    def Get_name(self) -> str:
        return "MPI_COMM_NULL" if self._c is None else self._c.name

    def Set_name(self, name: str) -> None:
        self._impl().name = name

    name = property(Get_name, Set_name)

    def Is_inter(self) -> bool:
        self._impl()
        return False

    def Is_intra(self) -> bool:
        return not self.Is_inter()

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self):
        self._impl()
        return UNDEFINED

    topology = property(Get_topology)

    def Compare(self, comm) -> int:
        a, b = self._impl(), comm._impl()
        if a is b:
            return IDENT
        if a.ranks == b.ranks:
            return CONGRUENT
        return SIMILAR if sorted(a.ranks) == sorted(b.ranks) else UNEQUAL

    def Get_info(self) -> Info:
        return Info.Create(dict(self._impl().info))

    def Set_info(self, info: Info) -> None:
        if info:
            self._impl().info.update(info.items())

    info = property(Get_info, Set_info)

    def Get_errhandler(self) -> Errhandler:
        return Errhandler(self._impl().errhandler)

    def Set_errhandler(self, errhandler) -> None:
        self._impl().errhandler = Errhandler(errhandler)

    def Call_errhandler(self, errorcode) -> None:
        pass

    def Abort(self, errorcode: int = 0):
        ENGINE.world.abort(f"MPI_Abort(errorcode={errorcode})")
        import os
        os._exit(errorcode if 0 < errorcode < 256 else 1)

    # -- attributes ----------------------------------------------------------------
    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        kv = new_keyval()
        _keyvals[kv] = (copy_fn, delete_fn)
        return kv

    @classmethod
    def Free_keyval(cls, keyval):
        _keyvals.pop(keyval, None)
        return -1

    def Get_attr(self, keyval):
        c = self._impl()
        if keyval == TAG_UB_KEY:
            return TAG_UB
        if keyval in (HOST, IO):
            return -1 if keyval == HOST else c.rank
        if keyval == WTIME_IS_GLOBAL:
            return 0
        if keyval == UNIVERSE_SIZE:
            return ENGINE.world.size
        if keyval in (APPNUM, LASTUSEDCODE):
            return None
        return c.attrs.get(keyval)

    def Set_attr(self, keyval, attrval):
        c = self._impl()
        if keyval not in _keyvals:
            raise Exception(ERR_KEYVAL, "invalid keyval")
        self.Delete_attr(keyval) if keyval in c.attrs else None
        c.attrs[keyval] = attrval

    def Delete_attr(self, keyval):
        c = self._impl()
        if keyval in c.attrs:
            val = c.attrs.pop(keyval)
            fn = _keyvals.get(keyval, (None, None))[1]
            if fn is not None:
                fn(self, keyval, val)

    def _copy_attrs(self, new: CommImpl):
        for kv, val in self._c.attrs.items():
            fn = _keyvals.get(kv, (None, None))[0]
            if fn is None or fn is False:
                continue
            if fn is True:
                new.attrs[kv] = val
            else:
                out = fn(self, kv, val)
                if out is not NotImplemented:
                    new.attrs[kv] = out

    # -- creation -------------------------------------------------------------------
    def Dup(self, info=None):
        c = self._impl()
        new = CommImpl(_new_ctx(c), c.ranks)
        self._copy_attrs(new)
        if info:
            new.info.update(info.items())
        else:
            new.info.update(c.info)
        return type(self)._wrap(new)

    def Dup_with_info(self, info):
        return self.Dup(info)

    def Idup(self, info=None):
        return self.Dup(info), Request()

    def Idup_with_info(self, info):
        return self.Idup(info)

    def Clone(self):
        return self.Dup()

    def Free(self):
        c = self._impl()
        if self is COMM_WORLD or self is COMM_SELF or c is _WORLD or c is _SELF:
            raise Exception(ERR_COMM, "cannot free a predefined communicator")
        for kv in list(c.attrs):
            self.Delete_attr(kv)
        c.freed = True
        self._c = None

    def Disconnect(self):
        self.Free()

    def free(self):
        if self._c is not None and self._c not in (_WORLD, _SELF):
            self.Free()

    def Split(self, color=0, key=0):
        c = self._impl()
        ctx = _new_ctx(c)
        table = self.allgather((color, key))
        if color == UNDEFINED or color is None:
            return Intracomm()
        members = sorted((k, r) for r, (col, k) in enumerate(table) if col == color)
        return Intracomm._wrap(CommImpl(ctx, [c.ranks[r] for _, r in members]))

    def Split_type(self, split_type, key=0, info=None):
        valid = split_type == COMM_TYPE_SHARED
        if split_type in (COMM_TYPE_HW_GUIDED, COMM_TYPE_RESOURCE_GUIDED):
            valid = bool(info) and info.get("mpi_hw_resource_type") == "mpi_shared_memory"
        elif split_type not in (UNDEFINED, COMM_TYPE_SHARED, COMM_TYPE_HW_UNGUIDED):
            raise Exception(ERR_ARG, f"unknown split type {split_type}")
        host = ENGINE.worker.address.host_id
        hosts = self.allgather(host if valid else None)
        if not valid:
            self.Split(UNDEFINED, key)
            return Intracomm()
        return self.Split(hosts.index(host), key)

    def Create(self, group: Group):
        c = self._impl()
        ranks = group._check()
        ctx = _new_ctx(c)
        if ENGINE.world.rank not in ranks:
            return Intracomm()
        return Intracomm._wrap(CommImpl(ctx, ranks))

    def Create_group(self, group: Group, tag: int = 0):
        c = self._impl()
        ranks = group._check()
        if ENGINE.world.rank not in ranks:
            raise Exception(ERR_GROUP, "calling process is not in the group")
        tmp = CommImpl(0, ranks)
        tmp.coll = KIND_CGRP | (c.ctx << CTX_SHIFT)
        tmp.coll_seq = tag & 0x3FFFFF
        ctx = allreduce_max(tmp, _state["next_ctx"])
        _state["next_ctx"] = ctx + 1
        return Intracomm._wrap(CommImpl(ctx, ranks))

    @classmethod
    def Create_from_group(cls, group, stringtag="org.mpi4py", info=None, errhandler=None):
        ranks = group._check()
        tmp = CommImpl(0, ranks)
        tmp.coll = KIND_CGRP
        tmp.coll_seq = sum(map(ord, stringtag)) & 0x3FFFFF
        ctx = allreduce_max(tmp, _state["next_ctx"])
        _state["next_ctx"] = ctx + 1
        return Intracomm._wrap(CommImpl(ctx, ranks))

    @classmethod
    def Get_parent(cls):
        return Intercomm()

    # -- bsend buffers -----------------------------------------------------------
    def Attach_buffer(self, buf):
        from . import MPI
        MPI.Attach_buffer(buf)

    def Detach_buffer(self):
        from . import MPI
        return MPI.Detach_buffer()

    def Flush_buffer(self):
        pass

    def Iflush_buffer(self):
        return Request()

    # -- misc -------------------------------------------------------------------
    def py2f(self):
        return id(self._c) if self._c else 0

    @property
    def handle(self):
        return self.py2f()


class Intracomm(Comm):
    __slots__ = ()

    def Create_intercomm(self, *args, **kwargs):
        raise NotImplementedError("intercommunicators are not supported by mpi_shim")

    def Create_cart(self, *args, **kwargs):
        raise NotImplementedError("topologies are not supported by mpi_shim")

    Create_graph = Create_dist_graph = Create_dist_graph_adjacent = Create_cart


class Intercomm(Comm):
    __slots__ = ()

    def Is_inter(self) -> bool:
        self._impl()
        return True


def _predefined_copy(cls, name):
    return cls(globals()[name])


COMM_NULL = Comm()
_WORLD = _SELF = None
COMM_WORLD = Intracomm()
COMM_SELF = Intracomm()


def init_predefined():
    """Create COMM_WORLD (context 0) and COMM_SELF (context 1)."""
    global _WORLD, _SELF
    w = ENGINE.world
    _WORLD = CommImpl(0, range(w.size), "MPI_COMM_WORLD")
    _SELF = CommImpl(1, [w.rank], "MPI_COMM_SELF")
    COMM_WORLD._c = _WORLD
    COMM_SELF._c = _SELF
