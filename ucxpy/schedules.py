"""Collective communication schedules: who talks to whom, and in which round.

Pure rank arithmetic, no I/O, shared by the MPI layer (``mpi_shim.coll``)
and the OpenSHMEM layer (``shmem.coll``), which each move the data with
their own requests, tags and buffers.  Ranks here are indices ``0..n-1``
within the group; callers map them to their own process ids.
"""
from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import List, Optional, Tuple


def binomial_tree(rank: int, n: int, root: int) -> Tuple[Optional[int], List[int]]:
    """``(parent, children)`` of ``rank`` in the binomial tree rooted at
    ``root`` over ``n`` ranks; the parent is None at the root.  Children come
    largest subtree first, the order a broadcast should send in."""
    if not (0 <= root < n and 0 <= rank < n):
        raise ValueError(f"rank {rank} / root {root} outside a group of {n}")
    vr = (rank - root) % n
    parent = None
    mask = 1
    while mask < n:
        if vr & mask:
            parent = (vr - mask + root) % n
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            children.append((vr + mask + root) % n)
        mask >>= 1
    return parent, children


class DoublingPlan(namedtuple("DoublingPlan", "fold partners unfold")):
    """Recursive doubling for any ``n``: the ``n - 2**k`` ranks beyond the
    largest power of two first fold into a neighbour, the power-of-two core
    exchanges pairwise, and the folded ranks get the result back.

    ``fold``: ``("send", peer)`` (this rank hands its value to ``peer`` and
    sits out), ``("recv", peer)`` (this rank absorbs ``peer``'s value) or None.
    ``partners``: the exchange partner of each round (empty if folded out).
    ``unfold``: the reverse of ``fold`` (``("recv", peer)`` for a rank that
    sat out).  Every peer with a lower rank holds values of lower ranks,
    which keeps non-commutative reductions in rank order."""
    __slots__ = ()
    # fold: Optional[Tuple[str, int]]
    # partners: List[int]
    # unfold: Optional[Tuple[str, int]]


class _Fold(namedtuple("_Fold", "pof2 rem fold unfold newrank")):
    """The power-of-two core both doubling schedules run on: the ``rem = n -
    pof2`` even ranks below ``2 rem`` hand their value to ``rank + 1`` and sit
    out (``newrank`` None); the others get core rank ``newrank``, and
    :meth:`real` maps a core rank back to a group rank."""
    __slots__ = ()
    # pof2: int
    # rem: int
    # fold: Optional[Tuple[str, int]]
    # unfold: Optional[Tuple[str, int]]
    # newrank: Optional[int]

    def real(self, nd: int) -> int:
        return nd * 2 + 1 if nd < self.rem else nd + self.rem


def _fold(rank: int, n: int) -> _Fold:
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} outside a group of {n}")
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    if rank < 2 * rem and rank % 2 == 0:      # folds into rank + 1, sits out
        return _Fold(pof2, rem, ("send", rank + 1), ("recv", rank + 1), None)
    if rank < 2 * rem:
        return _Fold(pof2, rem, ("recv", rank - 1), ("send", rank - 1), rank // 2)
    return _Fold(pof2, rem, None, None, rank - rem)


def recursive_doubling(rank: int, n: int) -> DoublingPlan:
    f = _fold(rank, n)
    if f.newrank is None:
        return DoublingPlan(f.fold, [], f.unfold)
    partners = []
    mask = 1
    while mask < f.pof2:
        partners.append(f.real(f.newrank ^ mask))
        mask <<= 1
    return DoublingPlan(f.fold, partners, f.unfold)


class RingPlan(namedtuple("RingPlan", "right left reduce_scatter owned allgather")):
    """Ring reduce-scatter followed by ring allgather over ``n`` blocks.

    ``right``/``left``: the neighbours this rank sends to and receives from.
    ``reduce_scatter``: per step ``(send_block, recv_block)``; the received
    block is combined into this rank's copy of it.  After the ``n - 1``
    steps this rank holds the fully reduced block ``owned``.
    ``allgather``: per step ``(send_block, recv_block)``; the received block
    replaces this rank's copy.  Each rank sends ``2 (n - 1) / n`` of the data
    in all (bandwidth-optimal), and reduces ``(n - 1) / n`` of it.  Blocks are
    combined in ring order, so the operation must be commutative."""
    __slots__ = ()
    # right: int
    # left: int
    # reduce_scatter: List[Tuple[int, int]]
    # owned: int
    # allgather: List[Tuple[int, int]]


def ring_allreduce(rank: int, n: int) -> RingPlan:
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} outside a group of {n}")
    rs = [((rank - s) % n, (rank - s - 1) % n) for s in range(n - 1)]
    ag = [((rank + 1 - s) % n, (rank - s) % n) for s in range(n - 1)]
    return RingPlan((rank + 1) % n, (rank - 1) % n, rs, (rank + 1) % n, ag)


class HalvingPlan(namedtuple("HalvingPlan", "fold reduce_scatter owned allgather unfold nblocks")):
    """Rabenseifner's allreduce: a recursive-halving reduce-scatter, then a
    recursive-doubling allgather, over ``nblocks`` (the largest power of two
    ``<= n``) blocks; ranks beyond it fold in first and get the result back,
    as in :class:`DoublingPlan` (``fold``/``unfold``, no rounds for a rank
    that sits out).

    ``reduce_scatter``: per round ``(peer, send, keep)``, half-open block
    ranges: this rank sends ``send`` and combines what ``peer`` sends into
    ``keep`` (the ranges halve each round, far partners first).  Afterwards
    this rank holds the reduced block ``owned``.  ``allgather``: per round
    ``(peer, send, recv)``: the ranges double back.  Each rank sends
    ``2 (p - 1) / p`` of the data in ``2 log2 p`` rounds (the ring needs
    ``2 (n - 1)``); blocks are combined out of rank order, so the operation
    must be commutative."""
    __slots__ = ()
    # fold: Optional[Tuple[str, int]]
    # reduce_scatter: List[Tuple[int, Tuple[int, int], Tuple[int, int]]]
    # owned: int
    # allgather: List[Tuple[int, Tuple[int, int], Tuple[int, int]]]
    # unfold: Optional[Tuple[str, int]]
    # nblocks: int


def halving_doubling(rank: int, n: int) -> HalvingPlan:
    f = _fold(rank, n)
    pof2, newrank, real = f.pof2, f.newrank, f.real
    if newrank is None:
        return HalvingPlan(f.fold, [], -1, [], f.unfold, pof2)
    rs, lo, hi = [], 0, pof2
    mask = pof2 >> 1
    while mask:
        mid = lo + mask
        if newrank & mask:
            rs.append((real(newrank ^ mask), (lo, mid), (mid, hi)))
            lo = mid
        else:
            rs.append((real(newrank ^ mask), (mid, hi), (lo, mid)))
            hi = mid
        mask >>= 1
    ag = []
    mask = 1
    while mask < pof2:
        mine, theirs = newrank & ~(mask - 1), (newrank ^ mask) & ~(mask - 1)
        ag.append((real(newrank ^ mask), (mine, mine + mask), (theirs, theirs + mask)))
        mask <<= 1
    return HalvingPlan(f.fold, rs, lo, ag, f.unfold, pof2)


def block_bounds(count: int, n: int) -> List[Tuple[int, int]]:
    """``(start, stop)`` of ``n`` nearly equal blocks of ``count`` elements."""
    q, r = divmod(count, n)
    out, start = [], 0
    for i in range(n):
        stop = start + q + (i < r)
        out.append((start, stop))
        start = stop
    return out


#: allreduce payloads from this many bytes on use a reduce-scatter +
#: allgather schedule (when the group has more than one rank, the operation
#: is commutative and every rank gets a block); below it recursive
#: doubling's log2(n) rounds win.  Measured on 2 cores, 2 and 4 ranks
#: (bench/allreduce_algos.py): recursive doubling is
#: ahead up to 256 KiB (a round costs tens of microseconds in Python), the
#: bandwidth schedules from 1 MiB
ALLREDUCE_RING_MIN = 512 * 1024


def allreduce_algorithm(nbytes: int, count: int, n: int, commutative: bool) -> str:
    """Which allreduce schedule a group of ``n`` uses for ``count`` elements
    of ``nbytes`` in all (MPICH's split: latency-bound small messages,
    bandwidth-bound large ones): ``"recursive_doubling"`` below
    ``ALLREDUCE_RING_MIN`` or for non-commutative operations; above it
    ``"halving_doubling"`` (Rabenseifner: ``2 log2 n`` rounds) when ``n`` is a
    power of two of at least 4, else ``"ring"`` (the same data volume with no
    fold, in ``2 (n - 1)`` rounds; for 2 ranks the two are the same)."""
    if n > 1 and commutative and nbytes >= ALLREDUCE_RING_MIN and count >= n:
        return "halving_doubling" if n >= 4 and n & (n - 1) == 0 else "ring"
    return "recursive_doubling"


def collective_table(n: int):
    """``(collective, size range, algorithm)`` rows for ``ucxpy-info``: what
    the layers above choose for a group of ``n`` ranks."""
    big = f">= {ALLREDUCE_RING_MIN // 1024} KiB"
    small = f"< {ALLREDUCE_RING_MIN // 1024} KiB"
    return [
        ("barrier", "-", "dissemination"),
        ("bcast", "any", "binomial tree"),
        ("reduce", "any", "binomial tree (rank order for non-commutative ops)"),
        ("allreduce", small, allreduce_algorithm(0, n, n, True)),
        ("allreduce", big, allreduce_algorithm(ALLREDUCE_RING_MIN, n, n, True).replace(
            "halving_doubling", "halving/doubling (Rabenseifner)") +
         " (commutative ops; else recursive doubling)"),
        ("scan/exscan", "any", "recursive doubling"),
        ("allgather", "any", "ring"),
        ("gather/scatter/alltoall", "any", "direct (all messages at once)"),
    ]


# -- shared-memory teams (ucxpy.shmteam): which calls, which of its algorithms -----
#: team reductions up to this many bytes are done whole by every member after
#: one synchronisation (n reads of the whole vector each); larger ones are
#: reduce-scattered in the slots and gathered after a second one
WHOLE_REDUCE_MAX = 16 << 10

#: the largest blocking collectives a team takes (bytes: a member's vector
#: for reductions and bcast, the whole receive buffer for allgather and
#: alltoall), for groups of 2 and of more members; above them the layers use
#: their message algorithms, whose single-copy rendezvous moves less memory
#: than two copies through the slots.  From ``bench/shmteam_ab.py`` at 2 and
#: 4 ranks on 2 cores (docs/notes/performance-history.md): with 2 members the
#: messages win from 1 MiB on (16 MiB for allreduce); with 4 members on 2
#: cores the team wins at every size for reductions and bcast, up to 1 MiB
#: (alltoall) and 4 MiB (allgather) for the others.
TEAM_MAX = {
    "bcast": (256 << 10, 1 << 62),
    "allreduce": (4 << 20, 1 << 62),
    "reduce": (4 << 20, 1 << 62),
    "allgather": (256 << 10, 4 << 20),
    "alltoall": (256 << 10, 1 << 20),
}


def team_max(op: str, n: int) -> int:
    """Bytes up to which a group of ``n`` runs collective ``op`` on its team."""
    two, more = TEAM_MAX[op]
    return two if n <= 2 else more


def team_table(n: int) -> list:
    """``(collective, size range, algorithm)`` rows for ``ucxpy-info``."""
    def upto(op):
        m = team_max(op, n)
        return "any" if m >= 1 << 40 else f"<= {m >> 20} MiB" if m >= 1 << 20 else \
            f"<= {m >> 10} KiB"
    rows = [("barrier", "-", "flags: every member's counter"),
            ("bcast", upto("bcast"), "root's slot, copied out by the others")]
    for op in ("allreduce", "reduce"):
        rows.append((op, f"<= {WHOLE_REDUCE_MAX >> 10} KiB",
                     "one sync, each member reduces all slots (rank order)"))
        rows.append((op, f"> {WHOLE_REDUCE_MAX >> 10} KiB, {upto(op)}",
                     "reduce-scatter in the slots, gather (commutative ops)"))
    rows += [("allgather", upto("allgather"), "own slot, every slot copied out"),
             ("alltoall", upto("alltoall"), "own slot, each member's block copied out")]
    return rows
