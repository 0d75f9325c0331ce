"""Collective communication schedules: who talks to whom, and in which round.

Pure rank arithmetic, no I/O, shared by the MPI layer (``mpi_shim.coll``)
and the OpenSHMEM layer (``shmem.coll``), which each move the data with
their own requests, tags and buffers.  Ranks here are indices ``0..n-1``
within the group; callers map them to their own process ids.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple


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


class DoublingPlan(NamedTuple):
    """Recursive doubling for any ``n``: the ``n - 2**k`` ranks beyond the
    largest power of two first fold into a neighbour, the power-of-two core
    exchanges pairwise, and the folded ranks get the result back.

    ``fold``: ``("send", peer)`` (this rank hands its value to ``peer`` and
    sits out), ``("recv", peer)`` (this rank absorbs ``peer``'s value) or None.
    ``partners``: the exchange partner of each round (empty if folded out).
    ``unfold``: the reverse of ``fold`` (``("recv", peer)`` for a rank that
    sat out).  Every peer with a lower rank holds values of lower ranks,
    which keeps non-commutative reductions in rank order."""
    fold: Optional[Tuple[str, int]]
    partners: List[int]
    unfold: Optional[Tuple[str, int]]


def recursive_doubling(rank: int, n: int) -> DoublingPlan:
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} outside a group of {n}")
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    if rank < 2 * rem and rank % 2 == 0:      # folds into rank + 1, sits out
        return DoublingPlan(("send", rank + 1), [], ("recv", rank + 1))
    if rank < 2 * rem:
        fold, unfold, newrank = ("recv", rank - 1), ("send", rank - 1), rank // 2
    else:
        fold, unfold, newrank = None, None, rank - rem
    partners = []
    mask = 1
    while mask < pof2:
        nd = newrank ^ mask
        partners.append(nd * 2 + 1 if nd < rem else nd + rem)
        mask <<= 1
    return DoublingPlan(fold, partners, unfold)
