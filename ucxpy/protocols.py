"""Protocol plug-ins: a tagged-message protocol written in Python, for the
message sizes it names, in place of the stock ones.

Theory of operation
-------------------
The core (and below it the native data plane) owns matching and each
sender's order; a plug-in owns what happens to the bytes of a message once
its size chose it.  Both ends of a job name the same plug-in
(``UCXPY_PROTO_PLUGIN=name:sizes``, e.g. ``pipelined-copy:64K-inf``); the
worker makes one instance (:func:`load`) and from then on:

* **Sending.**  ``Endpoint.tag_send_nb`` of a message of those sizes (from
  Python, mpi_shim or libucp: none of them sends such a message any other
  way) calls :meth:`Protocol.send`, which returns the send's request.  The
  plug-in's first frame to the peer is its *offer*, which goes on the
  endpoint's connection in order with the stock protocols' frames
  (``Protocol.frame``: one core frame id, ``AmId.PLUGIN``, whose header
  starts with the plug-in's own one-byte kind).
* **Matching.**  The receiver's plug-in hands each offer to
  :meth:`Protocol.offer` with the message's tag and size: the core matches
  it in the worker's one matcher exactly as a rendezvous offer (MPI's order
  across every protocol, probes, wildcards), or keeps it as an unexpected
  message that a later receive takes.  The data plane stops at the offer's
  frame in the shm inbox and leaves it to Python; a receive of libucp that
  it matches is adopted by Python (docs/guide/c-programs.md).
* **Receiving.**  Once matched, :meth:`Protocol.start_recv` gets the receive
  (its buffer fits the message: the core checked) and moves the data with
  whatever frames it likes, completing the receive with the message's
  :class:`~ucxpy.request.TagInfo` and the send's request with None.
* **Failure.**  :meth:`Protocol.fail_peer` fails what it waits for from a
  peer that failed.

A C half
--------
A plug-in may also have a C half (:attr:`Protocol.native`: a cffi module's
function that returns the address of its ``ucxdp_proto_ops_t``, written
against native/dp/proto.h).  The data plane then runs, without the
interpreter, the messages of the plug-in's sizes that C callers (libucp:
MPICH, Open MPI, OSHMEM) send and receive on shm: their sends, the offers
their posted receives take, and the frames addressed to those.  The two
halves speak the same frames and tell their messages apart by id (the C
half's have bit 63, dp.h's UCXDP_RNDV_EXT_ID; a Python half never gives
such ids), so a message may start on one side and
end on the other; everything the C half leaves (Python's sends and
receives, unexpected offers, tracing) is the Python half's, which stays the
reference.  ``UCXPY_PROTO_NATIVE=n`` runs every message in Python.

The shipped example, :class:`PipelinedCopy`, is a rendezvous through the
inbox: offer, clear-to-send, then the message in fragments that the sender
copies into the ring while the receiver copies the previous ones out (no
registration, no CMA).  Its frames and timings are events in
``ucxpy-trace`` (category ``plugin``).  Its C half is
native/proto/pipelined_copy.c (``ucxpy._proto_pipelined``).
"""
from __future__ import annotations

import importlib
import itertools
import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from . import config
from .buffers import recv_view, send_view
from .config import ConfigError, parse_size, parse_size_ranges
from .errors import ProtocolError
from .request import Request, TagInfo
from .wire import AmId

config.declare(
    "protocols",
    ("PIPELINED_FRAG", 16384, parse_size,
     "fragment size of the pipelined-copy protocol plug-in (UCXPY_PROTO_PLUGIN="
     "pipelined-copy:...)"),
)

#: the plug-ins ucxpy ships, by the name UCXPY_PROTO_PLUGIN gives
BUILTIN = {"pipelined-copy": "ucxpy.protocols:PipelinedCopy"}


class PluginOffer:
    """A plug-in's offer of a tagged message, waiting to be matched (the
    core keeps it as an unexpected message's ``rts``)."""
    __slots__ = ("protocol", "ep", "size", "state")

    def __init__(self, protocol, ep, size: int, state):
        self.protocol = protocol
        self.ep = ep
        self.size = size
        self.state = state          # the plug-in's own (e.g. the sender's request id)


class Protocol:
    """Base of a protocol plug-in: the frame helper, the core's matching and
    the bookkeeping every plug-in needs.  Subclasses implement
    :meth:`send`, :meth:`on_frame` and :meth:`start_recv`."""

    #: the name UCXPY_PROTO_PLUGIN gives it
    name = "protocol"
    #: its C half, "module:function" (a cffi module's function returning the
    #: address of a ucxdp_proto_ops_t, native/dp/proto.h), or None
    native = None

    def __init__(self, worker, sizes: tuple):
        self.worker = worker
        self.sizes = sizes          # ((first, last), ...) payload sizes it runs
        self.low = min((lo for lo, _ in sizes), default=1 << 62)

    def covers(self, n: int) -> bool:
        for lo, hi in self.sizes:
            if lo <= n <= hi:
                return True
        return False

    # -- what subclasses implement ------------------------------------------------
    def send(self, ep, mv: memoryview, tag: int) -> Request:
        """Send ``mv`` (its bytes stay the caller's until the request
        completes) with ``tag`` to ``ep``'s peer; return the request."""
        raise NotImplementedError

    def on_frame(self, ep, kind: int, header: memoryview, payload) -> None:
        """A frame of this plug-in arrived from ``ep``'s peer (``payload`` is
        valid during the call only)."""
        raise NotImplementedError

    def start_recv(self, req, offer: PluginOffer, info: TagInfo) -> None:
        """``req`` (a receive whose buffer ``req.buf`` fits ``offer.size``
        bytes) matched ``offer``: move the data and complete ``req`` with
        ``info``."""
        raise NotImplementedError

    def fail_peer(self, ep, exc: BaseException) -> None:
        """``ep``'s peer failed: fail what waits for it."""

    def drop(self, offer: PluginOffer) -> None:
        """``offer`` matched a receive too small for it (the receive fails
        with TruncationError): release the sender."""

    # -- what the core gives them ---------------------------------------------------
    def frame(self, ep, kind: int, header: bytes, payload=b"", on_complete=None) -> bool:
        """Send one frame of this plug-in to ``ep``'s peer, in order with
        every other frame of the endpoint (``Endpoint.send_frame``)."""
        return ep.send_frame(AmId.PLUGIN, bytes((kind,)) + header, payload, on_complete)

    def offer(self, ep, tag: int, offer: PluginOffer) -> None:
        """An offer of a tagged message arrived: the core matches it, or keeps
        it for a later receive; :meth:`start_recv` follows the match."""
        self.worker._plugin_offer(ep, tag, offer)

    def native_table(self) -> tuple:
        """``(address, param)``: its C half's table and the number its
        ``create`` gets (:meth:`native_param`); raises ConfigError when
        :attr:`native` names nothing loadable."""
        mod, _, fn = self.native.partition(":")
        try:
            lib = importlib.import_module(mod).lib
            address = int(getattr(lib, fn)())
        except (ImportError, AttributeError, ValueError, TypeError) as e:
            raise ConfigError(f"protocol plug-in {self.name}: no C half {self.native!r} "
                              f"({e}); UCXPY_PROTO_NATIVE=n runs it in Python") from None
        return address, self.native_param()

    def native_param(self) -> int:
        """The number its C half's ``create`` gets (e.g. a fragment size)."""
        return 0

    def trace(self, name: str, ep, **args) -> None:
        tr = self.worker.tr
        if tr is not None:
            tr.event("plugin", f"{self.name}:{name}", ep.lane.name if ep.lane else "",
                     peer=ep.remote_id, **args)


# -- the shipped example -------------------------------------------------------------
_OFFER = struct.Struct("<QQQ")      # tag, send id, size
_CTS = struct.Struct("<QQ")         # send id, receive id (0: the receive takes nothing)
_FRAG = struct.Struct("<QQ")        # receive id, offset        payload: the fragment
OFFER, CTS, FRAG = 1, 2, 3


class PipelinedCopy(Protocol):
    """A rendezvous through the inbox, in fragments: the sender offers, the
    receiver answers clear-to-send once a receive matched, and the sender
    pushes the message as ``UCXPY_PIPELINED_FRAG``-byte frames, which the
    receiver copies into the receive's buffer as they come; the last one
    completes the receive, and the send once the transport has taken it."""

    name = "pipelined-copy"
    native = "ucxpy._proto_pipelined:ucxpy_pipelined_copy_ops"

    def __init__(self, worker, sizes: tuple):
        super().__init__(worker, sizes)
        self.frag = max(1, int(config.setting("UCXPY_PIPELINED_FRAG")))
        self._ids = itertools.count(1)
        self.sends = {}             # send id -> (ep, mv, request)
        self.recvs = {}             # receive id -> [ep, req, buffer, size, received, info]
        self.counts = {"offers": 0, "fragments": 0, "received": 0}

    def native_param(self) -> int:
        return self.frag

    def send(self, ep, mv, tag):
        req = Request(self.worker)
        sid = next(self._ids)
        mv = send_view(mv)                 # (a flat byte view already from the core)
        self.sends[sid] = (ep, mv, req)
        self.counts["offers"] += 1
        self.trace("offer", ep, tag=tag, size=mv.nbytes, send=sid)
        try:
            self.frame(ep, OFFER, _OFFER.pack(tag, sid, mv.nbytes))
        except BaseException:
            self.sends.pop(sid, None)
            raise
        return req

    def on_frame(self, ep, kind, header, payload):
        if kind == OFFER:
            tag, sid, size = _OFFER.unpack(header)
            self.offer(ep, tag, PluginOffer(self, ep, size, sid))
        elif kind == CTS:
            sid, rid = _CTS.unpack(header)
            self._clear_to_send(sid, rid)
        elif kind == FRAG:
            rid, off = _FRAG.unpack(header)
            self._fragment(rid, off, payload)
        else:
            raise ProtocolError(f"{self.name}: frame of unknown kind {kind}")

    def drop(self, offer):
        self.frame(offer.ep, CTS, _CTS.pack(offer.state, 0))

    def start_recv(self, req, offer, info):
        ep, size = offer.ep, offer.size
        if size == 0:
            self.frame(ep, CTS, _CTS.pack(offer.state, 0))
            req.complete(info)
            return
        rid = next(self._ids)
        self.recvs[rid] = [ep, req, recv_view(req.buf), size, 0, info]
        self.trace("cts", ep, size=size, send=offer.state, recv=rid)
        self.frame(ep, CTS, _CTS.pack(offer.state, rid))

    def _clear_to_send(self, sid: int, rid: int) -> None:
        entry = self.sends.pop(sid, None)
        if entry is None:
            raise ProtocolError(f"{self.name}: clear-to-send for unknown send {sid}")
        ep, mv, req = entry
        n = mv.nbytes
        if rid == 0 or n == 0:
            req.complete()
            return
        last = (n - 1) // self.frag * self.frag
        for off in range(0, n, self.frag):
            piece = mv[off:off + self.frag]
            if off == last:
                if self.frame(ep, FRAG, _FRAG.pack(rid, off), piece, req._sent):
                    req.complete()
            else:
                self.frame(ep, FRAG, _FRAG.pack(rid, off), piece)
            self.counts["fragments"] += 1
        self.trace("sent", ep, size=n, send=sid, fragments=(n + self.frag - 1) // self.frag)

    def _fragment(self, rid: int, off: int, payload) -> None:
        r = self.recvs.get(rid)
        if r is None:
            raise ProtocolError(f"{self.name}: fragment for unknown receive {rid}")
        ep, req, buf, size, got, info = r
        n = len(payload)
        if off + n > size:
            raise ProtocolError(f"{self.name}: fragment [{off}, {off + n}) beyond {size} bytes")
        buf[off:off + n] = payload
        got += n
        if got < size:
            r[4] = got
            return
        del self.recvs[rid]
        self.counts["received"] += 1
        self.trace("received", ep, size=size, recv=rid)
        req.complete(info)

    def fail_peer(self, ep, exc):
        for sid, (e, _mv, req) in list(self.sends.items()):
            if e is ep:
                del self.sends[sid]
                req.complete(exc=exc)
        for rid, r in list(self.recvs.items()):
            if r[0] is ep:
                del self.recvs[rid]
                r[1].complete(exc=exc)


def parse_spec(spec: str) -> tuple:
    """``name:sizes`` -> ``(name, ((first, last), ...))``; ``('', ())`` for ''."""
    spec = spec.strip()
    if not spec:
        return "", ()
    target, sep, sizes = spec.rpartition(":")
    if not sep or not target:
        raise ConfigError(f"UCXPY_PROTO_PLUGIN={spec!r}: name:sizes, e.g. "
                          f"pipelined-copy:64K-inf")
    ranges = parse_size_ranges(sizes)
    if not ranges:
        raise ConfigError(f"UCXPY_PROTO_PLUGIN={spec!r}: no sizes")
    return target, ranges


def plugin_class(target: str) -> type:
    """The Protocol class ``target`` names (a name of :data:`BUILTIN` or
    ``module:Class``); ConfigError when there is none."""
    path = BUILTIN.get(target, target)
    mod, _, cls = path.partition(":")
    try:
        klass = getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"UCXPY_PROTO_PLUGIN: no protocol {path!r} ({e})") from None
    if not (isinstance(klass, type) and issubclass(klass, Protocol)):
        raise ConfigError(f"UCXPY_PROTO_PLUGIN: {path} is not a ucxpy.protocols.Protocol")
    return klass


def load(worker, spec: str) -> Optional[Protocol]:
    """The plug-in ``spec`` names (``name:sizes``: a name of :data:`BUILTIN`
    or ``module:Class``, then ``:`` and the sizes as
    :func:`ucxpy.config.parse_size_ranges` reads them), made for ``worker``;
    None for ''."""
    target, ranges = parse_spec(spec)
    if not target:
        return None
    try:
        klass = plugin_class(target)
    except ConfigError as e:
        raise ConfigError(f"UCXPY_PROTO_PLUGIN={spec!r}: {str(e).split(': ', 1)[1]}") from None
    return klass(worker, ranges)
