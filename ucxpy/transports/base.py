"""The transport contract (ucxpy's UCT).

A transport moves *frames* between two workers and knows nothing about tags,
MPI or SHMEM.  A frame is ``(am_id, header, payload)``:

* ``am_id``  -- int 0..255 chosen by the core (see ``ucxpy.wire.AmId``);
* ``header`` -- small bytes-like (at most ``MAX_HEADER`` bytes) the core packs;
* ``payload`` -- any buffer-protocol object, possibly empty, at most
  ``attrs.max_frame`` bytes.

Frames sent on one :class:`TransportEndpoint` are delivered to the remote
:class:`Interface` owner in the order they were sent (per-endpoint FIFO).  The
core relies on that for MPI's non-overtaking rule: all traffic from worker A to
worker B goes over the endpoint A created to B.

Theory of operation
-------------------
One :class:`Interface` exists per (worker, transport).  The worker calls
``iface.progress()`` from ``Worker.progress()``; the interface then delivers
every complete incoming frame by calling ``owner.recv_frame(...)`` and
completes queued sends.  Nothing happens behind the user's back: no threads in
transports.

Sending never blocks.  ``ep.send()`` returns ``True`` when the payload buffer
is no longer referenced (copied into a ring/kernel buffer), or ``False`` when
the frame was accepted but parts of it are still queued *by reference* (zero
copy).  In the ``False`` case ``on_complete(exc_or_None)`` is called later,
from ``progress()``, once the payload may be reused (or with an exception if
the connection died).  Queued frames keep their order.

Receiving: for ``am_id`` values in ``owner.direct_am_ids`` a transport with
``Caps.RX_ZCOPY`` first calls ``owner.recv_dest(ep, am_id, header, length)``;
if that returns a writable memoryview of exactly ``length`` bytes the payload
is received straight into it and ``recv_frame`` gets that same view as payload.
Otherwise ``recv_frame`` receives a memoryview that is only valid during the
call (it may point into a shared ring); the core copies what it keeps.

Failure: when a connection breaks, or the peer process dies, the interface
calls ``owner.conn_failed(ep, exc)`` exactly once per endpoint (``ep`` may be
an endpoint created by ``accept``) with a :class:`ucxpy.errors.ConnectionLost`,
fails the ``on_complete`` of all queued sends of that endpoint, and makes later
``send()`` calls raise ``ConnectionLost``.  Malformed input from the wire is a
``ConnectionLost``/``ProtocolError`` on that connection, never a crash.
"""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional, Protocol

MAX_HEADER = 1024


def byte_view(buf):
    """A payload with a byte length: bytes/bytearray as they are, anything
    else as a flat unsigned-byte memoryview (InvalidBuffer if not contiguous)."""
    if type(buf) is bytes or type(buf) is bytearray:
        return buf
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        try:
            mv = mv.cast("B")
        except TypeError:
            from ..errors import InvalidBuffer
            raise InvalidBuffer("payload must be a contiguous buffer") from None
    return mv


class Caps(enum.IntFlag):
    """Capability flags, like ``UCT_IFACE_FLAG_*``."""

    NONE = 0
    AM_SHORT = 1 << 0      # tiny frames with a fast path
    AM_BCOPY = 1 << 1      # frames copied into transport buffers
    AM_ZCOPY = 1 << 2      # payload sent from the user buffer without a copy
    RX_ZCOPY = 1 << 3      # payload may be received straight into a core buffer
    GET_ZCOPY = 1 << 4     # one-sided read of a peer's memory (rkey)
    PUT_ZCOPY = 1 << 5     # one-sided write into a peer's memory (rkey)
    ATOMIC32 = 1 << 6      # remote 32-bit atomics
    ATOMIC64 = 1 << 7      # remote 64-bit atomics
    CONNECT_TO_IFACE = 1 << 8  # connect from an interface address alone
    INTRA_HOST = 1 << 9    # only reaches peers on the same host
    LOOPBACK = 1 << 10     # only reaches the same worker
    #: memory domain: same-host peers map this process's shared segments
    #: (``mem_map(length=n)``) and load/store them directly (shm)
    MEM_MAP = 1 << 11
    #: memory domain: a region must be registered with the interface
    #: (``Interface.pack_local_key``) for peers' one-sided access (ofi, verbs)
    MEM_REG = 1 << 12


@dataclass
class TransportAttrs:
    """What the core needs to choose protocols and lanes (``uct_iface_attr``)."""

    caps: Caps
    max_short: int            # frames with payload <= this take the short path
    max_bcopy: int            # eager-copy limit: payload copied into the transport
    max_frame: int            # largest payload one frame may carry
    latency: float            # seconds, one-way, small message (estimate)
    bandwidth: float          # bytes / second (estimate)
    overhead: float = 1e-6    # seconds of CPU per frame (estimate)
    max_get: int = 0          # largest one-sided get, 0 if none
    priority: int = 0         # tie-breaker; higher wins

    def estimate(self, size: int) -> float:
        """Estimated time to move ``size`` bytes: the cost model lanes are ranked by."""
        return self.overhead + self.latency + size / self.bandwidth


@dataclass
class Availability:
    """Result of :meth:`Interface.query`: shown by ``ucxpy-info``."""

    available: bool
    reason: str = ""
    devices: list = field(default_factory=list)


class TransportOwner(Protocol):
    """What a transport calls back into (implemented by ``ucxpy.worker.Worker``)."""

    direct_am_ids: frozenset

    def recv_frame(self, ep: "TransportEndpoint", am_id: int, header: memoryview,
                   payload: memoryview) -> None: ...

    def recv_dest(self, ep: "TransportEndpoint", am_id: int, header: memoryview,
                  length: int) -> Optional[memoryview]: ...

    def conn_failed(self, ep: "TransportEndpoint", exc: BaseException) -> None: ...


class TransportEndpoint(abc.ABC):
    """One direction-agnostic connection to a peer interface."""

    #: set by the core after wire-up: the owning ``ucxpy.Endpoint`` (or None)
    owner_ep = None
    #: the interface that created or accepted this endpoint
    iface: "Interface"

    @abc.abstractmethod
    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        """Send one frame in order.  Never blocks.

        Returns True if done (payload reusable now, ``on_complete`` not called),
        False if queued by reference (``on_complete`` called from progress).
        Raises ConnectionLost if the connection is already broken,
        MessageTooLarge if the payload exceeds ``attrs.max_frame``.
        """

    def get(self, local: memoryview, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """One-sided read of ``len(local)`` bytes at ``remote_addr`` described by
        ``rkey`` into ``local`` (``Caps.GET_ZCOPY``).  Same return convention as
        :meth:`send`."""
        raise NotImplementedError(f"{type(self).__name__} has no get_zcopy")

    def put(self, local: memoryview, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """One-sided write of ``local`` to ``remote_addr`` described by ``rkey``
        (``Caps.PUT_ZCOPY``).  Same return convention as :meth:`send`."""
        raise NotImplementedError(f"{type(self).__name__} has no put_zcopy")

    def pack_local_key(self, buf: memoryview) -> tuple[int, bytes]:
        """Describe ``buf`` for a peer's :meth:`get` or :meth:`put`: returns
        ``(address, rkey)``."""
        raise NotImplementedError(f"{type(self).__name__} has no get_zcopy")

    @property
    def pending(self) -> int:
        """Frames queued but not yet handed to the wire."""
        return 0

    def close(self) -> None:
        """Close gracefully (idempotent); queued frames are flushed when possible."""


class Interface(abc.ABC):
    """A transport instance bound to one worker."""

    name: ClassVar[str] = "?"
    attrs: TransportAttrs

    def __init__(self, owner: TransportOwner, config) -> None:
        self.owner = owner
        self.config = config

    @classmethod
    def query(cls, config) -> Availability:
        """Can this transport run here?  Must not raise."""
        return Availability(True)

    @abc.abstractmethod
    def address(self) -> bytes:
        """Opaque interface address a peer passes to :meth:`connect`."""

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        """Can we connect to the peer interface at ``address`` on host ``host_id``?"""
        return True

    @abc.abstractmethod
    def connect(self, address: bytes) -> TransportEndpoint:
        """Create an endpoint to the peer interface (may finish connecting lazily;
        frames sent before that are queued in order)."""

    @abc.abstractmethod
    def progress(self) -> int:
        """Deliver incoming frames, push queued sends; return number of events."""

    def wait_fds(self) -> list:
        """File descriptors that become readable when the interface has work:
        lets an idle worker sleep in ``select`` instead of spinning."""
        return []

    def close(self) -> None:
        """Release every resource (idempotent)."""


# -- helpers for transports that queue work (ofi, verbs) --------------------------------
class ChunkedOp:
    """One one-sided operation posted as ``nchunks`` pieces: ``release()``
    (free a local registration, ...) and then ``on_complete(exc)`` run once
    when the last piece finished; the first error is the one reported."""

    __slots__ = ("on_complete", "left", "exc", "what", "release", "keep")

    def __init__(self, on_complete, nchunks: int, what: str = "operation", release=None,
                 keep=None):
        self.on_complete = on_complete
        self.left = nchunks
        self.exc = None
        self.what = what              # "get", "put", ... for error messages
        self.release = release
        self.keep = keep              # an object to keep alive until then (the buffer)

    def chunk_done(self, exc) -> None:
        if exc is not None and self.exc is None:
            self.exc = exc
        self.left -= 1
        if self.left:
            return
        release, self.release = self.release, None
        if release is not None:
            release()
        cb, self.on_complete = self.on_complete, None
        self.keep = None
        if cb is not None:
            cb(self.exc)


def fail_queued(frames, pieces, exc: BaseException) -> None:
    """Complete an endpoint's queued frames (tuples ending in their
    ``on_complete`` or None) and queued one-sided pieces (tuples starting
    with their :class:`ChunkedOp`) with ``exc``."""
    for frame in frames:
        if frame[-1] is not None:
            frame[-1](exc)
    for piece in pieces:
        piece[0].chunk_done(exc)
