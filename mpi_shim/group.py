"""``MPI.Group``: an ordered set of processes, stored as world ranks."""
from __future__ import annotations

from .exceptions import ERR_ARG, ERR_GROUP, ERR_RANK, Exception
from .status import PROC_NULL

UNDEFINED = -32766
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3


class Group:
    __slots__ = ("_ranks", "_index", "_me", "__weakref__")

    def __init__(self, group=None):
        if group is None:
            self._init(None)
        elif isinstance(group, Group):
            self._init(group._ranks)
        else:
            raise TypeError("expected a Group")

    def _init(self, ranks):
        from .request import ENGINE
        self._ranks = None if ranks is None else tuple(ranks)
        self._index = None if ranks is None else {w: i for i, w in enumerate(self._ranks)}
        me = ENGINE.world.rank if ENGINE.world is not None else 0
        self._me = UNDEFINED if ranks is None else self._index.get(me, UNDEFINED)
        return self

    @classmethod
    def _of(cls, ranks):
        g = cls.__new__(cls)
        return g._init(ranks)

    def _check(self):
        if self._ranks is None:
            raise Exception(ERR_GROUP, "invalid group (GROUP_NULL)")
        return self._ranks

    def __eq__(self, other):
        if not isinstance(other, Group):
            return NotImplemented
        return self._ranks == other._ranks

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return hash(self._ranks)

    def __bool__(self):
        return self._ranks is not None

    def __repr__(self):
        return f"<Group {self._ranks}>"

    def Get_size(self) -> int:
        return len(self._check())

    def Get_rank(self) -> int:
        self._check()
        return self._me

    size = property(Get_size)
    rank = property(Get_rank)

    def Dup(self):
        return Group._of(self._check())

    def Free(self):
        self._init(None)

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

    def Incl(self, ranks):
        return Group._of(self._sel(ranks))

    def Excl(self, ranks):
        drop = set(self._sel(ranks))
        return Group._of([w for w in self._ranks if w not in drop])

    @staticmethod
    def _expand(ranges):
        out = []
        for first, last, stride in ranges:
            if stride == 0:
                raise Exception(ERR_ARG, "zero stride")
            out.extend(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    def Range_incl(self, ranks):
        return self.Incl(self._expand(ranks))

    def Range_excl(self, ranks):
        return self.Excl(self._expand(ranks))

    def Translate_ranks(self, ranks=None, group=None):
        cur = self._check()
        if ranks is None:
            ranks = range(len(cur))
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not (0 <= r < len(cur)):
                raise Exception(ERR_RANK, f"rank {r} not in group")
            if group is None:
                out.append(r)
            else:
                group._check()
                out.append(group._index.get(cur[r], UNDEFINED))
        return out

    def Compare(self, group) -> int:
        a, b = self._check(), group._check()
        if a == b:
            return IDENT
        return SIMILAR if sorted(a) == sorted(b) else UNEQUAL

    def Union(self, group):
        a, b = self._check(), group._check()
        sa = set(a)
        return Group._of(list(a) + [w for w in b if w not in sa])

    def Intersection(self, group):
        sb = set(group._check())
        return Group._of([w for w in self._check() if w in sb])

    def Difference(self, group):
        sb = set(group._check())
        return Group._of([w for w in self._check() if w not in sb])

    @classmethod
    def Create_from_session_pset(cls, session, pset_name):
        from .request import ENGINE
        if pset_name in ("mpi://WORLD", "mpi://world"):
            return cls._of(range(ENGINE.world.size))
        return cls._of([ENGINE.world.rank])


GROUP_NULL = Group()
GROUP_EMPTY = Group._of(())
