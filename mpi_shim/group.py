"""``MPI.Group``: an ordered set of processes, stored as wids (see :mod:`.engine`)."""
from __future__ import annotations

from .engine import ENGINE
from .exceptions import ERR_ARG, ERR_GROUP, ERR_RANK, Exception
from .handle import Handle, register_family

UNDEFINED = -32766
PROC_NULL = -2
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3


class GroupImpl:
    __slots__ = ("ranks", "index", "me", "predefined", "_hid", "__weakref__")

    def __init__(self, ranks, predefined=False):
        self.ranks = tuple(ranks)
        self.index = {w: i for i, w in enumerate(self.ranks)}
        self.me = self.index.get(ENGINE.me, UNDEFINED)
        self.predefined = predefined


class Group(Handle):
    """Group of processes."""

    __slots__ = ()

    @classmethod
    def _of(cls, ranks):
        ranks = tuple(ranks)
        if not ranks:
            return cls._wrap(_EMPTY)
        return cls._wrap(GroupImpl(ranks))

    def _check(self):
        if self._h is None:
            raise Exception(ERR_GROUP, "invalid group (GROUP_NULL)")
        return self._h.ranks

    def __repr__(self):
        return f"<Group {self._h.ranks if self._h else 'GROUP_NULL'}>"

    def Get_size(self) -> int:
        """Return the number of processes in the group."""
        return len(self._check())

    def Get_rank(self) -> int:
        """Return the rank of this process in the group (UNDEFINED if not a member)."""
        self._check()
        return self._h.me

    size = property(Get_size, doc="Number of processes in the group.")
    rank = property(Get_rank, doc="Rank of this process in the group.")

    def Dup(self) -> "Group":
        """Duplicate the group."""
        return Group._of(self._check())

    def Free(self) -> None:
        """Free the group."""
        self._check()
        self._h = None

    def _sel(self, ranks):
        cur = self._check()
        out = []
        for r in ranks:
            if not (0 <= r < len(cur)):
                raise Exception(ERR_RANK, f"rank {r} not in group of {len(cur)}")
            out.append(cur[r])
        if len(set(out)) != len(out):
            raise Exception(ERR_RANK, "duplicate ranks")
        return out

    def Incl(self, ranks) -> "Group":
        """Create a group from the listed members of this group, in that order."""
        return Group._of(self._sel(ranks))

    def Excl(self, ranks) -> "Group":
        """Create a group without the listed members of this group."""
        drop = set(self._sel(ranks))
        return Group._of([w for w in self._h.ranks if w not in drop])

    def _expand(self, ranges):
        n = len(self._check())
        out = []
        for first, last, stride in ranges:
            if stride == 0:
                raise Exception(ERR_ARG, "zero stride in a rank range")
            seq = range(first, last + (1 if stride > 0 else -1), stride)
            for r in seq:
                if not (0 <= r < n):
                    raise Exception(ERR_RANK, f"rank {r} not in group of {n}")
            out.extend(seq)
        return out

    def Range_incl(self, ranks) -> "Group":
        """Create a group from ranges ``(first, last, stride)`` of members."""
        return self.Incl(self._expand(ranks))

    def Range_excl(self, ranks) -> "Group":
        """Create a group without ranges ``(first, last, stride)`` of members."""
        return self.Excl(self._expand(ranks))

    def Translate_ranks(self, ranks=None, group=None):
        """Translate ranks in this group to ranks in ``group`` (UNDEFINED if absent)."""
        cur = self._check()
        if ranks is None:
            ranks = range(len(cur))
        if group is not None:
            group._check()
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not (0 <= r < len(cur)):
                raise Exception(ERR_RANK, f"rank {r} not in group of {len(cur)}")
            out.append(r if group is None else group._h.index.get(cur[r], UNDEFINED))
        return out

    def Compare(self, group) -> int:
        """Compare two groups (IDENT, SIMILAR or UNEQUAL)."""
        a, b = self._check(), group._check()
        if a == b:
            return IDENT
        return SIMILAR if sorted(a) == sorted(b) else UNEQUAL

    def Union(self, group) -> "Group":
        """Create the union of two groups (this group's order first)."""
        a, b = self._check(), group._check()
        sa = set(a)
        return Group._of(list(a) + [w for w in b if w not in sa])

    def Intersection(self, group) -> "Group":
        """Create the intersection of two groups (this group's order)."""
        sb = set(group._check())
        return Group._of([w for w in self._check() if w in sb])

    Intersect = Intersection

    def Difference(self, group) -> "Group":
        """Create the members of this group that are not in ``group``."""
        sb = set(group._check())
        return Group._of([w for w in self._check() if w not in sb])

    @classmethod
    def Create_from_session_pset(cls, session, pset_name: str) -> "Group":
        """Create a group from a session's process set (``mpi://WORLD``, ``mpi://SELF``)."""
        return cls._of(pset_members(session, pset_name))


def pset_members(session, name):
    """The world ranks of process set ``name`` of ``session`` (a Session,
    checked by its ``_impl()``, or its implementation object)."""
    impl = getattr(session, "_impl", None)
    if impl is not None:
        impl()                              # (a null or finalized session raises)
    if name.lower() == "mpi://world":
        return tuple(range(ENGINE.world.size))
    if name.lower() == "mpi://self":
        return (ENGINE.me,)
    raise Exception(ERR_ARG, f"unknown process set {name!r}")


_EMPTY = GroupImpl((), predefined=True)
GROUP_NULL = Group._constant(None)
GROUP_EMPTY = Group._constant(_EMPTY)
register_family(Group)
