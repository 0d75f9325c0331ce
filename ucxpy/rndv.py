"""Rendezvous: moving large messages without an extra copy.

Theory of operation
-------------------
The sender posts the message and sends a request-to-send (RTS) carrying the
size and, when its lane can be read one-sidedly (``Caps.GET_ZCOPY``, e.g. shm
with process_vm_readv), the buffer's address and remote key.  Nothing moves
until the receiver has matched the RTS to a receive buffer.  Then:

* get path:  the receiver reads the sender's buffer straight into the receive
  buffer (single copy) and answers ATS; the sender completes on ATS.  If the
  read is refused (RemoteAccessError, e.g. CMA not permitted for this peer)
  before anything moved, the receiver falls back to the data path.
* data path: the receiver answers RTR with its receive id; the sender streams
  DATA frames from the user buffer (tcp: ``sendmsg`` from the buffer, received
  straight into the receive buffer through ``recv_dest``); the receiver
  completes when every byte arrived, the sender when its frames left.

Truncation or cancellation on the receiver answers ATS(DROPPED): the sender
completes normally (as in MPI, the error belongs to the receiver).

Transition table (sender / receiver)::

    sender    POSTED --RTS sent--> WAIT --ATS--------------------> DONE
                                     \\--RTR--> SENDING --last frame sent--> DONE
    receiver  MATCHED --get issued--> GETTING --get done, ATS sent--> DONE
                      \\--RTR sent--> RECEIVING --all bytes in--> DONE
    any state --peer failure--> DONE(ConnectionLost)
"""
from __future__ import annotations

import itertools

from . import wire
from .errors import ConnectionLost, ProtocolError, RemoteAccessError
from .transports.base import Caps


class RtsInfo:
    """A matched-or-not rendezvous offer, as the receiver sees it."""

    __slots__ = ("tep", "sreq_id", "size", "raddr", "rkey")

    def __init__(self, tep, sreq_id, size, raddr, rkey):
        self.tep = tep
        self.sreq_id = sreq_id
        self.size = size
        self.raddr = raddr
        self.rkey = rkey


class _Send:
    __slots__ = ("ep", "mv", "req", "frames_left")

    def __init__(self, ep, mv, req):
        self.ep = ep
        self.mv = mv
        self.req = req
        self.frames_left = 0


class _Recv:
    __slots__ = ("dest", "size", "received", "req", "result", "ep")

    def __init__(self, dest, size, req, result, ep):
        self.dest = dest
        self.size = size
        self.received = 0
        self.req = req
        self.result = result
        self.ep = ep


class RendezvousProtocol:
    """Per-worker state of all rendezvous transfers in flight."""

    def __init__(self, worker):
        self.worker = worker
        self.sends = {}   # sreq id -> _Send
        self.recvs = {}   # rreq id -> _Recv
        self._ids = itertools.count(1)

    # -- sender ------------------------------------------------------------
    def post_send(self, ep, tep, mv, req):
        """Register an outgoing buffer; returns ``(sreq_id, raddr, rkey)`` for the RTS."""
        sreq_id = next(self._ids)
        self.sends[sreq_id] = _Send(ep, mv, req)
        raddr, rkey = 0, b""
        if tep.iface.attrs.caps & Caps.GET_ZCOPY and mv.nbytes:
            raddr, rkey = tep.pack_local_key(mv)
        return sreq_id, raddr, rkey

    def on_rtr(self, tep, header, payload):
        sreq_id, rreq_id = wire.RTR.unpack(header)
        s = self.sends.get(sreq_id)
        if s is None:
            raise ProtocolError(f"RTR for unknown send {sreq_id}")
        out = s.ep.transport_endpoint()
        frag = out.iface.attrs.max_frame
        mv, size = s.mv, s.mv.nbytes
        offsets = range(0, size, frag) if size else ()
        s.frames_left = len(offsets) + 1     # +1 guards completion until all are posted
        for off in offsets:
            done = out.send(wire.AmId.RNDV_DATA, wire.DATA.pack(rreq_id, off),
                            mv[off:off + frag], lambda exc, s=s, i=sreq_id: self._frame_sent(i, s, exc))
            if done:
                s.frames_left -= 1
        self._frame_sent(sreq_id, s, None)

    def _frame_sent(self, sreq_id, s, exc):
        if exc is not None:
            self.sends.pop(sreq_id, None)
            s.req.complete(exc=exc)
            return
        s.frames_left -= 1
        if s.frames_left == 0 and self.sends.pop(sreq_id, None) is not None:
            s.req.complete()

    def on_ats(self, tep, header, payload):
        sreq_id, status = wire.ATS.unpack(header)
        s = self.sends.pop(sreq_id, None)
        if s is None:
            raise ProtocolError(f"ATS for unknown send {sreq_id}")
        if status == wire.ATS_ERROR:
            s.req.complete(exc=ConnectionLost("receiver failed to read the message",
                                              peer=s.ep.remote_id))
        else:
            s.req.complete()

    # -- receiver ----------------------------------------------------------
    def start_recv(self, rts: RtsInfo, dest, req, result) -> None:
        """Pull the offered message into ``dest`` (at least ``rts.size`` bytes)
        and complete ``req`` with ``result``."""
        ep = rts.tep.owner_ep
        if rts.size == 0:
            self._ack(ep, rts.sreq_id, wire.ATS_OK)
            req.complete(result)
            return
        dest = dest[:rts.size]
        if rts.rkey and rts.tep.iface.attrs.caps & Caps.GET_ZCOPY:
            def got(exc, ep=ep, rts=rts):
                if exc is None:
                    self._ack(ep, rts.sreq_id, wire.ATS_OK)
                    req.complete(result)
                else:
                    self._ack(ep, rts.sreq_id, wire.ATS_ERROR)
                    req.complete(exc=exc)
            try:
                if rts.tep.get(dest, rts.raddr, rts.rkey, got):
                    got(None)
                return
            except RemoteAccessError:
                pass        # one-sided read refused for this peer: ask for data frames
            except Exception as e:   # the sender is gone, ...
                got(e)
                return
        rreq_id = next(self._ids)
        self.recvs[rreq_id] = _Recv(dest, rts.size, req, result, ep)
        try:
            ep.send_frame(wire.AmId.RNDV_RTR, wire.RTR.pack(rts.sreq_id, rreq_id))
        except ConnectionLost as e:
            # The sender is gone: this receive fails, the caller's post does not.
            del self.recvs[rreq_id]
            req.complete(exc=e)

    def drop(self, rts: RtsInfo) -> None:
        """Decline an offer (truncation, cancelled probe): the sender completes."""
        self._ack(rts.tep.owner_ep, rts.sreq_id, wire.ATS_DROPPED)

    @staticmethod
    def _ack(ep, sreq_id, status):
        try:
            ep.send_frame(wire.AmId.RNDV_ATS, wire.ATS.pack(sreq_id, status))
        except ConnectionLost:
            pass   # the sender is gone; nothing waits for this ack

    def data_dest(self, header, length):
        """Where a DATA fragment goes (``recv_dest`` for zero-copy transports)."""
        rreq_id, off = wire.DATA.unpack(header)
        r = self.recvs.get(rreq_id)
        if r is None or off + length > r.size:
            return None
        return r.dest[off:off + length]

    def on_data(self, tep, header, payload):
        rreq_id, off = wire.DATA.unpack(header)
        r = self.recvs.get(rreq_id)
        n = len(payload)
        if r is None or off + n > r.size:
            raise ProtocolError(f"rendezvous fragment [{off}, {off + n}) for unknown "
                                f"or smaller receive {rreq_id}")
        if not (isinstance(payload, memoryview) and payload.obj is r.dest.obj):
            r.dest[off:off + n] = payload
        r.received += n
        if r.received == r.size:
            del self.recvs[rreq_id]
            r.req.complete(r.result)

    # -- failure -----------------------------------------------------------
    def fail_peer(self, ep, exc) -> None:
        for sid, s in list(self.sends.items()):
            if s.ep is ep:
                del self.sends[sid]
                s.req.complete(exc=exc)
        for rid, r in list(self.recvs.items()):
            if r.ep is ep:
                del self.recvs[rid]
                r.req.complete(exc=exc)
