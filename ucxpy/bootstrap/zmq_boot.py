"""Bootstrap client for jobs started by ``ucxpy-run``.

Theory of operation
-------------------
The launcher (:mod:`ucxpy.bootstrap.launcher`) runs a rendezvous service: a
zmq ROUTER socket at ``UCXPY_RUN_ADDR`` and a PUB socket for failure notices.
Each rank holds one DEALER connection to the ROUTER and one SUB connection to
the PUB, which it speaks ZMTP on over plain sockets (:mod:`.zmtp`: importing
pyzmq would cost each rank more than the rest of its wire-up).

Requests and replies are multipart messages (the ROUTER adds/strips the
peer identity frame)::

    request:  [req_id (8 bytes, big endian), op, header (JSON), payload..., session, mac]
    reply:    [req_id, status, header (JSON), payload..., mac]

    op       header                      payload         reply payload
    HELLO    rank size job_id pid host   -               - (hdr: pub_port, failed)
             group
    PUT      key                         [value]         -
    GET      key                         -               [value] (sent once put)
    LOOKUP   key                         -               [value] or [] (hdr: found)
    SPAWN    apps (argv maxprocs env     -               - (hdr: group, errcodes),
             wdir), port, universe                       once the processes started
    COLL     seq kind root               [data] or []    allgather: one frame per rank
                                                         bcast: [root's data]
                                                         barrier: []
    QUERY    seq                         -               - (hdr: missing, arrived)
    ABORT    message errorcode           -               -

    status: OK | ERR (hdr: message) | PEERFAIL (hdr: rank, code, message)

Authentication: ``session`` is 16 random bytes a rank draws once; ``mac`` is
HMAC-SHA256 with the job key (``UCXPY_AUTH_KEY``, which ``ucxpy-run`` puts
in every rank's environment) over the other frames, each length-prefixed,
under the label ``REQUEST_LABEL``; a reply's mac covers the requester's
session and the reply's frames (``REPLY_LABEL``).  The service drops,
without answering, any request that is unsigned or wrongly signed, a second
HELLO of a session, a request of a session that never said HELLO, and one
whose ``req_id`` is not larger than the session's previous one (a replay).
The rank ignores replies that are not signed by the service.  Notices on the
PUB socket end with a mac over topic and header (``NOTICE_LABEL``); unsigned
or wrongly signed ones are ignored.  Nothing is encrypted: the key itself
never travels.

``group`` is 0 for the ranks ``ucxpy-run`` started and a new number for the
processes of each SPAWN (``UCXPY_GROUP``); a group has its own ranks,
collectives and failure notices, the key-value store is shared.

A collective is identified by a per-rank sequence number (every rank calls the
collectives in the same order, so the n-th call on each rank is the same
operation).  The service answers all ranks once all ``size`` contributions of a
sequence number have arrived, or answers PEERFAIL as soon as a rank that has
not contributed is known to be dead.  Because the socket is a DEALER, a reply
that arrives after its request timed out is recognised by ``req_id`` and
dropped, so a timeout never desynchronises the connection.

The PUB socket carries ``[b"FAIL", {rank, code, message}, mac]`` and
``[b"ABORT", {rank, message}, mac]`` notices; the launcher repeats them while the job winds down
so that slow subscribers still see them.  :meth:`ZmqBootstrap.check_failures`
reads them without blocking, at most once per ``check_interval`` seconds.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time

from .. import auth, config
from ..errors import BootstrapError, ConfigError, PeerFailure
from ..netaddr import LOOPBACK, is_loopback, outward_ipv4
from .base import Bootstrap, BootstrapTimeout, resolve_timeout
from .zmtp import Connection

__all__ = ["ZmqBootstrap", "PROTOCOL_VERSION"]

PROTOCOL_VERSION = 2
REQUEST_LABEL = b"ucxpy-rendezvous-2 request"
REPLY_LABEL = b"ucxpy-rendezvous-2 reply"
NOTICE_LABEL = b"ucxpy-rendezvous-2 notice"
SESSION_LEN = 16

#: seconds to wait for the launcher to answer HELLO
CONNECT_TIMEOUT = 30.0


def encode_header(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_header(frame) -> dict:
    if not frame:
        return {}
    return json.loads(bytes(frame))


def _env_int(env, name, default=None):
    try:
        value = config.setting(name, env)
    except ConfigError as e:
        raise BootstrapError(str(e)) from None
    if value is None:
        if default is None:
            raise BootstrapError(f"{name} is not set (is this process started by ucxpy-run?)")
        return default
    return value


class ZmqBootstrap(Bootstrap):
    """Client of the ``ucxpy-run`` rendezvous service.

    Connecting sends HELLO and waits up to ``connect_timeout`` seconds for the
    answer; an unreachable service raises
    :class:`~ucxpy.errors.BootstrapError`.
    """

    kind = "zmq"

    def __init__(self, addr: str, rank: int, size: int, local_rank: int = 0,
                 local_size: int = 1, job_id: str = "", connect_timeout=None,
                 check_interval: float = 0.05, group: int = 0, key: bytes = b""):
        if not 0 <= rank < size:
            raise BootstrapError(f"rank {rank} out of range for size {size}")
        if len(key) < auth.KEY_MIN:
            raise BootstrapError("no job key: UCXPY_AUTH_KEY is not set (ucxpy-run sets it "
                                 "for its ranks)")
        self.key = bytes(key)
        self._session = auth.new_nonce()[:SESSION_LEN]
        self.addr = addr
        self.rank, self.size = int(rank), int(size)
        self.local_rank, self.local_size = int(local_rank), int(local_size)
        self.job_id = job_id
        self.group = int(group)
        self.hostname = socket.gethostname()
        self.check_interval = float(check_interval)
        self.failed: dict = {}          # rank -> message, every failure seen so far
        self._unreported: list = []     # PeerFailure not yet raised by check_failures
        self._next_check = 0.0
        self._seq = 0
        self._req_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False

        # the service's ROUTER and PUB, spoken to over plain sockets (.zmtp)
        self._req = self._sub = None
        if connect_timeout is None:
            connect_timeout = CONNECT_TIMEOUT
        try:
            self._req = Connection(addr, b"DEALER", timeout=connect_timeout)
        except ValueError as e:
            raise BootstrapError(f"UCXPY_RUN_ADDR={addr!r}: {e}") from None
        except OSError as e:
            raise BootstrapError(f"rank {rank}: rendezvous service at {addr} unreachable "
                                 f"({e})") from None
        try:
            hdr, _ = self._call("HELLO", {
                "rank": self.rank, "size": self.size, "job_id": job_id,
                "pid": os.getpid(), "host": self.hostname,
                "version": PROTOCOL_VERSION, "group": self.group,
            }, timeout=connect_timeout, what="connect")
        except BootstrapTimeout:
            self._abandon()
            raise BootstrapError(
                f"rank {rank}: rendezvous service at {addr} unreachable "
                f"(no answer within {connect_timeout:g} s)") from None
        except BaseException:
            self._abandon()
            raise

        host = addr.rsplit(":", 1)[0]
        try:
            self._sub = Connection(f"{host}:{int(hdr['pub_port'])}", b"SUB",
                                   timeout=connect_timeout)
            self._sub.subscribe(b"")
        except OSError as e:
            self._abandon()
            raise BootstrapError(f"rank {rank}: the rendezvous service's notices at {host}: "
                                 f"{e}") from None
        for r, msg in hdr.get("failed", {}).items():
            self._note_failure(int(r), msg)

    @classmethod
    def from_env(cls, env=None) -> "ZmqBootstrap":
        """Build from the variables ``ucxpy-run`` sets for each rank."""
        env = os.environ if env is None else env
        addr = config.setting("UCXPY_RUN_ADDR", env)
        if not addr:
            raise BootstrapError("UCXPY_RUN_ADDR is not set: start the job with ucxpy-run")
        size = _env_int(env, "UCXPY_SIZE")
        try:
            connect_timeout = config.setting("UCXPY_BOOTSTRAP_CONNECT_TIMEOUT", env)
        except ConfigError:
            raise BootstrapError("UCXPY_BOOTSTRAP_CONNECT_TIMEOUT is not a number") from None
        try:
            key = config.auth_key_from_env(env) or b""
        except ConfigError as e:
            raise BootstrapError(str(e)) from None
        return cls(addr, rank=_env_int(env, "UCXPY_RANK"), size=size,
                   local_rank=_env_int(env, "UCXPY_LOCAL_RANK", 0),
                   local_size=_env_int(env, "UCXPY_LOCAL_SIZE", size),
                   job_id=config.setting("UCXPY_JOB_ID", env), connect_timeout=connect_timeout,
                   group=_env_int(env, "UCXPY_GROUP", 0), key=key)

    def job_key(self, timeout=None):
        """The launcher's key, from the environment (no communication)."""
        return self.key

    def listen_address(self):
        """Loopback when the launcher is (a single-host job), else the local
        address that routes to the launcher."""
        host = self.addr.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        return LOOPBACK if is_loopback(host) else outward_ipv4(host)

    # -- request/reply -----------------------------------------------------
    def _call(self, op: str, header: dict, payload=(), timeout=None, what=None):
        """Send one request and wait for its reply; return (header, frames)."""
        if self._closed:
            raise BootstrapError("bootstrap is closed")
        what = what or op.lower()
        req_id = next(self._req_ids).to_bytes(8, "big")
        body = [req_id, op.encode(), encode_header(header), *[bytes(p) for p in payload]]
        mac = auth.sign_frames(self.key, REQUEST_LABEL, [*body, self._session])
        with self._lock:
            try:
                self._req.send_multipart([*body, self._session, mac])
            except OSError as e:
                raise BootstrapError(f"{what}: the rendezvous service is gone ({e})") from None
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                # Block in select, waking at least once a second so that
                # Ctrl-C (handled by Python between calls) is not delayed.
                try:
                    frames = self._req.recv_multipart(1.0 if wait is None else min(wait, 1.0)
                                                      + 0.001)
                except OSError as e:
                    raise BootstrapError(f"{what}: the rendezvous service is gone "
                                         f"({e})") from None
                if frames is not None:
                    if len(frames) < 4 or frames[0] != req_id:
                        continue        # stale reply to a request that timed out
                    if not auth.check(self.key, frames[-1], REPLY_LABEL, self._session,
                                      *frames[:-1]):
                        auth.refused("rendezvous", "reply not signed by the launcher")
                        continue
                    frames = frames[:-1]
                    status, hdr = frames[1], decode_header(frames[2])
                    if status == b"OK":
                        return hdr, frames[3:]
                    if status == b"PEERFAIL":
                        self._note_failure(int(hdr["rank"]), hdr["message"], report=False)
                        raise PeerFailure(f"{what}: {hdr['message']}", peer=int(hdr["rank"]))
                    raise BootstrapError(f"{what}: {hdr.get('message', status.decode())}")
                if deadline is not None and time.monotonic() >= deadline:
                    raise BootstrapTimeout(f"{what} timed out after {timeout:g} s")

    def _collective(self, kind: str, data, root: int, timeout):
        timeout = resolve_timeout(timeout)
        seq = self._seq
        self._seq += 1
        what = f"{kind} #{seq}"
        payload = [] if data is None else [data]
        try:
            return self._call("COLL", {"seq": seq, "kind": kind, "root": root},
                              payload, timeout=timeout, what=what)[1]
        except BootstrapTimeout:
            missing = self._query_missing(seq)
        if missing is None:
            raise BootstrapTimeout(
                f"rank {self.rank}: {what} timed out after {timeout:g} s and the "
                f"rendezvous service at {self.addr} is not responding")
        raise BootstrapTimeout(
            f"rank {self.rank}: {what} timed out after {timeout:g} s; "
            f"rank(s) {_ranges(missing)} did not join", missing=missing)

    def _query_missing(self, seq: int):
        try:
            hdr, _ = self._call("QUERY", {"seq": seq}, timeout=5.0)
        except BootstrapTimeout:
            return None
        return hdr.get("missing", [])

    # -- Bootstrap API -----------------------------------------------------
    def allgather(self, data: bytes, timeout=None) -> list:
        frames = self._collective("allgather", memoryview(data), -1, timeout)
        if len(frames) != self.size:
            raise BootstrapError(f"allgather returned {len(frames)} items for {self.size} ranks")
        return frames

    def barrier(self, timeout=None) -> None:
        self._collective("barrier", None, -1, timeout)

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        self._check_root(root)
        if self.rank == root:
            if data is None:
                raise BootstrapError("bcast: the root must supply data")
            payload = memoryview(data)
        else:
            payload = None
        frames = self._collective("bcast", payload, root, timeout)
        return frames[0] if frames else b""

    def put(self, key: str, value: bytes) -> None:
        self._call("PUT", {"key": str(key)}, [memoryview(value)], timeout=resolve_timeout(None),
                   what=f"put {key!r}")

    def get(self, key: str, timeout=None) -> bytes:
        timeout = resolve_timeout(timeout)
        try:
            return self._call("GET", {"key": str(key)}, timeout=timeout,
                              what=f"get {key!r}")[1][0]
        except BootstrapTimeout:
            raise BootstrapTimeout(f"rank {self.rank}: key {key!r} was not put "
                                   f"within {timeout:g} s") from None

    def lookup(self, key: str):
        """The value put under ``key``, or None if there is none (no waiting)."""
        hdr, frames = self._call("LOOKUP", {"key": str(key)}, timeout=resolve_timeout(None),
                                 what=f"lookup {key!r}")
        return frames[0] if hdr.get("found") else None

    def spawn(self, apps, **extra) -> tuple:
        """Ask the launcher to start new processes: ``apps`` is a list of
        ``{"argv": [...], "maxprocs": n, "env": {...}, "wdir": path}``; they
        form one new group.  Returns ``(group, errcodes)`` once started."""
        hdr, _ = self._call("SPAWN", {"apps": apps, **extra}, timeout=resolve_timeout(None),
                            what="spawn")
        return int(hdr["group"]), list(hdr.get("errcodes", []))

    def check_failures(self) -> None:
        """Raise :class:`~ucxpy.errors.PeerFailure` for a rank the launcher
        reported dead; each failure is raised once (all of them stay in
        :attr:`failed`).  Returns at once unless ``check_interval`` seconds
        have passed since the last real check."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.check_interval
        if self._unreported:
            raise self._unreported.pop(0)
        sub = self._sub
        if sub is None or not self._lock.acquire(blocking=False):
            return
        try:
            while True:
                try:
                    frames = sub.recv_multipart(0)
                except OSError:
                    break               # (the launcher is gone: requests report it)
                if frames is None:
                    break
                if len(frames) != 3 or not auth.check(self.key, frames[2], NOTICE_LABEL,
                                                      frames[0], frames[1]):
                    auth.refused("rendezvous", "notice not signed by the launcher")
                    continue
                try:
                    hdr = decode_header(frames[1])
                except ValueError:
                    continue
                if frames[0] in (b"FAIL", b"ABORT") and "rank" in hdr and \
                        int(hdr.get("group", 0)) == self.group:
                    self._note_failure(int(hdr["rank"]), hdr.get("message", ""))
        finally:
            self._lock.release()
        if self._unreported:
            raise self._unreported.pop(0)

    def _note_failure(self, rank: int, message: str, report: bool = True):
        if rank in self.failed or rank == self.rank:
            return
        self.failed[rank] = message
        if report:
            self._unreported.append(PeerFailure(message, peer=rank))

    def abort(self, message: str = "", errorcode: int = 1) -> None:
        """Ask the launcher to kill every other rank at once and to end the
        job with status ``errorcode``; returns so the caller can report and
        exit (the launcher kills it after the grace period otherwise).

        Raises :class:`~ucxpy.errors.BootstrapError` if the launcher did not
        acknowledge within 5 s."""
        if self._closed:
            raise BootstrapError("abort: bootstrap is closed")
        self._call("ABORT", {"message": str(message), "errorcode": int(errorcode)},
                   timeout=5.0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abandon()

    def _abandon(self):
        for s in (self._req, self._sub):
            if s is not None:
                s.close()


def _ranges(ranks) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    ranks = sorted(set(ranks))
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)
