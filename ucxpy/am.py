"""Active messages: user handlers run from progress (UCX's ucp_am).

Theory of operation
-------------------
``Endpoint.am_send_nb(am_id, header, data)`` sends a user header and a payload
to handler ``am_id`` (0..65535) registered on the remote worker with
``Worker.set_am_handler``.  Small payloads travel eagerly in one frame; above
the endpoint's rendezvous threshold only an offer (RTS) travels and the
handler chooses where the data lands with :meth:`AmMessage.receive`.

Ordering: handlers are invoked in the order the messages were sent on an
endpoint, whatever their size (the handler of a rendezvous message runs when
its offer arrives; its data completes later, possibly after handlers of
later messages ran).  Messages for an id with no handler yet are held, in
order, and delivered when a handler is registered.

The handler receives one :class:`AmMessage`.  ``msg.data`` (eager only) is a
memoryview valid during the call; keep a copy with ``bytes(msg.data)``.  For a
rendezvous message the handler calls ``msg.receive(buf)`` (a Request), or
returns True to keep the message and call ``receive``/``drop`` later;
otherwise the offer is declined when the handler returns and the sender
completes normally.
"""
from __future__ import annotations

import collections
import time

from . import wire
from .buffers import recv_view, send_view
from .errors import InvalidBuffer, MessageTooLarge, TruncationError
from .request import Request
from .rndv import RtsInfo
from .transports.base import MAX_HEADER

MAX_AM_ID = 0xFFFF
#: room left for the user header in an AM_RTS frame (rkey up to 64 bytes)
MAX_USER_HEADER = MAX_HEADER - wire.AM_RTS.size - 64


class AmMessage:
    """One incoming active message, as a handler sees it."""

    __slots__ = ("worker", "am_id", "source", "header", "length", "data", "_rts", "_taken")

    def __init__(self, worker, am_id, source, header, length, data=None, rts=None):
        self.worker = worker
        self.am_id = am_id
        self.source = source
        self.header = header
        self.length = length
        self.data = data
        self._rts = rts
        self._taken = False

    @property
    def is_rndv(self) -> bool:
        """True when the data has not arrived yet: take it with :meth:`receive`."""
        return self._rts is not None

    def receive(self, buf) -> Request:
        """Deliver the payload into ``buf`` (at least ``length`` bytes); the
        Request completes when the data is there."""
        mv = recv_view(buf)
        if self._taken:
            raise InvalidBuffer("active message already received or dropped")
        self._taken = True
        req = Request(self.worker)
        if len(mv) < self.length:
            if self._rts is not None:
                self.worker.rndv.drop(self._rts)
            req.complete(exc=TruncationError(
                f"active message of {self.length} bytes does not fit in {len(mv)} bytes",
                self.length, len(mv)))
            return req
        if self._rts is None:
            mv[:self.length] = self.data
            req.complete(self.length)
        else:
            self.worker.rndv.start_recv(self._rts, mv, req, self.length)
        return req

    def drop(self) -> None:
        """Decline the payload (the sender completes normally)."""
        if not self._taken:
            self._taken = True
            if self._rts is not None:
                self.worker.rndv.drop(self._rts)


class ActiveMessages:
    """Handler table and held messages of one worker."""

    def __init__(self, worker):
        self.worker = worker
        self.handlers = {}
        self.held = collections.defaultdict(collections.deque)   # am id -> AmMessage

    def set_handler(self, am_id: int, handler) -> None:
        if not (0 <= am_id <= MAX_AM_ID):
            raise ValueError(f"active message id {am_id} is outside 0..{MAX_AM_ID}")
        if handler is None:
            self.handlers.pop(am_id, None)
            return
        self.handlers[am_id] = handler
        held = self.held.pop(am_id, None)
        while held:
            self._dispatch(handler, held.popleft())

    def _dispatch(self, handler, msg: AmMessage) -> None:
        keep = handler(msg)
        if msg._rts is not None and not msg._taken and not keep:
            msg.drop()

    def _deliver(self, msg: AmMessage, tep=None) -> None:
        handler = self.handlers.get(msg.am_id)
        tr = self.worker.tr
        if tr is not None and tep is not None:
            tr.arrive(tep, "am", msg.source, msg.am_id, msg.length, handler is not None,
                      None, msg._rts)
        if handler is not None:
            if tr is not None and tr.events is not None:
                t0 = time.perf_counter_ns()        # (the trace's clock)
                try:
                    self._dispatch(handler, msg)
                finally:
                    tr.event("am", "am_dispatch", tep.iface.name if tep else "",
                             dur=time.perf_counter_ns() - t0, ts=t0, am_id=msg.am_id,
                             peer=msg.source)
                return
            self._dispatch(handler, msg)
            return
        if msg.data is not None:           # the payload view dies with this call
            msg.data = bytes(msg.data)
        self.held[msg.am_id].append(msg)

    # -- frame handlers ------------------------------------------------------
    def on_eager(self, tep, header, payload):
        am_id, hlen = wire.AM.unpack_from(header)
        n = wire.AM.size
        user_header = bytes(header[n:n + hlen])
        if len(user_header) != hlen:
            raise ValueError("active message header shorter than announced")
        self._deliver(AmMessage(self.worker, am_id, tep.owner_ep.remote_id, user_header,
                                len(payload), data=payload), tep)

    def on_rts(self, tep, header, payload):
        am_id, hlen, sreq_id, size, raddr = wire.AM_RTS.unpack_from(header)
        n = wire.AM_RTS.size
        user_header = bytes(header[n:n + hlen])
        if len(user_header) != hlen:
            raise ValueError("active message header shorter than announced")
        rts = RtsInfo(tep, sreq_id, size, raddr, bytes(header[n + hlen:]))
        self._deliver(AmMessage(self.worker, am_id, tep.owner_ep.remote_id, user_header,
                                size, rts=rts), tep)


def am_send_nb(ep, am_id: int, header, data) -> Request:
    """See :meth:`ucxpy.Endpoint.am_send_nb`."""
    if not (0 <= am_id <= MAX_AM_ID):
        raise ValueError(f"active message id {am_id} is outside 0..{MAX_AM_ID}")
    header = bytes(header)
    if len(header) > MAX_USER_HEADER:
        raise MessageTooLarge(f"active message header of {len(header)} bytes exceeds "
                              f"{MAX_USER_HEADER}")
    return ep.send_message(send_view(data), wire.AmId.AM_EAGER,
                           wire.AM.pack(am_id, len(header)) + header,
                           wire.AmId.AM_RTS, wire.AM_RTS, (am_id, len(header)), header)
