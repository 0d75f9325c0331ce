"""The rendezvous service ``ucxpy-run`` serves to its ranks: a key-value store,
collectives (barrier, allgather, bcast) and failure notices, over zmq.

The wire protocol is described in :mod:`ucxpy.bootstrap.zmq_boot` (the rank
side); the launcher (:mod:`ucxpy.bootstrap.launcher`) owns one
:class:`RendezvousService`, feeds it the ranks' exits and polls its sockets.

Processes belong to *groups*: group 0 is the job ``ucxpy-run`` started, and
every ``SPAWN`` (MPI's ``Comm_spawn``) adds a group of its own, with its own
ranks, collectives and failure bookkeeping.  The key-value store is shared by
all groups (MPI's published names are seen by the whole job).

Every request must carry a valid HMAC of the job key and come from a
session that said HELLO exactly once, with request ids that only grow
(:mod:`ucxpy.bootstrap.zmq_boot` describes the frames): anything else is
dropped without an answer and counted in :attr:`RendezvousService.rejected`
and ``ucxpy.auth.failures["rendezvous"]``.  Replies and the notices on the
PUB socket are signed by the service.  Error replies (only ever sent to
authenticated requests) never quote the job id or the key.
"""
from __future__ import annotations

import logging
import signal
import time

import zmq

try:
    from .. import auth
    from .zmq_boot import (NOTICE_LABEL, PROTOCOL_VERSION, REPLY_LABEL, REQUEST_LABEL,
                           SESSION_LEN, decode_header, encode_header)
except ImportError:     # pragma: no cover - loaded as a top-level module
    from ucxpy import auth
    from ucxpy.bootstrap.zmq_boot import (NOTICE_LABEL, PROTOCOL_VERSION, REPLY_LABEL,
                                          REQUEST_LABEL, SESSION_LEN, decode_header,
                                          encode_header)

log = logging.getLogger("ucxpy.rendezvous")

#: a rank that exited 0 is treated as gone from collectives after this long
CLEAN_EXIT_SETTLE = 1.0


def describe_exit(code: int) -> str:
    """-9 -> 'code -9 (SIGKILL)', 3 -> 'code 3'."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"code {code} (signal {-code})"
    return f"code {code}"


class Collective:
    """Contributions to the collective with one sequence number."""

    __slots__ = ("seq", "kind", "root", "parts", "waiters", "error")

    def __init__(self, seq: int, kind: str, root: int):
        self.seq, self.kind, self.root = seq, kind, root
        self.parts: dict = {}      # rank -> data frame (or None)
        self.waiters: dict = {}    # rank -> (identity, req_id)
        self.error = None          # (status, header) once failed


class Group:
    """The ranks of one group (the job, or one spawn) and their collectives."""

    __slots__ = ("gid", "size", "colls", "done_seqs", "connected", "gone")

    def __init__(self, gid: int, size: int):
        self.gid, self.size = gid, size
        self.colls: dict = {}           # seq -> Collective
        self.done_seqs: set = set()
        self.connected: set = set()
        self.gone: dict = {}            # rank -> (code, message, fatal, time)


class RendezvousService:
    """The KV and collective service ranks reach at ``UCXPY_RUN_ADDR``."""

    def __init__(self, size: int, job_id: str, bind_host: str = "127.0.0.1",
                 key: bytes = b""):
        if len(key) < auth.KEY_MIN:
            raise ValueError("the rendezvous service needs a job key")
        self.size, self.job_id = size, job_id
        self.key = bytes(key)
        #: requests dropped: unsigned, wrongly signed, replayed or stale
        self.rejected = 0
        self.sessions: dict = {}        # session -> [group id, rank, last request id]
        self.groups = {0: Group(0, size)}
        self.spawn_requests: list = []  # (ident, req_id, gid, apps, header), for the launcher
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.pub = self.ctx.socket(zmq.PUB)
        for s in (self.router, self.pub):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IPV6, 1)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        bind = f"tcp://{'[' + bind_host + ']' if ':' in bind_host else bind_host}"
        self.port = self.router.bind_to_random_port(bind)
        self.pub_port = self.pub.bind_to_random_port(bind)
        self.kv: dict = {}
        self.pending_gets: dict = {}    # key -> [(identity, req_id)]
        self.notices: list = []         # published PUB messages, re-sent periodically
        self.abort_request = None       # (rank, message, errorcode)

    @property
    def gone(self) -> dict:
        """Exits of the job's own ranks (group 0)."""
        return self.groups[0].gone

    def close(self):
        self.router.close()
        self.pub.close()
        self.ctx.term()

    # -- replies -----------------------------------------------------------
    def _reply(self, ident, req_id, status=b"OK", header=None, frames=(), session=None):
        """Send a signed reply; ``ident`` may be ``(identity, session)``."""
        if session is None:
            ident, session = ident
        body = [req_id, status, encode_header(header or {}), *[bytes(f) for f in frames]]
        mac = auth.sign_frames(self.key, REPLY_LABEL, [session, *body])
        try:
            self.router.send_multipart([ident, *body, mac], copy=False)
        except zmq.ZMQError:
            pass    # the rank is gone; nothing to tell it

    def _error(self, ident, req_id, message):
        self._reply(ident, req_id, b"ERR", {"message": message})

    # -- requests ----------------------------------------------------------
    def serve_pending(self, max_messages: int = 1000) -> None:
        """Handle whatever requests have arrived, without blocking."""
        for _ in range(max_messages):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            request = self._authenticate(frames)
            if request is None:
                continue
            ident, req_id, op, header, payload = request
            try:
                header = decode_header(header)
                self._dispatch(ident, req_id, op, header, payload)
            except Exception as e:     # noqa: BLE001 - a bad request must not kill the job
                self._error(ident, req_id, f"bad {op[:16]!r} request: {e}")

    def _authenticate(self, frames):
        """``((identity, session), req_id, op, header, payload)`` of a request
        that is signed with the job key, from a known session (or a new one
        saying HELLO) and newer than the session's last one; else None."""
        if len(frames) < 6:
            return self._drop("malformed request")
        ident, body, session, mac = frames[0], frames[1:-2], frames[-2], frames[-1]
        if len(session) != SESSION_LEN or len(body[0]) != 8:
            return self._drop("malformed request")
        if not auth.check(self.key, mac, REQUEST_LABEL, *body, session):
            return self._drop("request not signed with the job key")
        req_id, op, header, payload = body[0], body[1], body[2], body[3:]
        n = int.from_bytes(req_id, "big")
        state = self.sessions.get(session)
        if op == b"HELLO":
            if state is not None:
                return self._drop("HELLO replayed")
        elif state is None:
            return self._drop("request of an unknown session")
        elif n <= state[2]:
            return self._drop("request replayed (old request id)")
        if state is not None:
            state[2] = n
        return (ident, session), req_id, op, header, payload

    def _drop(self, why):
        self.rejected += 1
        auth.refused("rendezvous", why)
        return None

    def _dispatch(self, ident, req_id, op, hdr, payload):
        if op == b"HELLO":
            rank, gid = int(hdr["rank"]), int(hdr.get("group", 0))
            if hdr.get("job_id") != self.job_id:
                # (the request is signed with this job's key: a launcher mix-up)
                return self._error(ident, req_id, "the job id does not match this job's")
            grp = self.groups.get(gid)
            if grp is None:
                return self._error(ident, req_id, f"group {gid} does not exist")
            if not 0 <= rank < grp.size or int(hdr.get("size", -1)) != grp.size:
                return self._error(ident, req_id, f"rank {rank}/{hdr.get('size')} does "
                                   f"not fit a job of {grp.size}")
            if int(hdr.get("version", 0)) != PROTOCOL_VERSION:
                return self._error(ident, req_id, "bootstrap protocol version mismatch")
            self.sessions[ident[1]] = [gid, rank, int.from_bytes(req_id, "big")]
            grp.connected.add(rank)
            failed = {str(r): g[1] for r, g in grp.gone.items() if g[2]}
            return self._reply(ident, req_id, header={"pub_port": self.pub_port,
                                                      "failed": failed})
        gid, rank, _last = self.sessions[ident[1]]
        grp = self.groups[gid]
        if op == b"COLL":
            return self._collective(grp, rank, ident, req_id, hdr, payload)
        if op == b"PUT":
            key = str(hdr["key"])
            self.kv[key] = payload[0] if payload else b""
            self._reply(ident, req_id)
            for waiter in self.pending_gets.pop(key, ()):
                self._reply(*waiter, frames=[self.kv[key]])
            return None
        if op == b"GET":
            key = str(hdr["key"])
            if key in self.kv:
                return self._reply(ident, req_id, frames=[self.kv[key]])
            self.pending_gets.setdefault(key, []).append((ident, req_id))
            return None
        if op == b"LOOKUP":
            key = str(hdr["key"])
            return self._reply(ident, req_id, header={"found": key in self.kv},
                               frames=[self.kv[key]] if key in self.kv else [])
        if op == b"SPAWN":
            apps = list(hdr["apps"])
            total = sum(int(a["maxprocs"]) for a in apps)
            if total < 1:
                return self._error(ident, req_id, "spawn of no processes")
            gid = max(self.groups) + 1
            self.groups[gid] = Group(gid, total)
            self.spawn_requests.append((ident, req_id, gid, apps, hdr))
            return None
        if op == b"QUERY":
            coll = grp.colls.get(int(hdr["seq"]))
            if coll is None:
                missing = [] if int(hdr["seq"]) in grp.done_seqs else list(range(grp.size))
            else:
                missing = [r for r in range(grp.size) if r not in coll.parts]
            return self._reply(ident, req_id, header={"missing": missing})
        if op == b"ABORT":
            if self.abort_request is None:
                self.abort_request = (rank, str(hdr.get("message", "")),
                                      int(hdr.get("errorcode", 1)))
            return self._reply(ident, req_id)
        return self._error(ident, req_id, f"unknown operation {op[:16]!r}")

    def spawn_done(self, request, errcodes, message=None) -> None:
        """The launcher started (or failed to start) a spawn request's processes."""
        ident, req_id, gid, _, _ = request
        if message is not None:
            return self._error(ident, req_id, message)
        self._reply(ident, req_id, header={"group": gid, "errcodes": errcodes})

    def _collective(self, grp, rank, ident, req_id, hdr, payload):
        seq, kind, root = int(hdr["seq"]), str(hdr["kind"]), int(hdr.get("root", -1))
        if seq in grp.done_seqs:
            return self._error(ident, req_id, f"{kind} #{seq} already completed")
        coll = grp.colls.get(seq)
        if coll is None:
            coll = grp.colls[seq] = Collective(seq, kind, root)
        if coll.error is not None:
            return self._reply(ident, req_id, *coll.error)
        if (kind, root) != (coll.kind, coll.root):
            self._fail(coll, b"ERR", {"message": (
                f"collective mismatch at #{seq}: rank {rank} called {kind}"
                f"(root={root}) but another rank called {coll.kind}(root={coll.root})")})
            return self._reply(ident, req_id, *coll.error)
        if rank in coll.parts:
            return self._error(ident, req_id, f"rank {rank} joined {kind} #{seq} twice")
        if kind == "bcast" and rank == root and not payload:
            return self._error(ident, req_id, "bcast root sent no data")
        coll.parts[rank] = payload[0] if payload else None
        coll.waiters[rank] = (ident, req_id)
        if len(coll.parts) == grp.size:
            return self._complete(grp, coll)
        self._check_dead(grp, coll, time.monotonic())
        return None

    def _complete(self, grp, coll):
        if coll.kind == "allgather":
            frames = [coll.parts[r] or b"" for r in range(grp.size)]
        elif coll.kind == "bcast":
            frames = [coll.parts[coll.root] or b""]
        else:
            frames = []
        for ident, req_id in coll.waiters.values():
            self._reply(ident, req_id, frames=frames)
        del grp.colls[coll.seq]
        grp.done_seqs.add(coll.seq)

    def _fail(self, coll, status, header):
        coll.error = (status, header)
        for ident, req_id in coll.waiters.values():
            self._reply(ident, req_id, status, header)
        coll.waiters.clear()

    def _check_dead(self, grp, coll, now):
        """Fail ``coll`` if a rank it still waits for can never join."""
        if coll.error is not None:
            return
        for r in range(grp.size):
            if r in coll.parts or r not in grp.gone:
                continue
            code, message, fatal, when = grp.gone[r]
            if fatal or now - when >= CLEAN_EXIT_SETTLE:
                if not fatal:
                    message = (f"rank {r} exited with {describe_exit(code)} without "
                               f"joining {coll.kind} #{coll.seq}")
                self._fail(coll, b"PEERFAIL", {"rank": r, "code": code, "message": message})
                return

    # -- failures ----------------------------------------------------------
    def rank_gone(self, rank: int, code: int, message: str, fatal: bool,
                  group: int = 0) -> None:
        """Record that ``rank`` of ``group`` exited; fatal exits are announced on PUB."""
        self.groups[group].gone[rank] = (code, message, fatal, time.monotonic())
        if fatal:
            self.publish(b"FAIL", {"rank": rank, "group": group, "code": code,
                                   "message": message})
        self.expire()

    def publish(self, topic: bytes, header: dict) -> None:
        """Send a notice to every rank, signed (ranks ignore unsigned ones)."""
        msg = [topic, encode_header(header)]
        msg.append(auth.sign_frames(self.key, NOTICE_LABEL, msg))
        self.notices.append(msg)
        self.pub.send_multipart(msg)

    def republish(self) -> None:
        for msg in self.notices:
            self.pub.send_multipart(msg)

    def expire(self) -> None:
        now = time.monotonic()
        for grp in self.groups.values():
            for coll in list(grp.colls.values()):
                self._check_dead(grp, coll, now)

    def next_settle_deadline(self):
        """When a clean exit next becomes final for waiting collectives."""
        now = time.monotonic()
        pending, waiting = [], False
        for grp in self.groups.values():
            pending += [g[3] + CLEAN_EXIT_SETTLE for g in grp.gone.values()
                        if not g[2] and g[3] + CLEAN_EXIT_SETTLE > now]
            waiting = waiting or any(c.error is None for c in grp.colls.values())
        return min(pending) if pending and waiting else None
