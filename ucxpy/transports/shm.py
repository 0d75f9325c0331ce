"""Shared-memory transport: one receive queue (inbox) per process in /dev/shm,
CMA for large gets.

Theory of operation
-------------------
Each interface owns an *inbox*: one multi-producer frame ring (native/ring.c)
in the segment ``/dev/shm/ucxpy-shm-<pid>-<token>``, which every same-host
peer connected to it writes to, and a unix datagram socket
``ucxpy-<pid>-<token>`` in the abstract namespace (no file, gone when the
process dies).  The socket name, the pid and the inbox size make up the
interface address.  Shared memory therefore grows with the number of
processes on the host, not with the number of pairs, as in UCX's mm
transports and MPICH's shared memory.

A connection is a pair of 64-bit *sources* that the connector draws at
random: ``out`` marks the frames it pushes into the acceptor's inbox, ``in``
those the acceptor pushes into the connector's.  ``connect(address)`` maps
the peer's inbox (one mapping per peer inbox, shared by its endpoints) and
sends the peer a CONNECT datagram naming both sources; the endpoint holds
its frames until that datagram is in the peer's socket, so a peer always
finds the CONNECT of a source before its first frame.  The peer reads the
datagram from ``progress()`` (at once when a frame of an unknown source shows
up, else every millisecond and whenever it is about to sleep), maps the
connector's inbox and creates the accepted endpoint.  The kernel stamps
datagrams with the sender's credentials; only processes of our own uid are
accepted.

``progress()`` reads the inbox in order and hands each frame to the endpoint
of its source.  Frames of a source we closed, or refused, are dropped.

Security: the boundary is the user, as for ptrace and CMA (a process of the
same uid could read our memory anyway), so shm needs no job key.  Inboxes
are created ``O_EXCL`` with mode 0600 and mapped only if they are regular
files owned by our uid that nobody else may access; connection requests and
refusals (NACK) count only when the kernel-stamped sender is of our uid
(others are dropped and counted in ``rejected`` and
``ucxpy.auth.failures["shm"]``).  Wake-ups are accepted from anyone: they
only make us look at our inbox.

Connection states (per endpoint)::

    state        event                               next
    open         close() with an empty queue         closed   (CLOSE record pushed)
    open         close() with queued frames          closing  (flushed by progress)
    closing      queue drained, CLOSE record pushed  closed
    open/closing CLOSE record from the peer          failed   (conn_failed once)
    open/closing peer pid exits (pidfd readable)     failed   (conn_failed once, after its frames)
    open/closing NACK, corrupt inbox, inbox closed   failed   (conn_failed once)

Send never blocks: a frame goes straight into the peer's inbox with one C
call that takes the inbox's producer lock and copies header and payload.
When the inbox is full, or another producer holds the lock (BUSY), frames
queue in order; payloads up to ``max_bcopy`` (or any payload sent without
``on_complete``) are copied into the queue and ``send`` returns True, larger
payloads are queued by reference, ``send`` returns False and ``on_complete``
runs from ``progress()`` once the frame is in the inbox.  A lock held for
``_LOCK_GRACE`` seconds by a process that no longer exists is broken (it
published nothing of the frame it was writing).

Sleep/wake: the inbox carries a "consumer sleeping" flag and a table of the
producers waiting for space.  ``wait_fds()`` (called by the worker right
before it sleeps) sets them; a peer that then pushes sends one datagram to
our socket, and we send one to each waiting producer when we free space.  No
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
import os
import secrets
import socket
import struct
import time
from collections import deque
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..lazy import logger
from .. import auth
from .._dp import BAD_BIT as _NATIVE_BAD
from .._dp import WAKE_BIT as _WAKE_BIT
from .._native import ffi, lib
from ..netaddr import host_id as local_host_id, ns_inode as _ns_inode
from ..errors import (ConnectionLost, InvalidBuffer, MessageTooLarge, ProtocolError,
                      RemoteAccessError)
from .liveness import PidWatch, pid_alive as _pid_alive
from .base import MAX_HEADER, Availability, Caps, Interface, TransportAttrs, TransportEndpoint
from .shm_md import RKEY, RKEY_MAGIC, ShmMemoryDomain

#: the lowest flag bit of a count the native consumer returns (BAD_BIT;
#: WAKE_BIT is the one above it)
_NATIVE_FLAGS = _NATIVE_BAD

log = logger("ucxpy.shm")

from ..shmfile import SHM_DIR, unlink_quiet as _unlink_quiet
from .shm_inbox import _LOCK_STUCK
from .shm_inbox import (HDR, SEG_PREFIX, Inbox, free_stuck_lock as _free_stuck_lock,
                        inbox_name, new_source as _new_source, reap_stale_segments,
                        ring_ok as _ring_ok)

RING_FULL = lib.UCXPY_RING_FULL
RING_BUSY = lib.UCXPY_RING_BUSY
RING_CLOSED = lib.UCXPY_RING_CLOSED
RING_LOST = lib.UCXPY_RING_LOST
_RING_WAITERS = lib.UCXPY_RING_WAITERS
_WAITERS_LOST = lib.UCXPY_RING_WAITERS_LOST

#: interface address: magic, version, flags, pid, inbox size, probe address,
#: pid-namespace inode, /dev/shm device; then the socket name
_ADDR = struct.Struct("<4sBBIQQQQ")
_ADDR_MAGIC = b"USHM"
#: CONNECT datagram: magic, version, flags, pid, inbox size, probe address,
#: out source, in source; then the connector's socket name
_REQ = struct.Struct("<4sBBIQQQQ")
_REQ_MAGIC = b"UCRQ"
_NACK = b"N"            # + the out source (8 bytes): the peer refused the connection
_WAKE = b"W"
_RESET = b"R"           # our inbox was corrupt and reset: check your frames
_SOURCE = struct.Struct("<Q")
#: remote key of get / put (the memory domain packs the same for RMA)
_RKEY, _RKEY_MAGIC = RKEY, RKEY_MAGIC
_VERSION = 2
_F_CMA = 1

#: seconds between control-socket checks, times the owner's ``cpu_share()``
#: (ranks per CPU): a rank that runs 1/16 of the time at 32 ranks on 2 CPUs
#: would otherwise drain its socket every 60 us of its own CPU (20 us each,
#: a tenth of its all-to-all's CPU).  Nothing waits on it: a peer's first
#: frame drains the socket for its connection request (_poll)
_HOUSEKEEPING = 1e-3
_LIVENESS = 0.1          # seconds between peer-death checks
_BATCH = 64              # frames delivered per progress()
_LOCK_GRACE = 0.2        # seconds a peer's inbox lock may be held before we ask whether its holder lives
#: seconds a live peer's inbox may look closed before a frame to it fails: its
#: owner repairs a scribbled flag within the lock's _LOCK_STUCK and a pass
_CLOSED_REPAIR = _LOCK_STUCK + 1.0

_push = lib.ucxpy_ring_push
_peek = lib.ucxpy_ring_peek
_release = lib.ucxpy_ring_release
_from_buffer = ffi.from_buffer
_CLOSE = (-1, b"", b"", None)    # queued in place of a frame: the connection's CLOSE record


# -- host identity -------------------------------------------------------------

def _shm_dev() -> int:
    try:
        return os.stat(SHM_DIR).st_dev
    except OSError:
        return 0


#: eager-copy limit (rendezvous from one byte more): two copies through the
#: ring, each of cache-warm memory, cost less than the rendezvous handshake
#: and a CMA read (which pins the peer's pages and copies what the other
#: core just wrote) up to here.  2 pinned ranks, 2026-12-06, ucxpy-perf
#: tag_lat: 128 KiB 10.3 us eager against 51 us by rendezvous, 256 KiB 21.8
#: against 68 us (MPICH 20 and 35-44 us); tag_bw 128 KiB 11.6 against 6.2
#: GB/s.  At most an eighth of the ring (RING_EAGER_SHARE): in a small ring,
#: a few large eager frames would fill it and queue everything behind them
#: (the default 2 MiB ring takes the whole limit), and where many local
#: peers share the ring the endpoint's rule lowers it further
#: (ucxpy.endpoint.protocol_thresholds: 146 KiB at 8 ranks on a host, 68 KiB
#: at 16, 33 KiB at 32)
EAGER_LIMIT = 256 << 10
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


def _creds(ancillary) -> Optional[tuple]:
    """(pid, uid, gid) the kernel stamped on a datagram, or None."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return struct.unpack("<iII", data[:12])
    return None


def _parse_request(msg: bytes) -> Optional[tuple]:
    """``(pid, capacity, probe, out source, in source, reply socket)`` of a
    CONNECT datagram, or None if it is malformed, of another version, or
    names a socket that is not the sender pid's."""
    try:
        _magic, ver, _flags, pid, capacity, probe, out_src, in_src = _REQ.unpack_from(msg)
    except struct.error:
        return None
    peer_sock = msg[_REQ.size:]
    if ver != _VERSION or not out_src or not in_src or out_src == in_src or \
            inbox_name(peer_sock, pid) is None:
        return None
    return pid, capacity, probe, out_src, in_src, peer_sock


def _own_user(cred, pid: int) -> bool:
    """The kernel-stamped credentials say: process ``pid`` of our own uid."""
    return cred is not None and cred[0] == pid and cred[1] == os.getuid()


# -- endpoint --------------------------------------------------------------------

class ShmEndpoint(TransportEndpoint):
    """One connection: we push frames marked ``_out`` into the peer's inbox;
    its frames, marked ``_in``, arrive in ours."""

    def __init__(self, iface: "ShmInterface", peer: Optional[Inbox], out_src: int, in_src: int,
                 peer_pid: int, peer_sock: bytes, peer_probe: int, accepted: bool):
        self.iface = iface
        self._peer_inbox = peer     # None: we only receive (its inbox is gone already)
        self._tx = None
        self._tx_addr = 0
        if peer is not None:
            self._tx = peer.handle(out_src)
            peer.users += 1
            self._tx_addr = int(ffi.cast("uintptr_t", self._tx))     # for native senders
        self._out = out_src
        self._in = in_src
        #: the id our peer's frames carry in our inbox (the contract's native_conn)
        self.native_conn = in_src
        self._peer_pid = peer_pid
        self._peer_sock = peer_sock
        self._peer_probe = peer_probe
        self._cma_ok: Optional[bool] = None
        self.accepted = accepted
        #: frames wait until our CONNECT is in the peer's socket
        self._held = not accepted
        self._queue: deque = deque()
        self._max_frame = iface.attrs.max_frame
        self._max_bcopy = iface.attrs.max_bcopy
        self._exc: Optional[BaseException] = None
        self._closing = False
        self._closed = False       # locally closed: deliver nothing more
        self._busy_holder = 0      # who held the peer inbox's lock when we last found it taken
        self._busy_since = 0.0     # since when
        self._closed_seen = 0.0    # when the peer's inbox was first found closed
        self._lane = None          # the native senders' view (set_native_lane)

    def __repr__(self):
        state = "failed" if self._exc else "closed" if self._closed else \
            "closing" if self._closing else "open"
        return (f"<ShmEndpoint peer pid {self._peer_pid} {state}"
                f"{' accepted' if self.accepted else ''} queued={len(self._queue)}>")

    @property
    def pending(self) -> int:
        return len(self._queue)

    # -- the native senders' view (the contract's native_tx / set_native_lane) ----
    @property
    def native_tx(self) -> int:
        return self._tx_addr if self._tx is not None else 0

    @property
    def native_max_frame(self) -> int:
        return self._max_frame

    @property
    def native_lane(self):
        return self._lane

    def set_native_lane(self, lane) -> None:
        old, self._lane = self._lane, lane
        if old is not None and old is not lane:
            old.open = False
            old.dead = True
        if lane is not None:
            # the offers' keys name our pid; a peer's keys name its own, and
            # are read by CMA where CMA to it works (the data plane's shm
            # rendezvous, native/dp/rndv.c)
            lane.set_peer(self.iface.pid, self._peer_pid, self.cma_ok())
        self._lane_sync()

    def _lane_sync(self) -> None:
        """Keep the native lane's ``open`` exactly what :meth:`send` needs to
        push a frame now (nothing queued or held before it, open)."""
        lane = self._lane
        if lane is not None:
            lane.open = not (self._queue or self._held or self._exc is not None or
                             self._closing or self._tx is None)

    # -- sending ---------------------------------------------------------------
    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        if self._exc is not None or self._closing or self._tx is None:
            raise self._exc or ConnectionLost("shm endpoint is closed" if self._closing else
                                              "the peer's shm inbox is gone")
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
        if not self._queue and not self._held:
            rc = _push(self._tx, am_id, header, hlen, payload, plen)
            if rc == 0:
                return True
            if rc == 1:
                self.iface._wake(self._peer_sock)
                return True
            if rc != RING_FULL and rc != RING_BUSY and rc != RING_CLOSED:
                self._push_error(rc)
        # Inbox full or busy, or closed (a flag a scribble may have set: the
        # owner repairs it, _flush decides), or older frames waiting: queue.
        if on_complete is None or plen <= self._max_bcopy:
            if type(payload) is not bytes:
                payload = ffi.buffer(payload)[:]
            self._queue.append((am_id, header, payload, None))
            done = True
        else:
            self._queue.append((am_id, header, payload, on_complete))
            done = False
        self.iface._queued(self)
        return done

    def _push_exc(self, rc: int) -> BaseException:
        if rc == lib.UCXPY_RING_TOOBIG:
            return MessageTooLarge("frame does not fit the peer's shm inbox")
        if rc == RING_CLOSED:
            return ConnectionLost("shm peer closed its inbox")
        if rc == RING_LOST:
            return ProtocolError("frames to the shm peer were lost: its inbox was found "
                                 "corrupt and reset")
        return ProtocolError("shm inbox state is corrupt")

    def _push_error(self, rc: int):
        exc = self._push_exc(rc)
        if not isinstance(exc, MessageTooLarge):
            self._fail(exc)
        raise exc

    def _busy(self) -> None:
        """The peer inbox's lock was taken: after _LOCK_GRACE, free it if its
        holder no longer exists."""
        now = time.monotonic()
        holder = lib.ucxpy_ring_lock_owner(self._tx)
        if holder != self._busy_holder:
            self._busy_holder, self._busy_since = holder, now
        elif now - self._busy_since > _LOCK_GRACE:
            _free_stuck_lock(self._tx, holder, self._peer_inbox.name, now - self._busy_since)

    def _flush(self) -> int:
        """Push queued frames while the inbox takes them; returns frames pushed."""
        if self._tx is None or self._held:
            return 0
        n = 0
        queue = self._queue
        notify = False
        while queue:
            am_id, header, payload, cb = queue[0]
            if am_id < 0:
                rc = lib.ucxpy_ring_push_close(self._tx)
            else:
                rc = _push(self._tx, am_id, header, len(header), payload, len(payload))
            if rc == RING_FULL:
                break
            if rc == RING_BUSY:
                self._busy()
                break
            if rc == RING_CLOSED:
                # the owner closed its inbox, or its flag was scribbled on and
                # the owner repairs it: give it _LOCK_GRACE, and while it
                # lives the time its repair may take (a scribbled lock word
                # beside the flag is broken only after _LOCK_STUCK)
                now = time.monotonic()
                self._closed_seen = self._closed_seen or now
                waited = now - self._closed_seen
                if waited <= _LOCK_GRACE or (waited <= _CLOSED_REPAIR
                                             and _pid_alive(self._peer_pid)):
                    break
            self._closed_seen = 0.0
            self._busy_holder = 0
            queue.popleft()
            if am_id < 0:
                notify |= rc == 1
                self._shutdown()
                break
            if rc < 0:
                exc = self._push_exc(rc)
                if cb is not None:
                    cb(exc)
                if not isinstance(exc, MessageTooLarge):
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
            if self._lane is not None:
                self._lane_sync()
        return n

    def wake_peer(self) -> None:
        """A native push found the peer asleep: wake it."""
        self.iface._wake(self._peer_sock)

    # -- one-sided ---------------------------------------------------------------
    def pack_local_key(self, buf) -> tuple:
        try:
            c = _from_buffer(buf)
        except TypeError as e:
            raise InvalidBuffer(f"cannot describe buffer for get: {e}") from None
        addr = int(ffi.cast("uintptr_t", c))
        return addr, _RKEY.pack(_RKEY_MAGIC, self.iface.pid, addr, len(c))

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
        self._queue.append(_CLOSE)
        self.iface._queued(self)
        self._flush()

    def _shutdown(self) -> None:
        """Our CLOSE record is in the peer's inbox: we are done."""
        self._closed = True
        if self._exc is None:
            self._exc = ConnectionLost("shm endpoint is closed")
        self._release_resources(close_sent=True)

    def _fail(self, exc: BaseException) -> None:
        """Connection broke: fail queued sends, tell the owner once."""
        if self._exc is not None:
            return
        self._exc = exc
        self._lane_sync()
        notify = not (self._closed or self._closing)   # a closing owner is not told
        self._closed = True
        queued, self._queue = self._queue, deque()
        self._release_resources(close_sent=False)
        for _am, _h, _p, cb in queued:
            if cb is not None:
                cb(exc)
        if notify:
            self.iface.owner.conn_failed(self, exc)

    def _release_resources(self, close_sent: bool) -> None:
        lane, self._lane = self._lane, None
        if lane is not None:                 # (before the inbox goes)
            lane.open = False
            lane.dead = True
        tx, self._tx = self._tx, None
        if tx is not None and not close_sent and not self._held:
            # best effort: the peer forgets our source at once
            lib.ucxpy_ring_push_close(tx)
        self.iface._forget(self)
        if self._peer_inbox is not None:
            self.iface._unmap_peer(self._peer_inbox)
            self._peer_inbox = None


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
            caps=caps, max_short=256,
            max_bcopy=min(EAGER_LIMIT, self.ring_size // RING_EAGER_SHARE, max_frame),
            max_frame=max_frame, latency=0.5e-6, bandwidth=8e9, overhead=0.5e-6,
            max_get=(1 << 40) if caps & Caps.GET_ZCOPY else 0, priority=2,
            rx_shared=self.ring_size)
        self.md = ShmMemoryDomain(self.name, cma=bool(caps & Caps.GET_ZCOPY))
        reap_stale_segments()
        token = secrets.token_hex(8)
        self.pid = os.getpid()          # (what every offer and key names: no syscall per send)
        self._sock_name = f"ucxpy-{self.pid}-{token}".encode()
        try:
            self._inbox = Inbox.create(f"{SEG_PREFIX}{self.pid}-{token}", self.ring_size)
        except OSError as e:
            self.md.close()
            raise ConnectionLost(f"cannot create a shm inbox of {HDR + self.ring_size} "
                                 f"bytes in {SHM_DIR}: {e.strerror}") from None
        self._rx = self._inbox.handle()
        self._rx_addr = int(ffi.cast("uintptr_t", self._rx))      # for the fast path
        self._rx_view = self._inbox.data_view()
        self._peek_out = ffi.new("uint64_t[]", lib.UCXPY_RING_PEEK_OUT)
        self._waiter_out = ffi.new("uint64_t[]", _RING_WAITERS)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind(b"\0" + self._sock_name)
        self._sock.setblocking(False)
        self._probe = lib.ucxpy_cma_probe_addr()
        self._address = _ADDR.pack(_ADDR_MAGIC, _VERSION,
                                   _F_CMA if caps & Caps.GET_ZCOPY else 0, self.pid,
                                   self.ring_size, self._probe, _ns_inode("pid"),
                                   _shm_dev()) + self._sock_name
        self._eps: set = set()              # live endpoints
        self._by_src: dict = {}             # in source -> endpoint
        self._dropped: dict = {}            # source -> peer pid: frames still coming are dropped
        self._peer_inboxes: dict = {}       # name -> Inbox we produce into
        self._pending: set = set()          # endpoints with queued frames
        self._armed_producers: list = []    # endpoints that asked a peer for a wake-up
        self._to_fail: list = []            # (ep, exc) reported from progress
        self._ctl_out: deque = deque()      # control datagrams to retry
        self._peers = PidWatch()            # peer processes, for death detection
        self._in_poll = False
        self._corrupt = False               # found corrupt, not reset yet
        self._corrupt_since = 0.0
        self._armed = False
        self._closed = False
        #: times our inbox was found corrupt and reset
        self.resets = 0
        #: control datagrams dropped: other users' requests and refusals
        self.rejected = 0
        #: frames of unknown sources dropped (refused or closed connections)
        self.dropped_frames = 0
        #: the owner's consumer of our inbox's frames (the contract's
        #: ``native``: the data plane's Inbox, set by the worker), and how
        #: many frames it took
        self.native = None
        self.native_rx = 0
        now = time.monotonic()
        self._housekeeping_every = _HOUSEKEEPING
        self._next_housekeeping = now + _HOUSEKEEPING
        self._next_liveness = now + _LIVENESS

    @classmethod
    def query(cls, config) -> Availability:
        try:
            if not os.access(SHM_DIR, os.W_OK):
                return Availability(False, f"{SHM_DIR} is not writable")
            usable, reason = _cma_status(apply=False) if config.shm_cma else (False, "CMA disabled")
            return Availability(True, f"inbox {config.shm_ring_size} B; {reason}",
                                devices=["memory"])
        except Exception as e:   # query must not raise
            return Availability(False, f"{type(e).__name__}: {e}")

    @classmethod
    def host_memory_domain(cls, config) -> Optional[ShmMemoryDomain]:
        """Shared segments and their keys, without inboxes or CMA."""
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
        return pidns == _ns_inode("pid") and shmdev == _shm_dev() and _ring_ok(ring)

    # -- wire-up -----------------------------------------------------------------
    def connect(self, address: bytes) -> ShmEndpoint:
        if self._closed:
            raise ConnectionLost("shm interface is closed")
        (_m, _v, _f, pid, ring, probe, _ns, _dev), peer_sock = self._parse_address(address)
        name = inbox_name(peer_sock, pid)
        if name is None or not _ring_ok(ring):
            raise ConnectionLost("malformed shm address")
        ep = ShmEndpoint(self, self._map_peer(name, ring), _new_source(), _new_source(),
                         pid, peer_sock, probe, accepted=False)
        self._add(ep)
        req = _REQ.pack(_REQ_MAGIC, _VERSION, 0, self.pid, self.ring_size, self._probe,
                        ep._out, ep._in) + self._sock_name
        self._send_ctl(peer_sock, req, ep)
        return ep

    def _map_peer(self, name: str, capacity: int) -> Inbox:
        inbox = self._peer_inboxes.get(name)
        if inbox is None:
            try:
                inbox = Inbox.open(name, capacity)
            except OSError as e:
                raise ConnectionLost(f"cannot map the peer's shm inbox {name}: "
                                     f"{e.strerror or e}") from None
            self._peer_inboxes[name] = inbox
        return inbox

    def _unmap_peer(self, inbox: Inbox) -> None:
        inbox.users -= 1
        if inbox.users <= 0 and self._peer_inboxes.get(inbox.name) is inbox:
            del self._peer_inboxes[inbox.name]
            inbox.close()

    def _add(self, ep: ShmEndpoint) -> None:
        self._eps.add(ep)
        self._by_src[ep._in] = ep
        pid = ep._peer_pid
        if not self._peers.watch(pid):
            self._to_fail.append((ep, ConnectionLost(f"shm peer process {pid} is gone")))

    def _forget(self, ep: ShmEndpoint) -> None:
        self._eps.discard(ep)
        self._pending.discard(ep)
        if not self._pending and self.native is not None:
            self.native.busy = False
        if self._by_src.get(ep._in) is ep:
            if self.native is not None:
                self.native.forget_conn(ep._in)
            del self._by_src[ep._in]
            self._dropped[ep._in] = ep._peer_pid
        pid = ep._peer_pid
        if not any(e._peer_pid == pid for e in self._eps):
            self._peers.unwatch(pid)

    def _queued(self, ep: ShmEndpoint) -> None:
        """``ep`` has frames queued: our progress pushes them (and tells a C
        caller's progress, libucp's, that it must run ours: ``busy``; a
        native sender's lane closes until they are out)."""
        self._pending.add(ep)
        if self.native is not None:
            self.native.busy = True
        if ep._lane is not None:
            ep._lane.open = False

    def _send_ctl(self, dest: bytes, msg: bytes, ep: Optional[ShmEndpoint] = None) -> None:
        try:
            self._sock.sendto(msg, b"\0" + dest)
        except BlockingIOError:
            self._ctl_out.append((dest, msg, ep))
            return
        except OSError as e:
            if ep is not None:
                self._to_fail.append((ep, ConnectionLost(
                    f"shm peer interface unreachable: {e.strerror}")))
            return
        if ep is not None and ep._held:
            ep._held = False            # our CONNECT is in: frames may follow it
            if ep._queue:
                self._queued(ep)
            else:
                ep._lane_sync()

    def _wake(self, dest: bytes) -> None:
        try:
            self._sock.sendto(_WAKE, b"\0" + dest)
        except OSError:
            # Full queue: the peer has wake-ups pending anyway.  Gone: the
            # liveness check or its CLOSE record reports it.
            pass

    def _wake_waiters(self) -> None:
        """We freed inbox space that producers wait for: wake them."""
        k = lib.ucxpy_ring_take_waiters(self._rx, self._waiter_out, _RING_WAITERS)
        if k & _WAITERS_LOST:
            # some waiter could not be listed: wake every peer
            for sock in {ep._peer_sock for ep in self._eps}:
                self._wake(sock)
            return
        for i in range(k):
            ep = self._by_src.get(self._waiter_out[i])
            if ep is not None:
                self._wake(ep._peer_sock)

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
            elif msg[:1] == _RESET:
                self._check_lost()
            elif msg[:1] == _NACK:
                cred = _creds(anc)
                if cred is None or cred[1] != os.getuid():
                    self._refuse("refusal from another user", cred)
                    continue
                self._nacked(msg[1:1 + _SOURCE.size])

    def _accept(self, msg: bytes, cred) -> None:
        req = _parse_request(msg)
        if req is None:
            log.warning("shm: malformed connection request ignored")
            return
        pid, capacity, probe, out_src, in_src, peer_sock = req
        nack = _NACK + _SOURCE.pack(out_src)
        if not _own_user(cred, pid):
            self._refuse("connection request from another user or pid", cred)
            if cred is not None and cred[1] == os.getuid():
                self._send_ctl(peer_sock, nack)
            return
        self._dropped[out_src] = pid        # until accepted: its frames are not ours
        if self._closed or not _ring_ok(capacity) or out_src in self._by_src:
            self._send_ctl(peer_sock, nack)
            return
        try:
            peer = self._map_peer(inbox_name(peer_sock, pid), capacity)
        except ConnectionLost as e:
            # The connector closed already: what it sent before is in our
            # inbox, so the endpoint delivers that, then fails.
            peer, why = None, e
        try:
            ep = ShmEndpoint(self, peer, in_src, out_src, pid, peer_sock, probe, accepted=True)
        except ProtocolError as e:
            log.warning("shm: cannot accept a connection from pid %d: %s", pid, e)
            self._send_ctl(peer_sock, nack)
            return
        del self._dropped[out_src]
        self._add(ep)
        if peer is None:
            self._to_fail.append((ep, why))

    def _refuse(self, why: str, cred) -> None:
        self.rejected += 1
        auth.refused("shm", why, f"pid {cred and cred[0]} uid {cred and cred[1]}")

    def _nacked(self, raw: bytes) -> None:
        if len(raw) != _SOURCE.size:
            return
        out_src, = _SOURCE.unpack(raw)
        for ep in list(self._eps):
            if ep._out == out_src and not ep.accepted:
                ep._fail(ConnectionLost("shm peer refused the connection"))

    # -- progress ----------------------------------------------------------------
    def progress(self) -> int:
        if self._corrupt:
            self._reset()
        n = self._poll() if self._rx is not None and not self._corrupt else 0
        if self._pending:
            for ep in list(self._pending):
                n += ep._flush()
            if not self._pending and self.native is not None:
                self.native.busy = False
        if self._armed:
            self._disarm()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            n += self._housekeeping(now)
        return n

    @property
    def native_ring(self) -> int:
        """The contract's ``native_ring``: the address of our inbox's
        consumer handle (native/ring.c), or 0 once it is gone."""
        return self._rx_addr if self._rx is not None else 0

    def poll_native(self, spins: int) -> int:
        """Let the ``native`` consumer take the frames it handles at the
        front of our inbox, polling an empty inbox up to ``spins`` times (a
        blocking receive's wait): how many it took.  Anything else stays for
        :meth:`progress`, in order."""
        native = self.native
        if native is None or self._rx is None or self._corrupt or self._in_poll:
            return 0
        n = self.native_flags(native.dispatch(_BATCH, spins))
        self.native_rx += n
        return n

    @property
    def native_idle(self) -> bool:
        """May the ``native`` consumer take a frame from our inbox now (not
        from inside our own poll, which holds one; the inbox whole)?"""
        return self.native is not None and self._rx is not None and not self._corrupt \
            and not self._in_poll

    def native_flags(self, n: int) -> int:
        """A count the ``native`` consumer returned, its flags acted on."""
        return self._native_flags(n) if n >= _NATIVE_FLAGS else n

    def _native_flags(self, n: int) -> int:
        """The consumer's count without its flags, acting on them: a
        producer waits for space (wake it), the ring is corrupt (reset it)."""
        if n & _NATIVE_BAD:
            self._corrupt = True
        if n & _WAKE_BIT:
            self._wake_waiters()
            self._wake_answered()
        return n & (_NATIVE_BAD - 1)

    def _wake_answered(self) -> None:
        """Peers the consumer pushed a frame to (an answer) that sleep: wake
        them (the consumer names their connections)."""
        conns, every = self.native.take_wakes()
        if every:
            for sock in {ep._peer_sock for ep in self._eps}:
                self._wake(sock)
            return
        for conn in conns:
            ep = self._by_src.get(conn)
            if ep is not None:
                self._wake(ep._peer_sock)

    def _poll(self, limit: int = _BATCH) -> int:
        """Deliver up to ``limit`` frames of our inbox; returns how many.
        Runs of frames the owner's ``native`` consumer handles (eager
        messages of wired-up connections: the data plane, native/dp/inbox.c)
        go through one C call; every other frame through
        ``owner.recv_frame``."""
        rx = self._rx
        out = self._peek_out
        n = 0
        rc = _peek(rx, out)
        if rc == 0:
            return 0
        native = self.native
        if native is not None and not self.owner.native_consumes:
            native = None
        if native is not None:
            n = self.native_flags(native.dispatch(limit, 0))
            if n:
                self.native_rx += n
                if n >= limit or self._corrupt:
                    return n
                rc = _peek(rx, out)
        view = self._rx_view
        recv = self.owner.recv_frame
        by_src = self._by_src
        wake = False
        self._in_poll = True
        try:
            while rc > 0:
                src = out[5]
                ep = by_src.get(src)
                if ep is None and src not in self._dropped:
                    self._drain_socket()        # its CONNECT is in our socket
                    ep = by_src.get(src)
                try:
                    if ep is None:
                        if rc == 2:
                            self._dropped.pop(src, None)
                        else:
                            self.dropped_frames += 1
                    elif rc == 1:
                        ho = out[1]
                        po = out[3]
                        recv(ep, out[0], view[ho:ho + out[2]], view[po:po + out[4]])
                    else:
                        ep._fail(ConnectionLost("shm peer closed the connection"))
                        self._dropped.pop(src, None)
                finally:
                    if _release(rx) == 1:
                        wake = True
                n += 1
                if n >= limit or self._closed:      # (a callback may close us)
                    break
                if native is not None:
                    k = native.dispatch(limit - n, 0)
                    if k:
                        if k >= _NATIVE_FLAGS:
                            if k & _WAKE_BIT:
                                wake = True
                            k = self._native_flags(k & ~_WAKE_BIT)
                        self.native_rx += k
                        n += k
                        if n >= limit or self._corrupt:
                            break
                rc = _peek(rx, out)
        finally:
            self._in_poll = False
            if self._closed:
                self._unmap_inbox()
        if wake and not self._closed:
            self._wake_waiters()
        if rc < 0 and not self._closed:
            self._corrupt = True
        if self._corrupt and not self._closed:
            self._reset()
        return n

    def _reset(self) -> None:
        """Our inbox is corrupt: discard what it holds (ucxpy_ring_reset); the
        producers whose frames that lost learn it and fail their connection,
        and we ask every peer to check now.  Retried from progress() while a
        producer holds the lock."""
        if lib.ucxpy_ring_reset(self._rx, self.pid) == 0:
            now = time.monotonic()
            self._corrupt_since = self._corrupt_since or now
            holder = lib.ucxpy_ring_lock_owner(self._rx)
            if not (_free_stuck_lock(self._rx, holder, self._inbox.name,
                                     now - self._corrupt_since)
                    and lib.ucxpy_ring_reset(self._rx, self.pid)):
                return
        self._corrupt_since = 0.0
        self._corrupt = False
        self.resets += 1
        log.error("shm: inbox %s was corrupt: its frames were discarded; the connections "
                  "that lost frames fail", self._inbox.name)
        for sock in {ep._peer_sock for ep in self._eps}:
            self._send_ctl(sock, _RESET)

    def _check_lost(self) -> int:
        """Fail our connections whose frames a peer's inbox reset discarded."""
        n = 0
        for ep in list(self._eps):
            if ep._tx is not None and lib.ucxpy_ring_check_lost(ep._tx):
                ep._fail(ep._push_exc(RING_LOST))
                n += 1
        return n

    def _drain(self) -> None:
        """Deliver every frame our inbox holds now (and perhaps a few more)."""
        budget = self.ring_size // lib.UCXPY_RING_PREFIX
        while self._rx is not None and not self._corrupt and budget > 0:
            k = self._poll()
            if k < _BATCH:
                return
            budget -= k

    def _housekeeping(self, now: float) -> int:
        self._next_housekeeping = now + self._housekeeping_every
        n = self._drain_socket()
        retry, self._ctl_out = self._ctl_out, deque()
        for dest, msg, ep in retry:
            if ep is None or ep._exc is None:
                self._send_ctl(dest, msg, ep)
        if self._to_fail:
            self._drain()           # deliver what the peers published first
            while self._to_fail:
                ep, exc = self._to_fail.pop(0)
                ep._fail(exc)
                n += 1
        if now >= self._next_liveness:
            self._next_liveness = now + _LIVENESS
            share = getattr(self.owner, "cpu_share", None)
            self._housekeeping_every = _HOUSEKEEPING * (share() if share is not None else 1.0)
            n += self._check_peers()
        return n

    def _check_peers(self) -> int:
        if self._rx is not None and not self._corrupt and \
                lib.ucxpy_ring_check_header(self._rx) != 0:
            self._corrupt = True            # scribbled over: repair it
            self._reset()
        self._check_lost()
        dead = self._peers.dead()
        if not dead:
            return 0
        self._drain()               # deliver what the dead published before dying
        n = 0
        for ep in [e for e in self._eps if e._peer_pid in dead]:
            # a killed process cannot unlink its inbox: its peers do
            if ep._peer_inbox is not None:
                _unlink_quiet(ep._peer_inbox.path)
            ep._fail(ConnectionLost(f"shm peer process {ep._peer_pid} died"))
            n += 1
        for src in [s for s, pid in self._dropped.items() if pid in dead]:
            del self._dropped[src]
        return n

    # -- sleeping ----------------------------------------------------------------
    def control_fds(self) -> list:
        """The contract's: the control socket (connection requests, accepts,
        closes, wake-ups)."""
        return [] if self._closed else [self._sock.fileno()]

    def wait_fds(self) -> list:
        if self._closed:
            return []
        self._drain_socket()
        ready = bool(self._to_fail or self._ctl_out)
        if self._rx is not None and lib.ucxpy_ring_arm_consumer(self._rx):
            ready = True
        armed = []
        for ep in self._pending:
            if ep._tx is None or ep._held or not ep._queue:
                continue
            _am, h, p, _cb = ep._queue[0]
            need = lib.UCXPY_RING_PREFIX + len(h) + len(p) + 16
            armed.append(ep)
            if lib.ucxpy_ring_arm_producer(ep._tx) >= 2 * need:
                ready = True
        self._armed_producers = armed
        self._armed = True
        # first progress() after waking: check the socket and the pidfds
        self._next_housekeeping = self._next_liveness = 0.0
        if ready:
            self._wake(self._sock_name)     # make select() return at once
        return [self._sock.fileno()] + self._peers.fds()

    def _disarm(self) -> None:
        self._armed = False
        if self._rx is not None:
            lib.ucxpy_ring_disarm_consumer(self._rx)
        for ep in self._armed_producers:
            if ep._tx is not None:
                lib.ucxpy_ring_disarm_producer(ep._tx)
        self._armed_producers = []

    # -- teardown ----------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._rx is not None:
            lib.ucxpy_ring_close_consumer(self._rx)     # producers' pushes now fail
        exc = ConnectionLost("shm interface closed")
        for ep in list(self._eps):
            queued, ep._queue = ep._queue, deque()
            if ep._exc is None:
                ep._closed = True
                ep._exc = ConnectionLost("shm endpoint is closed")
                ep._release_resources(close_sent=False)
            for _am, _h, _p, cb in queued:
                if cb is not None:
                    cb(exc)
        self._peers.close()
        for inbox in self._peer_inboxes.values():
            inbox.close()
        self._peer_inboxes.clear()
        if not self._in_poll:
            self._unmap_inbox()
        self.md.close()
        self._sock.close()

    def _unmap_inbox(self) -> None:
        self._rx = None
        self.native = None          # (it reads the ring being unmapped)
        if self._rx_view is not None:
            self._rx_view.release()
            self._rx_view = None
        self._inbox.close()
