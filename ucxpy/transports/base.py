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
import weakref
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, ClassVar, Optional

from ..errors import InvalidBuffer
from ..record import field, record

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


@record
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
    rx_shared: int = 0        # bytes of a receive queue all same-host peers write to (0: none)

    def estimate(self, size: int) -> float:
        """Estimated time to move ``size`` bytes: the cost model lanes are ranked by."""
        return self.overhead + self.latency + size / self.bandwidth


@record
class Availability:
    """Result of :meth:`Interface.query`: shown by ``ucxpy-info``."""

    available: bool
    reason: str = ""
    devices: list = field(default_factory=list)


class TransportOwner:
    """What a transport calls back into (implemented by ``ucxpy.worker.Worker``)."""

    direct_am_ids: frozenset

    def recv_frame(self, ep: "TransportEndpoint", am_id: int, header: memoryview,
                   payload: memoryview) -> None: ...

    def recv_dest(self, ep: "TransportEndpoint", am_id: int, header: memoryview,
                  length: int) -> Optional[memoryview]: ...

    def conn_failed(self, ep: "TransportEndpoint", exc: BaseException) -> None: ...

    def cpu_share(self) -> float:
        """Ranks per CPU on this host, at least 1.  Optional: a transport
        reads it with getattr and takes 1 without it."""


class TransportEndpoint(abc.ABC):
    """One direction-agnostic connection to a peer interface."""

    #: set by the core after wire-up: the owning ``ucxpy.Endpoint`` (or None)
    owner_ep = None
    #: the core's: frames that arrived on this connection and wait for the
    #: peer's LANE_MOVE on another one (a list), else None
    held = None
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

    def atomic(self, op: str, size: int, remote_addr: int, rkey: bytes, value: int,
               compare: int, on_complete: Callable[[Optional[BaseException], int], None]) -> None:
        """Device atomic ``op`` (one of the domain's ``device_atomic_ops``) on
        the ``size``-byte word at ``remote_addr`` (``MdCaps.ATOMIC32/64``);
        ``on_complete(exc, old value)`` runs from progress."""
        raise NotImplementedError(f"{type(self).__name__} has no device atomics")

    def pack_local_key(self, buf: memoryview) -> tuple[int, bytes]:
        """Describe ``buf`` for a peer's :meth:`get` or :meth:`put`: returns
        ``(address, rkey)`` (the rendezvous protocols' one-off registration;
        RMA registers through the interface's :class:`MemoryDomain`)."""
        raise NotImplementedError(f"{type(self).__name__} has no get_zcopy")

    #: Optional: the connection lends its stream socket to the owner's data
    #: plane, which writes and reads whole frames on it (tcp; None: not
    #: offered).  ``stream_out() -> fd`` when a frame written now would be
    #: next in the connection's order (else -1), and ``stream_tail(bytes)``
    #: queues, first, the rest of one frame the socket took only part of.
    #: ``stream_in() -> fd`` when the socket's next bytes are the
    #: connection's next frame (nothing of it buffered; else -1), and
    #: ``stream_spill(bytes, parse)`` takes back what was read and not taken
    #: as the head of the stream (parsed now when ``parse``, else at the next
    #: progress), ``stream_fail(exc)`` fails the connection when the stream is
    #: out of step.  ``stream_spins`` bounds the polls of one read (each is a
    #: system call), ``native_max_frame`` the payload of a frame written so.
    #: The connection frames bytes; what the frames mean is the owner's.
    stream_out = None
    stream_in = None
    stream_spins: int = 0

    #: The id this connection's frames carry in its interface's inbox, for
    #: the interface's ``native`` consumer (None: no inbox of that kind)
    native_conn = None

    #: Optional: the address of the peer's native inbox this connection
    #: pushes frames into, as a producer (0: none), and the largest payload
    #: a frame there carries.  The owner may then give the connection a
    #: native sender's view of it (``set_native_lane(lane)``, a
    #: ``ucxpy._dp.Lane``), whose ``open`` the connection keeps true exactly
    #: while a frame pushed now would be next in its order (nothing queued,
    #: accepted, not closing) and whose ``dead`` it sets, for good, before
    #: it lets go of that inbox.  It also tells the lane
    #: (``lane.set_peer(pid, peer pid, cma)``) which processes its memory
    #: keys name and whether CMA to the peer works, for the data plane's
    #: rendezvous reads.
    native_tx: int = 0
    native_max_frame: int = 0
    #: the lane given by ``set_native_lane`` (None: none)
    native_lane = None

    def set_native_lane(self, lane) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no native inbox to push into")

    def wake_peer(self) -> None:
        """A native push into the peer's inbox found the peer asleep: wake it."""
        raise NotImplementedError(f"{type(self).__name__} has no native inbox to push into")

    #: True when frames can go back over this connection to the peer that
    #: opened it (a byte stream both ways: tcp).  The core then answers a
    #: peer on the connection it came in on instead of opening a second one
    #: (UCX's tcp shares one connection per pair likewise): one socket per
    #: pair, and on tcp the replies carry the acknowledgements that a
    #: one-way connection sends as packets of their own.  Such a connection
    #: must deliver the peer's frames until the peer's end of stream, even
    #: after :meth:`close` (which ends only our direction).
    duplex = False

    def hand_over(self, other: "TransportEndpoint") -> bool:
        """Give the frames queued here to ``other`` (a ``duplex`` connection
        to the same peer that we have sent nothing on) and drop this
        connection, when none of them has reached the wire yet (it is still
        being made): the peer then sees them, in order, on ``other`` only.
        False, nothing done, where that does not hold."""
        return False

    def can_send(self) -> bool:
        """Whether :meth:`send` takes frames (at once, or queued while the
        connection is being made): not closing, not broken."""
        return True

    @property
    def pending(self) -> int:
        """Frames queued but not yet handed to the wire."""
        return 0

    def close(self) -> None:
        """Close gracefully (idempotent); queued frames are flushed when possible."""


class MdCaps(enum.IntFlag):
    """What a :class:`MemoryDomain` does (``UCT_MD_FLAG_*`` and the
    one-sided part of ``UCT_IFACE_FLAG_*``)."""

    NONE = 0
    ALLOC = 1 << 0      # mem_alloc: memory that same-host peers can map
    REG = 1 << 1        # mem_reg: existing memory made reachable by peers
    RKEY_PTR = 1 << 2   # an unpacked key may map the region here (load/store)
    PUT = 1 << 3        # TransportEndpoint.put into a peer's registered memory
    GET = 1 << 4        # TransportEndpoint.get from it
    ATOMIC32 = 1 << 5   # TransportEndpoint.atomic, 32-bit, by the device
    ATOMIC64 = 1 << 6   # the same, 64-bit


class MdRemoteKey:
    """A peer's region as a memory domain unpacked it (``uct_rkey_bundle``):

    * ``address`` -- where the region starts in *this* process when the key
      maps it (``rkey_ptr``: loads, stores and CPU atomics), else 0;
    * ``transport_key`` -- bytes for :meth:`TransportEndpoint.put` / ``get`` /
      ``atomic``, or None when the lane cannot reach it one-sidedly;
    * ``valid()`` -- False once the owner unregistered the region, where the
      domain can tell (a stale key must not touch reused memory);
    * ``guard()`` -- what ``valid()`` checks as ``(address, value)``: valid
      while the 64-bit word at ``address`` holds ``value`` ((0, 0): always
      valid), or None when ``valid()`` is not such a word (native callers,
      e.g. ``Endpoint.atomic_fetch_now``, then leave the key to Python);
    * ``release()`` -- drop what unpacking mapped (``rkey_release``).
    """

    __slots__ = ("address", "transport_key", "keep")

    def __init__(self, address: int = 0, transport_key: Optional[bytes] = None, keep=None):
        self.address = address
        self.transport_key = transport_key
        self.keep = keep          # what keeps ``address`` mapped

    def valid(self) -> bool:
        return True

    def guard(self) -> Optional[tuple]:
        return (0, 0)

    def release(self) -> None:
        self.keep = None
        self.address = 0


class MemoryDomain:
    """A transport's memory (UCT's ``md``): how its peers reach this
    process's memory, kept apart from frames.  ``ucxpy.rma`` uses only this
    interface and the flags in ``caps``:

    * an unpacked key with an ``address`` -> loads, stores and CPU atomics;
    * else ``transport_key`` and PUT/GET -> the lane's one-sided put/get
      (``TransportEndpoint.put`` / ``get``), and device atomics with
      ATOMIC32/64 when the atomic mode says so (``UCXPY_ATOMIC_MODE``);
    * else active messages served by the target (the core's fallback).

    ``name`` is the key's name inside a packed ``ucxpy`` remote key (the
    interface name); ``access`` names the one-sided mode in traces and
    ``RemoteKey.mode`` ("rdma": asynchronous, completed through the lane,
    unordered with its frames; "cma": a synchronous copy).
    """

    name: str = "?"
    caps: MdCaps = MdCaps.NONE
    access: str = "rdma"
    #: device atomics ``atomic`` posts (subset of ucxpy.atomics.OPS names)
    device_atomic_ops: frozenset = frozenset()

    def mem_alloc(self, length: int, address: int = 0):
        """Memory peers on this host may map (ALLOC): an object with ``view``
        (writable memoryview of ``length`` bytes) and ``address``; freed with
        :meth:`mem_free`.  ``address`` not 0: the memory is also mapped at
        exactly that free, page-aligned address, which is then its
        ``address`` (UCP's fixed-address allocation); a domain that cannot
        raises."""
        raise NotImplementedError(f"memory domain {self.name} cannot allocate")

    def mem_free(self, alloc) -> None:
        """Release memory from :meth:`mem_alloc` (idempotent)."""

    def mem_reg(self, view: memoryview, alloc=None):
        """Register ``view`` (REG; ``alloc`` when it is this domain's own
        :meth:`MemoryDomain.mem_alloc` memory) and return a handle for :meth:`rkey_pack`
        and :meth:`mem_dereg`.  Peers reach the memory until ``mem_dereg``."""
        raise NotImplementedError(f"memory domain {self.name} cannot register memory")

    def mem_dereg(self, memh) -> None:
        """Revoke a registration (idempotent): later peer accesses fail."""

    def rkey_pack(self, memh) -> bytes:
        """The bytes peers unpack with :meth:`rkey_unpack`."""
        raise NotImplementedError

    def rkey_unpack(self, packed: bytes, base: int, length: int) -> Optional[MdRemoteKey]:
        """A peer's key for its region ``[base, base+length)`` as reached from
        this domain's lane, or None when this lane cannot reach it except by
        active messages (another host, a permission).  Raises
        :class:`ucxpy.errors.RemoteAccessError` for a key that can never work
        (its memory is gone)."""
        return None

    def rkey_map(self, packed: bytes, length: int) -> Optional[memoryview]:
        """The peer's region mapped here, whatever the lane, as a writable view
        that keeps the mapping (``RemoteKey.map()``); None if it cannot be."""
        return None

    def close(self) -> None:
        """Release every registration and mapping (idempotent)."""


class ViewRegistrations:
    """Device registrations that live exactly as long as the buffer view
    they describe (ofi's ``fi_mr_reg``, verbs' ``ibv_reg_mr``).

    ``for_view(view)`` registers a view once (``register(view)``) and reuses
    the registration while that very view lives: the core keeps the view of
    a rendezvous send until the receiver acknowledged it, and RMA keeps one
    per memory handle until ``unmap``.  When the view is collected the
    registration is queued in ``dead`` and closed by :meth:`reap` (from the
    transport's ``progress()``, never from inside a garbage-collection
    callback) with ``deregister(reg)``."""

    def __init__(self, register, deregister):
        self._register = register
        self._deregister = deregister
        self._by_view = {}        # id(view) -> (weakref to view, registration)
        self.dead = []            # registrations to close from progress()
        self.hits = self.misses = 0

    def __len__(self):
        return len(self._by_view)

    def for_view(self, view: memoryview):
        key = id(view)
        entry = self._by_view.get(key)
        if entry is not None and entry[0]() is view:
            self.hits += 1
            return entry[1]
        self.misses += 1
        reg = self._register(view)
        dead, table = self.dead, self._by_view

        def gone(ref, key=key, reg=reg):
            e = table.get(key)
            if e is not None and e[0] is ref:
                del table[key]
            dead.append(reg)
        table[key] = (weakref.ref(view, gone), reg)
        return reg

    def reap(self) -> None:
        while self.dead:
            self._deregister(self.dead.pop())

    def clear(self) -> None:
        """Close every registration (the interface closes)."""
        entries, self._by_view = list(self._by_view.values()), {}
        for _ref, reg in entries:
            self._deregister(reg)
        self.reap()


class RegistrationDomain(MemoryDomain):
    """The memory domain of a transport that registers memory with a device
    and lets its peers read and write it one-sidedly (ofi, verbs): a
    registration is the interface's ``pack_local_key(view)`` for a view of
    our own, revoked when that view is dropped."""

    caps = MdCaps.REG | MdCaps.PUT | MdCaps.GET

    def __init__(self, iface, caps: Optional[MdCaps] = None, atomic_ops=frozenset()):
        self.name = iface.name
        self.iface = iface
        if caps is not None:
            self.caps = caps
        self.device_atomic_ops = frozenset(atomic_ops)

    def mem_reg(self, view, alloc=None):
        own = view[:]                      # the transport ties the registration to it
        _addr, key = self.iface.pack_local_key(own)
        return [own, bytes(key)]

    def mem_dereg(self, memh) -> None:
        memh[0] = None

    def rkey_pack(self, memh) -> bytes:
        return memh[1]

    def rkey_unpack(self, packed, base, length):
        return MdRemoteKey(transport_key=bytes(packed))


#: an Interface's ``split_floor`` where its rendezvous never splits
NO_SPLIT = 1 << 62


class Interface(abc.ABC):
    """A transport instance bound to one worker."""

    name: ClassVar[str] = "?"
    attrs: TransportAttrs
    #: its memory domain, or None: peers then reach memory by active messages
    md: Optional[MemoryDomain] = None
    #: set by the core (``ucxpy.rndv.split_floor``): rendezvous offers on
    #: this interface of at least this many bytes are split (the sender puts
    #: part while the receiver gets the rest), smaller ones the receiver
    #: reads whole; what the data plane's rendezvous read (native/dp/rndv.c)
    #: may take is below it
    split_floor: int = NO_SPLIT
    #: Optional: the address of a native inbox this interface receives into
    #: (0: none).  The owner may then set ``native`` to a consumer of it (the
    #: data plane's ``ucxpy._dp.Inbox``): ``dispatch(limit, spins)`` takes
    #: the frames it handles at the front of the inbox, in order, and stops
    #: at the first other one.  The interface calls it from its
    #: ``progress()`` (while ``owner.native_consumes``) and from
    #: ``poll_native(spins)``, its owner's wait, before handling any frame
    #: itself, and calls ``forget_conn(native_conn)`` when a connection goes;
    #: ``native_idle`` says whether the owner may call the consumer itself
    #: now (not from inside the interface's own poll), and
    #: ``native_flags(n)`` acts on the flags of a count the consumer
    #: returned (a producer to wake, a corrupt inbox).
    #: The consumer runs the owner's protocols: the interface moves bytes and
    #: knows no tags.
    native_ring: int = 0
    native = None

    def __init__(self, owner: TransportOwner, config) -> None:
        self.owner = owner
        self.config = config

    @classmethod
    def query(cls, config) -> Availability:
        """Can this transport run here?  Must not raise."""
        return Availability(True)

    @classmethod
    def host_memory_domain(cls, config) -> Optional[MemoryDomain]:
        """A memory domain of this transport that works without an interface,
        or None: when no selected transport allocates memory that same-host
        peers map (``MdCaps.ALLOC``), the core uses the first transport's
        that does, as UCX opens every memory domain whatever ``UCX_TLS``
        selects (``mem_map(length, shared=True)`` and ``RemoteKey.map``)."""
        return None

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

    def control_fds(self) -> list:
        """File descriptors, fixed for the interface's life, that are
        readable when :meth:`progress` has work no native consumer of its
        inbox sees (a connection request, a control message): a native
        caller's progress (libucp's) polls them, without side effects, to
        know when to run ours.  [] when there are none."""
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
