"""Collectives among same-host processes through shared segments.

A :class:`ShmTeam` is a group of processes on one host (UCC's ``tl/shm``,
the shared-memory collectives of MPICH and Open MPI).  Each member owns one
segment (``Worker.mem_map(length, shared=True)``) that every other member
maps (``RemoteKey.map``): two counters, each in cache lines of its own, and
two data slots.  An operation copies a member's contribution into its own
slot and publishes it by raising its counter; the others wait for the
counters and copy or reduce straight out of the peers' slots.  No message
moves: a small allreduce costs one synchronisation instead of log2(n)
rounds of requests, and an oversubscribed rank waits on a word in memory
instead of for its partner's time slice and a progress pass.

Theory of operation
-------------------
Every member runs the team's operations in one order (the layer above
guarantees it: MPI's collective ordering), numbered ``k = 1, 2, ...``;
operation ``k`` uses slot ``k % 2`` of every segment.  Operations larger
than a slot run as several, one per slot-sized piece.

=============  ==========================================================
counter        meaning once member ``r`` has stored ``k`` in it
=============  ==========================================================
``seq[r]``     ``r`` has begun operation ``k`` (its contribution, if the
               operation has one, is in its slot ``k % 2``), so it has
               finished ``k - 1``: it reads nobody's slot ``(k - 1) % 2``
               any more
``red[r]``     ``r``'s block of operation ``k``'s reduction is in its slot
=============  ==========================================================

A member writes its slot ``k % 2`` for operation ``k`` only once every
``seq`` is at least ``k - 1``: the slot's previous readers (operation
``k - 2``) are done with it.  The counters are C11 sequentially
consistent atomics (``ucxpy.atomics``): a store publishes the data
written before it, a load that sees it makes that data visible.

Each operation also leaves its signature (its kind and byte count) beside
``seq``, in word ``k % 4``, before raising ``seq``; a member that waited
for the others' ``seq`` compares their signatures with its own before it
reads their slots, so members that called different collectives or sizes
raise :class:`~ucxpy.errors.TruncationError` instead of reducing or
copying mismatched bytes.  Four words, because a member that only reads (a
broadcast's non-root) may begin operation ``k + 2`` while another still
checks ``k``: it begins ``k + 3`` only after the root of ``k + 2`` saw
every ``seq`` at ``k + 1``.

Waiting spins on the counter briefly, then goes through the worker's wait
loop (progress, failure checks, oversubscription-aware yielding, the
timeout), and raises if a member's endpoint has failed or the ``check``
callback raises (a layer's revoked communicator): a dead member never
leaves the others waiting.

A member that waits long sleeps (``worker.wait_until`` with its long naps)
and is rung awake (:mod:`ucxpy.doorbell`): before sleeping it stores in its
own segment's ``sleep`` word which counter of which member it waits for and
for what value, and counts itself in member 0's ``sleepers`` word; a member
that raises a counter then reads ``sleepers`` and, if anyone sleeps, rings
those that wait for this counter.  Both sides store first and load after
(sequentially consistent), so either the sleeper sees the counter on its
last look or the raiser sees the sleeper.  Where the members cannot ring each
other (another network namespace) the waits nap briefly, as before.

Forming a team is itself collective (:meth:`ShmTeam.create`): the layer
supplies the allgather that exchanges the segments' keys and then whether
every member could map every other one; if any could not (another host,
``UCXPY_SHM_COLL=n``, no same-host transport in ``UCXPY_TLS``, the
per-process team limit), nobody uses the team.  Which calls a layer gives
its team, and which of the reduction algorithms runs, are size choices in
:mod:`ucxpy.schedules` (``TEAM_MAX``, ``WHOLE_REDUCE_MAX``) beside the
message schedules'.
"""
from __future__ import annotations

import weakref
from os import sched_yield
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Sequence

from .lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from . import doorbell
from .atomics import add64, address_of, load64, pointer, store64
from .errors import ConnectionLost, TruncationError, UcxpyError
from .schedules import TEAM_MAX, WHOLE_REDUCE_MAX, block_bounds, team_max
from .transports.base import Caps

#: byte offsets in a segment: the two counters, 128 bytes apart (a cache
#: line each and the line the adjacent-line prefetcher pairs with it), then
#: the two slots.  SLEEP (the owner's, beside its SEQ: only the owner writes
#: either) says what the owner sleeps on; SLEEPERS, used in member 0's
#: segment only, counts the members asleep.  SIG (four words beside SEQ, by
#: operation number mod 4) is what the owner's operation is: its kind and
#: bytes, written before SEQ publishes it
SEQ, SIG, SLEEP, RED, SLEEPERS, HEADER = 0, 8, 64, 128, 192, 256
#: operation kinds in a signature (bits 56 and up; the bytes below)
_BARRIER, _BCAST, _ALLGATHER, _ALLTOALL, _REDUCE = 1, 2, 3, 4, 5
#: which counter a sleeper waits on (bit 16 of its SLEEP word)
_ON_SEQ, _ON_RED = 0, 1
#: the longest nap of a member that cannot be rung (ucxpy.worker.MAX_NAP)
UNRUNG_NAP = 2e-3
_MINUS_ONE = (1 << 64) - 1

#: counter loads spun on before the worker's wait loop takes over (more
#: ranks than CPUs: sched_yield calls, each followed by one load)
SPINS = 200
YIELDS = 64

_TEAMS: "weakref.WeakSet[ShmTeam]" = weakref.WeakSet()


class ShmTeam:
    """The same-host members of a group, ranks ``0..size-1``, ``rank`` this
    process; built by :meth:`create`.  Operations take numpy arrays (flat,
    C-contiguous; byte arrays for the data-movement ones) and block."""

    def __init__(self, worker, rank: int, eps: Sequence, mh, views: List[memoryview],
                 slot: int, wait: Optional[Callable] = None,
                 bells: Optional[Sequence[Optional[bytes]]] = None):
        self.worker = worker
        self.rank, self.size = rank, len(views)
        self.eps = list(eps)
        self.slot = slot
        self.check: Optional[Callable[[], None]] = None
        self._mh = mh
        self._views = views                     # the mappings live as long as these
        arrays = [np.frombuffer(v, np.uint8) for v in views]
        self._slots = [(a[HEADER:HEADER + slot], a[HEADER + slot:HEADER + 2 * slot])
                       for a in arrays]
        # the same slots as byte memoryviews: small copies through them cost
        # half what numpy's slicing does
        self._bytes = [(memoryview(s0), memoryview(s1)) for s0, s1 in self._slots]
        bases = [address_of(v) for v in views]
        self._seq = [pointer(b + SEQ) for b in bases]
        self._red = [pointer(b + RED) for b in bases]
        self._sleep = [pointer(b + SLEEP) for b in bases]
        self._sleepers = pointer(bases[0] + SLEEPERS)
        #: the header words (SIG's); written and read plainly, published by
        #: SEQ's store as the slots are
        self._hdr = [v[:HEADER].cast("Q") for v in views]
        #: every member's doorbell name, when all of them can ring each other
        self._bells = list(bells) if bells is not None and all(bells) else None
        if self._bells is not None:
            worker.add_wake_source(doorbell.doorbell())
        self._others = [r for r in range(self.size) if r != rank]
        self._k = 0
        self._known = 0                          # every seq is known to be >= this
        self._cache: dict = {}
        #: bytes up to which each collective belongs on this team (ucxpy.schedules)
        self.limits = {op: team_max(op, self.size) for op in TEAM_MAX}
        self._wait = wait or worker.wait_until
        self._yield = worker.oversubscribed()
        self.closed = False
        _TEAMS.add(self)

    # -- forming and closing -------------------------------------------------------
    @classmethod
    def create(cls, worker, rank: int, eps: Sequence, exchange: Callable[[object], list],
               slot: Optional[int] = None, wait: Optional[Callable] = None
               ) -> Optional["ShmTeam"]:
        """Form a team over a group (collective: every member calls it).

        ``eps[r]`` is this worker's endpoint to member ``r`` (ignored at
        ``rank``); ``exchange(obj)`` is the layer's blocking allgather (the
        list of every member's ``obj``, by rank).  Returns the team, or None
        on every member when any member cannot join."""
        cfg = worker.config
        slot = int(slot or cfg.shm_coll_slot)
        n = len(eps)
        mh = packed = bell = None
        # a same-host transport selected (UCXPY_TLS): the user wants memory shared
        intra = any(i.attrs.caps & Caps.INTRA_HOST and not i.attrs.caps & Caps.LOOPBACK
                    for i in worker.ifaces)
        if n > 1 and cfg.shm_coll and intra and len(_TEAMS) < cfg.shm_coll_teams:
            try:
                mh = worker.mem_map(length=HEADER + 2 * slot, shared=True)
                packed = mh.pack_rkey()
            except (UcxpyError, OSError):
                if mh is not None:
                    mh.unmap()
                mh = packed = None
            try:
                bell = (doorbell.namespace(), doorbell.doorbell().name)
            except OSError:
                bell = None
        try:
            infos = exchange((packed, bell))
            keys = [i[0] for i in infos]
            # ringing works within one network namespace (abstract socket names)
            bells = [i[1][1] if i[1] is not None and bell is not None and i[1][0] == bell[0]
                     else None for i in infos]
            views: List[Optional[memoryview]] = [None] * n
            ok = mh is not None and all(k is not None for k in keys)
            if ok:
                views[rank] = mh.buf
                for r, key in enumerate(keys):
                    if r != rank:
                        try:
                            views[r] = eps[r].unpack_rkey(key).map()
                        except (UcxpyError, OSError):
                            views[r] = None
                        if views[r] is None or len(views[r]) < HEADER + 2 * slot:
                            ok = False
                            break
            if all(exchange(ok)):
                return cls(worker, rank, eps, mh, views, slot, wait, bells)
        except BaseException:
            if mh is not None:              # (the exchange failed: a dead peer, a revoke)
                mh.unmap()
            raise
        if mh is not None:
            mh.unmap()
        return None

    def close(self) -> None:
        """Leave the team (local: a member's mappings of this segment stay valid)."""
        if not self.closed:
            self.closed = True
            _TEAMS.discard(self)
            self._slots = self._views = self._bytes = self._hdr = ()
            self._cache.clear()                 # (its views hold the peers' mappings)
            self._mh.unmap()

    # -- waiting -------------------------------------------------------------------
    def _await(self, counters, k: int, ranks) -> None:
        """Wait until the counters of ``ranks`` are at least ``k``."""
        for r in ranks:
            p = counters[r]
            if load64(p) >= k:
                continue
            if self._yield:
                # more ranks than CPUs: the member being waited for may be
                # queued behind this one, so give it the CPU at once
                for _ in range(YIELDS):
                    sched_yield()
                    if load64(p) >= k:
                        break
                else:
                    self._sleep_on(counters, p, k, r)
                continue
            for _ in range(SPINS):
                if load64(p) >= k:
                    break
            else:
                self._sleep_on(counters, p, k, r)

    def _sleep_on(self, counters, p, k: int, r: int) -> None:
        """Wait in the worker's loop for member ``r``'s counter ``p`` to
        reach ``k``: announced in the sleep word, so that ``r`` rings."""
        ready = self._ready(p, k, r)
        if self._bells is None:
            self._wait(ready, max_nap=UNRUNG_NAP)
            return
        me = self._sleep[self.rank]
        on = _ON_RED if counters is self._red else _ON_SEQ
        store64(me, (k << 17) | (on << 16) | (r + 1))
        add64(self._sleepers, 1)
        try:
            self._wait(ready)           # (its first look comes after the stores)
        finally:
            store64(me, 0)
            add64(self._sleepers, _MINUS_ONE)

    def _raised(self, on: int, k: int) -> None:
        """This member's counter ``on`` is now ``k``: ring the members that
        sleep until it is (one load when nobody sleeps)."""
        if not load64(self._sleepers) or self._bells is None:
            return
        mine = self.rank + 1
        sleep, bells = self._sleep, self._bells
        for m in self._others:
            w = load64(sleep[m])
            if w and w & 0xFFFF == mine and (w >> 16) & 1 == on and w >> 17 <= k:
                doorbell.ring(bells[m])

    def _ready(self, p, k: int, r: int) -> Callable[[], bool]:
        ep, check = self.eps[r], self.check

        def ready() -> bool:
            if load64(p) >= k:
                return True
            if ep.failed is not None:
                raise ConnectionLost(f"shm team: member {r} failed: {ep.failed}") from ep.failed
            if check is not None:
                check()
            return False
        return ready

    def _begin(self, writes: bool) -> int:
        """Number the next operation; before one that writes its slot, wait
        until that slot's last readers are done with it."""
        k = self._k = self._k + 1
        if writes and self._known < k - 1:
            self._await(self._seq, k - 1, self._others)
            self._known = k - 1
        return k

    def _publish(self, k: int) -> None:
        store64(self._seq[self.rank], k)
        self._raised(_ON_SEQ, k)

    def _sync(self, k: int) -> None:
        """Publish operation ``k`` and wait until every member has."""
        store64(self._seq[self.rank], k)
        self._raised(_ON_SEQ, k)
        self._await(self._seq, k, self._others)
        self._known = k

    def _sign(self, k: int, kind: int, nbytes: int) -> int:
        """Leave operation ``k``'s signature (before publishing it)."""
        sig = (kind << 56) | nbytes
        self._hdr[self.rank][SIG // 8 + (k & 3)] = sig
        return sig

    def _verify(self, k: int, sig: int, ranks) -> None:
        """The signatures of ``ranks``' operation ``k`` (published: their seq
        was seen at ``k``) are ``sig``, else raise."""
        i = SIG // 8 + (k & 3)
        hdr = self._hdr
        for r in ranks:
            theirs = hdr[r][i]
            if theirs != sig:
                names = {_BARRIER: "barrier", _BCAST: "bcast", _ALLGATHER: "allgather",
                         _ALLTOALL: "alltoall", _REDUCE: "reduction"}
                what = [f"{names.get(x >> 56, '?')} of {x & ((1 << 56) - 1)} bytes"
                        for x in (theirs, sig)]
                raise TruncationError(f"shm team: member {r} called a {what[0]}, member "
                                      f"{self.rank} a {what[1]} (the members called different "
                                      f"collectives or sizes)", theirs & ((1 << 56) - 1),
                                      sig & ((1 << 56) - 1))

    # -- operations ------------------------------------------------------------------
    def barrier(self) -> None:
        k = self._begin(False)
        sig = self._sign(k, _BARRIER, 0)
        self._sync(k)
        self._verify(k, sig, self._others)

    def bcast(self, buf, root: int) -> None:
        """``root``'s bytes into every member's ``buf`` (a byte array, or a
        flat byte memoryview)."""
        n, step = buf.nbytes, self.slot
        if 0 < n <= step:                           # one piece (_begin and _publish inline)
            k = self._k = self._k + 1
            seq = self._seq
            sig = self._sign(k, _BCAST, n)
            if self.rank == root:
                if self._known < k - 1:
                    self._await(seq, k - 1, self._others)
                    self._known = k - 1
                self._bytes[root][k & 1][:n] = buf
                store64(seq[root], k)
                self._raised(_ON_SEQ, k)
            else:
                store64(seq[self.rank], k)
                self._raised(_ON_SEQ, k)
                if load64(seq[root]) < k:
                    self._await(seq, k, (root,))
                self._verify(k, sig, (root,))
                buf[:] = self._bytes[root][k & 1][:n]
            return
        for off in range(0, n, step) if n else ():
            m = min(step, n - off)
            if self.rank == root:
                k = self._begin(True)
                self._sign(k, _BCAST, m)
                self._slots[root][k & 1][:m] = buf[off:off + m]
                self._publish(k)
            else:
                k = self._begin(False)
                sig = self._sign(k, _BCAST, m)
                self._publish(k)
                self._await(self._seq, k, (root,))
                self._verify(k, sig, (root,))
                buf[off:off + m] = self._slots[root][k & 1][:m]

    def allgather(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Every member's ``send`` bytes, by rank, into ``recv`` (byte arrays,
        C-contiguous; ``send`` may be ``recv``'s own block)."""
        b, step = send.nbytes, self.slot
        if 0 < b <= step:
            k = self._begin(True)
            sig = self._sign(k, _ALLGATHER, b)
            self._bytes[self.rank][k & 1][:b] = send
            self._sync(k)
            self._verify(k, sig, self._others)
            np.concatenate(self._blocks(k & 1, 0, b), out=recv)
            return
        for off in range(0, b, step) if b else ():
            m = min(step, b - off)
            k = self._begin(True)
            sig = self._sign(k, _ALLGATHER, m)
            s = k & 1
            self._slots[self.rank][s][:m] = send[off:off + m]
            self._sync(k)
            self._verify(k, sig, self._others)
            for r in range(self.size):
                recv[r * b + off:r * b + off + m] = self._slots[r][s][:m]

    def alltoall(self, send: np.ndarray, recv: np.ndarray) -> None:
        """Block ``j`` of ``send`` to member ``j``, block ``i`` of ``recv`` from
        member ``i`` (byte arrays of ``size`` equal blocks)."""
        n, me = self.size, self.rank
        b = send.nbytes // n
        step = max(1, self.slot // n)
        if 0 < b <= step:                           # the whole buffer in one piece
            k = self._k = self._k + 1               # (_begin and _sync inline)
            seq = self._seq
            if self._known < k - 1:
                self._await(seq, k - 1, self._others)
            sig = self._sign(k, _ALLTOALL, b)
            self._bytes[me][k & 1][:n * b] = send
            store64(seq[me], k)
            self._raised(_ON_SEQ, k)
            for r in self._others:
                if load64(seq[r]) < k:
                    self._await(seq, k, self._others)
                    break
            self._known = k
            self._verify(k, sig, self._others)
            np.concatenate(self._blocks(k & 1, me * b, (me + 1) * b), out=recv)
            return
        for off in range(0, b, step) if b else ():
            m = min(step, b - off)
            k = self._begin(True)
            sig = self._sign(k, _ALLTOALL, m)
            s = k & 1
            mine = self._slots[me][s]
            for j in range(n):
                mine[j * m:(j + 1) * m] = send[j * b + off:j * b + off + m]
            self._sync(k)
            self._verify(k, sig, self._others)
            for r in range(n):
                recv[r * b + off:r * b + off + m] = self._slots[r][s][me * m:(me + 1) * m]

    def _blocks(self, s: int, lo: int, hi: int) -> list:
        """Bytes ``lo:hi`` of every member's slot ``s`` (cached, as :meth:`_operands`)."""
        key = ("bytes", s, lo, hi)
        blocks = self._cache.get(key)
        if blocks is None:
            if len(self._cache) >= 64:
                self._cache.clear()
            blocks = self._cache[key] = [sl[s][lo:hi] for sl in self._slots]
        return blocks

    def allreduce(self, x: np.ndarray, out: np.ndarray, combine: Callable) -> None:
        """``out = x_0 op x_1 op ... op x_(size-1)`` on every member, where
        ``combine(a, b, dest)`` computes ``a op b`` into ``dest`` (elementwise;
        numpy arrays of ``x``'s dtype).  ``x`` may be ``out`` (in place).
        Large vectors are reduce-scattered, so ``op`` must then commute."""
        if x.nbytes <= WHOLE_REDUCE_MAX and x.nbytes <= self.slot and x.size:
            return self._reduce_whole(x, out, combine, None)
        self._reduce(x, out, combine, None)

    def reduce(self, x: np.ndarray, out: Optional[np.ndarray], combine: Callable,
               root: int) -> None:
        """:meth:`allreduce` with the result at ``root`` only (``out`` there)."""
        self._reduce(x, out, combine, root)

    def _reduce(self, x, out, combine, root) -> None:
        count = x.size
        if not count:
            return
        step = self.slot // x.itemsize
        if x.nbytes <= WHOLE_REDUCE_MAX:
            if count <= step:
                return self._reduce_whole(x, out, combine, root)
            for lo in range(0, count, step):
                hi = min(count, lo + step)
                self._reduce_whole(x[lo:hi], None if out is None else out[lo:hi], combine, root)
            return
        for lo in range(0, count, step):
            self._reduce_scatter(x[lo:lo + step], out, lo, combine, root)

    def _typed(self, r: int, s: int, dtype, lo: int, hi: int) -> np.ndarray:
        """Elements ``lo:hi`` of member ``r``'s slot ``s`` as ``dtype``."""
        isz = dtype.itemsize
        return self._slots[r][s][lo * isz:hi * isz].view(dtype)

    def _operands(self, s: int, x: np.ndarray) -> list:
        """Every member's slot ``s`` as an array shaped like ``x`` (cached:
        a loop of equal calls makes no new views)."""
        key = ("typed", s, x.dtype, x.size)
        views = self._cache.get(key)
        if views is None:
            if len(self._cache) >= 64:
                self._cache.clear()
            nb = x.nbytes
            views = self._cache[key] = [sl[s][:nb].view(x.dtype) for sl in self._slots]
        return views

    def _reduce_whole(self, x, out, combine, root) -> None:
        """One slot's worth, reduced whole (in rank order) by whoever needs
        the result."""
        k = self._k = self._k + 1
        if self._known < k - 1:
            self._await(self._seq, k - 1, self._others)
            self._known = k - 1
        views = self._operands(k & 1, x)
        views[self.rank][...] = x
        sig = self._sign(k, _REDUCE, x.nbytes)
        seq = self._seq
        store64(seq[self.rank], k)
        self._raised(_ON_SEQ, k)
        if root is not None and root != self.rank:
            return
        for r in self._others:
            if load64(seq[r]) < k:
                self._await(seq, k, self._others)
                break
        self._known = k
        self._verify(k, sig, self._others)
        combine(views[0], views[1], out)
        for r in range(2, self.size):
            combine(out, views[r], out)

    def _reduce_scatter(self, x, out, lo, combine, root) -> None:
        """One piece: each member reduces its block of it into its own slot
        (``op`` commutes: its own value first, then the others' in rank
        order) and whoever needs the result gathers the blocks."""
        k = self._begin(True)
        s = k & 1
        c, me, dt = x.size, self.rank, x.dtype
        self._slots[me][s][:x.nbytes] = x.view(np.uint8)
        sig = self._sign(k, _REDUCE, x.nbytes)
        self._sync(k)
        self._verify(k, sig, self._others)
        bounds = block_bounds(c, self.size)
        a, b = bounds[me]
        acc = self._typed(me, s, dt, a, b)       # only this member reads this block
        for r in self._others:
            combine(acc, self._typed(r, s, dt, a, b), acc)
        store64(self._red[me], k)
        self._raised(_ON_RED, k)
        if root is not None and root != me:
            return
        out[lo + a:lo + b] = acc
        self._await(self._red, k, self._others)
        for r in self._others:
            a, b = bounds[r]
            out[lo + a:lo + b] = self._typed(r, s, dt, a, b)


def live_teams() -> int:
    """Teams of this process not closed yet (``UCXPY_SHM_COLL_TEAMS`` caps it)."""
    return len(_TEAMS)
