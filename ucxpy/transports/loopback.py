"""Loopback transport ("self"): frames from a worker to itself.

``send()`` only queues; the frame reaches ``owner.recv_frame`` from the next
``progress()`` call, never from inside ``send`` (so a handler that replies to
itself cannot recurse).  Payloads up to ``max_bcopy`` are copied and the send
completes at once; larger ones are kept by reference and ``on_complete`` runs
right after delivery.

The address is ``b"SELF"`` plus a random 8-byte interface id: only this very
interface is reachable through it.

Memory domain: the worker's own registered memory is in this process, so a
key unpacked on the self lane maps it where it is (loads, stores, CPU
atomics); it stays valid while the registration does.
"""
from __future__ import annotations

import collections
import itertools
import os
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..errors import ConnectionLost, MessageTooLarge, RemoteAccessError, TransportUnavailable
from .base import (MAX_HEADER, Availability, Caps, Interface, MdCaps, MdRemoteKey,
                   MemoryDomain, TransportAttrs, TransportEndpoint, byte_view)

_TAG = b"SELF"


class SelfEndpoint(TransportEndpoint):
    """Endpoint to our own interface; frames come back to the same owner on it."""

    def __init__(self, iface: "SelfInterface"):
        self.iface = iface
        self._closed = False

    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        iface = self.iface
        if self._closed or iface._closed:
            raise ConnectionLost("self endpoint is closed")
        if len(header) > MAX_HEADER:
            raise MessageTooLarge(f"header of {len(header)} B exceeds {MAX_HEADER} B")
        payload = byte_view(payload)
        plen = len(payload)         # a flat byte view: len is its size
        if plen > iface.attrs.max_frame:
            raise MessageTooLarge(f"payload of {plen} B exceeds self max_frame")
        done = True
        if type(payload) is not bytes:
            if plen <= iface.attrs.max_bcopy:
                payload = bytes(payload)
            else:
                done = False
        iface._queue.append((self, am_id, bytes(header), payload, None if done else on_complete))
        if len(iface._queue) == 1:
            if iface._wake_w is not None:
                iface._wake()
            iface._busy_changed()
        return done

    @property
    def pending(self) -> int:
        return sum(1 for f in self.iface._queue if f[0] is self)

    def close(self) -> None:
        """Refuse new sends; frames already queued are still delivered."""
        self._closed = True


class _OwnKey(MdRemoteKey):
    __slots__ = ("live", "reg_id")

    def __init__(self, address, live, reg_id):
        MdRemoteKey.__init__(self, address)
        self.live, self.reg_id = live, reg_id

    def valid(self) -> bool:
        return self.reg_id in self.live

    def guard(self):
        return None            # a set membership, not a word


class SelfMemoryDomain(MemoryDomain):
    """Registrations of one worker, reached by itself (see the module docstring)."""

    caps = MdCaps.REG | MdCaps.RKEY_PTR

    def __init__(self, name: str):
        self.name = name
        self._live: set = set()
        self._ids = itertools.count(1)

    def mem_reg(self, view, alloc=None) -> list:
        reg = [next(self._ids)]
        self._live.add(reg[0])
        return reg

    def mem_dereg(self, reg) -> None:
        self._live.discard(reg[0])

    def rkey_pack(self, reg) -> bytes:
        return reg[0].to_bytes(8, "little")

    def rkey_unpack(self, packed, base, length):
        if len(packed) != 8:
            raise RemoteAccessError("malformed self memory key")
        reg_id = int.from_bytes(packed, "little")
        if reg_id not in self._live:
            raise RemoteAccessError("stale remote key: the memory was unmapped")
        return _OwnKey(base, self._live, reg_id)

    def close(self) -> None:
        self._live.clear()


class SelfInterface(Interface):
    """Delivers a worker's frames to itself from ``progress()``."""

    name = "self"

    def __init__(self, owner, config) -> None:
        super().__init__(owner, config)
        self.attrs = TransportAttrs(
            caps=Caps.LOOPBACK | Caps.AM_SHORT | Caps.AM_BCOPY | Caps.AM_ZCOPY | Caps.RX_ZCOPY,
            max_short=256, max_bcopy=16384, max_frame=1 << 62,
            latency=0.2e-6, bandwidth=10e9, overhead=0.5e-6, priority=100)
        self.md = SelfMemoryDomain(self.name)
        self._id = os.urandom(8)
        self._queue = collections.deque()
        self._closed = False
        self._wake_r = self._wake_w = None   # pipe, made only if someone wants to sleep

    @classmethod
    def query(cls, config) -> Availability:
        return Availability(True, devices=["self"])

    def address(self) -> bytes:
        return _TAG + self._id

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        return bytes(address) == _TAG + self._id

    def connect(self, address: bytes) -> SelfEndpoint:
        if not self.is_reachable(address, b""):
            raise TransportUnavailable("self transport only reaches its own interface")
        if self._closed:
            raise ConnectionLost("self interface is closed")
        return SelfEndpoint(self)

    def progress(self) -> int:
        """Deliver the frames queued before this call (not those queued by handlers)."""
        q = self._queue
        if not q:
            return 0
        if self._wake_r is not None:
            self._drain_wake()
        owner = self.owner
        direct_ids = owner.direct_am_ids
        n = len(q)
        for _ in range(n):
            ep, am_id, header, payload, on_complete = q.popleft()
            hview, pview = memoryview(header), memoryview(payload)
            if am_id in direct_ids:
                dest = owner.recv_dest(ep, am_id, hview, pview.nbytes)
                if dest is not None:
                    if type(dest) is not memoryview or dest.format != "B" or dest.ndim != 1:
                        dest = memoryview(dest).cast("B")
                    if dest.nbytes == pview.nbytes:
                        dest[:] = pview
                        pview = dest
            owner.recv_frame(ep, am_id, hview, pview)
            if on_complete is not None:
                on_complete(None)
        if q:
            if self._wake_w is not None:
                self._wake()
        else:
            self._busy_changed()
        return n

    def c_idle(self) -> bool:
        """Nothing queued: a C caller's progress (libucp's) needs none of
        ours.  Frames are queued only by Python (a send to oneself goes
        through it), and :meth:`_busy_changed` tells the worker at once."""
        return not self._queue

    def _busy_changed(self) -> None:
        # only a C caller's progress reads the count (libucp's workers:
        # ucxpy.capi sets c_matches), and a recount costs ~1.5 us: twice per
        # message to oneself would tax the Python API's
        owner = self.owner
        if getattr(owner, "c_matches", False):
            owner._sync_py_poll()

    def wait_fds(self) -> list:
        """A pipe that is readable while frames are queued."""
        if self._closed:
            return []
        if self._wake_r is None:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            if self._queue:
                self._wake()
        return [self._wake_r]

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Drop queued frames (their ``on_complete`` get ConnectionLost)."""
        if self._closed:
            return
        self._closed = True
        q, self._queue = self._queue, collections.deque()
        for frame in q:
            if frame[4] is not None:
                frame[4](ConnectionLost("self interface closed"))
        if q:
            self._busy_changed()
        if self._wake_r is not None:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = None
