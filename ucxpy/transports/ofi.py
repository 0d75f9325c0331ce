"""libfabric transport: reliable-datagram (RDM) endpoints through cffi.

Theory of operation
-------------------
Each :class:`OfiInterface` opens one fabric/domain/RDM endpoint with its own
address vector and completion queue (``native/ofi_shim.c``), for the
provider named by ``UCXPY_OFI_PROVIDER`` (a ``;``-list such as
``tcp;ofi_rxm``; several candidates separated by ``,`` are tried in order;
default ``tcp;ofi_rxm,shm``) and optionally the domain ``UCXPY_OFI_DOMAIN``.
On InfiniBand/RoCE use ``verbs;ofi_rxm``: nothing below depends on the
provider.

Interface address (little-endian)::

    "UOFI" | version u8 | flags u8 | pad u16 | pid u32 | uuid u64
    | len(provider) u8 | len(fabric) u8 | len(host id) u16 | len(name) u16
    | provider | fabric | host id | fi_getname() bytes

RDM endpoints have no connections: ``connect()`` is one ``fi_av_insert``.
So that the receiver can tell frames of different endpoints apart (the
core's FIFO unit), every frame starts with a 32-byte prefix naming the
sending interface (its uuid), a connection id and the connection's token::

    magic u16 | am_id u8 | kind u8 | header len u16 | seq u16 | payload len u32
    | connection id u32 | sender uuid u64 | token u64

Authentication.  Anyone who can reach the provider's address can send us a
frame, so a connection proves membership of the job first (see
:mod:`ucxpy.auth`), in three frames::

    connector                                   acceptor
    HELLO  (its interface address, Nc) ----->   pending endpoint (not the owner's yet)
                       <----- CHALLENGE (Na, HMAC(key, "acceptor", Nc, Na, ids))
    check; AUTH (HMAC(key, "connector", ...)) ->  check: endpoint open
    frames flow (queued until now)  <-------->  frames flow

``Nc``/``Na`` are fresh random nonces, ``ids`` the connection id and both
uuids.  The *token* is a further HMAC of the same transcript, known only to
the two sides: every frame after the challenge carries it, and a frame whose
token does not match its connection is dropped before anything else looks
at it (sequence numbers, malformed-frame handling), so nobody without the
key can inject into, reorder or break an open connection.  HELLO and
CHALLENGE carry token 0 (they cannot know it yet).  A failed proof drops
the pending endpoint (acceptor) or fails the connection (connector), and is
counted (``rejected``, ``auth_failures``, ``ucxpy.auth.failures["ofi"]``);
pending endpoints are bounded (the oldest is dropped past
:data:`MAX_PENDING`).  Accepted endpoints carry ``kind=REPLY`` frames and the
connector's id.  ``close()`` sends BYE once the queue is drained; the peer
reports that endpoint as lost, like EOF on tcp.

Memory registrations get random 64-bit keys (the provider checks them on
every one-sided access); the bounce buffers are registered for local access
only, so no peer can read or write them one-sidedly.

Frames travel in registered *bounce buffers*: ``rx_depth`` receive slots are
pre-posted with ``fi_recv`` and re-posted after ``recv_frame`` returns;
sends copy prefix, header and payload into one of ``tx_depth`` send slots
(so ``send()`` returns True) and ``fi_send`` it.  ``max_frame`` is the slot
size (``UCXPY_OFI_BOUNCE``, 64 KiB); bigger messages use the core's
rendezvous.  When no slot is free or the provider says ``-FI_EAGAIN``,
frames queue per endpoint, in order, and are posted from ``progress()``
(payloads over ``max_bcopy`` with an ``on_complete`` are queued by reference).
The provider is asked for ``FI_ORDER_SAS``, so posted frames keep their order.

One-sided operations (``Caps.GET_ZCOPY``, ``Caps.PUT_ZCOPY``):
``pack_local_key(view)`` registers the view with ``fi_mr_reg`` and returns its
address and a remote key (magic, owner uuid, MR key, base, length, flags).
The registration lives exactly as long as that view object (the core keeps
it until the receiver acknowledged the rendezvous), tracked by a weak
reference: no cache of our own pins user memory, and a key can never outlive
its buffer.  Repeated registration of the same pages is cheap on hardware
providers, which cache registrations themselves.  ``get()``/``put()`` post ``fi_read`` /
``fi_write`` in ``max_msg_size`` chunks; ``on_complete`` runs from
``progress()`` when the last chunk's completion arrives.  Remote addresses
are virtual addresses when the provider uses ``FI_MR_VIRT_ADDR`` and offsets
into the region otherwise (``tcp;ofi_rxm`` here), decided by the key's
owner and recorded in the key.

Completions: ``progress()`` drains the CQ (``fi_cq_read``/``fi_cq_readerr``
in one shim call).  Operation contexts are slots of an array in the shim:
``[0, rx_depth)`` receives, then ``tx_depth`` send slots, then ``rma_depth``
one-sided operations.

Failure (RDM has no connection to break):

* an error completion of a send or of a one-sided operation towards a peer
  (``FI_EIO``, ``FI_ECONNREFUSED``, ... when its process is gone) fails that
  endpoint: ``conn_failed`` once, queued sends and operations get
  :class:`ConnectionLost`;
* peers on the same host are watched through a pidfd (0.1 s), as shm does;
* peers on other hosts that die silently are reported by the launcher
  (``Worker.check_peers``) or by the timeout of the blocking call;
* a malformed frame (bad magic, lengths, unknown connection) fails the
  connection it names with :class:`ProtocolError`, or is dropped and counted
  in ``rejected`` if it names none.

Endpoint states::

    state           event                        next
    authenticating  connector: valid CHALLENGE   open (AUTH, then the queued frames)
                    acceptor: valid AUTH         open (frames reach the owner)
    authenticating  proof fails                  failed (connector: conn_failed;
                                                 acceptor: dropped, never the owner's)
    open     close(), queue empty                closed  (BYE sent)
    open     close(), frames queued              closing (BYE after the queue)
    open/closing  BYE / error completion /       failed  (conn_failed once)
             peer pid exits / bad frame
"""
from __future__ import annotations

import collections
import contextlib
import mmap
import os
import random
import socket
import struct
import time
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..lazy import logger
from .. import auth, config
from ..netaddr import host_id as this_host_id
from ..errors import (ConnectionLost, MessageTooLarge, ProtocolError, RemoteAccessError,
                      TransportUnavailable)
from .liveness import PidWatch
from .base import (MAX_HEADER, Availability, Caps, ChunkedOp, Interface, TransportAttrs,
                   TransportEndpoint, fail_queued)
from .ofi_md import OfiMemoryDomain, _errstr, pack_rkey, unpack_rkey  # noqa: F401 (tests use them)

try:
    from .._ofi import ffi, lib
    _IMPORT_ERROR = None
except ImportError as _e:  # built only where libfabric's headers exist
    ffi = lib = None
    _IMPORT_ERROR = _e

log = logger("ucxpy.ofi")

DEFAULT_PROVIDERS = ("tcp;ofi_rxm", "shm")
INTRA_HOST_PROVIDERS = ("shm",)

_ADDR = struct.Struct("<4sBBHIQBBHH")
_ADDR_MAGIC = b"UOFI"
_VERSION = 2
PREFIX = struct.Struct("<HBBHHIIQQ")
_PSIZE = PREFIX.size
FRAME_MAGIC = 0x0F1B
KIND_DATA, KIND_HELLO, KIND_BYE, KIND_REPLY, KIND_REPLY_BYE, KIND_CHALLENGE, KIND_AUTH = range(7)
#: frames of these kinds travel from the acceptor to the connector
_FROM_ACCEPTOR = (False, False, False, True, True, True, False)
_HANDSHAKE = (KIND_HELLO, KIND_CHALLENGE, KIND_AUTH)
_LABEL_ACC, _LABEL_CON = b"ucxpy-ofi-2 acceptor", b"ucxpy-ofi-2 connector"
_LABEL_TOKEN = b"ucxpy-ofi-2 token"
_NONCE = auth.NONCE_LEN
#: connection requests (HELLO without AUTH yet) kept at once
MAX_PENDING = 256

#: uuids of the open interfaces of this process: a provider may crash when
#: sending to an interface of the same process that was closed (shm unmaps
#: its region), so such sends fail with ConnectionLost instead
_LIVE_IN_PROCESS = set()

_HOUSEKEEPING = 1e-3
_RESEND_TRIES = 8        # a failed send is retried this often (delays doubling) ...
_RESEND_DELAY = 1e-3     # ... from this, before the peer counts as lost
_LIVENESS = 0.1
_POLL_BATCH = 64


def _providers(text: str) -> tuple:
    return tuple(p.strip() for p in text.split(",") if p.strip())


config.declare(
    "ofi",
    ("OFI_PROVIDER", (), _providers,
     "libfabric providers to try, comma-separated, each a ';'-stack such as tcp;ofi_rxm "
     "(default: " + ", ".join(DEFAULT_PROVIDERS) + ")"),
    ("OFI_DOMAIN", "", str, "libfabric domain (device) to open; empty = the provider's first"),
    ("OFI_BOUNCE", 64 << 10, config.parse_size,
     "bytes per registered bounce slot: eager messages up to this size (at least 1K)"),
    ("OFI_RX_DEPTH", 64, config.parse_size, "receive slots posted per interface (at least 2)"),
    ("OFI_TX_DEPTH", 64, config.parse_size, "send slots per interface (at least 2)"),
    ("OFI_RMA_DEPTH", 64, config.parse_size, "one-sided operations in flight per interface"),
    ("OFI_PINNED", 64, config.parse_size,
     "user buffers kept registered (most recently used first)"),
)


def provider_candidates(cfg=None) -> list:
    """Providers to try, from ``UCXPY_OFI_PROVIDER`` (comma-separated) or the default."""
    return list(config.setting("UCXPY_OFI_PROVIDER", cfg) or DEFAULT_PROVIDERS)


@contextlib.contextmanager
def _provider_env(provider: str, cfg):
    """While a provider opens: ``FI_TCP_IFACE=lo`` for libfabric's tcp
    provider when this process listens on loopback only (a single-host job,
    see :mod:`ucxpy.netaddr`) and the user chose no device, so that the
    provider listens on loopback too.  (Its domain-name hint is ignored under
    ofi_rxm; the variable is read at every fi_getinfo.)"""
    if getattr(cfg, "tcp_iface", "") != "127.0.0.1" or "FI_TCP_IFACE" in os.environ \
            or config.setting("UCXPY_OFI_DOMAIN", cfg) or provider.split(";")[0] != "tcp":
        yield
        return
    os.environ["FI_TCP_IFACE"] = "lo"
    try:
        yield
    finally:
        del os.environ["FI_TCP_IFACE"]


# ----------------------------------------------------------------- addresses

def pack_address(pid: int, uuid: int, provider: str, fabric: str, host_id: bytes,
                 name: bytes, flags: int = 0) -> bytes:
    p, f = provider.encode(), fabric.encode()
    return _ADDR.pack(_ADDR_MAGIC, _VERSION, flags, 0, pid, uuid, len(p), len(f),
                      len(host_id), len(name)) + p + f + host_id + name


def unpack_address(data) -> dict:
    """Parse an interface address; raises ValueError if malformed."""
    data = bytes(data)
    try:
        magic, ver, flags, _pad, pid, uuid, lp, lf, lh, ln = _ADDR.unpack_from(data)
    except struct.error:
        raise ValueError("ofi address too short") from None
    if magic != _ADDR_MAGIC or ver != _VERSION:
        raise ValueError("not an ofi address of this version")
    off = _ADDR.size
    if len(data) != off + lp + lf + lh + ln or ln == 0:
        raise ValueError("ofi address has the wrong length")
    prov = data[off:off + lp].decode("ascii", "replace")
    off += lp
    fabric = data[off:off + lf].decode("ascii", "replace")
    off += lf
    host = data[off:off + lh]
    off += lh
    return dict(flags=flags, pid=pid, uuid=uuid, provider=prov, fabric=fabric, host_id=host,
                name=data[off:off + ln])


# ----------------------------------------------------------------- endpoint

class OfiEndpoint(TransportEndpoint):
    """Frames to one peer interface over the shared RDM endpoint."""

    def __init__(self, iface: "OfiInterface", peer: dict, fi_addr: int, conn_id: int,
                 accepted: bool, remote_conn: int = 0):
        self.iface = iface
        self.peer = peer
        self.peer_uuid = peer["uuid"]
        self.peer_pid = peer["pid"]
        self.fi_addr = fi_addr
        self.same_process = peer["pid"] == os.getpid() and peer["host_id"] == iface.host_id
        self.conn_id = conn_id           # our id (connector) / the connector's id (accepted)
        self.accepted = accepted
        self._kind = KIND_REPLY if accepted else KIND_DATA
        self._queue = collections.deque()       # (kind, am_id, header, payload, cb)
        self._rma_queue = collections.deque()   # (op, is_read, ptr, len, desc, raddr, key)
        self._inflight = 0                      # frames posted, completion not yet seen
        self._tx_seq = 0                        # sequence number of the next frame
        self._exc: Optional[BaseException] = None
        self._closing = False
        self._closed = False
        self.authed = False                     # the handshake completed
        self._nonce = auth.new_nonce()          # our challenge
        self._peer_nonce = b""
        self.token = 0                          # carried by every frame after CHALLENGE

    def __repr__(self):
        state = "failed" if self._exc else "closed" if self._closed else \
            "closing" if self._closing else "open" if self.authed else "authenticating"
        return (f"<OfiEndpoint peer pid {self.peer_pid} conn {self.conn_id} {state}"
                f"{' accepted' if self.accepted else ''} queued={len(self._queue)}>")

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._rma_queue)

    # -- frames ------------------------------------------------------------------
    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        if self._exc is not None or self._closing:
            raise self._exc or ConnectionLost("ofi endpoint is closed", peer=None)
        if type(header) is not bytes:
            header = bytes(header)
        if type(payload) is not bytes:
            payload = memoryview(payload)
            if payload.format != "B" or payload.ndim != 1:
                payload = payload.cast("B")
            plen = payload.nbytes
        else:
            plen = len(payload)
        if len(header) > MAX_HEADER:
            raise MessageTooLarge(f"frame header of {len(header)} bytes exceeds {MAX_HEADER}")
        if plen > self.iface.attrs.max_frame:
            raise MessageTooLarge(f"ofi frame payload of {plen} bytes exceeds max_frame "
                                  f"{self.iface.attrs.max_frame}")
        if not 0 <= am_id <= 255:
            raise ValueError(f"am_id {am_id} is not in 0..255")
        if not self._queue and self.authed and \
                self.iface._post_frame(self, self._kind, am_id, header, payload):
            return True
        return self._enqueue(self._kind, am_id, header, payload, on_complete)

    def _enqueue(self, kind, am_id, header, payload, cb) -> bool:
        if cb is None or type(payload) is bytes or len(payload) <= self.iface.attrs.max_bcopy:
            if type(payload) is not bytes:
                payload = bytes(payload)
            self._queue.append((kind, am_id, header, payload, None))
            done = True
        else:
            self._queue.append((kind, am_id, header, payload, cb))
            done = False
        self.iface._pending.add(self)
        return done

    def _flush(self) -> int:
        """Post queued frames and one-sided chunks while resources last."""
        n = 0
        iface = self.iface
        q = self._queue
        while q:
            kind, am_id, header, payload, cb = q[0]
            if not self.authed and kind not in _HANDSHAKE:
                break                   # frames wait for the handshake
            if not iface._post_frame(self, kind, am_id, header, payload):
                break
            q.popleft()
            n += 1
            if cb is not None:
                cb(None)
        rq = self._rma_queue
        while rq and self.authed:
            if not iface._post_rma(self, *rq[0]):
                break
            rq.popleft()
        if not q and not rq:
            iface._pending.discard(self)
            if self._closing and not self._closed:
                self._shutdown()
        return n

    # -- one-sided -----------------------------------------------------------------
    def pack_local_key(self, buf) -> tuple:
        return self.iface.pack_local_key(buf)

    def get(self, local, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """``fi_read`` of ``len(local)`` bytes at ``remote_addr`` into ``local``."""
        return self._rma(True, local, remote_addr, rkey, on_complete)

    def put(self, local, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """``fi_write`` of ``local`` at ``remote_addr`` (``Caps.PUT_ZCOPY``)."""
        return self._rma(False, local, remote_addr, rkey, on_complete)

    def _rma(self, is_read, local, remote_addr, rkey, on_complete) -> bool:
        if self._exc is not None or self._closed:
            raise self._exc or ConnectionLost("ofi endpoint is closed", peer=None)
        uuid, key, base, length, virt = unpack_rkey(rkey)
        if uuid != self.peer_uuid:
            raise RemoteAccessError("ofi remote key belongs to another interface")
        mv = memoryview(local)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        n = mv.nbytes
        off = remote_addr - base
        if off < 0 or off + n > length:
            raise RemoteAccessError(f"ofi remote access [{remote_addr:#x}, +{n}) outside "
                                    f"the registered region [{base:#x}, +{length})")
        if n == 0:
            return True
        if is_read and mv.readonly:
            raise RemoteAccessError("ofi get into a read-only buffer")
        iface = self.iface
        reg = iface.md.register(mv) if iface.mr_local else None
        with ffi.from_buffer(mv) as p:
            address = int(ffi.cast("uintptr_t", p))
        desc = reg.desc if reg is not None else ffi.NULL
        raddr = remote_addr if virt else off
        chunk = iface.max_rma
        offsets = range(0, n, chunk)
        dead = iface.md.regs.dead
        op = ChunkedOp(on_complete, len(offsets), "get" if is_read else "put",
                       release=(lambda: dead.append(reg)) if reg is not None else None)
        for o in offsets:
            piece = (op, is_read, address + o, min(chunk, n - o), desc, raddr + o, key)
            if self._rma_queue or not self.authed or not self.iface._post_rma(self, *piece):
                self._rma_queue.append(piece)
                self.iface._pending.add(self)
        return False

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:
        if self._closing or self._exc is not None or self._closed:
            return
        self._closing = True
        if not self._queue and not self._rma_queue:
            self._shutdown()

    def _shutdown(self) -> None:
        """Tell the peer we are done (BYE), then forget the endpoint."""
        self._closed = True
        if self._exc is None:
            bye = KIND_REPLY_BYE if self.accepted else KIND_BYE
            if not self.iface._post_frame(self, bye, 0, b"", b""):
                self.iface._bye_later.append(self)
            self._exc = ConnectionLost("ofi endpoint is closed", peer=None)
        self.iface._forget(self)

    def _fail(self, exc: BaseException, notify: bool = True) -> None:
        """The peer is gone: fail queued work, tell the owner once."""
        if self._exc is not None:
            return
        self._exc = exc
        was_open = not self._closed
        self._closed = True
        queued, self._queue = self._queue, collections.deque()
        rq, self._rma_queue = self._rma_queue, collections.deque()
        self.iface._forget(self)
        fail_queued(queued, rq, exc)
        self.iface._fail_inflight_rma(self, exc)
        if notify and was_open and (self.authed or not self.accepted):
            # (a pending accepted endpoint was never the owner's)
            self.iface.owner.conn_failed(self, exc)


# ----------------------------------------------------------------- interface

class OfiInterface(Interface):
    """libfabric RDM transport of one worker."""

    name = "ofi"

    def __init__(self, owner, cfg) -> None:
        super().__init__(owner, cfg)
        if lib is None:
            raise TransportUnavailable(f"ofi: ucxpy._ofi is not built ({_IMPORT_ERROR})")
        self._h = None
        self._closed = False
        self.uuid = random.getrandbits(63) | 1
        opt = config.setting
        self.bounce = max(opt("UCXPY_OFI_BOUNCE", cfg), 1024)
        self.rx_depth = max(opt("UCXPY_OFI_RX_DEPTH", cfg), 2)
        self.tx_depth = max(opt("UCXPY_OFI_TX_DEPTH", cfg), 2)
        self.rma_depth = max(opt("UCXPY_OFI_RMA_DEPTH", cfg), 1)
        self.slot_size = (_PSIZE + MAX_HEADER + self.bounce + 63) & ~63
        self._tx0 = self.rx_depth
        self._rma0 = self.rx_depth + self.tx_depth
        nslots = self._rma0 + self.rma_depth
        errs = []
        for prov in provider_candidates(cfg):
            h = ffi.new("uxofi_t **")
            a = ffi.new("uxofi_attrs_t *")
            err = ffi.new("char[]", lib.UXOFI_ERRLEN)
            dom = opt("UCXPY_OFI_DOMAIN", cfg).encode()
            with _provider_env(prov, cfg):
                rc = lib.uxofi_open(prov.encode(), dom or ffi.NULL, nslots, h, a, err,
                                    lib.UXOFI_ERRLEN)
            if rc == 0:
                self._h, self.fi = h[0], a
                break
            errs.append(f"{prov}: {ffi.string(err).decode(errors='replace')}")
        if self._h is None:
            raise TransportUnavailable("ofi: no provider could be opened: " + "; ".join(errs))
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        fi = self.fi
        self.provider = ffi.string(fi.provider).decode()
        self.fabric = ffi.string(fi.fabric).decode()
        self.domain = ffi.string(fi.domain).decode()
        self.mr_mode = int(fi.mr_mode)
        self.virt_addr = bool(self.mr_mode & lib.FI_MR_VIRT_ADDR)
        self.prov_key = bool(self.mr_mode & lib.FI_MR_PROV_KEY)
        self.mr_local = bool(self.mr_mode & lib.FI_MR_LOCAL)
        self.max_rma = max(4096, min(int(fi.max_msg_size), 1 << 30))
        self.rejected = 0
        #: handshakes whose proof did not match our key, frames with a wrong token
        self.auth_failures = 0
        self.key = auth.interface_key(self.config)
        self._pending_auth = collections.OrderedDict()   # (uuid, conn) -> accepted ep
        intra = any(p in self.provider.split(";") for p in INTRA_HOST_PROVIDERS)
        caps = (Caps.AM_SHORT | Caps.AM_BCOPY | Caps.GET_ZCOPY | Caps.PUT_ZCOPY
                | Caps.CONNECT_TO_IFACE)
        #: registrations (ofi_md.py): RMA regions, rendezvous buffers, bounce buffers
        self.md = OfiMemoryDomain(self, (1 << (8 * min(int(fi.mr_key_size) or 8, 8))) - 1,
                                  self.mr_local, self.virt_addr,
                                  config.setting("UCXPY_OFI_PINNED", self.config))
        if intra:
            caps |= Caps.INTRA_HOST
        self.intra_host = intra
        self.attrs = TransportAttrs(
            caps=caps, max_short=256, max_bcopy=self.bounce, max_frame=self.bounce,
            latency=2e-6 if intra else 15e-6, bandwidth=5e9 if intra else 1.5e9,
            overhead=3e-6, max_get=1 << 40, priority=0)
        # bounce buffers: page-aligned anonymous memory, registered once
        self._rx_mem = mmap.mmap(-1, self.rx_depth * self.slot_size)
        self._tx_mem = mmap.mmap(-1, self.tx_depth * self.slot_size)
        self._rx_view = memoryview(self._rx_mem)
        self._tx_view = memoryview(self._tx_mem)
        self._rx_ptr = ffi.from_buffer(self._rx_mem)
        self._tx_ptr = ffi.from_buffer(self._tx_mem)
        self._rx_desc = self.md.register_raw(self._rx_ptr, len(self._rx_mem))
        self._tx_desc = self.md.register_raw(self._tx_ptr, len(self._tx_mem))
        self._tx_free = list(range(self._rma0 - 1, self._tx0 - 1, -1))
        self._tx_owner = {}               # send slot -> endpoint
        self._rma_free = list(range(self._rma0 + self.rma_depth - 1, self._rma0 - 1, -1))
        self._rma_ops = {}                # rma slot -> (op, endpoint)
        self._comps = ffi.new("uxofi_comp_t[]", _POLL_BATCH)
        # endpoints
        self._next_conn = 1
        self._conns = {}                  # our conn id -> connector endpoint
        self._accepted = {}               # (peer uuid, peer conn id) -> accepted endpoint
        self._peers = {}                  # peer ep name -> fi_addr
        #: (reply?, sender uuid, conn id) -> [next seq, {seq: (slot, length)}, alive]
        self._streams = {}
        self._pending = set()
        self._bye_later = []
        self._resend = []                 # (due time, send slot) to post again
        self._to_fail = []
        self.host_id = this_host_id()
        self._peer_procs = PidWatch()     # same-host peer processes
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        now = time.monotonic()
        self._next_housekeeping = now + _HOUSEKEEPING
        self._next_liveness = now + _LIVENESS
        for i in range(self.rx_depth):
            self._post_recv(i)
        name = ffi.new("char[]", 1024)
        ln = ffi.new("size_t *", 1024)
        rc = lib.uxofi_getname(self._h, name, ln)
        if rc:
            raise TransportUnavailable(f"ofi: fi_getname: {_errstr(rc)}")
        self.ep_name = ffi.buffer(name, ln[0])[:]
        _LIVE_IN_PROCESS.add(self.uuid)
        self._address = pack_address(os.getpid(), self.uuid, self.provider, self.fabric,
                                     self.host_id, self.ep_name)

    def __repr__(self):
        return f"<OfiInterface {self.provider} {self.domain} uuid {self.uuid:x}>"

    @classmethod
    def query(cls, cfg) -> Availability:
        if lib is None:
            return Availability(False, f"ucxpy._ofi is not built ({_IMPORT_ERROR})")
        try:
            errs = []
            for prov in provider_candidates(cfg):
                out = ffi.new("char[256]")
                rc = lib.uxofi_probe(prov.encode(), out, 256)
                if rc == 0:
                    v = lib.uxofi_version()
                    return Availability(
                        True, f"libfabric {v >> 16}.{v & 0xffff}: "
                              f"{ffi.string(out).decode(errors='replace')}",
                        devices=[prov])
                errs.append(f"{prov}: fi_getinfo: {_errstr(rc)}")
            return Availability(False, "no libfabric provider with FI_EP_RDM, FI_MSG|FI_RMA: "
                                + "; ".join(errs))
        except Exception as e:  # query must not raise
            return Availability(False, f"{type(e).__name__}: {e}")

    def address(self) -> bytes:
        return self._address

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        try:
            peer = unpack_address(address)
        except ValueError:
            return False
        if peer["provider"] != self.provider or peer["fabric"] != self.fabric:
            return False
        if self.intra_host or self.fabric.startswith("127."):
            return peer["host_id"] == self.host_id and host_id == self.host_id
        return True

    # -- registration (the memory domain, ofi_md.py) -------------------------------
    def pack_local_key(self, buf) -> tuple:
        return self.md.pack_local_key(buf)

    # -- wire-up ---------------------------------------------------------------------
    def _av(self, name: bytes) -> int:
        fa = self._peers.get(name)
        if fa is None:
            out = ffi.new("uint64_t *")
            rc = lib.uxofi_av_insert(self._h, name, out)
            if rc:
                raise ConnectionLost(f"ofi: fi_av_insert: {_errstr(rc)}")
            fa = self._peers[name] = int(out[0])
        return fa

    def connect(self, address: bytes) -> OfiEndpoint:
        if self._closed:
            raise ConnectionLost("ofi interface is closed")
        try:
            peer = unpack_address(address)
        except ValueError as e:
            raise TransportUnavailable(f"ofi: {e}") from None
        if peer["provider"] != self.provider:
            raise TransportUnavailable(f"ofi: peer uses provider {peer['provider']}, "
                                       f"we use {self.provider}")
        conn = self._next_conn
        self._next_conn += 1
        ep = OfiEndpoint(self, peer, self._av(peer["name"]), conn, accepted=False)
        self._conns[conn] = ep
        self._watch(ep)
        hello = self._address + ep._nonce
        if not self._post_frame(ep, KIND_HELLO, 0, b"", hello):
            ep._enqueue(KIND_HELLO, 0, b"", hello, None)
        return ep

    # -- authentication (see the module docstring) ---------------------------------
    def _transcript(self, ep: OfiEndpoint) -> tuple:
        """(Nc, Na, conn id, connector uuid, acceptor uuid) as both sides see it."""
        if ep.accepted:
            nc, na, cu, au = ep._peer_nonce, ep._nonce, ep.peer_uuid, self.uuid
        else:
            nc, na, cu, au = ep._nonce, ep._peer_nonce, self.uuid, ep.peer_uuid
        return nc, na, struct.pack("<IQQ", ep.conn_id, cu, au)

    def _proof(self, ep: OfiEndpoint, label: bytes) -> bytes:
        return auth.tag(self.key, label, *self._transcript(ep))

    def _set_token(self, ep: OfiEndpoint) -> None:
        tag = auth.tag(self.key, _LABEL_TOKEN, *self._transcript(ep))
        ep.token = int.from_bytes(tag[:8], "little") or 1

    def _refuse(self, why: str, uuid: int, conn: int) -> None:
        self.rejected += 1
        self.auth_failures += 1
        auth.refused("ofi", why, f"interface {uuid:x} connection {conn}")

    def _on_hello(self, uuid: int, conn: int, payload) -> None:
        """A connection request: open a pending endpoint and challenge it."""
        payload = bytes(payload)
        try:
            if len(payload) <= _NONCE:
                raise ValueError("HELLO too short")
            peer = unpack_address(payload[:-_NONCE])
            if peer["uuid"] != uuid or peer["provider"] != self.provider:
                raise ValueError("HELLO does not match its sender")
            fa = self._av(peer["name"])
        except (ValueError, ConnectionLost) as e:
            self.rejected += 1
            log.debug("ofi: connection request refused: %s", e)
            return
        old = self._accepted.get((uuid, conn))
        if old is not None:
            if old.authed:      # somebody replays or forges an old request
                return self._refuse("HELLO for an open connection", uuid, conn)
            old._fail(ConnectionLost("ofi: connection request superseded"), notify=False)
        while len(self._pending_auth) >= MAX_PENDING:
            _key, oldest = self._pending_auth.popitem(last=False)
            self._refuse("too many pending connection requests: oldest dropped",
                         oldest.peer_uuid, oldest.conn_id)
            oldest._fail(ConnectionLost("ofi: connection request dropped"), notify=False)
        ep = OfiEndpoint(self, peer, fa, conn, accepted=True)
        ep._peer_nonce = payload[-_NONCE:]
        self._set_token(ep)
        self._accepted[(uuid, conn)] = self._pending_auth[(uuid, conn)] = ep
        # HELLO was the stream's seq 0; the rest comes in order from 1
        self._streams[(False, uuid, conn)] = [1, {}, True]
        self._watch(ep)
        challenge = ep._nonce + self._proof(ep, _LABEL_ACC)
        if not self._post_frame(ep, KIND_CHALLENGE, 0, b"", challenge):
            ep._enqueue(KIND_CHALLENGE, 0, b"", challenge, None)

    def _on_challenge(self, uuid: int, conn: int, payload) -> None:
        """The acceptor's answer to our HELLO: check its proof, send ours."""
        ep = self._conns.get(conn)
        if ep is None or ep.peer_uuid != uuid or ep.authed or ep._exc is not None:
            return self._refuse("unexpected CHALLENGE", uuid, conn)
        payload = bytes(payload)
        if len(payload) != _NONCE + auth.TAG_LEN:
            self._refuse("malformed CHALLENGE", uuid, conn)
            return ep._fail(ConnectionLost("ofi: peer sent a malformed handshake"))
        ep._peer_nonce = payload[:_NONCE]
        if not auth.check(self.key, payload[_NONCE:], _LABEL_ACC, *self._transcript(ep)):
            self._refuse("acceptor's proof does not match the job key", uuid, conn)
            return ep._fail(ConnectionLost(
                f"ofi: peer pid {ep.peer_pid} failed authentication (not a member of this job)"))
        self._set_token(ep)
        self._streams[(True, uuid, conn)] = [1, {}, True]
        ep.authed = True
        proof = self._proof(ep, _LABEL_CON)
        ep._queue.appendleft((KIND_AUTH, 0, b"", proof, None))   # before any queued frame
        self._pending.add(ep)
        ep._flush()

    def _on_auth(self, ep: OfiEndpoint, payload) -> None:
        if ep.authed or not ep.accepted:
            return self._refuse("unexpected AUTH", ep.peer_uuid, ep.conn_id)
        self._pending_auth.pop((ep.peer_uuid, ep.conn_id), None)
        if not auth.check(self.key, bytes(payload), _LABEL_CON, *self._transcript(ep)):
            self._refuse("connector's proof does not match the job key", ep.peer_uuid,
                         ep.conn_id)
            return ep._fail(ConnectionLost("ofi: peer failed authentication"), notify=False)
        ep.authed = True
        if ep._queue or ep._rma_queue:
            self._pending.add(ep)

    def _forget(self, ep: OfiEndpoint) -> None:
        st = self._streams.get((not ep.accepted, ep.peer_uuid, ep.conn_id))
        if st is not None:
            st[2] = False
            stash, st[1] = st[1], {}
            if not self._closed:
                for slot, _len in stash.values():
                    self._post_recv(slot)
        if ep.accepted:
            if self._pending_auth.get((ep.peer_uuid, ep.conn_id)) is ep:
                del self._pending_auth[(ep.peer_uuid, ep.conn_id)]
            if self._accepted.get((ep.peer_uuid, ep.conn_id)) is ep:
                del self._accepted[(ep.peer_uuid, ep.conn_id)]
        elif self._conns.get(ep.conn_id) is ep:
            del self._conns[ep.conn_id]
        self._pending.discard(ep)
        pid = ep.peer_pid
        if pid in self._peer_procs and not any(e.peer_pid == pid for e in self._live_eps()):
            self._peer_procs.unwatch(pid)

    def _live_eps(self):
        return list(self._conns.values()) + list(self._accepted.values())

    def _watch(self, ep: OfiEndpoint) -> None:
        """Watch a same-host peer's process through a pidfd."""
        pid = ep.peer_pid
        if ep.peer["host_id"] != self.host_id or pid == os.getpid() or pid in self._peer_procs:
            return
        if not self._peer_procs.watch(pid):
            self._to_fail.append((ep, ConnectionLost(f"ofi peer process {pid} is gone")))

    # -- data path -------------------------------------------------------------------
    def _post_recv(self, slot: int) -> None:
        off = slot * self.slot_size
        rc = lib.uxofi_recv(self._h, slot, self._rx_ptr + off, self.slot_size, self._rx_desc)
        if rc:
            raise TransportUnavailable(f"ofi: fi_recv: {_errstr(rc)}")

    def _post_frame(self, ep: OfiEndpoint, kind, am_id, header, payload) -> bool:
        """Copy one frame into a send slot and post it; False if no resources."""
        if not self._tx_free:
            return False
        if ep.same_process and ep.peer_uuid not in _LIVE_IN_PROCESS:
            self._to_fail.append((ep, ConnectionLost("ofi peer interface was closed")))
            self._wake()
            return False
        slot = self._tx_free.pop()
        off = (slot - self._tx0) * self.slot_size
        hlen = len(header)
        plen = len(payload) if type(payload) is bytes else payload.nbytes
        view = self._tx_view
        PREFIX.pack_into(view, off, FRAME_MAGIC, am_id, kind, hlen, ep._tx_seq, plen,
                         ep.conn_id, self.uuid,
                         0 if kind == KIND_HELLO or kind == KIND_CHALLENGE else ep.token)
        start = off + _PSIZE
        if hlen:
            view[start:start + hlen] = header
        if plen:
            view[start + hlen:start + hlen + plen] = payload
        total = _PSIZE + hlen + plen
        rc = lib.uxofi_send(self._h, slot, self._tx_ptr + off, total, self._tx_desc, ep.fi_addr)
        if rc == 0:
            self._tx_owner[slot] = [ep, total, 0]
            ep._inflight += 1
            ep._tx_seq = (ep._tx_seq + 1) & 0xFFFF
            return True
        self._tx_free.append(slot)
        if rc == -lib.FI_EAGAIN:
            return False
        exc = ConnectionLost(f"ofi: fi_send: {_errstr(rc)}", peer=None)
        self._to_fail.append((ep, exc))
        self._wake()
        return False

    def _post_rma(self, ep, op, is_read, ptr, length, desc, raddr, key, tries=0) -> bool:
        if op.exc is not None:          # an earlier chunk failed: skip the rest
            op.chunk_done(None)
            return True
        if not self._rma_free:
            return False
        if ep.same_process and ep.peer_uuid not in _LIVE_IN_PROCESS:
            op.chunk_done(ConnectionLost("ofi peer interface was closed"))
            return True
        slot = self._rma_free.pop()
        fn = lib.uxofi_read if is_read else lib.uxofi_write
        rc = fn(self._h, slot, ffi.cast("void *", ptr), length, desc, ep.fi_addr, raddr, key)
        if rc == 0:
            self._rma_ops[slot] = (op, ep, (op, is_read, ptr, length, desc, raddr, key), tries)
            return True
        self._rma_free.append(slot)
        if rc == -lib.FI_EAGAIN:
            return False
        op.chunk_done(RemoteAccessError(
            f"ofi: fi_{'read' if is_read else 'write'}: {_errstr(rc)}"))
        return True

    def _fail_inflight_rma(self, ep, exc) -> None:
        for slot, (op, e, _piece, _tries) in list(self._rma_ops.items()):
            if e is ep:
                op.chunk_done(exc)
                self._rma_ops[slot] = (ChunkedOp(None, 1, "orphan"), None, None, 0)

    def progress(self) -> int:
        h = self._h
        if h is None:
            return 0
        n = 0
        comps = self._comps
        got = lib.uxofi_poll(h, comps, _POLL_BATCH)
        if got < 0:
            log.error("ofi: fi_cq_read: %s", _errstr(got))
            got = 0
        for i in range(got):
            c = comps[i]
            slot = c.slot
            if slot < self._tx0:
                n += self._on_recv(slot, c)
            elif slot < self._rma0:
                self._on_sent(slot, c)
                n += 1
            elif slot != lib.UXOFI_NO_SLOT:
                self._on_rma(slot, c)
                n += 1
            else:
                log.warning("ofi: completion without context: %s", _errstr(c.err))
        if self._pending:
            for ep in list(self._pending):
                n += ep._flush()
        if self.md.regs.dead:
            self.md.regs.reap()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            n += self._housekeeping(now)
        return n

    def _on_sent(self, slot, c) -> None:
        entry = self._tx_owner.get(slot)
        if entry is None:
            self._tx_free.append(slot)
            return
        ep = entry[0]
        if c.err and ep._exc is None and entry[2] < _RESEND_TRIES and not self._closed:
            # ofi_rxm reports a send that raced with its own connection set-up
            # (both sides connecting at once) as an error: the frame is still
            # in its slot, so post it again a little later; the receiver puts
            # frames back in order by sequence number.
            entry[2] += 1
            self._resend.append((time.monotonic() + _RESEND_DELAY * (1 << entry[2]), slot))
            return
        del self._tx_owner[slot]
        self._tx_free.append(slot)
        ep._inflight -= 1
        if c.err:
            msg = ffi.string(lib.uxofi_last_error(self._h)).decode(errors="replace")
            ep._fail(ConnectionLost(f"ofi: send to peer pid {ep.peer_pid} failed: {msg}"))

    def _resend_due(self, now: float) -> None:
        keep = []
        for due, slot in self._resend:
            entry = self._tx_owner.get(slot)
            if entry is None:
                continue
            ep, total, _tries = entry
            if ep._exc is not None:
                del self._tx_owner[slot]
                self._tx_free.append(slot)
                continue
            if due > now:
                keep.append((due, slot))
                continue
            off = (slot - self._tx0) * self.slot_size
            rc = lib.uxofi_send(self._h, slot, self._tx_ptr + off, total, self._tx_desc,
                                ep.fi_addr)
            if rc == -lib.FI_EAGAIN:
                keep.append((now + _RESEND_DELAY, slot))
            elif rc:
                del self._tx_owner[slot]
                self._tx_free.append(slot)
                ep._fail(ConnectionLost(f"ofi: fi_send: {_errstr(rc)}"))
        self._resend = keep

    def _on_rma(self, slot, c) -> None:
        entry = self._rma_ops.pop(slot, None)
        self._rma_free.append(slot)
        if entry is None:
            return
        op, ep, piece, tries = entry
        if not c.err:
            op.chunk_done(None)
            return
        if (ep is not None and ep._exc is None and tries < _RESEND_TRIES
                and c.err in (lib.FI_ECANCELED, lib.FI_ENOTCONN, lib.FI_EAGAIN)):
            # see _on_sent: ofi_rxm cancels operations on a connection it
            # drops while resolving simultaneous connects; try again
            ep._rma_queue.append(piece + (tries + 1,))
            self._pending.add(ep)
            return
        msg = ffi.string(lib.uxofi_last_error(self._h)).decode(errors="replace")
        if c.err in (lib.FI_EIO, lib.FI_ECONNREFUSED, lib.FI_ECONNRESET,
                     lib.FI_EHOSTUNREACH) and ep is not None:
            exc = ConnectionLost(f"ofi: {op.what} from peer pid {ep.peer_pid} failed: {msg}")
            op.chunk_done(exc)
            ep._fail(exc)
        else:
            op.chunk_done(RemoteAccessError(f"ofi: {op.what} failed: {msg}"))

    def _on_recv(self, slot, c) -> int:
        if c.err:
            if c.err != lib.FI_ECANCELED and not self._closed:
                msg = ffi.string(lib.uxofi_last_error(self._h)).decode(errors="replace")
                log.warning("ofi: receive failed: %s", msg)
                self._post_recv(slot)
            return 0
        length = int(c.len)
        off = slot * self.slot_size
        if length < _PSIZE:
            self.rejected += 1
            log.warning("ofi: runt frame of %d bytes dropped", length)
            self._post_recv(slot)
            return 0
        magic, _am, kind, hlen, seq, plen, conn, uuid, token = \
            PREFIX.unpack_from(self._rx_view, off)
        if magic != FRAME_MAGIC or kind > KIND_AUTH:
            self.rejected += 1
            log.debug("ofi: frame with bad magic or kind dropped")
            self._post_recv(slot)
            return 0
        if kind == KIND_HELLO or kind == KIND_CHALLENGE:
            # handshake frames open a stream (seq 0); they cannot carry a token
            if _PSIZE + hlen + plen == length and not hlen:
                start = off + _PSIZE
                (self._on_hello if kind == KIND_HELLO else self._on_challenge)(
                    uuid, conn, self._rx_view[start:start + plen])
            else:
                self.rejected += 1
            self._post_recv(slot)
            return 0
        from_acceptor = _FROM_ACCEPTOR[kind]
        ep = self._conns.get(conn) if from_acceptor else self._accepted.get((uuid, conn))
        if ep is None or ep.peer_uuid != uuid:
            self.rejected += 1
            log.debug("ofi: frame for unknown connection %d of %x dropped", conn, uuid)
            self._post_recv(slot)
            return 0
        if token != ep.token or not ep.token:
            self._refuse("frame with a wrong token", uuid, conn)
            self._post_recv(slot)
            return 0
        # Completions may come out of order (ofi_rxm moves big messages by its
        # own rendezvous), so each stream's frames are put back in order.
        key = (from_acceptor, uuid, conn)
        st = self._streams.get(key)
        if st is None:
            st = self._streams[key] = [0, {}, True]
        elif not st[2]:             # the endpoint is gone: late frames are dropped
            self._post_recv(slot)
            return 0
        if seq != st[0]:
            # The missing frame already holds a posted buffer (the provider
            # matches buffers in arrival order), so stashing cannot starve it.
            st[1][seq] = (slot, length)
            return 0
        n = 0
        while True:
            try:
                self._deliver(off, length)
            finally:
                if not self._closed:
                    self._post_recv(slot)
            n += 1
            st[0] = (st[0] + 1) & 0xFFFF
            nxt = st[1].pop(st[0], None)
            if nxt is None or self._closed:
                return n
            slot, length = nxt
            off = slot * self.slot_size

    def _bad_frame(self, kind, conn, uuid, why) -> None:
        """A malformed frame that carried its connection's token (so came
        from the peer itself) fails that connection."""
        ep = self._conns.get(conn) if _FROM_ACCEPTOR[kind] else \
            self._accepted.get((uuid, conn))
        if ep is not None and ep.peer_uuid == uuid:
            ep._fail(ProtocolError(f"ofi: malformed frame from peer pid {ep.peer_pid}: {why}"))
        else:
            self.rejected += 1
            log.warning("ofi: malformed frame dropped: %s", why)

    def _deliver(self, off: int, length: int) -> None:
        view = self._rx_view
        magic, am_id, kind, hlen, _seq, plen, conn, uuid, _token = PREFIX.unpack_from(view, off)
        if _PSIZE + hlen + plen != length:
            self._bad_frame(kind, conn, uuid, f"lengths {hlen}+{plen} do not add up to {length}")
            return
        if _FROM_ACCEPTOR[kind]:
            ep = self._conns.get(conn)
            if ep is not None and ep.peer_uuid != uuid:
                ep = None
        else:
            ep = self._accepted.get((uuid, conn))
        if ep is None:
            self.rejected += 1
            log.debug("ofi: frame for unknown connection %d of %x dropped", conn, uuid)
            return
        if kind == KIND_AUTH:
            return self._on_auth(ep, view[off + _PSIZE + hlen:off + length])
        if kind in (KIND_BYE, KIND_REPLY_BYE):
            ep._fail(ConnectionLost(f"ofi peer pid {ep.peer_pid} closed the connection"),
                     notify=ep.authed or not ep.accepted)
            return
        if not ep.authed:
            return self._refuse("frame before the handshake completed", uuid, conn)
        if ep._closed:
            return
        start = off + _PSIZE
        self.owner.recv_frame(ep, am_id, view[start:start + hlen],
                              view[start + hlen:start + hlen + plen])

    # -- housekeeping ------------------------------------------------------------------
    def _housekeeping(self, now: float) -> int:
        self._next_housekeeping = now + _HOUSEKEEPING
        n = 0
        if self._woken:
            self._woken = False
            try:
                while self._wake_r.recv(4096):
                    pass
            except OSError:
                pass
        if self._resend:
            self._resend_due(now)
        while self._bye_later:
            ep = self._bye_later[0]
            bye = KIND_REPLY_BYE if ep.accepted else KIND_BYE
            if not self._post_frame(ep, bye, 0, b"", b""):
                break
            self._bye_later.pop(0)
        while self._to_fail:
            ep, exc = self._to_fail.pop(0)
            ep._fail(exc)
            n += 1
        if now >= self._next_liveness:
            self._next_liveness = now + _LIVENESS
            n += self._check_peers()
        return n

    def _check_peers(self) -> int:
        dead = self._peer_procs.dead()
        if not dead:
            return 0
        self.progress_cq_only()     # deliver what the dead peer sent before dying
        n = 0
        for ep in [e for e in self._live_eps() if e.peer_pid in dead]:
            ep._fail(ConnectionLost(f"ofi peer process {ep.peer_pid} died"))
            n += 1
        return n

    def progress_cq_only(self) -> None:
        for _ in range(16):
            got = lib.uxofi_poll(self._h, self._comps, _POLL_BATCH)
            if got <= 0:
                return
            for i in range(got):
                c = self._comps[i]
                if c.slot < self._tx0:
                    self._on_recv(c.slot, c)
                elif c.slot < self._rma0:
                    self._on_sent(c.slot, c)
                elif c.slot != lib.UXOFI_NO_SLOT:
                    self._on_rma(c.slot, c)

    # -- sleeping ----------------------------------------------------------------------
    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"w")
            except OSError:
                pass

    def wait_fds(self) -> list:
        if self._h is None:
            return []
        fds = [self._wake_r.fileno()] + self._peer_procs.fds()
        busy = bool(self._pending or self._to_fail or self._bye_later or self._rma_ops
                    or self._resend)
        if self.fi.wait_fd >= 0 and not busy and lib.uxofi_trywait(self._h):
            return fds + [self.fi.wait_fd]
        if busy or self.fi.wait_fd >= 0:
            self._wake()        # work is pending: make select() return at once
        return fds

    # -- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE_IN_PROCESS.discard(self.uuid)
        if self._h is None:
            return
        exc = ConnectionLost("ofi interface closed")
        eps = self._live_eps() if hasattr(self, "_conns") else []
        for ep in eps:
            queued, ep._queue = ep._queue, collections.deque()
            rq, ep._rma_queue = ep._rma_queue, collections.deque()
            if ep._exc is None and not ep._closed:
                ep._shutdown()
            fail_queued(queued, rq, exc)
        if hasattr(self, "_tx_owner"):
            # let the BYEs leave: rxm/tcp deliver only while we progress
            deadline = time.monotonic() + 0.2
            while (self._tx_owner or self._bye_later) and time.monotonic() < deadline:
                self.progress_cq_only()
                while self._bye_later:
                    ep = self._bye_later[0]
                    if not self._post_frame(ep, KIND_REPLY_BYE if ep.accepted else KIND_BYE,
                                            0, b"", b""):
                        break
                    self._bye_later.pop(0)
            for op, _ep, _piece, _tries in list(self._rma_ops.values()):
                op.chunk_done(exc)
            self._rma_ops.clear()
            self.md.release()
        h, self._h = self._h, None
        lib.uxofi_close_ep(h)         # cancels the posted receives
        if isinstance(self.md, OfiMemoryDomain):
            self.md.close_bounce()    # registrations go before their domain
        lib.uxofi_close(h)
        for name in ("_rx_ptr", "_tx_ptr"):
            p = getattr(self, name, None)
            if p is not None:
                ffi.release(p)
                setattr(self, name, None)
        if hasattr(self, "_peer_procs"):
            self._peer_procs.close()
        if hasattr(self, "_wake_r"):
            self._wake_r.close()
            self._wake_w.close()
