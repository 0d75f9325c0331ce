"""Blocking collectives of same-host communicators on a shared-memory team.

An intracommunicator whose members all map each other's memory (one host,
``UCXPY_SHM_COLL=y``) forms a :class:`ucxpy.shmteam.ShmTeam` at its
:data:`FORM_AT`-th blocking buffer collective, and from then on its
blocking ``Barrier``, ``Bcast``, ``Allreduce``, ``Reduce``, ``Allgather``
and ``Alltoall`` go through the team up to the sizes of
``ucxpy.schedules.TEAM_MAX`` instead of messages (``ucxpy-info -e -n
RANKS`` prints both tables).  Nonblocking and persistent collectives, the
pickle forms and the other collectives keep the message algorithms of
:mod:`.coll`; MPI never
matches a blocking collective with a nonblocking one, and both kinds keep
their own order, so the two coexist on one communicator.

Every choice here is a function of what MPI requires to be the same on every
member (the call, the communicator, the operation, the byte count), never
of a member's own buffer form, tracing or thread state: all members always
take the same path.  The layouts (derived datatypes, ``IN_PLACE``) are
packed into and unpacked out of plain bytes around the team's operation.
"""
from __future__ import annotations

import weakref
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

import ucxpy
from ucxpy import coll as engine
from ucxpy.schedules import team_max  # noqa: F401  (cco.py reads S.team_max)
from ucxpy.shmteam import ShmTeam

from .coll import _revoked
from .engine import ENGINE
from .exceptions import ERR_TRUNCATE, Exception, translate

#: a communicator forms its team at its second blocking buffer collective:
#: the many communicators that live for one collective never pay for one
FORM_AT = 2


def team(c) -> Optional[ShmTeam]:
    """``c``'s team, formed at its :data:`FORM_AT`-th call here (collective:
    every member calls this once per blocking buffer collective), or None."""
    t = c.shm
    if t is None:
        if c.remote is not None or c.size < 2 or c.rank < 0:
            c.shm = False
            return None
        c.shm_calls += 1
        if c.shm_calls < FORM_AT:
            return None
        t = c.shm = _form(c) or False
    return t or None


def usable(c) -> Optional[ShmTeam]:
    """:func:`team`, raising ERR_REVOKED when ``c`` has one and is revoked
    (a member that has not seen the revoke yet waits in the team until it
    does: the team's waits check it too)."""
    t = team(c)
    if t is not None:
        _check(c)
    return t


def _form(c) -> Optional[ShmTeam]:
    try:
        t = engine.form_shm_team(c, wait=ENGINE.wait_until)
    except ucxpy.UcxpyError as e:
        raise translate(e) from None
    if t is not None:
        ref = weakref.ref(c)
        t.check = lambda: _check(ref())
        weakref.finalize(c, t.close)             # a communicator dropped without Free
    return t


def _check(c) -> None:
    if c is not None and c.revoked:
        raise _revoked()


def release(c) -> None:
    """Leave ``c``'s team (Free, Disconnect)."""
    t = c.shm
    if t:
        t.close()
    c.shm = False


def run(fn, *args) -> None:
    """Run team operation ``fn`` (``t.allreduce``...), with ucxpy's errors as
    MPI's, as a span on the trace timeline when tracing (category ``coll``,
    the MPI name, ``algorithm`` ``shmteam_<operation>``)."""
    w = ENGINE.worker
    try:
        if w.tr is None:
            return fn(*args)
        with ucxpy.trace.span(w, "coll", fn.__name__.capitalize(), blocking=True,
                              algorithm="shmteam_" + fn.__name__):
            return fn(*args)
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


def reduces(op, x) -> bool:
    """Whether the team takes a reduction by ``op`` of array ``x`` (the
    same answer on every member: the op and the type signature are)."""
    h = op._h
    return h is not None and h.predefined and h.commute and not x.dtype.hasobject \
        and x.dtype.itemsize > 0


# -- bytes in and out of MPI messages ---------------------------------------------
def source(m) -> np.ndarray:
    """The packed bytes of message ``m`` as a byte array (no copy when contiguous)."""
    return np.frombuffer(m.pack(), np.uint8)


class Target:
    """Where a message's bytes land: its memory when contiguous, else a
    staging array unpacked by :meth:`done`."""

    __slots__ = ("m", "arr", "staged")

    def __init__(self, m, nbytes: Optional[int] = None):
        self.m = m
        c = m.contig()
        self.staged = c is None
        self.arr = np.empty(m.nbytes, np.uint8) if c is None else np.frombuffer(c, np.uint8)
        if nbytes is not None and nbytes != len(self.arr):
            raise Exception(ERR_TRUNCATE, f"a block of {nbytes} bytes for a receive block "
                                          f"of {len(self.arr)}")

    def done(self) -> None:
        if self.staged:
            self.m.unpack(self.arr)


def bcast(t: ShmTeam, c, m, root: int) -> None:
    """``Bcast`` of message ``m`` (the root's data, or where it goes)."""
    if c.rank == root:
        run(t.bcast, source(m), root)
        return
    d = Target(m)
    run(t.bcast, d.arr, root)
    d.done()


def allgather(t: ShmTeam, sm, parts) -> None:
    """``Allgather`` of ``sm`` (None: ``IN_PLACE``) into the equal ``parts``
    of the receive message (one per member)."""
    me = t.rank
    send = source(parts[me] if sm is None else sm)
    b = len(send)
    dsts = [Target(p, b) for p in parts]
    recv = np.empty(b * t.size, np.uint8)
    run(t.allgather, send, recv)
    for i, d in enumerate(dsts):
        if i != me or sm is not None:
            d.arr[:] = recv[i * b:(i + 1) * b]
            d.done()


def alltoall(t: ShmTeam, sparts, rparts) -> None:
    """``Alltoall`` of the equal ``sparts`` into the equal ``rparts``
    (messages; whole contiguous buffers go straight to :meth:`ShmTeam.alltoall`)."""
    blocks = [source(p) for p in sparts]
    b = len(blocks[0]) if blocks else 0
    if any(len(x) != b for x in blocks):
        raise Exception(ERR_TRUNCATE, "Alltoall send blocks of different sizes")
    dsts = [Target(p, b) for p in rparts]
    send = np.concatenate(blocks)
    recv = np.empty(b * t.size, np.uint8)
    run(t.alltoall, send, recv)
    for i, d in enumerate(dsts):
        d.arr[:] = recv[i * b:(i + 1) * b]
        d.done()
