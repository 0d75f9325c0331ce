"""User-level failure mitigation (ULFM): revoke, failed-process queries,
agreement and shrink, on ucxpy's failure detection.

Theory of operation
-------------------
*Failure detection* is ucxpy's: a dead peer fails its endpoint (launcher
notice, pidfd, connection loss), which fails every receive naming it, so
operations on a communicator with a dead member raise ``ERR_PROC_FAILED``.
``Get_failed`` reports the members whose endpoint has failed.

*Revoke* marks the communicator here and sends a notice (active message
``AM_ULFM``, naming the context id) to every other member; a member that
gets it marks its communicator with that context and the sender as
revoked.  Revoking fails every receive posted on the communicator's context
with ``ERR_REVOKED``, and every later call on it except the fault-tolerance
ones, queries and ``Free`` raises ``ERR_REVOKED``.

*Agreement* (``Agree``, ``Shrink``; the algorithm is the collective
engine's :func:`ucxpy.coll.agree`, run on the communicator's participants,
both groups of an intercommunicator in one order, with a tag of the
communicator's own agreement sequence): the survivors combine a value through a
coordinator, the lowest-ranked member each of them believes alive.  Every
participant sends the coordinator its value and the failures it knows; the
coordinator combines the values of the members it hears from (a member that
dies meanwhile is added to the failed set), and sends every survivor the
result with the union of the failed sets.  A participant whose coordinator
dies (or was dead already, unknown to it) sends the same contribution, with
the same tag, to the next live member, which takes it from its queue of
arrived messages when it finds itself coordinator.  Failure knowledge only
grows and is never wrong, so all survivors end at the same coordinator.
Failures before or during an agreement are tolerated, except the death of a
coordinator after it has sent the result to some survivors but not all (a
full consensus protocol would need another round).
"""
from __future__ import annotations

import pickle

from ucxpy import coll as engine

from .comm import provide as _provide
from .comm import CommImpl, claim_ctx, next_ctx_value
from .engine import CTX_SHIFT, ENGINE, KIND_CTRL, SEQ_SHIFT
from .exceptions import ERR_ARG, ERR_PROC_FAILED, ERR_REVOKED, Exception
from .group import Group
from .ops import GenOp, run
from .request import Request

AM_ULFM = 0x4D70
_SEQ_AGREE = 2 << SEQ_SHIFT                   # distinct from intercomm creation (seq 0)
_state = {"setup": False}


def serve_notices():
    """Install the handler of revoke notices (at MPI initialization)."""
    _setup()


def _setup():
    if not _state["setup"]:
        _state["setup"] = True
        ENGINE.worker.set_am_handler(AM_ULFM, _on_notice)


def _participants(c):
    """Every process of ``c`` in one order all of them agree on."""
    if c.remote is None:
        return list(c.group)
    low_first = c.group[0] < c.remote[0]
    return list(c.group + c.remote) if low_first else list(c.remote + c.group)


def _failed_wids(c):
    ENGINE.worker.check_peers()
    out = []
    for w in _participants(c):
        ep = ENGINE.eps.get(w)
        if ep is not None and ep.failed is not None and w != ENGINE.me:
            out.append(w)
    return out


# -- revoke ------------------------------------------------------------------------
def _mark_revoked(c) -> None:
    if c.revoked:
        return
    c.revoked = True
    exc = Exception(ERR_REVOKED, "the communicator was revoked")
    ctx_mask = ((1 << 20) - 1) << CTX_SHIFT
    ENGINE.worker.fail_receives(c.ctx << CTX_SHIFT, ctx_mask | (7 << 60), exc)   # P2P
    for kind in range(1, 6):                                                      # coll ...
        ENGINE.worker.fail_receives((kind << 60) | (c.ctx << CTX_SHIFT), ctx_mask | (7 << 60),
                                    exc)


def revoke(c) -> None:
    _setup()
    _mark_revoked(c)
    if c.local is not None:
        _mark_revoked(c.local)
    note = pickle.dumps(("revoke", c.ctx))
    for w in set(_participants(c)) - {ENGINE.me}:
        ep = ENGINE.eps.get(w)
        if ep is not None and ep.failed is None:
            try:
                ep.am_send_nb(AM_ULFM, b"", note)
            except Exception:
                pass
            except BaseException:       # a peer that died meanwhile
                pass


def _on_notice(msg):
    kind, ctx = pickle.loads(bytes(msg.data))
    if kind == "revoke":
        for c in list(ENGINE.comms.get(ctx, ())):
            if msg.source in c.group or (c.remote is not None and msg.source in c.remote):
                _mark_revoked(c)
    return False


# -- queries ---------------------------------------------------------------------------
def get_failed(c):
    return Group._of(_failed_wids(c))


def ack_failed(c, num_to_ack=None):
    failed = _failed_wids(c)
    if num_to_ack is not None:
        failed = failed[:max(int(num_to_ack), 0)]
    c.acked = frozenset(c.acked) | frozenset(failed)
    return len(c.acked)


# -- agreement -------------------------------------------------------------------------
class _Members:
    """An agreement's participants (:func:`_participants`) as a team of the
    collective engine: their endpoints (None where there is none) and
    worker ids by position, this process's position."""
    __slots__ = ("worker", "eps", "peers", "rank")

    def __init__(self, wids):
        self.worker = ENGINE.worker
        self.peers = list(wids)
        self.eps = [ENGINE.eps.get(w) for w in wids]
        self.rank = self.peers.index(ENGINE.me)


def g_agree(c, value, combine):
    """Generator: ``(combined value, failed wids)`` agreed by the survivors
    (:func:`ucxpy.coll.agree`, on the communicator's participants)."""
    _setup()
    # its own sequence: survivors may have run different numbers of collectives
    # before they noticed a failure, but every survivor starts every agreement
    c.ft_seq += 1
    epoch = c.ft_seq & 0xFFFF
    parts = _participants(c)
    team = _Members(parts)
    known = {parts.index(w) for w in _failed_wids(c)}
    tag = KIND_CTRL | _SEQ_AGREE | (c.ctx << CTX_SHIFT) | (epoch << 8)
    acc, failed = yield from engine.agree(team, value, combine, tag, known)
    return acc, {parts[r] for r in failed}


def agree(comm, flag):
    c = comm._impl_any()
    if not isinstance(flag, int):
        raise TypeError("Agree needs an int flag")
    acc, failed = run(g_agree(c, int(flag), lambda a, b: a & b))
    unacked = [w for w in failed if w not in c.acked]
    if unacked:
        raise Exception(ERR_PROC_FAILED, f"{len(unacked)} process(es) failed "
                                         "(acknowledge them with Ack_failed)")
    return acc


def _flag_view(flag):
    if isinstance(flag, int):
        raise TypeError("Iagree needs a one-element integer buffer, not an int")
    mv = memoryview(flag)
    if mv.readonly:
        raise TypeError("Iagree needs a writable buffer")
    if mv.nbytes != 4:
        raise ValueError(f"Iagree needs exactly one C int (4 bytes), got {mv.nbytes} bytes")
    return mv.cast("B").cast("i")


def iagree(comm, flag):
    c = comm._impl_any()
    view = _flag_view(flag)

    def gen():
        acc, failed = yield from g_agree(c, int(view[0]), lambda a, b: a & b)
        view[0] = acc
        return None
    return Request._from(GenOp(gen()))


def shrink(comm):
    c = comm._impl_any()
    ctx, failed = run(g_agree(c, next_ctx_value(), max))
    local = [w for w in c.group if w not in failed]
    if c.remote is None:
        new = CommImpl(claim_ctx(ctx), local)
    else:
        new = CommImpl(claim_ctx(ctx), local, [w for w in c.remote if w not in failed])
    new.errhandler = c.errhandler
    return type(comm)._new(new)


_ = ERR_ARG


# the communicator's methods that use these (.comm does not import this module)
_provide(ack_failed=ack_failed, agree=agree, get_failed=get_failed, iagree=iagree,
         revoke=revoke, shrink=shrink)
