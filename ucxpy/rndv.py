"""Rendezvous: moving large messages without an extra copy.

Theory of operation
-------------------
The sender posts the message and sends a request-to-send (RTS) carrying the
size and, when its lane can be read one-sidedly (``Caps.GET_ZCOPY``, e.g. shm
with process_vm_readv), the buffer's address and remote key.  Nothing moves
until the receiver has matched the RTS to a receive buffer.  Then one of:

* get:   the receiver reads the sender's buffer straight into the receive
  buffer (single copy) and answers ATS.
* split: for messages of at least ``UCXPY_RNDV_SPLIT_THRESH`` bytes on a lane
  that can also write one-sidedly, both processes copy at once: the receiver
  sends RTP with the key of the first part of its buffer, which the sender
  puts (then FIN), while the receiver gets the rest (then ATS).  Two cores
  copy instead of one.
* data:  the receiver answers RTR(offset, length); the sender streams DATA
  frames of that range from the user buffer (tcp: ``sendmsg`` from the
  buffer, received straight into the receive buffer through ``recv_dest``).

A refused or failed one-sided copy (RemoteAccessError, e.g. CMA not
permitted for this peer, a provider error) falls back to data frames for
that part, on either side.  The receiver
completes when every byte has landed (its get, FIN, DATA frames).  The sender
completes when the receiver no longer reads its buffer (ATS, or an RTR which
means "send it to me instead") and its own part is out (put done, frames
sent).  Truncation or cancellation on the receiver answers ATS(DROPPED): the
sender completes normally (as in MPI, the error belongs to the receiver).

Transition table (sender / receiver)::

    sender    POSTED --RTS--> WAIT --ATS--------------------------------> DONE
                               |--RTR(range)--> SENDING --frames out----> DONE
                               '--RTP--> PUTTING --put+FIN, then ATS---> DONE
    receiver  MATCHED --get--> GETTING --done, ATS-----------------------> DONE
                      |--RTR(0, size)--> RECEIVING --all bytes in--------> DONE
                      '--RTP, get rest--> SPLIT --own get + FIN in-------> DONE
    any state --peer failure--> DONE(ConnectionLost)
"""
from __future__ import annotations

import itertools

from . import wire
from .errors import ConnectionLost, ProtocolError, RemoteAccessError
from .request import Request
from .transports.base import NO_SPLIT, Caps

EXT_ID = wire.RNDV_EXT_ID


class RtsInfo:
    """A matched-or-not rendezvous offer, as the receiver sees it."""

    __slots__ = ("tep", "sreq_id", "size", "raddr", "rkey")

    def __init__(self, tep, sreq_id, size, raddr, rkey):
        self.tep = tep
        self.sreq_id = sreq_id
        self.size = size
        self.raddr = raddr
        self.rkey = rkey


class SendState:
    """``reading``: the receiver may still read our buffer (until ATS or RTR);
    ``busy``: our own parts (put, data frames) not yet out."""

    __slots__ = ("ep", "mv", "req", "reading", "busy")

    def __init__(self, ep, mv, req):
        self.ep = ep
        self.mv = mv
        self.req = req
        self.reading = True
        self.busy = 0


class _Recv:
    """``exposed``: the part of ``dest`` published to the sender for its put,
    kept alive until completion (transports tie registrations to the view)."""

    __slots__ = ("dest", "size", "received", "req", "result", "ep", "exposed")

    def __init__(self, dest, size, req, result, ep):
        self.exposed = None
        self.dest = dest
        self.size = size
        self.received = 0
        self.req = req
        self.result = result
        self.ep = ep


def split_floor(caps, split_thresh: int) -> int:
    """The smallest rendezvous that :func:`rndv_variant` may split on a lane
    with ``caps`` (both one-sided directions), :data:`NO_SPLIT` where it
    never does: the core sets it on each interface (``Interface.split_floor``)
    for the native paths that read an offer whole below it."""
    if caps & Caps.GET_ZCOPY and caps & Caps.PUT_ZCOPY:
        return split_thresh
    return NO_SPLIT


def rndv_variant(caps, size: int, split_thresh: int, rkey: bool = True) -> tuple:
    """``(variant, split_at)``: how the receiver of a ``size``-byte
    rendezvous on a lane with ``caps`` moves the data (``ucxpy-info -e``
    prints the same choice).  ``"split"``: the sender puts the first
    ``split_at`` bytes (page-aligned half) while the receiver gets the rest;
    ``"get"``: the receiver gets it all (zero copy); ``"rtr"``: the sender
    streams data frames (no one-sided access, or no key offered)."""
    if not (rkey and caps & Caps.GET_ZCOPY):
        return "rtr", 0
    if size >= split_floor(caps, split_thresh):
        start = (size // 2) & ~4095
        if start:
            return "split", start
    return "get", 0


class RendezvousProtocol:
    """Per-worker state of all rendezvous transfers in flight."""

    def __init__(self, worker):
        self.worker = worker
        self.sends = {}   # sreq id -> SendState
        self.recvs = {}   # rreq id -> _Recv
        self._ids = itertools.count(1)

    # -- sender ------------------------------------------------------------
    def post_send(self, ep, tep, mv, req):
        """Register an outgoing buffer; returns ``(sreq_id, raddr, rkey)`` for the RTS."""
        sreq_id = next(self._ids)
        self.sends[sreq_id] = SendState(ep, mv, req)
        raddr, rkey = 0, b""
        if tep.iface.attrs.caps & Caps.GET_ZCOPY and mv.nbytes:
            raddr, rkey = tep.pack_local_key(mv)
        return sreq_id, raddr, rkey

    def offer(self, ep, mv, tag, lane):
        """:meth:`post_send` and the RTS of a tagged send in one, by the data
        plane's shm rendezvous (``lane``: the connection's ``_dp.Lane``,
        whose ``rts`` pushes the offer with the key of ``mv``): the send's
        request, or None with nothing registered when the lane could not
        send it now (the caller then takes the Python path)."""
        sreq_id = next(self._ids)
        req = Request(self.worker)
        self.sends[sreq_id] = SendState(ep, mv, req)
        rc = lane.rts(self.worker.dp, tag, sreq_id, mv)
        if rc >= 0:
            if rc:
                ep._tep.wake_peer()
            return req
        del self.sends[sreq_id]
        return None

    def _send_of(self, sreq_id, tep=None):
        """The send a reply is about, or None: a send already completed with
        an error (its peer's connection broke, a one-sided copy failed) may
        still receive the replies its peer sent before; they are dropped.

        A send a C caller (libucp) offered through the data plane (its id has
        ``wire.RNDV_EXT_ID``) becomes one of ours when its receiver asks for its
        bytes (frames, a split) rather than reading them: its bytes are the
        data plane's view of the caller's buffer (``rndv_adopt``), and its
        completion is the data plane's answer to the caller
        (``rndv_answered``)."""
        s = self.sends.get(sreq_id)
        if s is not None or not sreq_id & EXT_ID or tep is None:
            return s
        dp = self.worker.dp
        if dp is None or tep.owner_ep is None:
            return None
        mv = dp.rndv_adopt(sreq_id)
        if mv is None:
            return None
        req = Request(self.worker)
        req.add_done_callback(
            lambda r, i=sreq_id: dp.rndv_answered(i, wire.ATS_OK if r.exc is None
                                                  else wire.ATS_ERROR))
        s = self.sends[sreq_id] = SendState(tep.owner_ep, mv, req)
        return s

    def _settle(self, sreq_id, s, exc=None):
        """Complete the send when nothing of it is outstanding any more."""
        if exc is not None or (not s.reading and s.busy == 0):
            if self.sends.pop(sreq_id, None) is not None:
                tr = self.worker.tr
                if tr is not None:
                    tr.rndv_done(sreq_id=sreq_id)
                s.req.complete(exc=exc)

    def on_rtr(self, tep, header, payload):
        sreq_id, rreq_id, off, length = wire.RTR.unpack(header)
        s = self._send_of(sreq_id, tep)
        if s is None:
            return
        if off + length > s.mv.nbytes:
            raise ProtocolError(f"RTR asks for [{off}, {off + length}) of a {s.mv.nbytes}-byte send")
        s.reading = False           # the receiver wants frames instead of reading
        tr = self.worker.tr
        if tr is not None:
            tr.rndv("rtr", tep.iface.name, sreq_id=sreq_id, offset=off, length=length)
        self._send_frames(sreq_id, s, rreq_id, off, length)

    def _send_frames(self, sreq_id, s, rreq_id, start, length):
        out = s.ep.transport_endpoint()
        frag = out.iface.attrs.max_frame
        s.busy += 1                 # guards completion until every frame is posted
        tr = self.worker.tr
        if tr is not None:
            tr.count("rndv.data_tx", length, s.ep.remote_id, out.iface.name)
            if tr.events is not None:
                for off in range(start, start + length, frag):
                    tr.rndv("data", out.iface.name, sreq_id=sreq_id, offset=off,
                            size=min(frag, start + length - off))
        for off in range(start, start + length, frag):
            s.busy += 1
            n = min(frag, start + length - off)
            if out.send(wire.AmId.RNDV_DATA, wire.DATA.pack(rreq_id, off), s.mv[off:off + n],
                        lambda exc, s=s, i=sreq_id: self._part_done(i, s, exc)):
                s.busy -= 1
        self._part_done(sreq_id, s, None)

    def _part_done(self, sreq_id, s, exc):
        s.busy -= 1
        self._settle(sreq_id, s, exc)

    def on_rtp(self, tep, header, payload):
        n = wire.RTP.size
        sreq_id, rreq_id, length, raddr = wire.RTP.unpack(header[:n])
        rkey = bytes(header[n:])
        s = self._send_of(sreq_id, tep)
        if s is None:
            return
        if length > s.mv.nbytes:
            raise ProtocolError(f"RTP asks for {length} bytes of a {s.mv.nbytes}-byte send")
        out = s.ep.transport_endpoint()
        tr = self.worker.tr
        if tr is not None:
            tr.rndv("rtp", tep.iface.name, sreq_id=sreq_id, length=length)
        if out.iface.attrs.caps & Caps.PUT_ZCOPY:
            s.busy += 1

            part = s.mv[:length]
            if tr is not None:
                tr.rndv("put", out.iface.name, sreq_id=sreq_id, size=length)

            def put_done(exc, s=s, i=sreq_id, part=part):
                if exc is None:
                    s.ep.send_frame(wire.AmId.RNDV_FIN, wire.FIN.pack(rreq_id, length))
                self._part_done(i, s, exc)
            try:
                if out.put(part, raddr, rkey, put_done):
                    put_done(None)
                return
            except RemoteAccessError:
                s.busy -= 1         # refused: send the part as frames instead
                if tr is not None:
                    tr.rndv("fallback", out.iface.name, sreq_id=sreq_id, part="put")
            except Exception as e:
                s.busy -= 1
                self._settle(sreq_id, s, e)
                return
        self._send_frames(sreq_id, s, rreq_id, 0, length)

    def on_ats(self, tep, header, payload):
        sreq_id, status = wire.ATS.unpack(header)
        s = self._send_of(sreq_id)
        if s is None:
            if sreq_id & EXT_ID and self.worker.dp is not None:
                self.worker.dp.rndv_answered(sreq_id, status)   # (a C caller's send)
            return
        s.reading = False
        tr = self.worker.tr
        if tr is not None:
            tr.rndv("ats", tep.iface.name, sreq_id=sreq_id, status=status)
        exc = None
        if status == wire.ATS_ERROR:
            exc = ConnectionLost("receiver failed to read the message", peer=s.ep.remote_id)
        self._settle(sreq_id, s, exc)

    # -- receiver ----------------------------------------------------------
    def start_recv(self, rts: RtsInfo, dest, req, result) -> None:
        """Pull the offered message into ``dest`` (at least ``rts.size`` bytes)
        and complete ``req`` with ``result``."""
        ep = rts.tep.owner_ep
        size = rts.size
        if size == 0:
            self._ack(ep, rts.sreq_id, wire.ATS_OK)
            req.complete(result)
            return
        dest = dest[:size]
        rreq_id = next(self._ids)
        r = self.recvs[rreq_id] = _Recv(dest, size, req, result, ep)
        variant, start = rndv_variant(rts.tep.iface.attrs.caps, size,
                                      self.worker.config.rndv_split_thresh, bool(rts.rkey))
        tr = self.worker.tr
        try:
            if variant != "rtr":
                if tr is not None:
                    tr.rndv_recv(rts, rreq_id, variant, size)
                if start:
                    r.exposed = dest[:start]
                    laddr, lkey = rts.tep.pack_local_key(r.exposed)
                    ep.send_frame(wire.AmId.RNDV_RTP,
                                  wire.RTP.pack(rts.sreq_id, rreq_id, start, laddr) + lkey)
                if self._get(rts, rreq_id, r, start):
                    return
                if tr is not None:
                    tr.rndv("fallback", rts.tep.iface.name, rreq_id=rreq_id, part="get")
            elif tr is not None:
                tr.rndv_recv(rts, rreq_id, "rtr", size)
            self._ask_frames(rts, rreq_id, r, start)
        except Exception as e:   # the sender is gone, ...
            self._ack(ep, rts.sreq_id, wire.ATS_ERROR)
            self._fail_recv(rreq_id, e)

    def _get(self, rts, rreq_id, r, start) -> bool:
        """Read ``[start, size)`` of the sender's buffer; False if refused
        before anything moved (the caller asks for data frames instead)."""
        def got(exc):
            if exc is None:
                self._ack(r.ep, rts.sreq_id, wire.ATS_OK)
                self._landed(rreq_id, r, r.size - start)
            elif isinstance(exc, RemoteAccessError) and rreq_id in self.recvs:
                tr = self.worker.tr
                if tr is not None:
                    tr.rndv("fallback", rts.tep.iface.name, rreq_id=rreq_id, part="get")
                self._ask_frames(rts, rreq_id, r, start)   # failed, but the peer is there
            else:
                self._ack(r.ep, rts.sreq_id, wire.ATS_ERROR)
                self._fail_recv(rreq_id, exc)
        tr = self.worker.tr
        if tr is not None:
            tr.rndv("get", rts.tep.iface.name, rreq_id=rreq_id, offset=start,
                    size=r.size - start)
        try:
            if rts.tep.get(r.dest[start:], rts.raddr + start, rts.rkey, got):
                got(None)
        except RemoteAccessError:
            return False
        return True

    def _ask_frames(self, rts, rreq_id, r, start) -> None:
        """Ask the sender to stream ``[start, size)`` as data frames (RTR)."""
        try:
            r.ep.send_frame(wire.AmId.RNDV_RTR,
                            wire.RTR.pack(rts.sreq_id, rreq_id, start, r.size - start))
        except ConnectionLost as e:
            self._fail_recv(rreq_id, e)

    def _landed(self, rreq_id, r, nbytes) -> None:
        r.received += nbytes
        if r.received == r.size and self.recvs.pop(rreq_id, None) is not None:
            tr = self.worker.tr
            if tr is not None:
                tr.rndv_done(rreq_id=rreq_id)
            r.req.complete(r.result)

    def _fail_recv(self, rreq_id, exc) -> None:
        r = self.recvs.pop(rreq_id, None)
        if r is not None:
            r.req.complete(exc=exc)

    def on_fin(self, tep, header, payload):
        rreq_id, nbytes = wire.FIN.unpack(header)
        r = self.recvs.get(rreq_id)
        if r is None or r.received + nbytes > r.size:
            raise ProtocolError(f"FIN of {nbytes} bytes for unknown or smaller receive {rreq_id}")
        tr = self.worker.tr
        if tr is not None:
            tr.rndv("fin", tep.iface.name, rreq_id=rreq_id, size=nbytes)
        self._landed(rreq_id, r, nbytes)

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
        tr = self.worker.tr
        if tr is not None and tr.events is not None:
            tr.rndv("data_in", tep.iface.name, rreq_id=rreq_id, offset=off, size=n)
        self._landed(rreq_id, r, n)

    # -- failure -----------------------------------------------------------
    def fail_peer(self, ep, exc) -> None:
        dp = self.worker.dp
        if dp is not None:
            dp.rndv_fail_peer(ep.remote_id)     # (the C callers' sends to it)
        for sid, s in list(self.sends.items()):
            if s.ep is ep:
                del self.sends[sid]
                s.req.complete(exc=exc)
        for rid, r in list(self.recvs.items()):
            if r.ep is ep:
                del self.recvs[rid]
                r.req.complete(exc=exc)
