"""Shared-memory transport: SPSC frame rings in /dev/shm, CMA for large gets.

Theory of operation
-------------------
Each interface owns a unix datagram socket in the abstract namespace (no file,
gone when the process dies); its name, the pid and the ring size make up the
interface address.  ``connect(address)`` creates one segment
``/dev/shm/ucxpy-shm-<pid>-<token>`` holding two rings (ring 0: connector ->
acceptor, ring 1: acceptor -> connector), then sends the peer a CONNECT
datagram naming it.  The endpoint is usable at once: frames pushed before the
peer maps the segment wait in ring 0.  The peer finds the datagram from
``progress()`` (checked every millisecond, and whenever the worker is about to
sleep), maps the segment, *unlinks it immediately* (so a killed process never
leaks it) and creates the accepted endpoint.  The kernel stamps datagrams with
the sender's credentials; only processes of our own uid are accepted.

Security: the boundary is the user, as for ptrace and CMA (a process of the
same uid could read our memory anyway), so shm needs no job key.  Segments
are created ``O_EXCL`` with mode 0600; a segment is mapped only if it is a
regular file owned by our uid that nobody else may access; connection
requests and refusals (NACK) count only when the kernel-stamped sender is
of our uid (others are dropped and counted in ``rejected`` and
``ucxpy.auth.failures["shm"]``).  Wake-ups are accepted from anyone: they
only make us look at our rings.

Connection states (per endpoint)::

    state      event                              next
    open       close() with an empty queue        closed   (ring 0/1 marked closed)
    open       close() with queued frames         closing  (flushed by progress)
    closing    queue drained                      closed
    open/closing peer closed its ring & drained   failed   (conn_failed once)
    open/closing peer pid exits (pidfd readable)  failed   (conn_failed once)
    open/closing NACK, corrupt ring, no peer      failed   (conn_failed once)

Send never blocks: a frame goes straight into the ring with one C call that
copies header and payload.  When the ring is full, frames queue in order;
payloads up to ``max_bcopy`` (or any payload sent without ``on_complete``)
are copied into the queue and ``send`` returns True, larger payloads are
queued by reference, ``send`` returns False and ``on_complete`` runs from
``progress()`` once the frame is in the ring.

Sleep/wake: the ring carries a "consumer sleeping" and a "producer waiting"
flag.  ``wait_fds()`` (called by the worker right before it sleeps) sets them;
a peer that then pushes, or frees space, sends one datagram to our socket.  No
system call is made on the fast path.

Peer death: every peer pid gets a pidfd (readable once the process exits,
even as a zombie); they are polled every 0.1 s while connections exist and
are part of ``wait_fds()``.  Frames the dead peer had already published are
delivered before ``conn_failed``.

One-sided get (``Caps.GET_ZCOPY``): ``pack_local_key`` publishes
``(address, rkey)`` with rkey = (magic, pid, base, length); the peer's
``get`` bounds-checks and calls ``process_vm_readv`` straight into the
destination, a single copy.  Advertised only when ``UCXPY_SHM_CMA`` is on and
the kernel lets us (self probe, Yama policy).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import secrets
import socket
import struct
import time
from collections import deque
from typing import Callable, Optional

from .. import auth, shmfile
from .._fastpath import (WAKE_BIT as _WAKE_BIT, drain_tag as _drain_tag, recv_tag as _recv_tag,
                         send_tag as _send_tag)
from .._native import ffi, lib
from ..netaddr import host_id as local_host_id, ns_inode as _ns_inode
from ..errors import (ConnectionLost, InvalidBuffer, MessageTooLarge, ProtocolError,
                      RemoteAccessError)
from .liveness import PidWatch
from .base import MAX_HEADER, Availability, Caps, Interface, TransportAttrs, TransportEndpoint
from .shm_md import RKEY, RKEY_MAGIC, ShmMemoryDomain

log = logging.getLogger("ucxpy.shm")

from ..shmfile import SHM_DIR, unlink_quiet as _unlink_quiet
SEG_PREFIX = "ucxpy-shm-"
_SEG_RE = re.compile(r"^ucxpy-shm-([0-9]+)-[0-9a-f]{16}$")

HDR = lib.UCXPY_RING_HDR_SIZE
RING_FULL = lib.UCXPY_RING_FULL
RING_CLOSED = lib.UCXPY_RING_CLOSED
MAX_RING = 1 << 30

#: interface address: magic, version, flags, pid, ring size, probe address,
#: pid-namespace inode, /dev/shm device; then the socket name
_ADDR = struct.Struct("<4sBBIQQQQ")
_ADDR_MAGIC = b"USHM"
#: CONNECT datagram: magic, version, flags, pid, ring size, probe address,
#: len(segment name); then segment name and the connector's socket name
_REQ = struct.Struct("<4sBBIQQH")
_REQ_MAGIC = b"UCRQ"
#: seconds a closed connector keeps a segment its peer has not mapped yet
_ORPHAN_GRACE = 10.0
_NACK = b"N"            # + segment name: the peer refused the connection
_WAKE = b"W"
#: remote key of get / put (the memory domain packs the same for RMA)
_RKEY, _RKEY_MAGIC = RKEY, RKEY_MAGIC
_VERSION = 1
_F_CMA = 1

_HOUSEKEEPING = 1e-3     # seconds between control-socket checks
_LIVENESS = 0.1          # seconds between peer-death checks
_BATCH = 64              # frames delivered per endpoint per progress()

_push = lib.ucxpy_ring_push
_peek = lib.ucxpy_ring_peek
_release = lib.ucxpy_ring_release
_poll_many = lib.ucxpy_ring_poll_many
_from_buffer = ffi.from_buffer


# -- host identity -------------------------------------------------------------

def _shm_dev() -> int:
    try:
        return os.stat(SHM_DIR).st_dev
    except OSError:
        return 0


#: eager-copy limit (rendezvous from one byte more): two copies through the
#: ring cost less than the rendezvous handshake's Python up to here (8 B..64
#: KiB ping-pong, 2 pinned ranks, 2026-12-04: 64 KiB eager 8.5 us against 33
#: us by CMA rendezvous).  At most an eighth of the ring (RING_EAGER_SHARE):
#: in a small ring, a few large eager frames would fill it and queue
#: everything behind them (the default 2 MiB ring takes the whole limit)
EAGER_LIMIT = 64 << 10
RING_EAGER_SHARE = 8


def max_frame_for(ring_size: int) -> int:
    """Largest payload a ring of ``ring_size`` bytes accepts (a quarter of it,
    less for tiny rings: a frame with a full header must fit half the ring)."""
    limit = ring_size // 2 - lib.UCXPY_RING_PREFIX - MAX_HEADER
    return min(ring_size // 4, limit & ~7)


def _cma_status(apply: bool = True) -> tuple:
    """(usable, reason): can this process read peers with process_vm_readv?
    With ``apply`` (an interface is being created) a Yama ptrace_scope of 1
    is opened up for our peers with PR_SET_PTRACER_ANY."""
    rc = lib.ucxpy_cma_probe(os.getpid(), lib.ucxpy_cma_probe_addr())
    if rc != 1:
        return False, f"process_vm_readv on self failed ({os.strerror(-rc) if rc < 0 else rc})"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        return True, "CMA allowed (no Yama)"
    if scope == 0:
        return True, "CMA allowed (ptrace_scope=0)"
    if scope == 1:
        # Peers are usually siblings, not ancestors: allow them explicitly.
        if apply:
            lib.ucxpy_cma_allow_any_peer()
        return True, "CMA allowed (ptrace_scope=1, PR_SET_PTRACER_ANY)"
    if scope == 2 and _has_cap_sys_ptrace():
        return True, "CMA allowed (ptrace_scope=2, CAP_SYS_PTRACE)"
    return False, f"CMA forbidden by Yama ptrace_scope={scope}"


def _has_cap_sys_ptrace() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 19))
    except (OSError, ValueError):
        pass
    return False


def reap_stale_segments(min_age: float = 60.0) -> int:
    """Unlink ``ucxpy-shm-<pid>-*`` segments of dead processes, older than
    ``min_age`` seconds (a segment normally lives until the peer maps it, a few
    milliseconds; the age guard protects peers in another pid namespace that
    share /dev/shm).  Returns the number removed."""
    return shmfile.reap_dead(_SEG_RE, min_age)


def _creds(ancillary) -> Optional[tuple]:
    """(pid, uid, gid) the kernel stamped on a datagram, or None."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("<iII", data[:12])
    return None


def _parse_request(msg: bytes) -> Optional[tuple]:
    """``(pid, capacity, probe, segment name, reply socket)`` of a CONNECT
    datagram, or None if it is malformed, of another version, or names a
    segment that is not the sender pid's."""
    try:
        _magic, ver, _flags, pid, capacity, probe, nlen = _REQ.unpack_from(msg)
        name = msg[_REQ.size:_REQ.size + nlen].decode("ascii")
    except (struct.error, UnicodeDecodeError):
        return None
    peer_sock = msg[_REQ.size + nlen:]
    if ver != _VERSION or not _SEG_RE.match(name) or not peer_sock or \
            name.split("-")[2] != str(pid):
        return None
    return pid, capacity, probe, name, peer_sock


def _own_user(cred, pid: int) -> bool:
    """The kernel-stamped credentials say: process ``pid`` of our own uid."""
    return cred is not None and cred[0] == pid and cred[1] == os.getuid()


# -- segments --------------------------------------------------------------------

class ShmSegment:
    """One mapped connection segment: two rings of ``capacity`` data bytes."""

    def __init__(self, mm: mmap.mmap, capacity: int, path: str, owner: bool):
        self.capacity = capacity
        self.ring_mem = HDR + capacity
        self.path = path
        self.name = os.path.basename(path)
        self.owner = owner          # we created it: unlink it when done
        self.mm = mm
        self.base = _from_buffer(self.mm)

    @classmethod
    def create(cls, capacity: int) -> "ShmSegment":
        name = f"{SEG_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        # allocated now: a full /dev/shm must fail here, not SIGBUS later
        mm = shmfile.create(name, 2 * (HDR + capacity), allocate=True)
        seg = cls(mm, capacity, os.path.join(SHM_DIR, name), owner=True)
        for i in (0, 1):
            if lib.ucxpy_ring_init(seg.base + i * seg.ring_mem, seg.ring_mem) != 0:
                seg.close()
                raise OSError(errno.EINVAL, "cannot initialise shm ring")
        return seg

    @classmethod
    def open(cls, name: str, capacity: int) -> "ShmSegment":
        """Map a peer's segment and unlink its name at once (a file that is
        not the job user's private segment is refused and left alone)."""
        mm = shmfile.open_private(name, 2 * (HDR + capacity), exact=True, unlink=True)
        return cls(mm, capacity, os.path.join(SHM_DIR, name), owner=False)

    def ring(self, index: int):
        r = ffi.new("ucxpy_ring_t *")
        if lib.ucxpy_ring_attach(r, self.base + index * self.ring_mem, self.ring_mem) != 0:
            raise ProtocolError("shm ring header is corrupt")
        return r

    def data_view(self, index: int) -> memoryview:
        start = index * self.ring_mem + HDR
        return memoryview(self.mm)[start:start + self.capacity].toreadonly()

    def unlink(self) -> None:
        if self.owner and self.path:
            _unlink_quiet(self.path)
        self.path = ""

    def close(self) -> None:
        self.unlink()
        if self.mm is None:
            return
        ffi.release(self.base)
        try:
            self.mm.close()
        except BufferError:
            # A payload view escaped recv_frame; the mapping goes with it.
            pass
        self.mm = None


# -- endpoint --------------------------------------------------------------------

class ShmEndpoint(TransportEndpoint):
    """One connection: we produce into ``_tx`` and consume ``_rx``."""

    def __init__(self, iface: "ShmInterface", seg: ShmSegment, tx_index: int,
                 peer_pid: int, peer_sock: bytes, peer_probe: int, accepted: bool):
        self.iface = iface
        self._seg = seg
        self._tx = seg.ring(tx_index)
        self._rx = seg.ring(1 - tx_index)
        self._rx_addr = int(ffi.cast("uintptr_t", self._rx))   # for the fast path
        self._tx_addr = int(ffi.cast("uintptr_t", self._tx))
        self._rx_view = seg.data_view(1 - tx_index)
        self._out = ffi.new("uint64_t[5]")
        self._peer_pid = peer_pid
        self._peer_sock = peer_sock
        self._peer_probe = peer_probe
        self._cma_ok: Optional[bool] = None
        self.accepted = accepted
        self._queue: deque = deque()
        self._max_frame = iface.attrs.max_frame
        self._max_bcopy = iface.attrs.max_bcopy
        self._exc: Optional[BaseException] = None
        self._closing = False
        self._closed = False       # locally closed: deliver nothing more
        self._in_poll = False      # unmapping waits until _poll is done
        self._unmap_later = False

    def __repr__(self):
        state = "failed" if self._exc else "closed" if self._closed else \
            "closing" if self._closing else "open"
        return (f"<ShmEndpoint peer pid {self._peer_pid} {state}"
                f"{' accepted' if self.accepted else ''} queued={len(self._queue)}>")

    @property
    def pending(self) -> int:
        return len(self._queue)

    # -- sending ---------------------------------------------------------------
    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        if self._exc is not None or self._closing:
            raise self._exc or ConnectionLost("shm endpoint is closed")
        if type(payload) is not bytes:
            try:
                payload = _from_buffer(payload)
            except TypeError as e:
                raise InvalidBuffer(f"shm send needs a contiguous buffer: {e}") from None
        plen = len(payload)
        if plen > self._max_frame:
            raise MessageTooLarge(f"shm frame payload of {plen} bytes exceeds "
                                  f"max_frame {self._max_frame}")
        if type(header) is not bytes:
            header = bytes(header)
        hlen = len(header)
        if hlen > MAX_HEADER:
            raise MessageTooLarge(f"frame header of {hlen} bytes exceeds {MAX_HEADER}")
        if not self._queue:
            rc = _push(self._tx, am_id, header, hlen, payload, plen)
            if rc == 0:
                return True
            if rc == 1:
                self.iface._wake(self._peer_sock)
                return True
            if rc != RING_FULL:
                self._push_error(rc)
        # Ring full (or older frames waiting): queue in order.
        if on_complete is None or plen <= self._max_bcopy:
            if type(payload) is not bytes:
                payload = ffi.buffer(payload)[:]
            self._queue.append((am_id, header, payload, None))
            done = True
        else:
            self._queue.append((am_id, header, payload, on_complete))
            done = False
        self.iface._pending.add(self)
        return done

    def _push_error(self, rc: int):
        exc = MessageTooLarge("frame does not fit the peer's shm ring") \
            if rc == lib.UCXPY_RING_TOOBIG else ProtocolError("shm ring state is corrupt")
        if isinstance(exc, ProtocolError):
            self._fail(exc)
        raise exc

    def _flush(self) -> int:
        """Push queued frames while the ring has room; returns frames pushed."""
        if self._tx is None:
            return 0
        n = 0
        queue = self._queue
        notify = False
        while queue:
            am_id, header, payload, cb = queue[0]
            rc = _push(self._tx, am_id, header, len(header), payload, len(payload))
            if rc == RING_FULL:
                break
            queue.popleft()
            if rc < 0:
                exc = ProtocolError("shm ring state is corrupt") if rc != lib.UCXPY_RING_TOOBIG \
                    else MessageTooLarge("frame does not fit the peer's shm ring")
                if cb is not None:
                    cb(exc)
                if isinstance(exc, ProtocolError):
                    self._fail(exc)
                    return n
                continue
            notify |= rc == 1
            n += 1
            if cb is not None:
                cb(None)
                if self._tx is None:        # the callback closed us
                    return n
        if notify:
            self.iface._wake(self._peer_sock)
        if not queue:
            self.iface._pending.discard(self)
            if self._closing and not self._closed:
                self._shutdown()
        return n

    # -- receiving ---------------------------------------------------------------
    def _poll(self) -> int:
        """Deliver up to _BATCH frames; returns the number delivered."""
        rx = self._rx
        out = self._out
        rc = _peek(rx, out)
        if rc == 0:
            return 0
        n = 0
        view = self._rx_view
        recv = self.iface.owner.recv_frame
        wake = False
        self._in_poll = True
        try:
            while rc == 1:
                ho = out[1]
                po = out[3]
                try:
                    if not self._closed:
                        recv(self, out[0], view[ho:ho + out[2]], view[po:po + out[4]])
                finally:
                    if _release(rx) == 1:
                        wake = True
                n += 1
                if n >= _BATCH or self._closed:
                    break
                rc = _peek(rx, out)
        finally:
            self._in_poll = False
            if self._unmap_later:
                self._unmap()
        if wake and self._exc is None:
            self.iface._wake(self._peer_sock)
        if rc < 0 and self._exc is None:
            if rc == RING_CLOSED:
                self._fail(ConnectionLost("shm peer closed the connection"))
            else:
                self._fail(ProtocolError("shm ring from peer is corrupt"))
        return n

    def recv_eager(self, am_id: int, tag: int, mask: int, buf, spins: int) -> tuple:
        """The contract's fast path: one C call (native/fastpath.c) polls our
        ring, checks the next frame and copies its payload into ``buf``."""
        if self._exc is not None or self._closed or self._in_poll or self._rx is None:
            return -1, 0
        n, got = _recv_tag(self._rx_addr, am_id, tag, mask, buf, spins)
        if n >= _WAKE_BIT:
            self.iface._wake(self._peer_sock)
            return n - _WAKE_BIT, got
        return n, got

    def drain_eager(self, am_id: int, tag: int, queue, source: int) -> int:
        """The contract's drain: one C call (native/fastpath.c) completes the
        posted receives of ``queue`` from the frames already in our ring."""
        if self._exc is not None or self._closed or self._in_poll or self._rx is None:
            return 0
        n = _drain_tag(self._rx_addr, am_id, tag, queue, source)
        if n >= _WAKE_BIT:
            self.iface._wake(self._peer_sock)
            return n - _WAKE_BIT
        return n

    def send_eager(self, am_id: int, tag: int, buf, max_payload: int) -> bool:
        """The contract's fast send: one C call (native/fastpath.c) pushes the
        frame into our ring when nothing is queued before it."""
        if self._queue or self._exc is not None or self._closing or self._tx is None:
            return False
        rc = _send_tag(self._tx_addr, am_id, tag, buf, min(max_payload, self._max_frame))
        if rc == 0:
            return True
        if rc == 1:
            self.iface._wake(self._peer_sock)
            return True
        return False

    # -- one-sided ---------------------------------------------------------------
    def pack_local_key(self, buf) -> tuple:
        try:
            c = _from_buffer(buf)
        except TypeError as e:
            raise InvalidBuffer(f"cannot describe buffer for get: {e}") from None
        addr = int(ffi.cast("uintptr_t", c))
        return addr, _RKEY.pack(_RKEY_MAGIC, os.getpid(), addr, len(c))

    def get(self, local, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """Read the peer's registered memory into ``local`` (process_vm_readv)."""
        self._cma(lib.ucxpy_cma_read, local, remote_addr, rkey)
        return True

    def put(self, local, remote_addr: int, rkey: bytes,
            on_complete: Callable[[Optional[BaseException]], None]) -> bool:
        """Write ``local`` into the peer's registered memory (process_vm_writev)."""
        self._cma(lib.ucxpy_cma_write, local, remote_addr, rkey)
        return True

    def _cma(self, fn, local, remote_addr: int, rkey: bytes) -> None:
        """One synchronous cross-memory copy between ``local`` and the peer's
        region described by ``rkey`` (from the peer's ``pack_local_key``)."""
        if self._exc is not None:
            raise self._exc
        try:
            magic, pid, base, length = _RKEY.unpack(bytes(rkey))
        except struct.error:
            raise RemoteAccessError("malformed shm remote key") from None
        if magic != _RKEY_MAGIC or pid != self._peer_pid:
            raise RemoteAccessError("remote key does not belong to this peer")
        try:
            buf = _from_buffer(local, require_writable=fn is lib.ucxpy_cma_read)
        except TypeError as e:
            raise InvalidBuffer(f"local buffer of a one-sided copy: {e}") from None
        n = len(buf)
        if remote_addr < base or remote_addr + n > base + length:
            raise RemoteAccessError(f"access of {n} bytes at {remote_addr:#x} outside the "
                                    f"registered region {base:#x}+{length}")
        if not self.cma_ok():
            raise RemoteAccessError("CMA to the peer process is not permitted")
        done = fn(pid, buf, remote_addr, n)
        if done == n:
            return
        if done == -errno.ESRCH:
            exc = ConnectionLost(f"shm peer process {pid} is gone")
            self._fail(exc)
            raise exc
        why = os.strerror(-done) if done < 0 else f"short copy of {done}/{n} bytes"
        raise RemoteAccessError(f"cross-memory copy with pid {pid}: {why}")

    def cma_ok(self) -> bool:
        """Does CMA to this peer work?  (probed once)"""
        if self._cma_ok is None:
            self._cma_ok = bool(self.iface.attrs.caps & Caps.GET_ZCOPY) and \
                lib.ucxpy_cma_probe(self._peer_pid, self._peer_probe) == 1
        return self._cma_ok

    # -- lifetime ----------------------------------------------------------------
    def close(self) -> None:
        if self._closing or self._exc is not None:
            return
        self._closing = True
        if not self._queue:
            self._shutdown()

    def _shutdown(self) -> None:
        """Tell the peer we are done and drop the mapping."""
        self._closed = True
        if self._exc is None and lib.ucxpy_ring_close_producer(self._tx) == 1:
            self.iface._wake(self._peer_sock)
        if self._exc is None:
            self._exc = ConnectionLost("shm endpoint is closed")
            seg = self._seg
            if seg is not None and seg.owner and os.path.exists(seg.path):
                # The peer has not mapped the segment yet (our CONNECT is still
                # in its socket): leave the name for it to map, drain and
                # unlink (see ShmInterface.close for what happens to it then).
                seg.owner = False
                self.iface._orphans.append((time.monotonic() + _ORPHAN_GRACE, seg.path,
                                            self._peer_sock))
        self._release_resources()

    def _fail(self, exc: BaseException) -> None:
        """Connection broke: fail queued sends, tell the owner once."""
        if self._exc is not None:
            return
        self._exc = exc
        notify = not (self._closed or self._closing)   # a closing owner is not told
        self._closed = True
        queued, self._queue = self._queue, deque()
        self._release_resources()
        for _am, _h, _p, cb in queued:
            if cb is not None:
                cb(exc)
        if notify:
            self.iface.owner.conn_failed(self, exc)

    def _release_resources(self) -> None:
        self.iface._forget(self)
        if self._in_poll:
            self._unmap_later = True    # the ring is still being read
        else:
            self._unmap()

    def _unmap(self) -> None:
        self._unmap_later = False
        self._tx = self._rx = None
        if self._rx_view is not None:
            self._rx_view.release()
            self._rx_view = None
        if self._seg is not None:
            self._seg.close()
            self._seg = None


# -- interface ---------------------------------------------------------------------

class ShmInterface(Interface):
    """Shared-memory transport of one worker."""

    name = "shm"

    def __init__(self, owner, config) -> None:
        super().__init__(owner, config)
        self.ring_size = int(config.shm_ring_size)
        caps = Caps.AM_SHORT | Caps.AM_BCOPY | Caps.INTRA_HOST
        self.cma_reason = "disabled by UCXPY_SHM_CMA"
        if config.shm_cma:
            usable, self.cma_reason = _cma_status()
            if usable:
                caps |= Caps.GET_ZCOPY | Caps.PUT_ZCOPY
        max_frame = max_frame_for(self.ring_size)
        self.attrs = TransportAttrs(
            caps=caps, max_short=256, max_bcopy=min(EAGER_LIMIT, self.ring_size // RING_EAGER_SHARE, max_frame), max_frame=max_frame,
            latency=0.5e-6, bandwidth=8e9, overhead=0.5e-6,
            max_get=(1 << 40) if caps & Caps.GET_ZCOPY else 0, priority=2)
        self.md = ShmMemoryDomain(self.name, cma=bool(caps & Caps.GET_ZCOPY))
        reap_stale_segments()
        self._sock_name = f"ucxpy-{os.getpid()}-{secrets.token_hex(8)}".encode()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind(b"\0" + self._sock_name)
        self._sock.setblocking(False)
        self._probe = lib.ucxpy_cma_probe_addr()
        self._address = _ADDR.pack(_ADDR_MAGIC, _VERSION,
                                   _F_CMA if caps & Caps.GET_ZCOPY else 0, os.getpid(),
                                   self.ring_size, self._probe, _ns_inode("pid"),
                                   _shm_dev()) + self._sock_name
        self._eps: tuple = ()               # live endpoints, polled in order
        self._rings = ffi.new("ucxpy_ring_t *[]", 1)  # their rx rings, for poll_many
        self._gen = 0                       # bumped when _eps changes
        self._pending: set = set()          # endpoints with queued frames
        self._to_fail: list = []            # (ep, exc) reported from progress
        self._ctl_out: deque = deque()      # control datagrams to retry
        self._peers = PidWatch()            # peer processes, for death detection
        self._orphans: list = []            # (deadline, path, peer socket) of closed, unmapped segments
        self._armed = False
        self._closed = False
        #: control datagrams dropped: other users' requests and refusals
        self.rejected = 0
        now = time.monotonic()
        self._next_housekeeping = now + _HOUSEKEEPING
        self._next_liveness = now + _LIVENESS

    @classmethod
    def query(cls, config) -> Availability:
        try:
            if not os.access(SHM_DIR, os.W_OK):
                return Availability(False, f"{SHM_DIR} is not writable")
            usable, reason = _cma_status(apply=False) if config.shm_cma else (False, "CMA disabled")
            return Availability(True, f"ring {config.shm_ring_size} B; {reason}",
                                devices=["memory"])
        except Exception as e:   # query must not raise
            return Availability(False, f"{type(e).__name__}: {e}")

    @classmethod
    def host_memory_domain(cls, config) -> Optional[ShmMemoryDomain]:
        """Shared segments and their keys, without rings or CMA."""
        return ShmMemoryDomain(cls.name, cma=False) if os.access(SHM_DIR, os.W_OK) else None

    def address(self) -> bytes:
        return self._address

    @staticmethod
    def _parse_address(address: bytes):
        data = bytes(address)
        if len(data) <= _ADDR.size:
            raise ValueError("shm address too short")
        fields = _ADDR.unpack_from(data)
        if fields[0] != _ADDR_MAGIC or fields[1] != _VERSION:
            raise ValueError("not a shm address of this version")
        return fields, data[_ADDR.size:]

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        if host_id != local_host_id():
            return False
        try:
            (_m, _v, _f, _pid, ring, _probe, pidns, shmdev), _s = self._parse_address(address)
        except (ValueError, struct.error):
            return False
        # pids must mean the same processes and /dev/shm the same tmpfs
        return pidns == _ns_inode("pid") and shmdev == _shm_dev() and ring <= MAX_RING

    # -- wire-up -----------------------------------------------------------------
    def connect(self, address: bytes) -> ShmEndpoint:
        if self._closed:
            raise ConnectionLost("shm interface is closed")
        (_m, _v, _f, pid, ring, probe, _ns, _dev), peer_sock = self._parse_address(address)
        capacity = max(self.ring_size, ring)
        try:
            seg = ShmSegment.create(capacity)
        except OSError as e:
            raise ConnectionLost(f"cannot create a shm segment of {2 * (HDR + capacity)} "
                                 f"bytes in {SHM_DIR}: {e.strerror}") from None
        ep = ShmEndpoint(self, seg, 0, pid, peer_sock, probe, accepted=False)
        self._add(ep)
        name = seg.name.encode()
        req = _REQ.pack(_REQ_MAGIC, _VERSION, 0, os.getpid(), capacity, self._probe,
                        len(name)) + name + self._sock_name
        self._send_ctl(peer_sock, req, ep)
        return ep

    def _set_eps(self, eps: tuple) -> None:
        self._eps = eps
        self._rings = ffi.new("ucxpy_ring_t *[]", [ep._rx for ep in eps] or 1)
        self._gen += 1

    def _add(self, ep: ShmEndpoint) -> None:
        self._set_eps(self._eps + (ep,))
        pid = ep._peer_pid
        if not self._peers.watch(pid):
            self._to_fail.append((ep, ConnectionLost(f"shm peer process {pid} is gone")))

    def _send_ctl(self, dest: bytes, msg: bytes, ep: Optional[ShmEndpoint] = None) -> None:
        try:
            self._sock.sendto(msg, b"\0" + dest)
        except BlockingIOError:
            self._ctl_out.append((dest, msg, ep))
        except OSError as e:
            if ep is not None:
                self._to_fail.append((ep, ConnectionLost(
                    f"shm peer interface unreachable: {e.strerror}")))

    def _wake(self, dest: bytes) -> None:
        try:
            self._sock.sendto(_WAKE, b"\0" + dest)
        except OSError:
            # Full queue: the peer has wake-ups pending anyway.  Gone: the
            # liveness check or the ring's closed flag reports it.
            pass

    def _drain_socket(self) -> int:
        n = 0
        sock = self._sock
        while True:
            try:
                msg, anc, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except (BlockingIOError, InterruptedError):
                return n
            except OSError as e:
                log.warning("shm control socket: %s", e)
                return n
            if msg[:1] == _WAKE or not msg:
                continue
            n += 1
            if msg[:4] == _REQ_MAGIC:
                self._accept(msg, _creds(anc))
            elif msg[:1] == _NACK:
                cred = _creds(anc)
                if cred is None or cred[1] != os.getuid():
                    self._refuse("refusal from another user", cred)
                    continue
                self._nacked(msg[1:].decode("ascii", "replace"))

    def _accept(self, msg: bytes, cred) -> None:
        req = _parse_request(msg)
        if req is None:
            log.warning("shm: malformed connection request ignored")
            return
        pid, capacity, probe, name, peer_sock = req
        if not _own_user(cred, pid):
            self._refuse("connection request from another user or pid", cred)
            if cred is not None and cred[1] == os.getuid():
                self._send_ctl(peer_sock, _NACK + name.encode())
            return
        if capacity < 4096 or capacity > MAX_RING or capacity & (capacity - 1):
            self._send_ctl(peer_sock, _NACK + name.encode())
            return
        try:
            seg = ShmSegment.open(name, capacity)
        except OSError as e:
            if isinstance(e, PermissionError):
                self._refuse(str(e), cred)
            else:
                log.warning("shm: cannot map %s: %s", name, e)
            self._send_ctl(peer_sock, _NACK + name.encode())
            return
        try:
            ep = ShmEndpoint(self, seg, 1, pid, peer_sock, probe, accepted=True)
        except ProtocolError:
            seg.close()
            self._send_ctl(peer_sock, _NACK + name.encode())
            return
        self._add(ep)

    def _refuse(self, why: str, cred) -> None:
        self.rejected += 1
        auth.refused("shm", why, f"pid {cred and cred[0]} uid {cred and cred[1]}")

    def _nacked(self, name: str) -> None:
        for ep in list(self._eps):
            seg = ep._seg
            if seg is not None and not ep.accepted and seg.name == name:
                ep._fail(ConnectionLost("shm peer refused the connection"))

    def _forget(self, ep: ShmEndpoint) -> None:
        if ep in self._eps:
            self._set_eps(tuple(e for e in self._eps if e is not ep))
        self._pending.discard(ep)
        pid = ep._peer_pid
        if not any(e._peer_pid == pid for e in self._eps):
            self._peers.unwatch(pid)

    # -- progress ----------------------------------------------------------------
    def progress(self) -> int:
        n = 0
        eps = self._eps
        gen = self._gen          # a callback may close endpoints: stop then
        if eps:
            # one foreign call tests every ring; _poll looks at the frames
            rings = self._rings
            k = len(eps)
            i = _poll_many(rings, k, 0)
            while i >= 0:
                n += eps[i]._poll()
                if self._gen != gen:
                    break
                i = _poll_many(rings, k, i + 1)
        if self._pending:
            for ep in list(self._pending):
                n += ep._flush()
        if self._armed:
            self._disarm()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            n += self._housekeeping(now)
        return n

    def _housekeeping(self, now: float) -> int:
        self._next_housekeeping = now + _HOUSEKEEPING
        n = self._drain_socket()
        retry, self._ctl_out = self._ctl_out, deque()
        for dest, msg, ep in retry:
            if ep is None or ep._exc is None:
                self._send_ctl(dest, msg, ep)
        while self._to_fail:
            ep, exc = self._to_fail.pop(0)
            while ep._exc is None and ep._poll():
                pass        # deliver what the peer published before it went away
            ep._fail(exc)
            n += 1
        if now >= self._next_liveness:
            self._next_liveness = now + _LIVENESS
            n += self._check_peers()
        return n

    def _check_peers(self) -> int:
        dead = self._peers.dead()
        if not dead:
            return 0
        n = 0
        for ep in [e for e in self._eps if e._peer_pid in dead]:
            while ep._exc is None and ep._poll():
                pass        # deliver what the peer published before dying
            ep._fail(ConnectionLost(f"shm peer process {ep._peer_pid} died"))
            n += 1
        return n

    # -- sleeping ----------------------------------------------------------------
    def wait_fds(self) -> list:
        if self._closed:
            return []
        self._drain_socket()
        ready = bool(self._to_fail or self._ctl_out)
        for ep in self._eps:
            if lib.ucxpy_ring_arm_consumer(ep._rx):
                ready = True
            if ep._queue:
                am, h, p, _cb = ep._queue[0]
                need = lib.UCXPY_RING_PREFIX + len(h) + len(p) + 16
                if lib.ucxpy_ring_arm_producer(ep._tx) >= 2 * need:
                    ready = True
        self._armed = True
        # first progress() after waking: check the socket and the pidfds
        self._next_housekeeping = self._next_liveness = 0.0
        if ready:
            self._wake(self._sock_name)     # make select() return at once
        return [self._sock.fileno()] + self._peers.fds()

    def _peer_listening(self, peer_sock: bytes) -> bool:
        try:
            self._sock.sendto(_WAKE, b"\0" + peer_sock)
        except BlockingIOError:
            return True                 # its queue is full: it exists
        except OSError:
            return False                # ECONNREFUSED: that interface is closed
        return True

    def _unlink_unaccepted(self) -> None:
        """Closing: unlink the segments of connection requests still in our
        socket (their connectors may have closed already, leaving the names
        for us); only names of the sender's own pid and uid are touched."""
        while True:
            try:
                msg, anc, _f, _a = self._sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except OSError:
                return
            req = _parse_request(msg) if msg[:4] == _REQ_MAGIC else None
            if req is not None and _own_user(_creds(anc), req[0]):
                _unlink_quiet(os.path.join(SHM_DIR, req[3]))

    def _disarm(self) -> None:
        self._armed = False
        for ep in self._eps:
            lib.ucxpy_ring_disarm_consumer(ep._rx)
            lib.ucxpy_ring_disarm_producer(ep._tx)

    # -- teardown ----------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        exc = ConnectionLost("shm interface closed")
        for ep in list(self._eps):
            queued, ep._queue = ep._queue, deque()
            if ep._exc is None:
                ep._shutdown()
            for _am, _h, _p, cb in queued:
                if cb is not None:
                    cb(exc)
        self._peers.close()
        # An orphan whose peer interface still exists stays: our CONNECT is in
        # its socket and our frames in the ring; the peer unlinks the name when
        # it maps it, or when it closes without having accepted it (below).
        # A process that dies first leaves it to reap_stale_segments.
        now = time.monotonic()
        for deadline, path, peer_sock in self._orphans:
            if now >= deadline or not self._peer_listening(peer_sock):
                _unlink_quiet(path)
        self._orphans.clear()
        self._unlink_unaccepted()
        self.md.close()
        self._sock.close()
