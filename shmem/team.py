"""Teams: TEAM_WORLD, TEAM_SHARED, strided and 2-D splits, and team sync.

Theory of operation
-------------------
A team is an ordered list of world PEs plus a *slot* (0..255).  The slot
names the team's resources on every member:

* its sync counters: ``ROUNDS`` 64-bit words at heap offset
  ``(slot * ROUNDS + round) * 8`` in the reserved start of the heap;
* its tag space for collectives (see :mod:`shmem.coll`).

Teams sharing a member never share a slot: a split is collective over the
parent team, whose members OR together their bitmaps of slots in use and
take the lowest slots free on all of them.  Disjoint teams (the rows of a
2-D split, the TEAM_SHARED of different hosts) may share one.

``sync`` is a dissemination barrier: in round k the member at index i adds
1 to counter k at member i + 2**k and waits until its own counter k reaches
the number of syncs done so far.  Counters only grow, so a fast member
already in the next sync cannot be mistaken for a missing one; they are
zeroed when the slot is released, after the last sync has drained them.
Same-host members add with native atomics on the mapped heap; others by
ucxpy atomics (the waiter's progress serves them).
"""
from __future__ import annotations

TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

import numpy as np

from ucxpy import atomics
from ucxpy import coll as engine

from . import runtime
from .errors import InvalidPE, InvalidTeam

SLOTS = 256
ROUNDS = 32
WORLD_SLOT, SHARED_SLOT = 0, 1
INVALID_HANDLE, WORLD_HANDLE, SHARED_HANDLE = 0, 1, 2


class TeamState:
    """One team as this PE (a member) sees it."""

    def __init__(self, rt, handle: int, slot: int, pes, config=None):
        self.rt = rt
        self.handle = handle
        self.slot = slot
        self.pes = tuple(pes)
        self.index = {pe: i for i, pe in enumerate(self.pes)}
        self.me = self.index[rt.rank]
        self.n = len(self.pes)
        self.epoch = 0
        self.seq = 0
        self.config = {"num_contexts": 0}
        self.config.update(config or {})
        self.shm = None if self.n > 1 else False    # its ShmTeam (coll.py), False: none
        self.shm_calls = 0
        self._words = np.frombuffer(rt.heap.view(slot * ROUNDS * 8, ROUNDS * 8), np.uint64)
        # the peers this member signals in each round, resolved once
        self._targets = []
        d = 1
        while d < self.n:
            self._targets.append(rt.peers[self.pes[(self.me + d) % self.n]])
            d <<= 1

    def world_pe(self, pe: int) -> int:
        """World PE number of team member ``pe``; raises InvalidPE."""
        if 0 <= pe < self.n:
            return self.pes[pe]
        raise InvalidPE(f"PE {pe} is out of range for a team of {self.n} PEs")

    def next_tag(self) -> int:
        """Base tag of this team's next collective (every member calls
        collectives in the same order, so the sequence numbers agree)."""
        self.seq = (self.seq + 1) & 0xFFFF_FFFF
        return (0x5E << 56) | (self.slot << 48) | (self.seq << 16)

    # -- a team of ucxpy's collective engine (ucxpy.coll), which runs
    #    shmem's collectives: its rounds number the low bits of next_tag() --
    coll_tag = next_tag

    @property
    def rank(self) -> int:
        return self.me

    @property
    def size(self) -> int:
        return self.n

    @property
    def eps(self):
        eps = self.rt.world.eps
        return [eps[pe] for pe in self.pes]

    @property
    def peers(self):
        return self.pes                 # (world PEs are worker ids)

    @property
    def worker(self):
        return self.rt.worker

    @property
    def wait_until(self):
        return self.rt.worker.wait_until

    def check(self) -> None:
        """Nothing to check between rounds: a failed peer fails the requests."""

    def sync(self) -> None:
        """Dissemination barrier over the team (see the module docstring)."""
        if self.n == 1:
            return
        self.epoch += 1
        epoch = self.epoch
        words = self._words
        rt = self.rt
        posts = None
        base = self.slot * ROUNDS * 8
        for k, peer in enumerate(self._targets):
            off = base + k * 8
            if peer.base:
                atomics.add64(peer.ptr + off, 1)
            else:
                req = peer.ep.atomic_post("add", 1, peer.raddr + off, peer.rkey, 8)
                if not req.done:
                    posts = posts or []
                    posts.append(req)
            if words[k] < epoch:
                rt.wait(lambda: words[k] >= epoch, "team sync")
        if atomics.available:
            atomics.fence_acquire()
        if posts:
            rt.wait_requests(posts, "team sync")

    def release(self) -> None:
        self._words[:] = 0
        if self.shm:
            self.shm.close()
        self.shm = False


class TeamRegistry:
    """Handle -> TeamState for the teams this PE belongs to, and slots in use."""

    def __init__(self, rt):
        self.rt = rt
        self.states = {}
        self.used = set()
        self.world = self._add(WORLD_HANDLE, WORLD_SLOT, range(rt.size))
        me = rt.hosts[rt.rank]
        self.shared = self._add(SHARED_HANDLE, SHARED_SLOT,
                                [pe for pe in range(rt.size) if rt.hosts[pe] == me])
        self._next_handle = SHARED_HANDLE + 1

    def _add(self, handle, slot, pes, config=None) -> TeamState:
        st = TeamState(self.rt, handle, slot, pes, config)
        self.states[handle] = st
        self.used.add(slot)
        return st

    def state(self, handle: int) -> TeamState:
        st = self.states.get(handle)
        if st is None:
            raise InvalidTeam("invalid team (TEAM_INVALID, destroyed, or this PE "
                              "is not a member)")
        return st

    def agree_slots(self, parent: TeamState, count: int) -> list:
        """Collective over ``parent``: the ``count`` lowest slots free on
        every parent member."""
        bits = np.zeros(SLOTS // 64, np.uint64)
        for s in self.used:
            bits[s // 64] |= np.uint64(1 << (s % 64))
        run_rounds(parent, engine.allreduce(parent, bits, engine.NumpyOp("or", np.bitwise_or),
                                            bits), "reduce")
        free = [s for s in range(SLOTS)
                if not int(bits[s // 64]) >> (s % 64) & 1]
        if len(free) < count:
            raise InvalidTeam(f"no free team slot: at most {SLOTS} teams may overlap")
        return free[:count]

    def create(self, slot: int, pes, config=None) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._add(handle, slot, pes, config)
        return handle

    def destroy(self, handle: int) -> None:
        st = self.states.pop(handle, None)
        if st is not None and handle not in (WORLD_HANDLE, SHARED_HANDLE):
            self.rt.ctxs.destroy_team_contexts(handle)
            st.release()
            self.used.discard(st.slot)


def _registry():
    return runtime.get().teams


def _config_from(config, kwargs) -> dict:
    cfg = dict(config or {})
    cfg.update(kwargs)
    out = {}
    for key, value in cfg.items():
        if key.lower() != "num_contexts":
            raise ValueError(f"unknown team configuration key {key!r} (only num_contexts)")
        out["num_contexts"] = int(value)
    return out


class Team:
    """A team handle (``shmem_team_t``).  ``Team()`` / ``Team(None)`` is
    TEAM_INVALID; ``Team(t)`` is an alias of ``t`` (destroying an alias
    invalidates only the alias for predefined teams)."""

    __slots__ = ("_h",)

    def __new__(cls, team: Optional["Team"] = None):
        self = super().__new__(cls)
        if team is None:
            self._h = INVALID_HANDLE
        elif isinstance(team, Team):
            self._h = team._h
        else:
            raise TypeError(f"expected a Team or None, not {type(team).__name__}")
        return self

    @classmethod
    def _of(cls, handle: int) -> "Team":
        t = super().__new__(cls)
        t._h = handle
        return t

    def __eq__(self, other):
        return self._h == other._h if isinstance(other, Team) else NotImplemented

    def __ne__(self, other):
        return self._h != other._h if isinstance(other, Team) else NotImplemented

    def __hash__(self):
        return hash(("shmem.Team", self._h))

    def __bool__(self):
        return self._h != INVALID_HANDLE

    def __repr__(self):
        names = {INVALID_HANDLE: "TEAM_INVALID", WORLD_HANDLE: "TEAM_WORLD",
                 SHARED_HANDLE: "TEAM_SHARED"}
        return f"<shmem.Team {names.get(self._h, self._h)}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def _state(self) -> TeamState:
        if self._h == INVALID_HANDLE:
            raise InvalidTeam("operation on TEAM_INVALID")
        return _registry().state(self._h)

    def destroy(self) -> None:
        """Destroy the team (collective over its members).  No-op for the
        predefined TEAM_WORLD / TEAM_SHARED / TEAM_INVALID objects."""
        if self is TEAM_WORLD or self is TEAM_SHARED or self is TEAM_INVALID:
            return
        h, self._h = self._h, INVALID_HANDLE
        if h in (INVALID_HANDLE, WORLD_HANDLE, SHARED_HANDLE) or runtime.current is None:
            return
        _registry().destroy(h)

    def my_pe(self) -> int:
        """This PE's number in the team."""
        return self._state().me

    def n_pes(self) -> int:
        """Number of PEs in the team."""
        return self._state().n

    def get_config(self) -> dict:
        """The team's configuration, ``{'num_contexts': n}``."""
        return dict(self._state().config)

    def translate_pe(self, pe: Optional[int] = None, team: Optional["Team"] = None) -> int:
        """Number in ``team`` (default TEAM_WORLD) of this team's PE ``pe``
        (default: the caller); -1 if that PE is not in ``team``."""
        src = self._state()
        pe = src.me if pe is None else pe
        if not 0 <= pe < src.n:
            return -1
        dest = _registry().world if team is None else team._state()
        return dest.index.get(src.pes[pe], -1)

    def split_strided(self, start: int = 0, stride: int = 1, size: Optional[int] = None,
                      config=None, **kwargs) -> "Team":
        """New team of the parent's PEs ``start, start+stride, ...`` (``size``
        of them; default: as many as fit).  Collective over the parent;
        returns TEAM_INVALID (a falsy Team) on PEs not in the new team."""
        parent = self._state()
        if size is None:
            size = len(range(start, parent.n, stride)) if stride > 0 else 1
        idx = [start + i * stride for i in range(size)]
        if size < 1 or any(not 0 <= i < parent.n for i in idx) or len(set(idx)) != size:
            raise InvalidPE(f"split_strided(start={start}, stride={stride}, size={size}) "
                            f"does not fit a team of {parent.n} PEs")
        cfg = _config_from(config, kwargs)
        reg = _registry()
        (slot,) = reg.agree_slots(parent, 1)
        members = [parent.pes[i] for i in idx]
        if reg.rt.rank not in members:
            return Team()
        return Team._of(reg.create(slot, members, cfg))

    def split_2d(self, xrange: int, xaxis_config=None, yaxis_config=None):
        """Split into a 2-D grid with rows of ``xrange`` PEs: returns
        ``(xteam, yteam)``, this PE's row and column.  Collective."""
        parent = self._state()
        if xrange < 1:
            raise ValueError(f"xrange must be >= 1, got {xrange}")
        xrange = min(xrange, parent.n)
        reg = _registry()
        xslot, yslot = reg.agree_slots(parent, 2)
        me = parent.me
        row = me // xrange
        xs = [parent.pes[i] for i in range(row * xrange, min((row + 1) * xrange, parent.n))]
        ys = [parent.pes[i] for i in range(me % xrange, parent.n, xrange)]
        xt = Team._of(reg.create(xslot, xs, _config_from(xaxis_config, {})))
        yt = Team._of(reg.create(yslot, ys, _config_from(yaxis_config, {})))
        return xt, yt

    def create_ctx(self, options: int = 0):
        """A new communication context on this team (PE numbers in its
        operations are team-relative)."""
        return runtime.get().ctxs.new(int(options), self._state())

    def sync(self) -> None:
        """Wait until every team member called sync (no completion of RMA
        implied, unlike barrier_all)."""
        self._state().sync()


TEAM_INVALID = Team._of(INVALID_HANDLE)
runtime.register("teams", TeamRegistry)
TEAM_WORLD = Team._of(WORLD_HANDLE)
TEAM_SHARED = Team._of(SHARED_HANDLE)


def run_rounds(ts, gen, what: str):
    """Drive a collective engine's generator over team ``ts``, each round
    waited for by the runtime (which raises a failed peer's error); its
    result."""
    rt = ts.rt
    try:
        reqs = gen.send(None)
        while True:
            rt.wait_requests(reqs, what)
            reqs = gen.send(None)
    except StopIteration as e:
        return e.value


def team_state(team) -> TeamState:
    """TeamState of ``team`` (None = TEAM_WORLD); raises InvalidTeam."""
    if team is None:
        return _registry().world
    if not isinstance(team, Team):
        raise TypeError(f"expected a shmem.Team, not {type(team).__name__}")
    return team._state()


# -- C-style spellings --------------------------------------------------------
def team_my_pe(team) -> int:
    return team_state(team).me


def team_n_pes(team) -> int:
    return team_state(team).n


def team_get_config(team) -> dict:
    return team.get_config()


def team_translate_pe(src_team, src_pe: int, dest_team) -> int:
    try:
        return src_team.translate_pe(src_pe, dest_team)
    except InvalidTeam:
        return -1


def team_split_strided(parent, start: int, stride: int, size: int, config=None) -> Team:
    return parent.split_strided(start, stride, size, config)


def team_split_2d(parent, xrange: int, xaxis_config=None, yaxis_config=None):
    return parent.split_2d(xrange, xaxis_config, yaxis_config)


def team_destroy(team) -> None:
    team.destroy()


def team_sync(team=None) -> None:
    team_state(team).sync()


def team_create_ctx(team, options: int = 0):
    return team.create_ctx(options)
