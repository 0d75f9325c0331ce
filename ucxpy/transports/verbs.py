"""InfiniBand / RoCE transport on libibverbs: RC queue pairs through cffi.

Theory of operation
-------------------
One :class:`VerbsInterface` opens one device port (``UCXPY_VERBS_DEVICE``,
default the first device; ``UCXPY_VERBS_PORT``, default 1;
``UCXPY_VERBS_GID_INDEX``, default 0), one protection domain and one
completion queue with a completion channel (its fd is ``wait_fds()``).
Where ``ibv_get_device_list`` finds nothing -- this machine, whose kernel
has no RDMA support -- :meth:`VerbsInterface.query` says so and the context
falls back to the other transports.

Interface address (little-endian)::

    "UVRB" | version u8 | port u8 | link layer u8 | mtu u8 | lid u16
    | oob port u16 | pid u32 | uuid u64 | node guid u64 | gid 16 bytes
    | n u8 | n x IPv4

Wire-up.  An RC queue pair must learn its peer's QP number, PSN and path
(lid / gid) before it can move to RTR, and the transport contract connects
from the interface address alone, so each interface listens on a small
out-of-band TCP socket (the IP and port in its address, chosen like the tcp
transport's: one address, ``UCXPY_TCP_IFACE`` applies).  Three fixed-size
messages, which also prove that both sides hold the job key
(:mod:`ucxpy.auth`)::

    connector                                   acceptor
    create QP, RESET->INIT, post receives
    REQ (uuid, qpn, psn, lid, gid, mtu, Nc) ->  create QP, RESET->INIT, post receives,
                                                INIT->RTR (connector's qpn/psn/path),
                  <---- REP (..., Na, HMAC)     RTR->RTS, REP (its qpn, psn, lid, gid)
    check the HMAC; INIT->RTR->RTS;
    RTU (HMAC) -------------------------->     check the HMAC: frames may flow both ways
    frames flow

The HMACs (``"acceptor"`` in REP, ``"connector"`` in RTU) cover both
messages REQ and REP whole, so both fresh nonces ``Nc``/``Na`` and the QP
data: a replayed or forged exchange fails.  Frames that reach an accepted
QP before the RTU checked out are held in their receive slots and
delivered only then (dropped if it fails); a peer failing its proof is
disconnected and counted (``auth_failures``, ``ucxpy.auth.failures["verbs"]``).
The queue pair itself only talks to the QP number it was connected to.

The socket stays open afterwards: EOF or an error on it means the peer
process died (the fast failure report RC alone gives only after its retry
timeout).  Frames sent before the QP is ready queue in order.

Endpoint states::

    state       event                            next
    CONNECTING  oob socket connected, REQ sent   REQ_SENT
    REQ_SENT    REP received, QP at RTS, RTU     ESTABLISHED
    ACCEPTING   REQ received, QP at RTS, REP     WAIT_RTU
    WAIT_RTU    RTU received                     ESTABLISHED
    any         oob EOF / error, bad message,    FAILED (conn_failed once)
                error completion
    ESTABLISHED close() and queue drained        CLOSED (QP to ERR, socket closed)

QP states follow :data:`QP_TRANSITIONS`, pure Python data (which attribute
mask each transition sets, see :class:`QueuePair`); the table, the masks
and field values, the endpoint states above (:data:`OOB_STEPS`) and the
check of the QP data in REQ / REP live in :mod:`.verbs_qp` (re-exported
here) so they are unit tested without a device.

Data path.  AM frames go by SEND into receive buffers pre-posted per QP
(``UCXPY_VERBS_RX_DEPTH`` slots of ``UCXPY_VERBS_BOUNCE`` bytes + header,
re-posted after ``recv_frame``); sends copy into registered send slots.
RC keeps each QP's order; ``rnr_retry=7`` (infinite) lets a busy receiver
delay, never drop, a frame.  Rendezvous get and put are RDMA READ / WRITE on
memory registered with ``ibv_reg_mr`` (``pack_local_key``, registration
lifetime tied to the view as in the ofi transport); 64-bit fetch-add and
compare-swap are posted as verbs atomics when the device reports
``atomic_cap != IBV_ATOMIC_NONE`` (:meth:`VerbsEndpoint.atomic64`).
"""
from __future__ import annotations

import collections
import errno
import os
import random
import select
import socket
import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..lazy import logger
from .. import auth, config
from ..errors import (ConnectionLost, MessageTooLarge, ProtocolError, RemoteAccessError,
                      TransportUnavailable)
from ..netaddr import advertised_ipv4s
from .base import (MAX_HEADER, Availability, Caps, ChunkedOp, Interface, MdCaps,
                   RegistrationDomain, TransportAttrs, TransportEndpoint, ViewRegistrations,
                   fail_queued)
from .verbs_qp import (ACCEPTING, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC,  # noqa: F401
                       ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, CLOSED, CONNECTING,
                       ESTABLISHED, FAILED, MTU_BYTES, OOB_REP, OOB_REQ, OOB_RTU, OOB_STEPS,
                       QP_ATTR, QP_TRANSITIONS, RC_ACCESS, REQ_SENT, WAIT_RTU,
                       InvalidTransition, QpState, QueuePair, oob_step, transition_mask,
                       transition_params, valid_qp_data)

try:
    from .._verbs import ffi, lib
    _IMPORT_ERROR = None
except ImportError as _e:   # built only where infiniband/verbs.h exists
    ffi = lib = None
    _IMPORT_ERROR = _e

log = logger("ucxpy.verbs")


# The QP state machine, the endpoint connection steps and the QP data check
# are pure data and functions in verbs_qp (tested without libibverbs).

# ------------------------------------------------------------ addresses, keys, messages

_ADDR = struct.Struct("<4sBBBBHHIQQ16sB")
_ADDR_MAGIC = b"UVRB"
_VERSION = 1
_RKEY = struct.Struct("<4sQIQQ")
#: the device atomics (ucxpy.atomics names) the memory domain offers
DEVICE_ATOMICS = frozenset({"add", "cswap"})
_RKEY_MAGIC = b"VRK1"
#: out-of-band messages: magic, kind, pad, uuid, qpn, psn, lid, mtu, global, pad, gid,
#: nonce, HMAC
_OOB = struct.Struct("<4sBxxxQIIHBBxx16s16s32s")
_OOB_MAGIC = b"UVO2"
_MAC = auth.TAG_LEN
_LABEL_ACC, _LABEL_CON = b"ucxpy-verbs-2 acceptor", b"ucxpy-verbs-2 connector"
LINK_LAYER_ETHERNET = 2
PREFIX = struct.Struct("<HBBHHI")
_PSIZE = PREFIX.size
FRAME_MAGIC = 0xB1A5


def pack_address(port, link_layer, mtu, lid, oob_port, pid, uuid, guid, gid, ips) -> bytes:
    return _ADDR.pack(_ADDR_MAGIC, _VERSION, port, link_layer, mtu, lid, oob_port, pid,
                      uuid, guid, bytes(gid), len(ips)) + b"".join(map(socket.inet_aton, ips))


def unpack_address(data) -> dict:
    """Parse a verbs interface address; ValueError if malformed."""
    data = bytes(data)
    try:
        (magic, ver, port, ll, mtu, lid, oob_port, pid, uuid, guid, gid,
         n) = _ADDR.unpack_from(data)
    except struct.error:
        raise ValueError("verbs address too short") from None
    if magic != _ADDR_MAGIC or ver != _VERSION:
        raise ValueError("not a verbs address of this version")
    if n == 0 or len(data) != _ADDR.size + 4 * n:
        raise ValueError("verbs address has the wrong length")
    ips = [socket.inet_ntoa(data[_ADDR.size + 4 * i:_ADDR.size + 4 * i + 4]) for i in range(n)]
    return dict(port=port, link_layer=ll, mtu=mtu, lid=lid, oob_port=oob_port, pid=pid,
                uuid=uuid, guid=guid, gid=gid, ips=ips)


def pack_rkey(uuid: int, rkey: int, base: int, length: int) -> bytes:
    return _RKEY.pack(_RKEY_MAGIC, uuid, rkey, base, length)


def unpack_rkey(data) -> tuple:
    """-> (owner uuid, rkey, base, length); RemoteAccessError if malformed."""
    try:
        magic, uuid, rkey, base, length = _RKEY.unpack(bytes(data))
    except struct.error:
        raise RemoteAccessError("malformed verbs remote key") from None
    if magic != _RKEY_MAGIC:
        raise RemoteAccessError("not a verbs remote key")
    return uuid, rkey, base, length


def pack_oob(kind: int, uuid: int, qpn: int, psn: int, lid: int, mtu: int, is_global: bool,
             gid: bytes, nonce: bytes = bytes(16), mac: bytes = bytes(_MAC)) -> bytes:
    return _OOB.pack(_OOB_MAGIC, kind, uuid, qpn, psn, lid, mtu, 1 if is_global else 0,
                     bytes(gid), bytes(nonce), bytes(mac))


def unpack_oob(data) -> dict:
    try:
        magic, kind, uuid, qpn, psn, lid, mtu, glob, gid, nonce, mac = _OOB.unpack(bytes(data))
    except struct.error:
        raise ProtocolError("verbs: short out-of-band message") from None
    if magic != _OOB_MAGIC or kind not in (OOB_REQ, OOB_REP, OOB_RTU):
        raise ProtocolError("verbs: bad out-of-band message")
    if kind != OOB_RTU and not valid_qp_data(qpn, psn, mtu):
        raise ProtocolError("verbs: out-of-band message with invalid QP data")
    return dict(kind=kind, uuid=uuid, qpn=qpn, psn=psn, lid=lid, mtu=mtu, glob=bool(glob),
                gid=gid, nonce=nonce, mac=mac, body=bytes(data)[:-_MAC])


config.declare(
    "verbs",
    ("VERBS_DEVICE", "", str, "RDMA device to open (as ibv_devices names it); empty = the first "
                              "with an active port"),
    ("VERBS_PORT", 1, int, "port number on the device"),
    ("VERBS_GID_INDEX", 0, int, "GID table index (RoCE: the entry of the address to use)"),
    ("VERBS_GRH", False, config.parse_bool, "use a global route header on InfiniBand too (always "
                                            "on RoCE)"),
    ("VERBS_BOUNCE", 16 << 10, config.parse_size, "bytes per pre-registered bounce slot: eager "
                                                  "messages up to this size"),
    ("VERBS_RX_DEPTH", 32, int, "receive slots posted per interface"),
    ("VERBS_TX_DEPTH", 64, int, "send slots per interface"),
    ("VERBS_RMA_DEPTH", 32, int, "one-sided operations in flight per interface"),
)


def device_status() -> tuple:
    """(count, names or reason): what ``ibv_get_device_list`` sees."""
    names = ffi.new("char[1024]")
    n = lib.uxv_device_count(names, 1024)
    if n < 0:
        return 0, (f"ibv_get_device_list failed: {os.strerror(-n)} "
                   f"(no RDMA support in this kernel?)")
    if n == 0:
        return 0, "ibv_get_device_list returned 0"
    return n, ffi.string(names).decode(errors="replace").split(",")


# ------------------------------------------------------------ endpoint

_WR_RECV, _WR_SEND, _WR_RMA = 1, 2, 3


def _wr_id(kind: int, index: int, slot: int) -> int:
    return (kind << 56) | (index << 24) | slot


class VerbsEndpoint(TransportEndpoint):
    """One RC queue pair to a peer interface, plus its out-of-band socket."""

    def __init__(self, iface: "VerbsInterface", index: int, sock, peer: Optional[dict]):
        self.iface = iface
        self.index = index
        self.sock = sock
        self.peer = peer
        self.peer_uuid = peer["uuid"] if peer else 0
        self.accepted = peer is None
        self.state = CONNECTING if peer else ACCEPTING
        self._exc: Optional[BaseException] = None
        self._closing = False
        self._queue = collections.deque()
        self._rma_queue = collections.deque()
        self._oob_in = b""
        self.authed = False           # the peer proved it holds the job key
        self._nonce = auth.new_nonce()
        self._req_body = b""          # REQ without its (empty) HMAC: part of both proofs
        self._held = []               # (slot, length) received before the proof
        self.psn = random.getrandbits(24)
        self.qp = None
        self.qpn = 0
        self.qp_state = None
        self._rx_mr = None
        self._rx_mem = None
        self._create_qp()

    def __repr__(self):
        return f"<VerbsEndpoint qpn {self.qpn} state {self.state}>"

    # -- QP --------------------------------------------------------------------
    def _create_qp(self) -> None:
        iface = self.iface
        qpn = ffi.new("uint32_t *")
        self.qp = lib.uxv_qp_create(iface._h, iface.tx_depth + iface.rma_depth,
                                    iface.rx_depth, 0, qpn)
        if self.qp == ffi.NULL:
            raise ConnectionLost(f"verbs: ibv_create_qp: {os.strerror(ffi.errno)}")
        self.qpn = int(qpn[0])

        def apply(params, mask, qp=self.qp):
            p = ffi.new("uxv_qp_params_t *")
            for k, v in params.items():
                if k == "dgid":
                    ffi.memmove(p.dgid, bytes(v), 16)
                else:
                    setattr(p, k, v)
            return lib.uxv_qp_modify(qp, p, mask)
        self.qp_state = QueuePair(apply)
        self.qp_state.move(QpState.INIT, iface.local_qp_info(self.psn))
        # receive buffers are posted before the peer can learn our QP number
        size = iface.rx_depth * iface.slot_size
        self._rx_mem = bytearray(size)
        self._rx_view = memoryview(self._rx_mem)
        self._rx_ptr = ffi.from_buffer(self._rx_mem)
        lkey = ffi.new("uint32_t *")
        rkey = ffi.new("uint32_t *")
        self._rx_mr = lib.uxv_reg_mr(iface._h, self._rx_ptr, size, ACCESS_LOCAL_WRITE, lkey, rkey)
        if self._rx_mr == ffi.NULL:
            raise ConnectionLost(f"verbs: ibv_reg_mr: {os.strerror(ffi.errno)}")
        self._rx_lkey = int(lkey[0])
        for slot in range(iface.rx_depth):
            self._post_recv(slot)

    def _post_recv(self, slot: int) -> None:
        sz = self.iface.slot_size
        rc = lib.uxv_post_recv(self.qp, _wr_id(_WR_RECV, self.index, slot),
                               int(ffi.cast("uintptr_t", self._rx_ptr)) + slot * sz, sz,
                               self._rx_lkey)
        if rc:
            self._fail(ConnectionLost(f"verbs: ibv_post_recv: {os.strerror(rc)}"))

    def _remote_info(self, msg: dict) -> dict:
        return dict(qpn=msg["qpn"], psn=msg["psn"], lid=msg["lid"], gid=msg["gid"],
                    mtu=msg["mtu"],
                    **{"global": msg["glob"] or self.iface.use_grh})

    # -- out-of-band handshake ----------------------------------------------------
    def _oob_body(self, kind: int, nonce: bytes = bytes(16)) -> bytes:
        iface = self.iface
        return pack_oob(kind, iface.uuid, self.qpn, self.psn, iface.lid, iface.mtu,
                        iface.use_grh, iface.gid, nonce)[:-_MAC]

    def _oob_send(self, body: bytes, mac: bytes = bytes(_MAC)) -> None:
        try:
            self.sock.sendall(body + mac)     # 96 bytes into an empty socket buffer
        except OSError as e:
            self._fail(ConnectionLost(f"verbs: out-of-band send failed: {e}"))

    def _auth_failed(self, who: str) -> None:
        self.iface.auth_failures += 1
        auth.refused("verbs", f"{who}'s proof does not match the job key", repr(self))
        self._fail(ConnectionLost("verbs: peer failed authentication (not a member of "
                                  "this job)"))

    def _on_oob_readable(self) -> None:
        try:
            data = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            data = b""
            why = str(e)
        else:
            why = "peer closed its out-of-band socket"
        if not data:
            if self.state != CLOSED:
                self._fail(ConnectionLost(f"verbs: peer process gone ({why})"))
            return
        self._oob_in += data
        while len(self._oob_in) >= _OOB.size and self._exc is None:
            raw, self._oob_in = self._oob_in[:_OOB.size], self._oob_in[_OOB.size:]
            try:
                self._on_oob(unpack_oob(raw))
            except (ProtocolError, OSError) as e:
                self._fail(e if isinstance(e, ProtocolError) else ConnectionLost(str(e)))

    def _on_oob(self, msg: dict) -> None:
        kind = msg["kind"]
        nxt = oob_step(self.state, kind)       # ProtocolError if not expected now
        local = self.iface.local_qp_info(self.psn)
        key = self.iface.key
        if kind == OOB_REQ:                    # ACCEPTING
            self.peer_uuid = msg["uuid"]
            self._req_body = msg["body"]
            self.qp_state.connect(local, self._remote_info(msg))
            self.state = nxt
            self._rep_body = self._oob_body(OOB_REP, self._nonce)
            self._oob_send(self._rep_body,
                           auth.tag(key, _LABEL_ACC, self._req_body, self._rep_body))
        elif kind == OOB_REP:                  # REQ_SENT
            if msg["uuid"] != self.peer_uuid:
                raise ProtocolError("verbs: REP from another interface than addressed")
            if not auth.check(key, msg["mac"], _LABEL_ACC, self._req_body, msg["body"]):
                return self._auth_failed("acceptor")
            self.authed = True
            self.qp_state.connect(local, self._remote_info(msg))
            self._oob_send(self._oob_body(OOB_RTU),
                           auth.tag(key, _LABEL_CON, self._req_body, msg["body"]))
            self._established()
        else:                                  # OOB_RTU in WAIT_RTU
            if not auth.check(key, msg["mac"], _LABEL_CON, self._req_body, self._rep_body):
                return self._auth_failed("connector")
            self.authed = True
            self._established()
            held, self._held = self._held, []
            for slot, length in held:
                if self._exc is None:
                    self._on_recv(slot, length)

    def _established(self) -> None:
        self.state = ESTABLISHED
        if self._queue or self._rma_queue:
            self.iface._pending.add(self)

    def _on_oob_connected(self) -> None:
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._fail(ConnectionLost(f"verbs: cannot reach the peer's out-of-band socket: "
                                      f"{os.strerror(err)}"))
            return
        self.state = REQ_SENT
        self._req_body = self._oob_body(OOB_REQ, self._nonce)
        self._oob_send(self._req_body)

    # -- frames ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._rma_queue)

    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        if self._exc is not None or self._closing:
            raise self._exc or ConnectionLost("verbs endpoint is closed")
        header = bytes(header)
        if type(payload) is not bytes:
            payload = memoryview(payload)
            if payload.format != "B" or payload.ndim != 1:
                payload = payload.cast("B")
        plen = len(payload) if type(payload) is bytes else payload.nbytes
        if len(header) > MAX_HEADER:
            raise MessageTooLarge(f"frame header of {len(header)} bytes exceeds {MAX_HEADER}")
        if plen > self.iface.attrs.max_frame:
            raise MessageTooLarge(f"verbs frame payload of {plen} bytes exceeds max_frame")
        if not 0 <= am_id <= 255:
            raise ValueError(f"am_id {am_id} is not in 0..255")
        if not self._queue and self.state == ESTABLISHED and \
                self.iface._post_frame(self, am_id, header, payload):
            return True
        if on_complete is None or type(payload) is bytes or plen <= self.iface.attrs.max_bcopy:
            self._queue.append((am_id, header, bytes(payload), None))
            done = True
        else:
            self._queue.append((am_id, header, payload, on_complete))
            done = False
        self.iface._pending.add(self)
        return done

    def _flush(self) -> int:
        if self.state != ESTABLISHED:
            return 0
        n = 0
        while self._queue:
            am_id, header, payload, cb = self._queue[0]
            if not self.iface._post_frame(self, am_id, header, payload):
                break
            self._queue.popleft()
            n += 1
            if cb is not None:
                cb(None)
        while self._rma_queue:
            if not self.iface._post_rma(self, *self._rma_queue[0]):
                break
            self._rma_queue.popleft()
        if not self._queue and not self._rma_queue:
            self.iface._pending.discard(self)
            if self._closing:
                self._shutdown()
        return n

    def _on_recv(self, slot: int, length: int) -> None:
        if not self.authed:
            # the connector has not proven itself yet (its RTU is on the way):
            # keep the slot, deliver once it has
            self._held.append((slot, length))
            return
        off = slot * self.iface.slot_size
        view = self._rx_view
        try:
            if length < _PSIZE:
                raise ProtocolError("verbs: runt frame")
            magic, am_id, _kind, hlen, _pad, plen = PREFIX.unpack_from(view, off)
            if magic != FRAME_MAGIC or _PSIZE + hlen + plen != length:
                raise ProtocolError("verbs: malformed frame")
            if self._exc is None and self.state != CLOSED:
                s = off + _PSIZE
                self.iface.owner.recv_frame(self, am_id, view[s:s + hlen],
                                            view[s + hlen:s + hlen + plen])
        except ProtocolError as e:
            self._fail(e)
            return
        if self._exc is None:
            self._post_recv(slot)

    # -- one-sided -----------------------------------------------------------------
    def pack_local_key(self, buf) -> tuple:
        return self.iface.pack_local_key(buf)

    def get(self, local, remote_addr, rkey, on_complete) -> bool:
        """RDMA READ of ``len(local)`` bytes at ``remote_addr`` into ``local``."""
        return self._rma(lib.IBV_WR_RDMA_READ, local, remote_addr, rkey, on_complete)

    def put(self, local, remote_addr, rkey, on_complete) -> bool:
        """RDMA WRITE of ``local`` to ``remote_addr``."""
        return self._rma(lib.IBV_WR_RDMA_WRITE, local, remote_addr, rkey, on_complete)

    def atomic64(self, op: str, remote_addr: int, rkey: bytes, value: int, compare: int,
                 on_complete: Callable) -> bool:
        """64-bit ``add`` (fetch-and-add) or ``cswap`` at ``remote_addr``;
        ``on_complete(exc, old_value)``.  Needs ``Caps.ATOMIC64``."""
        if not self.iface.attrs.caps & Caps.ATOMIC64:
            raise RemoteAccessError("verbs: the device has no atomics (IBV_ATOMIC_NONE)")
        if remote_addr % 8:
            raise RemoteAccessError(f"misaligned 8-byte atomic at {remote_addr:#x}")
        result = bytearray(8)
        opcode = {"add": lib.IBV_WR_ATOMIC_FETCH_AND_ADD,
                  "cswap": lib.IBV_WR_ATOMIC_CMP_AND_SWP}[op]

        def done(exc):
            on_complete(exc, None if exc else int.from_bytes(result, "little"))
        return self._rma(opcode, result, remote_addr, rkey, done,
                         compare_add=value if op == "add" else compare, swap=value)

    def atomic(self, op, size, remote_addr, rkey, value, compare, on_complete) -> None:
        """The contract's device atomic: ``add`` (fetch-and-add) and ``cswap``
        on 64-bit words, the operations InfiniBand has."""
        if size != 8 or op not in DEVICE_ATOMICS:
            raise RemoteAccessError(f"verbs: no {size * 8}-bit device atomic {op!r} "
                                    f"(the device has 64-bit {', '.join(sorted(DEVICE_ATOMICS))})")
        if self.atomic64(op, remote_addr, rkey, value, compare, on_complete):
            raise AssertionError("verbs atomics complete from progress")  # pragma: no cover

    def _rma(self, opcode, local, remote_addr, rkey, on_complete, compare_add=0, swap=0):
        if self._exc is not None:
            raise self._exc
        uuid, key, base, length = unpack_rkey(rkey)
        if uuid != self.peer_uuid:
            raise RemoteAccessError("verbs remote key belongs to another interface")
        mv = memoryview(local).cast("B") if not isinstance(local, memoryview) else local
        n = mv.nbytes
        if remote_addr < base or remote_addr + n > base + length:
            raise RemoteAccessError(f"verbs remote access [{remote_addr:#x}, +{n}) outside "
                                    f"[{base:#x}, +{length})")
        if n == 0:
            return True
        reg = self.iface._register(mv)
        chunk = self.iface.max_msg
        offsets = range(0, n, chunk)
        iface = self.iface
        op = ChunkedOp(on_complete, len(offsets), "rdma", release=lambda: iface._deregister(reg),
                       keep=mv)
        for o in offsets:
            piece = (op, opcode, reg.address + o, min(chunk, n - o), reg.lkey,
                     remote_addr + o, key, compare_add, swap)
            if self._rma_queue or self.state != ESTABLISHED or \
                    not self.iface._post_rma(self, *piece):
                self._rma_queue.append(piece)
                self.iface._pending.add(self)
        return False

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:
        if self._closing or self._exc is not None:
            return
        self._closing = True
        if not self._queue and not self._rma_queue:
            self._shutdown()

    def _shutdown(self) -> None:
        self.state = CLOSED
        if self._exc is None:
            self._exc = ConnectionLost("verbs endpoint is closed")
        self._release()

    def _fail(self, exc: BaseException) -> None:
        if self._exc is not None:
            return
        self._exc = exc
        notify = self.state != CLOSED and not self._closing
        self.state = FAILED
        queued, self._queue = self._queue, collections.deque()
        rq, self._rma_queue = self._rma_queue, collections.deque()
        self._release()
        fail_queued(queued, rq, exc)
        self.iface._fail_rma_of(self, exc)
        if notify:
            self.iface.owner.conn_failed(self, exc)

    def _release(self) -> None:
        iface = self.iface
        iface._forget(self)
        if self.qp is not None and self.qp != ffi.NULL:
            try:
                self.qp_state.move(QpState.ERR, {})
            except (OSError, InvalidTransition):
                pass
            lib.uxv_qp_destroy(self.qp)
        self.qp = None
        if self._rx_mr is not None and self._rx_mr != ffi.NULL:
            lib.uxv_dereg_mr(self._rx_mr)
        self._rx_mr = None
        if self.sock is not None:
            try:
                iface._poller.unregister(self.sock.fileno())
            except (KeyError, ValueError, OSError):
                pass
            self.sock.close()
            self.sock = None


class _Reg:
    __slots__ = ("mr", "lkey", "rkey", "address", "length")


# ------------------------------------------------------------ interface

class VerbsInterface(Interface):
    """RC-QP transport on one InfiniBand / RoCE port."""

    name = "verbs"

    @classmethod
    def query(cls, cfg) -> Availability:
        if lib is None:
            return Availability(False, f"ucxpy._verbs is not built ({_IMPORT_ERROR})")
        try:
            n, info = device_status()
            if n == 0:
                return Availability(False, f"no RDMA devices found ({info})")
            want = config.setting("UCXPY_VERBS_DEVICE", cfg)
            if want and want not in info:
                return Availability(False, f"UCXPY_VERBS_DEVICE={want} not among {info}")
            h = ffi.new("uxv_t **")
            a = ffi.new("uxv_attrs_t *")
            err = ffi.new("char[]", lib.UXV_ERRLEN)
            rc = lib.uxv_open(want.encode(), config.setting("UCXPY_VERBS_PORT", cfg),
                              config.setting("UCXPY_VERBS_GID_INDEX", cfg), 16, h, a, err,
                              lib.UXV_ERRLEN)
            if rc:
                return Availability(False, ffi.string(err).decode(errors="replace"))
            lib.uxv_close(h[0])
            dev = ffi.string(a.device).decode()
            if a.port_state != lib.IBV_PORT_ACTIVE:
                return Availability(False, f"{dev} port {a.port} is not active "
                                           f"(state {a.port_state})")
            kind = "RoCE" if a.link_layer == LINK_LAYER_ETHERNET else "InfiniBand"
            return Availability(True, f"{kind}, mtu {MTU_BYTES.get(a.active_mtu, '?')}",
                                devices=[f"{dev}:{a.port}"])
        except Exception as e:  # query must not raise
            return Availability(False, f"{type(e).__name__}: {e}")

    def __init__(self, owner, cfg) -> None:
        super().__init__(owner, cfg)
        if lib is None:
            raise TransportUnavailable(f"verbs: ucxpy._verbs is not built ({_IMPORT_ERROR})")
        self._h = None
        self._closed = False
        self.uuid = random.getrandbits(63) | 1
        opt = config.setting
        self.bounce = opt("UCXPY_VERBS_BOUNCE", cfg)
        self.rx_depth = opt("UCXPY_VERBS_RX_DEPTH", cfg)
        self.tx_depth = opt("UCXPY_VERBS_TX_DEPTH", cfg)
        self.rma_depth = opt("UCXPY_VERBS_RMA_DEPTH", cfg)
        self.slot_size = (_PSIZE + MAX_HEADER + self.bounce + 63) & ~63
        h = ffi.new("uxv_t **")
        a = ffi.new("uxv_attrs_t *")
        err = ffi.new("char[]", lib.UXV_ERRLEN)
        rc = lib.uxv_open(opt("UCXPY_VERBS_DEVICE", cfg).encode(),
                          opt("UCXPY_VERBS_PORT", cfg), opt("UCXPY_VERBS_GID_INDEX", cfg),
                          4 * (self.tx_depth + self.rma_depth + self.rx_depth) + 256,
                          h, a, err, lib.UXV_ERRLEN)
        if rc:
            raise TransportUnavailable("verbs: " + ffi.string(err).decode(errors="replace"))
        self._h, self.dev = h[0], a
        try:
            self._setup(cfg)
        except BaseException:
            self.close()
            raise

    def _setup(self, cfg) -> None:
        a = self.dev
        self.port = int(a.port)
        self.lid = int(a.lid)
        self.mtu = int(a.active_mtu)
        self.gid = bytes(ffi.buffer(a.gid, 16))
        self.gid_index = int(a.gid_index)
        self.use_grh = a.link_layer == LINK_LAYER_ETHERNET or \
            config.setting("UCXPY_VERBS_GRH", cfg)
        self.max_rd_atomic = max(1, min(int(a.max_qp_rd_atom), 16))
        self.max_msg = max(4096, min(int(a.max_msg_sz) or (1 << 30), 1 << 30))
        caps = (Caps.AM_SHORT | Caps.AM_BCOPY | Caps.GET_ZCOPY | Caps.PUT_ZCOPY
                | Caps.CONNECT_TO_IFACE)
        md_caps = MdCaps.REG | MdCaps.PUT | MdCaps.GET
        if a.atomic_cap != lib.IBV_ATOMIC_NONE:
            caps |= Caps.ATOMIC64
            md_caps |= MdCaps.ATOMIC64
        #: RMA regions: ibv_reg_mr'd through pack_local_key; RDMA READ / WRITE,
        #: and the device's fetch-add / compare-swap (UCXPY_ATOMIC_MODE=device)
        self.md = RegistrationDomain(self, md_caps, DEVICE_ATOMICS)
        self.attrs = TransportAttrs(
            caps=caps, max_short=256, max_bcopy=self.bounce, max_frame=self.bounce,
            latency=2e-6, bandwidth=10e9, overhead=1e-6, max_get=1 << 40, priority=3)
        self._tx_mem = bytearray(self.tx_depth * self.slot_size)
        self._tx_view = memoryview(self._tx_mem)
        self._tx_ptr = ffi.from_buffer(self._tx_mem)
        self._tx_base = int(ffi.cast("uintptr_t", self._tx_ptr))
        lkey = ffi.new("uint32_t *")
        rkey = ffi.new("uint32_t *")
        self._tx_mr = lib.uxv_reg_mr(self._h, self._tx_ptr, len(self._tx_mem),
                                     ACCESS_LOCAL_WRITE, lkey, rkey)
        if self._tx_mr == ffi.NULL:
            raise TransportUnavailable(f"verbs: ibv_reg_mr: {os.strerror(ffi.errno)} "
                                       f"(is `ulimit -l` large enough?)")
        self._tx_lkey = int(lkey[0])
        self._tx_free = list(range(self.tx_depth - 1, -1, -1))
        self._tx_owner = {}
        self._rma_ops = {}
        self._rma_ids = 0
        self._wcs = ffi.new("uxv_wc_t[32]")
        self._eps = {}                # index -> endpoint
        self._next_index = 1
        self._pending = set()
        self._by_fd = {}
        self._poller = select.poll()
        self.regs = ViewRegistrations(self._register, self._deregister)
        self.key = auth.interface_key(cfg)
        self.auth_failures = 0
        ips = advertised_ipv4s(getattr(cfg, "tcp_iface", "") or "",
                               keyed=auth.job_key(cfg) is not None)
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((ips[0], 0))
        self._lsock.listen(128)
        self._lsock.setblocking(False)
        self._poller.register(self._lsock.fileno(), select.POLLIN)
        self._address = pack_address(self.port, int(a.link_layer), self.mtu, self.lid,
                                     self._lsock.getsockname()[1], os.getpid(), self.uuid,
                                     int(a.node_guid), self.gid, ips)
        lib.uxv_arm(self._h)

    def local_qp_info(self, psn: int) -> dict:
        return dict(port=self.port, gid_index=self.gid_index, mtu=self.mtu,
                    max_rd_atomic=self.max_rd_atomic, psn=psn)

    def address(self) -> bytes:
        return self._address

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        try:
            peer = unpack_address(address)
        except ValueError:
            return False
        return peer["link_layer"] == self.dev.link_layer

    # -- registration ------------------------------------------------------------------
    def _register(self, view: memoryview) -> _Reg:
        reg = _Reg()
        lkey = ffi.new("uint32_t *")
        rkey = ffi.new("uint32_t *")
        with ffi.from_buffer(view) as p:
            reg.address = int(ffi.cast("uintptr_t", p))
            reg.mr = lib.uxv_reg_mr(self._h, p, view.nbytes, RC_ACCESS, lkey, rkey)
        if reg.mr == ffi.NULL:
            raise RemoteAccessError(f"verbs: ibv_reg_mr of {view.nbytes} bytes: "
                                    f"{os.strerror(ffi.errno)} (ulimit -l?)")
        reg.lkey, reg.rkey, reg.length = int(lkey[0]), int(rkey[0]), view.nbytes
        return reg

    def _deregister(self, reg: Optional[_Reg]) -> None:
        if reg is not None and reg.mr is not None and self._h is not None:
            lib.uxv_dereg_mr(reg.mr)
            reg.mr = None

    def pack_local_key(self, buf) -> tuple:
        """Register the view (for as long as it lives) and describe it."""
        mv = buf if type(buf) is memoryview else memoryview(buf)
        reg = self.regs.for_view(mv)
        return reg.address, pack_rkey(self.uuid, reg.rkey, reg.address, reg.length)

    # -- wire-up -------------------------------------------------------------------------
    def connect(self, address: bytes) -> VerbsEndpoint:
        if self._closed:
            raise ConnectionLost("verbs interface is closed")
        try:
            peer = unpack_address(address)
        except ValueError as e:
            raise TransportUnavailable(f"verbs: {e}") from None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ep = self._add(sock, peer)
        err = sock.connect_ex((peer["ips"][0], peer["oob_port"]))
        if err == 0:
            ep._on_oob_connected()
        elif err not in (errno.EINPROGRESS, errno.EAGAIN):
            ep._fail(ConnectionLost(f"verbs: out-of-band connect: {os.strerror(err)}"))
        else:
            self._poller.modify(sock.fileno(), select.POLLIN | select.POLLOUT)
        return ep

    def _add(self, sock, peer) -> VerbsEndpoint:
        index = self._next_index
        self._next_index += 1
        ep = VerbsEndpoint(self, index, sock, peer)
        self._eps[index] = ep
        self._by_fd[sock.fileno()] = ep
        self._poller.register(sock.fileno(), select.POLLIN)
        return ep

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("verbs: accept: %s", e)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self._add(sock, None)
            except ConnectionLost as e:
                log.warning("verbs: cannot accept a connection: %s", e)
                sock.close()

    def _forget(self, ep: VerbsEndpoint) -> None:
        self._eps.pop(ep.index, None)
        self._pending.discard(ep)
        if ep.sock is not None:
            self._by_fd.pop(ep.sock.fileno(), None)

    # -- data path ---------------------------------------------------------------------
    def _post_frame(self, ep: VerbsEndpoint, am_id, header, payload) -> bool:
        if not self._tx_free:
            return False
        slot = self._tx_free.pop()
        off = slot * self.slot_size
        hlen = len(header)
        plen = len(payload) if type(payload) is bytes else payload.nbytes
        PREFIX.pack_into(self._tx_view, off, FRAME_MAGIC, am_id, 0, hlen, 0, plen)
        s = off + _PSIZE
        self._tx_view[s:s + hlen] = header
        self._tx_view[s + hlen:s + hlen + plen] = payload
        rc = lib.uxv_post_send(ep.qp, _wr_id(_WR_SEND, ep.index, slot), lib.IBV_WR_SEND,
                               self._tx_base + off, _PSIZE + hlen + plen, self._tx_lkey,
                               0, 0, 0, 0, 0)
        if rc:
            self._tx_free.append(slot)
            if rc == errno.ENOMEM:      # send queue full: retry from progress
                return False
            ep._fail(ConnectionLost(f"verbs: ibv_post_send: {os.strerror(rc)}"))
            return False
        self._tx_owner[slot] = ep
        return True

    def _post_rma(self, ep, op, opcode, laddr, length, lkey, raddr, rkey, cmp_add, swap) -> bool:
        if op.exc is not None:
            op.chunk_done(None)
            return True
        if len(self._rma_ops) >= self.rma_depth:
            return False
        self._rma_ids = (self._rma_ids + 1) & 0xFFFFFF
        wr = _wr_id(_WR_RMA, ep.index, self._rma_ids)
        rc = lib.uxv_post_send(ep.qp, wr, opcode, laddr, length, lkey, raddr, rkey,
                               cmp_add, swap, 0)
        if rc == errno.ENOMEM:
            return False
        if rc:
            op.chunk_done(RemoteAccessError(f"verbs: ibv_post_send: {os.strerror(rc)}"))
            return True
        self._rma_ops[wr] = (op, ep)
        return True

    def _fail_rma_of(self, ep, exc) -> None:
        for wr, (op, e) in list(self._rma_ops.items()):
            if e is ep:
                del self._rma_ops[wr]
                op.chunk_done(exc)

    def progress(self) -> int:
        if self._h is None:
            return 0
        n = 0
        wcs = self._wcs
        got = lib.uxv_poll(self._h, wcs, 32)
        for i in range(max(got, 0)):
            wc = wcs[i]
            n += 1
            kind, index, slot = wc.wr_id >> 56, (wc.wr_id >> 24) & 0xFFFFFFFF, wc.wr_id & 0xFFFFFF
            ok = wc.status == lib.IBV_WC_SUCCESS
            why = ffi.string(lib.uxv_wc_status_str(wc.status)).decode()
            if kind == _WR_SEND:
                ep = self._tx_owner.pop(slot, None)
                self._tx_free.append(slot)
                if not ok and ep is not None:
                    ep._fail(ConnectionLost(f"verbs: send failed: {why}"))
            elif kind == _WR_RMA:
                entry = self._rma_ops.pop(wc.wr_id, None)
                if entry is not None:
                    entry[0].chunk_done(None if ok else RemoteAccessError(f"verbs: {why}"))
                    if not ok and wc.status != lib.IBV_WC_REM_ACCESS_ERR:
                        entry[1]._fail(ConnectionLost(f"verbs: one-sided operation: {why}"))
            elif kind == _WR_RECV:
                ep = self._eps.get(index)
                if ep is None:
                    continue
                if ok:
                    ep._on_recv(slot, wc.byte_len)
                elif wc.status != lib.IBV_WC_WR_FLUSH_ERR:
                    ep._fail(ConnectionLost(f"verbs: receive failed: {why}"))
        if self._pending:
            for ep in list(self._pending):
                n += ep._flush()
        if self.regs.dead:
            self.regs.reap()
        for fd, ev in self._poller.poll(0):
            n += 1
            if fd == self._lsock.fileno():
                self._accept()
                continue
            ep = self._by_fd.get(fd)
            if ep is None:
                continue
            if ev & select.POLLOUT and ep.state == CONNECTING:
                self._poller.modify(fd, select.POLLIN)
                ep._on_oob_connected()
            elif ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                ep._on_oob_readable()
        return n

    def wait_fds(self) -> list:
        if self._h is None:
            return []
        lib.uxv_drain_events(self._h)
        lib.uxv_arm(self._h)
        return [int(self.dev.comp_fd), self._lsock.fileno()] + list(self._by_fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        exc = ConnectionLost("verbs interface closed")
        for ep in list(getattr(self, "_eps", {}).values()):
            queued, ep._queue = ep._queue, collections.deque()
            rq, ep._rma_queue = ep._rma_queue, collections.deque()
            ep._shutdown()
            fail_queued(queued, rq, exc)
        for op, _ep in list(getattr(self, "_rma_ops", {}).values()):
            op.chunk_done(exc)
        if hasattr(self, "regs"):
            self.regs.clear()
        if getattr(self, "_tx_mr", None) is not None and self._tx_mr != ffi.NULL:
            lib.uxv_dereg_mr(self._tx_mr)
        if hasattr(self, "_lsock"):
            self._lsock.close()
        h, self._h = self._h, None
        if h is not None:
            lib.uxv_close(h)
