"""Intercommunicators: a local and a remote group sharing one context.

Creation needs the two groups to agree on a context id and to learn each
other's members.  Inside each group that is a collective over the local
group; between the groups only the two *leaders* talk (over a peer
communicator, or directly when both groups are known), and each leader then
broadcasts what it learned to its group.  Point-to-point ranks on an
intercommunicator name processes of the remote group; collectives follow
MPI's intercommunicator forms (see :mod:`.coll`).
"""
from __future__ import annotations

import pickle
import zlib

from ucxpy import coll as engine

from .comm import provide as _provide
from .coll import _MAX, leader_swap, run
from .comm import Comm, CommImpl, Intracomm, claim_ctx, new_ctx, next_ctx_value, register_kind
from .engine import CTX_SHIFT, ENGINE, FULL, KIND_CGRP, KIND_CTRL, TAG_UB
from .errhandler import Errhandler
from .exceptions import ERR_ARG, ERR_COMM, ERR_GROUP, ERR_RANK, ERR_TAG, Exception
from .group import Group, UNDEFINED
from .info import INFO_NULL


def _check_leader(c: CommImpl, leader, what):
    if not (0 <= leader < c.size):
        raise Exception(ERR_RANK, f"invalid {what} {leader}")


def _exchange(dest_wid, tag, payload):
    """Leader to leader: send ``payload`` (any object) and receive the peer's."""
    rreq = ENGINE.worker.tag_recv_any_nb(tag, FULL, dest_wid)
    sreq = ENGINE.ep(dest_wid).tag_send_nb(pickle.dumps(payload, pickle.HIGHEST_PROTOCOL), tag)
    return run(_wait_pair(sreq, rreq))


def _wait_pair(sreq, rreq):
    yield [sreq, rreq]
    return pickle.loads(rreq.buf)


def _agree_local_then_leaders(local: CommImpl, leader, talk):
    """Max of next free context ids over the local group, combined by the
    leaders through ``talk((members, maxctx)) -> (remote members, remote max)``,
    broadcast to the group.  Returns ``(remote members, ctx)``."""
    mx = run(engine.allreduce(local, next_ctx_value(), _MAX, codec=engine.Codec()))
    out = None
    if local.rank == leader:
        remote, rmx = talk((local.group, mx))
        out = (tuple(remote), max(mx, rmx))
    remote, ctx = run(engine.bcast_obj(local, out, leader))
    return remote, claim_ctx(ctx)


def create_intercomm(intra, local_leader, peer_comm, remote_leader, tag):
    lc = intra._impl()
    if lc.kind == "inter":
        raise Exception(ERR_COMM, "Create_intercomm needs an intracommunicator")
    _check_leader(lc, local_leader, "local leader")
    if not (0 <= tag <= TAG_UB):
        raise Exception(ERR_TAG, f"invalid tag {tag}")

    def talk(mine):
        pc = peer_comm._impl()
        if not (0 <= remote_leader < pc.size):
            raise Exception(ERR_RANK, f"invalid remote leader {remote_leader}")
        return _exchange(pc.peers[remote_leader], KIND_CTRL | pc.p2p | tag, mine)
    remote, ctx = _agree_local_then_leaders(lc, local_leader, talk)
    if set(remote) & set(lc.group):
        raise Exception(ERR_COMM, "the local and remote groups overlap")
    return _finish(lc, CommImpl(ctx, lc.group, remote))


def create_from_groups(local_group, local_leader, remote_group, remote_leader, stringtag,
                       info, errhandler):
    lg, rg = local_group._check(), remote_group._check()
    if ENGINE.me not in lg:
        raise Exception(ERR_GROUP, "calling process is not in the local group")
    if not (0 <= local_leader < len(lg)) or not (0 <= remote_leader < len(rg)):
        raise Exception(ERR_RANK, "invalid leader rank")
    if set(lg) & set(rg):
        raise Exception(ERR_GROUP, "the local and remote groups overlap")
    code = zlib.crc32(stringtag.encode()) & 0x3FFFFF
    tmp = CommImpl(0, lg, coll_kind=KIND_CGRP)
    tmp.coll_seq = code

    def talk(mine):
        return _exchange(rg[remote_leader], KIND_CTRL | (code << 8), mine)
    remote, ctx = _agree_local_then_leaders(tmp, local_leader, talk)
    if tuple(remote) != tuple(rg):
        raise Exception(ERR_GROUP, "the remote group does not match the remote side's group")
    new = CommImpl(ctx, lg, rg)
    if errhandler is not None:
        new.errhandler = Errhandler._checked(errhandler, "comm")
    if info is not None and info != INFO_NULL and info:
        new.info.update(info.items())
    return Intercomm._wrap(new)


def _finish(parent: CommImpl, new: CommImpl):
    new.errhandler = parent.errhandler
    return Intercomm._wrap(new)


def _swap_and_share(c: CommImpl, mine):
    """Every member gets the remote group's value of ``mine`` (the remote
    leader's), through the leaders and a local broadcast."""
    return run(leader_swap(c, mine))


def inter_split(comm, color, key):
    c = comm._impl()
    ctx = new_ctx(c)
    local = Intracomm._wrap(c.local)
    table = local.allgather((color, key))
    rtable = _swap_and_share(c, table)
    if color == UNDEFINED:
        return Intercomm()
    mine = [c.group[r] for k, r in sorted((k, r) for r, (col, k) in enumerate(table)
                                          if col == color)]
    theirs = [c.remote[r] for k, r in sorted((k, r) for r, (col, k) in enumerate(rtable)
                                             if col == color)]
    if not theirs:
        return Intercomm()
    return _finish(c, CommImpl(ctx, mine, theirs))


def inter_create(comm, group):
    c = comm._impl()
    sel = group._check()
    if not set(sel) <= set(c.group):
        raise Exception(ERR_GROUP, "the group is not a subgroup of the local group")
    ctx = new_ctx(c)
    rsel = _swap_and_share(c, sel)
    if ENGINE.me not in sel or not rsel or not sel:
        return Intercomm()
    return _finish(c, CommImpl(ctx, sel, rsel))


def local_comm(comm):
    """An Intracomm over an intercommunicator's local group."""
    return Intracomm._wrap(comm._impl().local)


class Intercomm(Comm):
    """Intercommunicator."""

    __slots__ = ()
    _KINDS = ("inter",)

    def Get_remote_group(self) -> Group:
        """Access the remote group."""
        return Group._of(self._impl_any().remote)

    def Get_remote_size(self) -> int:
        """Return the number of processes in the remote group."""
        return len(self._impl_any().remote)

    remote_group = property(Get_remote_group, doc="Remote group.")
    remote_size = property(Get_remote_size, doc="Number of processes in the remote group.")

    def Merge(self, high: bool = False):
        """Merge the two groups into an intracommunicator (``high`` orders the groups)."""
        c = self._impl()
        ctx = new_ctx(c)
        rhigh = _swap_and_share(c, bool(high))
        if bool(high) == rhigh:
            low_first = c.group[0] < c.remote[0]
        else:
            low_first = not high
        members = c.group + c.remote if low_first else c.remote + c.group
        new = CommImpl(ctx, members)
        new.errhandler = c.errhandler
        return Intracomm._wrap(new)

    @classmethod
    def Create_from_groups(cls, local_group, local_leader, remote_group, remote_leader,
                           stringtag="org.mpi4py", info=INFO_NULL, errhandler=None):
        """Create an intercommunicator from a local and a remote group."""
        return create_from_groups(local_group, local_leader, remote_group, remote_leader,
                                  stringtag, info, errhandler)


register_kind("inter", Intercomm)
_ = (ERR_ARG, CTX_SHIFT)


# the communicator's methods that make these (.comm does not import this module)
_provide(create_intercomm=create_intercomm, inter_create=inter_create, inter_split=inter_split,
         local_comm=local_comm)
