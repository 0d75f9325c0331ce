"""SPMD start-up: one worker per rank, wired up through the launcher.

``ucxpy.init()`` works the same under ``ucxpy-run``, ``mpirun``/``mpiexec``
and as a plain single process::

    world = ucxpy.init()
    if world.rank == 0:
        world.send(b"hello", dest=1, tag=7)
    elif world.rank == 1:
        buf = bytearray(5); world.recv(buf, source=0, tag=7)
    world.finalize()
"""
from __future__ import annotations

import atexit
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from . import auth, record
from .bootstrap import from_env
from .config import Config
from .context import Context
from .errors import InvalidRank
from .request import Request, TagInfo
from .tag import ANY_SOURCE, FULL_MASK, RESERVED_TAG_BASE

_BARRIER_TAG = RESERVED_TAG_BASE | (1 << 48)


class World:
    """The ranks of an SPMD job: ``rank``, ``size``, a worker whose id is the
    rank, and a (lazily connected) endpoint to every rank."""

    def __init__(self, bootstrap, context: Context, timeout: float = 120.0):
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.size = bootstrap.size
        self.context = context
        self.worker = context.create_worker(worker_id=self.rank)
        self.worker.bootstrap = bootstrap
        self._barrier_epoch = 0
        self.finalized = False
        try:
            addrs = bootstrap.allgather(self.worker.address_bytes, timeout=timeout)
            self.eps = [self.worker.connect(a) for a in addrs]
            bootstrap.barrier(timeout=timeout)
            tr = self.worker.tr
            if tr is not None:
                tr.rank, tr.size = self.rank, self.size
                if tr.tracing and self.size > 1:
                    from .trace import align_clocks     # deferred: ucxpy.trace only when tracing
                    align_clocks(self, timeout=timeout)
        except BaseException:
            self.worker.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.finalize()
        else:
            self.abort()

    def ep(self, rank: int):
        """Endpoint to ``rank``; raises :class:`InvalidRank` when out of range."""
        if not (0 <= rank < self.size):
            raise InvalidRank(f"rank {rank} is out of range for a job of {self.size}")
        return self.eps[rank]

    def _source(self, source):
        if source is None or source == ANY_SOURCE:
            return ANY_SOURCE
        if not (0 <= source < self.size):
            raise InvalidRank(f"source rank {source} is out of range for a job of {self.size}")
        return source

    # -- tagged convenience --------------------------------------------------
    def isend(self, buf, dest: int, tag: int = 0) -> Request:
        return self.ep(dest).tag_send_nb(buf, tag)

    def send(self, buf, dest: int, tag: int = 0, timeout: Optional[float] = None) -> None:
        self.ep(dest).tag_send(buf, tag, timeout)

    def irecv(self, buf, source=ANY_SOURCE, tag: int = 0, tag_mask: int = FULL_MASK) -> Request:
        return self.worker.tag_recv_nb(buf, tag, tag_mask, self._source(source))

    def recv(self, buf, source=ANY_SOURCE, tag: int = 0, tag_mask: int = FULL_MASK,
             timeout: Optional[float] = None) -> TagInfo:
        return self.worker.tag_recv(buf, tag, tag_mask, self._source(source), timeout)

    def progress(self) -> int:
        return self.worker.progress()

    # -- synchronisation -----------------------------------------------------
    def barrier(self, timeout: Optional[float] = None) -> None:
        """Dissemination barrier over tagged messages: ceil(log2 size) rounds."""
        self._barrier_epoch = (self._barrier_epoch + 1) & 0xFFFF
        base = _BARRIER_TAG | (self._barrier_epoch << 8)
        dist, rnd, token = 1, 0, bytearray(1)
        sent_on = []
        while dist < self.size:
            tag = base | rnd
            rreq = self.worker.tag_recv_nb(token, tag, FULL_MASK, (self.rank - dist) % self.size)
            ep = self.eps[(self.rank + dist) % self.size]
            ep.tag_send(b"\0", tag, timeout)
            sent_on.append(ep)
            rreq.wait(timeout)
            dist, rnd = dist * 2, rnd + 1
        # A send completes once copied; on a connection still doing its
        # handshake the frame waits in the transport, and a caller that
        # blocks in something else next (a bootstrap collective) would
        # never let it leave: make sure ours did.
        for ep in sent_on:
            ep.flush(timeout)

    def finalize(self, timeout: Optional[float] = 60.0) -> None:
        """Barrier, close every endpoint gracefully, release transports."""
        if self.finalized:
            return
        self.finalized = True
        try:
            # Twice: the first barrier may open connections; after the second,
            # every rank's last frames travelled on established connections,
            # so a peer closing cannot overtake frames still being accepted.
            self.barrier(timeout)
            self.worker.flush(timeout)
            self.barrier(timeout)
        finally:
            self.worker.close()
            self.bootstrap.close()

    def abort(self, message: str = "aborted") -> None:
        """Tear down at once and ask the launcher to stop the job."""
        if self.finalized:
            return
        self.finalized = True
        try:
            self.bootstrap.abort(message)
        finally:
            self.worker.close()


_world: Optional[World] = None


def init(config=None, timeout: float = 120.0, **overrides) -> World:
    """Join the SPMD job this process was launched in (idempotent)."""
    global _world
    if _world is not None and not _world.finalized:
        return _world
    boot = from_env()
    try:
        cfg = config if config is not None else Config.from_env(**overrides)
        context = Context(job_config(cfg, boot, timeout))
    except BaseException:
        boot.close()
        raise
    _world = World(boot, context, timeout)
    atexit.register(_atexit)
    return _world


def job_config(config: Config, bootstrap, timeout=None) -> Config:
    """``config`` completed with what the launcher knows: the job key (unless
    the config has one) and, unless ``tcp_iface`` is set, the address
    listeners bind (loopback for a single-host job).  Calls the bootstrap's
    :meth:`~ucxpy.bootstrap.Bootstrap.job_key`, which may be collective."""
    changes = {}
    key = bootstrap.job_key(timeout)
    if key and auth.job_key(config) is None:
        changes["auth_key"] = key.decode("utf-8", "surrogateescape")
    if not config.tcp_iface:
        listen = bootstrap.listen_address()
        if listen:
            changes["tcp_iface"] = listen
    return record.replace(config, **changes) if changes else config


def _atexit():
    w = _world
    if w is not None and not w.finalized:
        w.finalized = True
        try:
            w.worker.close()
            w.bootstrap.close()
        except Exception:
            pass
