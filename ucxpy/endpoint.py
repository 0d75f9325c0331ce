"""Endpoint: a connection from one worker to a remote worker."""
from __future__ import annotations

TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from . import _dp, wire
from .address import WorkerAddress
from .am import am_send_nb as _am_send_nb
from .atomics import OPS as ATOMIC_OPS, POST_OPS
from .buffers import COMPLETED, send_view  # noqa: F401  (re-exported)
from .errors import ConnectionLost, TransportUnavailable
from .request import Request
from .rma import RemoteKey
from .transports.base import Caps

_TAG_EAGER = int(wire.AmId.TAG_EAGER)
_TAG_RTS = int(wire.AmId.TAG_RTS)
_RNDV_ATS = int(wire.AmId.RNDV_ATS)
_AM_EAGER = int(wire.AmId.AM_EAGER)
_FULL = 0xFFFF_FFFF_FFFF_FFFF


class Endpoint:
    """Messages to one remote worker.

    Created by :meth:`ucxpy.Worker.connect` (or implicitly when a peer
    connects to us).  The transport lane is chosen on first use by the cost
    model of the transports both sides share (see ``select_lane``).
    """

    def __init__(self, worker, remote: WorkerAddress):
        self.worker = worker
        self.remote = remote
        self.remote_id = remote.worker_id
        self.failed: Optional[BaseException] = None
        self.peer_closed = False
        self.closed = False
        self._tep = None
        self.incoming = set()      # transport endpoints the peer sends to us on
        self.lane = None
        self.rndv_thresh = 0
        self.short_thresh = 0
        #: the data plane's view of the connection's shm lane (a _dp.Lane)
        #: that tagged sends go by, without a protocol plug-in (UCXPY_FASTPATH)
        self._fast_lane = None
        #: ... or the tcp connection whose socket the data plane writes
        #: eager frames to (its ``stream_out``)
        self._fast_stream = None
        self._move_seen = False     # the peer's LANE_MOVE came before its WIREUP(MOVED)

    def __repr__(self) -> str:
        lane = self.lane.name if self.lane else "unconnected"
        return f"<Endpoint to worker {self.remote_id} via {lane}>"

    # -- wire-up -------------------------------------------------------------
    def transport_endpoint(self):
        """The outgoing transport endpoint, connecting on first use."""
        tep = self._tep
        if tep is not None:
            return tep
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise ConnectionLost("endpoint is closed", peer=self.remote_id)
        iface, raddr = select_lane(self.worker, self.remote)
        tep = self._duplex_on(iface) or iface.connect(raddr)
        tep.owner_ep = self
        self.lane = iface
        self.worker._mark_hot(iface)
        self.short_thresh, self.rndv_thresh = protocol_thresholds(
            iface.attrs, self.worker.config, self.worker.local_ranks() - 1)
        tep.send(wire.AmId.WIREUP, b"", self.worker.address_bytes)
        self._bind(tep)
        tr = self.worker.tr
        if tr is not None:
            tr.event("wireup", "wireup_connect", iface.name, peer=self.remote_id,
                     short_thresh=self.short_thresh, rndv_thresh=self.rndv_thresh)
        return tep

    def _bind(self, tep) -> None:
        """Send on ``tep`` from now on.  With the data plane (UCXPY_FASTPATH),
        a connection into a peer's native inbox gets its view of it, a
        ``_dp.Lane``, which tagged sends (ours and libucp's) go by in C, and a
        connection lending its socket (``stream_out``: tcp) has its eager
        messages written by the data plane's tcp eager path."""
        old, self._tep = self._tep, tep
        if old is not None and old is not tep and old.native_tx:
            old.set_native_lane(None)
        self._fast_lane = self._fast_stream = None
        w = self.worker
        if w.dp is None:
            return
        fast = w.protocol is None       # (a plug-in's sizes must reach it)
        lane = None
        if tep.native_tx:
            rts = _TAG_RTS if tep.iface.attrs.caps & Caps.GET_ZCOPY else 0
            lane = _dp.Lane(tep.native_tx, _TAG_EAGER, tep.native_max_frame, rts, _RNDV_ATS,
                            _AM_EAGER)
            tep.set_native_lane(lane)
            if fast:
                self._fast_lane = lane
        elif fast and tep.stream_out is not None:
            self._fast_stream = tep
        for t in self.incoming:     # the answers to offers read from the peer go by it
            native = t.iface.native
            if native is not None and t.native_conn:
                native.set_lane(t.native_conn, lane)

    def _move_to(self, tep) -> None:
        """Leave our own connection for ``tep``, the one the peer opened to
        us: both sides connected at once on a ``duplex`` lane, and the side
        whose worker uuid is larger moves (``Worker._on_wireup``), so that
        one connection carries the pair's frames both ways.  LANE_MOVE is
        our last frame on the old connection, WIREUP(MOVED) our first on the
        new one; the peer holds what arrives on the new one until the old
        one's LANE_MOVE, so our frames stay in order.  The old connection is
        closed once its queue has left.  While the old connection is still
        being made, nothing of ours has left yet: its queue, WIREUP first,
        moves to ``tep`` whole (``hand_over``) and the peer never sees it."""
        old = self._tep
        if not old.hand_over(tep):
            old.send(wire.AmId.LANE_MOVE, b"")
            tep.send(wire.AmId.WIREUP, wire.MOVED, self.worker.address_bytes)
            old.close()
        self._bind(tep)
        tr = self.worker.tr
        if tr is not None:
            tr.event("wireup", "lane_move", tep.iface.name, peer=self.remote_id)

    def _duplex_on(self, iface):
        """A connection the peer opened to ``iface`` that can carry our frames
        back (``TransportEndpoint.duplex``), or None.  The WIREUP then sent
        on it names us to the peer's side of it as usual.  When both sides
        connect before either's WIREUP arrives, one of them moves later
        (:meth:`_move_to`)."""
        for t in self.incoming:
            if t.iface is iface and t.duplex and t.can_send():
                return t
        return None

    # -- sending -------------------------------------------------------------
    def send_frame(self, am_id, header, payload=b"", on_complete=None) -> bool:
        """Send one core frame in order (see ``TransportEndpoint.send``)."""
        try:
            return (self._tep or self.transport_endpoint()).send(am_id, header, payload,
                                                                 on_complete)
        except ConnectionLost as e:
            raise self._named(e)

    def _named(self, exc: ConnectionLost) -> ConnectionLost:
        """Name this endpoint's peer in a transport's ConnectionLost."""
        if exc.peer is None:
            exc.peer = self.remote_id
        return exc

    def tag_send_nb(self, buf, tag: int) -> Request:
        """Send ``buf`` with ``tag``; returns a Request (already done when the
        transport took a copy).  ``buf`` must not change until it completes.

        Without tracing, statistics or a progress thread, the data plane
        sends it in C (UCXPY_FASTPATH): an eager message as one frame pushed
        into the peer's shm inbox or written to the tcp socket, a rendezvous
        offer as one RTS frame (shm; Python keeps the send until the ATS)."""
        tag &= _FULL
        mv = None
        lane = self._fast_lane
        if lane is not None or self._fast_stream is not None:
            w = self.worker
            if w.tr is None and w.lock is None:
                if lane is not None:
                    try:
                        rc = lane.eager(w.dp, tag, buf, self.rndv_thresh - 1)
                    except (TypeError, ValueError, BufferError):
                        rc = -2         # not a contiguous buffer: send_view reports it
                    if rc >= 0:
                        if rc:
                            self._tep.wake_peer()
                        w.fast_sends += 1
                        return COMPLETED
                    if rc == -1:
                        mv = send_view(buf)
                        if mv.nbytes >= self.rndv_thresh:
                            req = w.rndv.offer(self, mv, tag, lane)
                            if req is not None:
                                w.fast_offers += 1
                                return req
                elif self._stream_send(w, buf, tag):
                    w.fast_sends += 1
                    return COMPLETED
        if mv is None:
            mv = send_view(buf)
        plugin = self.worker.protocol
        if plugin is not None and plugin.covers(mv.nbytes):
            return plugin.send(self, mv, tag)   # (UCXPY_PROTO_PLUGIN: no fast path then)
        return self.send_message(mv, wire.AmId.TAG_EAGER, wire.EAGER.pack(tag),
                                 wire.AmId.TAG_RTS, wire.RTS, (tag,))

    def _stream_send(self, w, buf, tag: int) -> bool:
        """The data plane's tcp eager path: the frame written to the socket
        of ``_fast_stream`` by one sendmsg when a frame written now is next
        in the connection's order; what the socket did not take of it is
        queued there.  False: nothing sent (the Python path sends it)."""
        tep = self._fast_stream
        fd = tep.stream_out()
        if fd < 0:
            return False
        limit = self.rndv_thresh - 1
        if limit > tep.native_max_frame:
            limit = tep.native_max_frame
        try:
            left = _dp.tcp_eager_send(w.dp, fd, _TAG_EAGER, tag, buf, limit)
        except (TypeError, ValueError, BufferError):
            return False
        if left < 0:
            return False
        if left:
            data = bytes(send_view(buf))
            frame = _dp.tcp_eager_head(_TAG_EAGER, tag, len(data)) + data
            tep.stream_tail(frame[len(frame) - left:])
        return True

    def tag_send_sync_nb(self, buf, tag: int) -> Request:
        """Like :meth:`tag_send_nb`, but the request completes only once the
        receiver has matched the message (MPI's synchronous send, UCP's
        ``ucp_tag_send_sync_nbx``): whatever its size, the message goes by
        rendezvous, whose data moves only after the match (or by the protocol
        plug-in for the sizes it runs, which moves it after the match too)."""
        mv = send_view(buf)
        plugin = self.worker.protocol
        if plugin is not None and plugin.covers(mv.nbytes):
            return plugin.send(self, mv, tag & 0xFFFF_FFFF_FFFF_FFFF)
        return self.send_message(mv, wire.AmId.TAG_EAGER,
                                 wire.EAGER.pack(tag & 0xFFFF_FFFF_FFFF_FFFF), wire.AmId.TAG_RTS,
                                 wire.RTS, (tag & 0xFFFF_FFFF_FFFF_FFFF,), rndv=True)

    def send_message(self, mv, eager_id, eager_header, rts_id, rts_struct, rts_prefix,
                     rts_suffix=b"", rndv: bool = False) -> Request:
        """Send ``mv`` by the protocol its size selects: eager short (copied
        now), eager copy (the transport copies or references it) or rendezvous
        (an RTS of ``rts_struct.pack(*rts_prefix, sreq id, size, address)``
        + ``rts_suffix`` + remote key; data moves once the receiver matched).
        ``rndv`` forces rendezvous, whatever the size."""
        try:
            tep = self._tep or self.transport_endpoint()
            n = mv.nbytes
            if n < self.rndv_thresh and not rndv:
                if n <= self.short_thresh:
                    if self.worker.tr is not None:
                        self.worker.tr.send(self, eager_id, "eager_short", n, rts_prefix[0])
                    tep.send(eager_id, eager_header, bytes(mv))
                    return COMPLETED
                if self.worker.tr is not None:
                    self.worker.tr.send(self, eager_id, "eager_copy", n, rts_prefix[0])
                req = Request(self.worker)
                if tep.send(eager_id, eager_header, mv, req._sent):
                    return COMPLETED
                return req
            req = Request(self.worker)
            rndv = self.worker.rndv
            sreq_id, raddr, rkey = rndv.post_send(self, tep, mv, req)
            if self.worker.tr is not None:
                self.worker.tr.send(self, eager_id, "rndv", n, rts_prefix[0], sreq_id)
            try:
                tep.send(rts_id, rts_struct.pack(*rts_prefix, sreq_id, n, raddr) + rts_suffix + rkey)
            except BaseException:
                rndv.sends.pop(sreq_id, None)
                raise
            return req
        except ConnectionLost as e:
            raise self._named(e)

    def tag_send(self, buf, tag: int, timeout: Optional[float] = None) -> None:
        """Blocking :meth:`tag_send_nb`."""
        req = self.tag_send_nb(buf, tag)
        if not req.done:
            req.wait(timeout)
        elif req.exc is not None:
            raise req.exc

    def am_send_nb(self, am_id: int, header=b"", data=b"") -> Request:
        """Send an active message to handler ``am_id`` of the remote worker:
        a user ``header`` (bytes, small) and ``data`` (any buffer; large data
        goes by rendezvous into a buffer the handler chooses)."""
        return _am_send_nb(self, am_id, header, data)

    def am_send(self, am_id: int, header=b"", data=b"", timeout: Optional[float] = None) -> None:
        """Blocking :meth:`am_send_nb`."""
        req = self.am_send_nb(am_id, header, data)
        if not req.done:
            req.wait(timeout)
        elif req.exc is not None:
            raise req.exc

    # -- RMA and atomics -----------------------------------------------------------
    def unpack_rkey(self, packed):
        """Turn a peer's ``MemHandle.pack_rkey()`` bytes into a
        :class:`ucxpy.rma.RemoteKey` usable on this endpoint; raises
        RemoteAccessError if malformed or foreign."""
        return RemoteKey(self, packed)

    def put_nb(self, buf, remote_addr: int, rkey) -> Request:
        """Write ``buf`` at ``remote_addr`` of the peer's region ``rkey``."""
        return self.worker.rma.put_nb(self, buf, remote_addr, rkey)

    def get_nb(self, buf, remote_addr: int, rkey) -> Request:
        """Read ``len(buf)`` bytes at ``remote_addr`` of region ``rkey`` into ``buf``."""
        return self.worker.rma.get_nb(self, buf, remote_addr, rkey)

    def put(self, buf, remote_addr: int, rkey, timeout: Optional[float] = None) -> None:
        self.put_nb(buf, remote_addr, rkey).wait(timeout)

    def get(self, buf, remote_addr: int, rkey, timeout: Optional[float] = None) -> None:
        self.get_nb(buf, remote_addr, rkey).wait(timeout)

    def atomic_post(self, op: str, value: int, remote_addr: int, rkey, size: int = 8) -> Request:
        """Non-fetching atomic ``op`` in add/and/or/xor on a 4- or 8-byte word."""
        if op not in POST_OPS:
            raise ValueError(f"atomic_post supports {', '.join(POST_OPS)}, not {op!r}")
        return self.worker.rma.atomic_nb(self, op, value, remote_addr, rkey, size)

    def atomic_fetch_nb(self, op: str, value: int, remote_addr: int, rkey, size: int = 8,
                        compare: int = 0) -> Request:
        """Fetching atomic (add, and, or, xor, swap, cswap); the request's result
        is the old value.  ``cswap`` stores ``value`` if the word equals ``compare``."""
        return self.worker.rma.atomic_nb(self, op, value, remote_addr, rkey, size, compare)

    def atomic_fetch(self, op: str, value: int, remote_addr: int, rkey, size: int = 8,
                     compare: int = 0, timeout: Optional[float] = None) -> int:
        old = self.atomic_fetch_now(op, value, remote_addr, rkey, size, compare)
        if old is not None:
            return old
        return self.atomic_fetch_nb(op, value, remote_addr, rkey, size, compare).wait(timeout)

    def atomic_fetch_now(self, op: str, value: int, remote_addr: int, rkey, size: int = 8,
                         compare: int = 0) -> Optional[int]:
        """The old value of a fetching atomic that completes at once: the
        key maps the peer's memory here, CPU atomics, no trace, the native
        fast path on; one C call, no request.  None, with nothing done,
        otherwise (and for a bad address or op, which
        :meth:`atomic_fetch_nb` then reports): post it with that."""
        native = rkey.native
        if native is None or self.worker.tr is not None:
            return None
        code = ATOMIC_OPS.get(op)
        if code is None:
            return None
        return native.fetch(remote_addr, size, code, value, compare)

    def fence(self, timeout: Optional[float] = None) -> None:
        """Operations issued before the fence complete at the target before
        those issued after it (UCX's ``ucp_ep_fence``)."""
        tr = self.worker.tr
        if tr is not None:
            tr.event("rma", "fence", self.lane.name if self.lane else "", peer=self.remote_id)
        if self.worker.rma.outstanding(self):
            self.worker.wait_until(lambda: not self.worker.rma.outstanding(self),
                                   timeout, "fence")

    # -- completion / teardown -------------------------------------------------
    def flushed(self) -> bool:
        """True once every send posted on this endpoint has left and every RMA
        operation completed at the target; raises the endpoint's failure.

        A peer that closed its endpoint gracefully (its CLOSE came first) has
        taken everything it waited for: with nothing of ours outstanding the
        flush is complete, not failed.  (The last barrier of a job races the
        peers' closes: a rank that got our token may close before our flush
        looks.)"""
        tep = self._tep
        if self.failed is not None:
            if not (self.peer_closed and tep is not None and not tep.pending
                    and not self._outstanding()):
                raise self.failed
            return True
        if tep is not None and tep.pending:
            return False
        return not self._outstanding()

    def _outstanding(self) -> bool:
        w = self.worker
        if not w.rndv.sends and not w.rma.ops:
            return False          # the usual case: nothing of anyone's
        return any(s.ep is self for s in w.rndv.sends.values()) or w.rma.outstanding(self)

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until :meth:`flushed`."""
        tr = self.worker.tr
        if tr is not None:
            tr.event("rma", "flush", self.lane.name if self.lane else "", peer=self.remote_id)
        if not self.flushed():    # (and no wait set up, nor its message, when it is)
            self.worker.wait_until(self.flushed, timeout, f"flush of {self!r}")

    def flush_nb(self) -> Request:
        """A request done once :meth:`flushed` (failed with the endpoint's
        failure), completed by this worker's progress: the non-blocking
        :meth:`flush`."""
        return self.worker.when(self.flushed)

    def close(self, timeout: Optional[float] = None) -> None:
        """Flush, tell the peer, then close the transport endpoint (idempotent)."""
        if self.closed:
            return
        try:
            if self.failed is None and self._tep is not None:
                self.flush(timeout)
                self._tep.send(wire.AmId.CLOSE, b"")
                self.worker.wait_until(lambda: not self._tep.pending, timeout, "close")
        except ConnectionLost:
            pass
        finally:
            self.abort()

    def abort(self) -> None:
        """Close at once; pending operations fail with ConnectionLost."""
        if self.closed:
            return
        self.closed = True
        if self._tep is not None:
            self._tep.close()
        self.worker._endpoint_closed(self)

    def fail(self, exc: BaseException) -> None:
        """Complete everything that depends on the peer with ``exc``."""
        if self.failed is not None:
            return
        self.failed = exc
        tr = self.worker.tr
        if tr is not None:
            tr.totals["peer.failures"] += 1
            tr.event("fault", "peer_failure", self.lane.name if self.lane else "",
                     peer=self.remote_id, error=f"{type(exc).__name__}: {exc}")
        self.worker._endpoint_failed(self, exc)


#: the smallest eager limit the receive-queue share below sets
MIN_SHARED_EAGER = 4096


def protocol_thresholds(attrs, config, local_peers: int = 0) -> tuple:
    """``(short_thresh, rndv_thresh)`` of an endpoint on a lane with ``attrs``:
    eager short up to ``short_thresh`` bytes (copied at send time), eager copy
    above, rendezvous from ``rndv_thresh`` bytes on.  The automatic
    rendezvous threshold is one byte above the transport's eager-copy limit;
    a configured one is capped there too (an eager frame must fit a frame).

    On a lane whose receive queue all ``local_peers`` same-host peers write
    to (``attrs.rx_shared`` bytes, shm's inbox) and whose rendezvous reads
    one-sidedly (``Caps.GET_ZCOPY``), the eager limit is also at most
    ``rx_shared / (2 * local_peers)`` (not below :data:`MIN_SHARED_EAGER`): an
    all-to-all's messages then fit half the queue at once, and larger ones
    move by one copy without passing through it.  A full queue makes
    senders queue and copy again, and wait for the receiver to run (32
    ranks on 2 CPUs, 64 KiB to every peer, 2026-12-05: 31 ms eager, 19 ms by
    rendezvous; at 8 ranks eager is the cheaper)."""
    eager = min(attrs.max_bcopy, attrs.max_frame)
    if attrs.rx_shared and local_peers > 0 and attrs.caps & Caps.GET_ZCOPY:
        eager = min(eager, max(attrs.rx_shared // (2 * local_peers), MIN_SHARED_EAGER))
    auto_rndv = eager + 1
    rndv = auto_rndv if config.rndv_thresh < 0 else min(config.rndv_thresh, auto_rndv)
    short = attrs.max_short if config.short_thresh < 0 else config.short_thresh
    return short, rndv


def select_lane(worker, remote: WorkerAddress):
    """Pick the interface to reach ``remote``: among the transports both sides
    have and that can reach it, the lowest estimated small-message time, ties
    broken by priority.  Deterministic, from declared attributes only."""
    best, reasons = None, []
    for iface in worker.ifaces:
        raddr = remote.transport(iface.name)
        if raddr is None:
            reasons.append(f"{iface.name}: peer does not have it")
            continue
        caps = iface.attrs.caps
        if caps & Caps.LOOPBACK:
            if remote.uuid != worker.uuid:
                continue
        elif not iface.is_reachable(raddr, remote.host_id):
            reasons.append(f"{iface.name}: unreachable")
            continue
        key = (iface.attrs.estimate(8), -iface.attrs.priority)
        if best is None or key < best[0]:
            best = (key, iface, raddr)
    if best is None:
        raise TransportUnavailable(
            f"no transport reaches worker {remote.worker_id}: " + "; ".join(reasons))
    return best[1], best[2]
