"""The tcp transport's frame format and receive side, without any I/O.

A :class:`FrameReader` owns one connection's receive ring.  The connection
reads from its socket into :meth:`FrameReader.space` and reports how many
bytes arrived with :meth:`FrameReader.received`; the reader cuts the stream
into frames and hands each to the owner through the transport contract's
upcalls (``recv_dest`` / ``recv_frame``).  Nothing here touches a socket, so
tests and the fuzzers drive it with plain byte strings
(:meth:`FrameReader.feed`) and mutation testing covers it exactly.

Frame (little-endian 16-byte prefix, then header, then payload)::

    magic u16 (0xC5A7) | am_id u8 | flags u8 (0) | header len u16 | pad u16
    | payload len u64

Receive paths, chosen per frame:

* **direct**: ``am_id`` is one of the owner's ``direct_am_ids`` and its
  ``recv_dest`` returns a buffer of exactly the payload length: the payload
  is written there (what is already in the ring is copied, the rest is read
  straight into it) and ``recv_frame`` gets that buffer.  ``recv_dest`` is
  asked once per frame; a refusal (``None`` or a buffer of the wrong size) is
  remembered until the frame is delivered, so the owner is not asked again
  while the rest of it arrives.
* **ring**: the frame fits the ring (``RBUF_SIZE`` less a reserve for the
  next prefix and header): ``recv_frame`` gets a view into the ring, valid
  only during the call.
* **big**: a larger non-direct payload goes into a separate buffer (one of up
  to ``BIG_CACHE`` bytes is kept for the next frame: fresh pages cost more
  than the copy).

A bad prefix (magic, flags, a header over ``MAX_HEADER``, a payload over
``max_frame``) or a buffered payload over ``max_buffered`` raises
:class:`FrameError`; the connection then fails.  Upcalls may close the
connection; the connection then clears :attr:`FrameReader.live` and the
reader stops delivering at once.
"""
from __future__ import annotations

import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from ..errors import ProtocolError
from .base import MAX_HEADER

FRAME_MAGIC = 0xC5A7
PREFIX = struct.Struct("<HBBHxxQ")
_PSIZE = PREFIX.size

RBUF_SIZE = 1 << 16          # per-connection receive ring
RESERVE = 4096 + MAX_HEADER  # room kept free at the ring's end for the next prefix + header
BIG_CACHE = 1 << 22          # non-direct payloads up to this reuse one buffer


class FrameError(ProtocolError):
    """The byte stream is not a sequence of valid frames."""


def pack_prefix(am_id: int, hlen: int, plen: int) -> bytes:
    """The 16-byte prefix of a frame with ``hlen`` header and ``plen`` payload bytes."""
    return PREFIX.pack(FRAME_MAGIC, am_id, 0, hlen, plen)


def pack_frame(am_id: int, header=b"", payload=b"") -> bytes:
    """One whole frame (prefix, header, payload) as bytes."""
    return PREFIX.pack(FRAME_MAGIC, am_id, 0, len(header), len(payload)) \
        + bytes(header) + bytes(payload)


class FrameReader:
    """Cuts one connection's byte stream into frames (see the module docstring).

    ``owner`` gets ``recv_dest(ep, am_id, header, plen)`` and
    ``recv_frame(ep, am_id, header, payload)``; ``ep`` is passed through.
    """

    def __init__(self, owner, ep, max_frame: int, max_buffered: int):
        self.owner = owner
        self.ep = ep
        self.max_frame = max_frame
        self.max_buffered = max_buffered
        self.buf = bytearray(RBUF_SIZE)
        self.view = memoryview(self.buf)
        self.start = self.end = 0      # unconsumed bytes are buf[start:end]
        self.declined = False          # recv_dest refused the frame at start
        self.pending = None            # payload being read: [view, got, am_id, header]
        self.big = None                # see _big_buffer
        self.live = True               # cleared by the connection when it stops taking frames

    def reset(self) -> None:
        """Drop everything buffered (a new connection attempt, or draining)."""
        self.start = self.end = 0
        self.declined = False
        self.pending = None

    @property
    def buffered(self) -> int:
        """Bytes in the ring not consumed yet."""
        return self.end - self.start

    # ---- the connection's side
    def space(self) -> memoryview:
        """Where the next read must go: the rest of a payload being read, or
        the free end of the ring (compacted first when little is left)."""
        pl = self.pending
        if pl is not None:
            return pl[0][pl[1]:]
        start, end = self.start, self.end
        if start == end:
            self.start = self.end = end = 0
        elif RBUF_SIZE - end < RESERVE:
            end -= start
            self.view[:end] = self.view[start:start + end]   # memmove
            self.start, self.end = 0, end
        return self.view[end:]

    def received(self, n: int) -> int:
        """``n`` bytes were written into :meth:`space`: deliver the frames
        they complete and return how many were delivered."""
        pl = self.pending
        if pl is None:
            self.end += n
            return self.parse()
        pl[1] += n
        if pl[1] < pl[0].nbytes:
            return 0
        self.pending = None
        self.owner.recv_frame(self.ep, pl[2], memoryview(pl[3]), pl[0])
        return 1

    def take(self, n: int) -> Optional[bytes]:
        """The next ``n`` bytes, consumed, or None while fewer are buffered
        (the connection's handshake messages, before any frame)."""
        start = self.start
        if self.end - start < n:
            return None
        self.start = start + n
        return bytes(self.buf[start:start + n])

    def feed(self, data) -> int:
        """Push ``data`` through :meth:`space`/:meth:`received` as a socket
        read would; return the frames delivered (tests and fuzzers)."""
        data = memoryview(data).cast("B")
        events = off = 0
        while off < len(data) and self.live:
            room = self.space()
            n = min(room.nbytes, len(data) - off)
            room[:n] = data[off:off + n]
            off += n
            events += self.received(n)
        return events

    # ---- parsing
    def _big_buffer(self, size: int) -> memoryview:
        if size > BIG_CACHE:
            return memoryview(bytearray(size))
        if self.big is None or self.big.nbytes < size:
            self.big = memoryview(bytearray(max(size, RBUF_SIZE * 4)))
        return self.big[:size]

    def parse(self) -> int:
        """Deliver every complete frame in the ring; start reading a payload
        that goes elsewhere.  Returns the number of frames delivered."""
        buf, view, owner, ep = self.buf, self.view, self.owner, self.ep
        direct_ids = owner.direct_am_ids
        max_frame = self.max_frame
        events = 0
        while True:
            rstart = self.start
            avail = self.end - rstart
            if avail < _PSIZE:
                return events
            magic, am_id, flags, hlen, plen = PREFIX.unpack_from(buf, rstart)
            if magic != FRAME_MAGIC or flags or hlen > MAX_HEADER or plen > max_frame:
                raise FrameError(f"bad frame prefix (magic {magic:#x}, flags {flags:#x}, "
                                 f"header {hlen} B, payload {plen} B)")
            hstart = rstart + _PSIZE
            pstart = hstart + hlen
            have = avail - _PSIZE - hlen
            if have < 0:
                return events
            if have > plen:
                have = plen
            if am_id in direct_ids and not self.declined:
                dest = owner.recv_dest(ep, am_id, view[hstart:pstart], plen)
                if not self.live:
                    return events
                if dest is not None and type(dest) is not memoryview:
                    dest = memoryview(dest)
                if dest is not None and dest.nbytes == plen:
                    dest[:have] = view[pstart:pstart + have]
                    if have == plen:
                        self.start = pstart + plen
                        owner.recv_frame(ep, am_id, view[hstart:pstart], dest)
                        events += 1
                        if not self.live:
                            return events
                        continue
                    self.pending = [dest, have, am_id, bytes(view[hstart:pstart])]
                    self.start = self.end = 0
                    return events
                self.declined = True
            if have == plen:
                self.start = pstart + plen
                self.declined = False
                owner.recv_frame(ep, am_id, view[hstart:pstart], view[pstart:pstart + plen])
                events += 1
                if not self.live:
                    return events
                continue
            if plen > self.max_buffered:
                raise FrameError(f"payload length {plen} exceeds the {self.max_buffered} B "
                                 f"limit for buffered frames")
            if _PSIZE + hlen + plen <= RBUF_SIZE - RESERVE:
                return events     # fits the ring: wait for the rest
            dest = self._big_buffer(plen)
            dest[:have] = view[pstart:pstart + have]
            self.pending = [dest, have, am_id, bytes(view[hstart:pstart])]
            self.declined = False
            self.start = self.end = 0
            return events
