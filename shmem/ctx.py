"""Communication contexts: independent streams of RMA/AMO completion.

A context owns the list of its operations still in flight to AM-mode PEs
(same-host MAPPED operations complete before the call returns, so they never
enter it).  ``quiet`` on a context waits for its list only; ``fence`` is
free because ucxpy executes AM-mode operations on one endpoint in issue
order.  A context made from a team takes team-relative PE numbers.
"""
from __future__ import annotations

import enum
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from . import runtime
from .errors import InvalidContext
from .team import Team, team_state

INVALID_HANDLE, DEFAULT_HANDLE = 0, 1
#: prune completed requests from a context's list past this length
_PRUNE_AT = 512


class CTX(enum.IntFlag):
    """Context creation options (accepted; every context is serialized)."""
    PRIVATE = 1
    SERIALIZED = 2
    NOSTORE = 4


CTX_PRIVATE = CTX.PRIVATE
CTX_SERIALIZED = CTX.SERIALIZED
CTX_NOSTORE = CTX.NOSTORE


class CtxState:
    __slots__ = ("handle", "team", "options", "pending", "world_team")

    def __init__(self, handle, team, options=0):
        self.handle = handle
        self.team = team                  # TeamState
        self.options = options
        self.pending = []                 # ucxpy Requests in flight (AM mode)
        self.world_team = team.handle == 1

    def track(self, req) -> None:
        """Remember an AM-mode request until the next quiet."""
        p = self.pending
        p.append(req)
        if len(p) > _PRUNE_AT:
            p[:] = [r for r in p if not r.done or r.exc is not None]

    def quiet(self, rt) -> None:
        p = self.pending
        if p:                             # (emptied in place: shmem.accel's quiet reads it)
            reqs = p[:]
            p.clear()
            rt.wait_requests(reqs, "quiet")


class ContextRegistry:
    def __init__(self, rt):
        self.rt = rt
        self.default = CtxState(DEFAULT_HANDLE, rt.teams.world)
        self.states = {DEFAULT_HANDLE: self.default}
        self._next = DEFAULT_HANDLE + 1

    def create(self, options, team_state) -> int:
        h = self._next
        self._next += 1
        self.states[h] = CtxState(h, team_state, options)
        return h

    def new(self, options, team_state) -> "Ctx":
        """A new context on ``team_state`` (Team.create_ctx)."""
        return Ctx._of(self.create(options, team_state))

    def destroy(self, handle) -> None:
        st = self.states.pop(handle, None)
        if st is not None:
            st.quiet(self.rt)

    def destroy_team_contexts(self, team_handle) -> None:
        for h, st in list(self.states.items()):
            if h != DEFAULT_HANDLE and st.team.handle == team_handle:
                self.destroy(h)

    def quiet_all(self) -> None:
        for st in list(self.states.values()):
            st.quiet(self.rt)

    def state(self, handle) -> CtxState:
        st = self.states.get(handle)
        if st is None:
            raise InvalidContext("invalid context (CTX_INVALID or destroyed)")
        return st


def ctx_state(rt, ctx) -> CtxState:
    """CtxState for ``ctx`` (None = the default context)."""
    if ctx is None:
        return rt.ctxs.default
    try:
        h = ctx._h
    except AttributeError:
        raise TypeError(f"expected a shmem.Ctx, not {type(ctx).__name__}") from None
    return rt.ctxs.default if h == DEFAULT_HANDLE else rt.ctxs.state(h)


class Ctx:
    """A context handle (``shmem_ctx_t``).  ``Ctx()`` is CTX_INVALID;
    ``Ctx(c)`` an alias of ``c``.  Usable as a context manager that
    destroys it on exit."""

    __slots__ = ("_h",)

    def __new__(cls, ctx: Optional["Ctx"] = None):
        self = super().__new__(cls)
        if ctx is None:
            self._h = INVALID_HANDLE
        elif isinstance(ctx, Ctx):
            self._h = ctx._h
        else:
            raise TypeError(f"expected a Ctx or None, not {type(ctx).__name__}")
        return self

    @classmethod
    def _of(cls, handle) -> "Ctx":
        c = super().__new__(cls)
        c._h = handle
        return c

    def __eq__(self, other):
        return self._h == other._h if isinstance(other, Ctx) else NotImplemented

    def __ne__(self, other):
        return self._h != other._h if isinstance(other, Ctx) else NotImplemented

    def __hash__(self):
        return hash(("shmem.Ctx", self._h))

    def __bool__(self):
        return self._h != INVALID_HANDLE

    def __repr__(self):
        names = {INVALID_HANDLE: "CTX_INVALID", DEFAULT_HANDLE: "CTX_DEFAULT"}
        return f"<shmem.Ctx {names.get(self._h, self._h)}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    @staticmethod
    def create(options: int = 0, team=None) -> "Ctx":
        """A new context (on ``team``, default TEAM_WORLD)."""
        rt = runtime.get()
        return Ctx._of(rt.ctxs.create(int(options), team_state(team)))

    def destroy(self) -> None:
        """Quiet and destroy the context; no-op for CTX_DEFAULT/CTX_INVALID."""
        if self is CTX_DEFAULT or self is CTX_INVALID:
            return
        h, self._h = self._h, INVALID_HANDLE
        if h in (INVALID_HANDLE, DEFAULT_HANDLE) or runtime.current is None:
            return
        runtime.current.ctxs.destroy(h)

    def _state(self) -> CtxState:
        if self._h == INVALID_HANDLE:
            raise InvalidContext("operation on CTX_INVALID")
        return runtime.get().ctxs.state(self._h)

    def get_team(self):
        """The team the context was created on."""
        return Team._of(self._state().team.handle)

    def fence(self) -> None:
        """Order this context's puts/AMOs to each PE (see module docstring)."""
        self._state()

    def quiet(self) -> None:
        """Wait until this context's puts/AMOs/nbi gets completed."""
        self._state().quiet(runtime.get())


CTX_INVALID = Ctx._of(INVALID_HANDLE)
CTX_DEFAULT = Ctx._of(DEFAULT_HANDLE)
runtime.register("ctxs", ContextRegistry)


def ctx_create(options: int = 0) -> Ctx:
    return Ctx.create(options)


def ctx_destroy(ctx: Ctx) -> None:
    ctx.destroy()


def ctx_get_team(ctx: Ctx):
    return ctx.get_team()
