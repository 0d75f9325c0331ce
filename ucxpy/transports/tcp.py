"""TCP transport: frames over non-blocking stream sockets.

Theory of operation
-------------------
Each :class:`TcpInterface` owns one listening socket and one ``epoll`` set
holding the listener and every connection.  ``progress()`` asks epoll for ready
sockets with timeout 0 (one cheap syscall, cheaper than a failing ``recv`` on
each connection) and services only those; ``wait_fds()`` hands out the epoll
descriptor itself, which becomes readable whenever any socket has work, so an
idle worker can sleep in ``select``/``poll`` on a single fd.  An idle
``progress()`` costs about half a microsecond, so the intended policy is: spin
on it for ``busy_poll`` seconds after the last event, then sleep on
``wait_fds()`` (spinning wins on idle cores; on an oversubscribed machine only
sleeping keeps latency sane).

Interface address (network byte order, 8 + 4*n bytes)::

    version u8 | n u8 | port u16 | nonce u32 | n x IPv4 (4 bytes)

The listener binds one address (see :mod:`ucxpy.netaddr`): ``UCXPY_TCP_IFACE``,
else loopback for a single-host job or a process without a job key, else the
routed one; that address is the only one advertised (``n`` = 1; older
addresses with several IPs are still tried in turn, same-host ones first).
``nonce`` is random per interface and names it: a connector only accepts the
listener whose hello carries the nonce it dialled, so an IP that exists on
several hosts (docker bridges, ...) cannot connect us to the wrong process.
The nonce is no secret: membership is proven with the job key.

Handshake (version 2).  Both sides send ``HELLO`` (32 bytes) first::

    magic b"UXTC" | version u16 | role u16 (0 connector, 1 acceptor)
    | nonce u32 | flags u32 (0) | challenge 16 random bytes

the connector sends the interface nonce it wants, the acceptor its own; the
challenges are fresh for every connection.  Once a side has the peer's hello
it sends ``PROOF``, 32 bytes::

    HMAC-SHA256(job key, "ucxpy-tcp-2 <its role>", connector challenge,
                acceptor challenge, interface nonce, TLS binding)

and frames flow only after the peer's proof checked out
(``hmac.compare_digest``).  The hellos cross on the wire, so this costs one
extra round trip at connection time and nothing per frame.  A recorded
handshake replayed later fails (the other side's challenge is new); a side
cannot be made to prove for the other role (the role is in the label).  A
peer that fails is dropped without involving the owner and counted
(``rejected``, ``auth_failures``, ``ucxpy.auth.failures["tcp"]``).

TLS (``UCXPY_TCP_TLS=y``): the hello exchange runs inside TLS 1.3.  Each
process makes a throw-away self-signed certificate (``openssl`` command);
nobody checks it against a CA: instead the SHA-256 of the acceptor's
certificate is the *TLS binding* in both proofs, so a man in the middle
showing its own certificate cannot produce a valid proof (the certificate is
pinned through the job key).  Both sides of a job must agree on
``UCXPY_TCP_TLS``.

Frames and the receive side (ring, direct and big payloads) are in
:mod:`ucxpy.transports.tcp_frames`, which does no I/O.

One connection per pair.  A connection carries frames both ways
(``duplex``): the core answers a peer on the connection the peer opened, and
when both sides connected at once the one whose worker uuid is larger moves
to the other's (``Endpoint._move_to``, ``Worker._peer_moved``), so a pair
ends with one socket, as UCX's tcp does.  On loopback a one-way connection
costs an ACK packet per message that a reply otherwise carries: 8 B half
round trip 5.6 -> 5.2 us.  ``close()`` ends our direction only
(``shutdown(SHUT_WR)``); the peer's frames are delivered until its end of
stream.

Connection states
-----------------
=============  ===========================  ==================================
state          event                        next
=============  ===========================  ==================================
CONNECTING     socket writable, no error    HANDSHAKE (hello sent, or the TLS
                                            handshake started)
CONNECTING     error / timeout              CONNECTING (next IP) or FAILED
CONNECTING     all IPs failed, some only    CONNECTING after a backoff (0.05 s
               transiently (no route: ARP   doubling to 1 s), until
               lost on a lossy link)        peer_timeout since connect()
HANDSHAKE      TLS done (UCXPY_TCP_TLS)     HANDSHAKE (hello sent)
HANDSHAKE      valid peer hello             HANDSHAKE (proof sent)
HANDSHAKE      valid peer proof             ESTABLISHED (queued frames flow)
HANDSHAKE      bad hello or proof, EOF,     acceptor: dropped (counted);
               TLS error, peer_timeout      connector: CONNECTING (next IP)
                                            or FAILED
ESTABLISHED    EOF, reset, malformed frame  FAILED (owner.conn_failed once)
ESTABLISHED    close() and queue drained    DRAINING (shutdown(SHUT_WR) sent)
DRAINING       EOF / peer_timeout           CLOSED
=============  ===========================  ==================================
"""
from __future__ import annotations

import collections
import errno
import hmac
import os
import select
import socket
import struct
import time
from itertools import islice
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..lazy import logger
from .. import auth
from ..errors import (ConfigError, ConnectionLost, MessageTooLarge, ProtocolError,
                      TransportUnavailable)
from ..netaddr import advertised_ipv4s, local_ipv4s
from .base import (MAX_HEADER, Availability, Caps, Interface, TransportAttrs, TransportEndpoint,
                   byte_view)
from .tcp_frames import FRAME_MAGIC, PREFIX, FrameError, FrameReader

log = logger(__name__)

ADDR_VERSION = 1
_ADDR = struct.Struct("!BBHI")
HELLO_MAGIC = b"UXTC"
HELLO_VERSION = 2
_HELLO = struct.Struct("<4sHHII16s")
PROOF_LEN = auth.TAG_LEN
_PROOF_LABEL = (b"ucxpy-tcp-2 connector", b"ucxpy-tcp-2 acceptor")
_U32 = struct.Struct("<I")
ROLE_CONNECTOR, ROLE_ACCEPTOR = 0, 1
SHORT_FAST = 16384           # bytes payloads up to this take send()'s Python fast path
#: every write: a peer gone is EPIPE, never SIGPIPE (a C program that embeds
#: us, libucp's MPICH, keeps SIGPIPE's default, which kills the process)
_NOSIGNAL = socket.MSG_NOSIGNAL
TCP_SPINS = 64               # peeks per fast receive call (a system call each)
EAGER_LIMIT = 65536          # eager up to here, rendezvous (RTS, RTR, data) above
COALESCE_LIMIT = 1 << 16     # small queued frames are merged up to this size
MAX_IOV = 64
_IN, _OUT = select.POLLIN, select.POLLOUT
_QUICKACK = getattr(socket, "TCP_QUICKACK", 0)      # Linux

CONNECTING, HANDSHAKE, ESTABLISHED, DRAINING, FAILED, CLOSED = range(6)
_GONE = (FAILED, CLOSED)
_READING = (HANDSHAKE, ESTABLISHED, DRAINING)
#: connect errors worth retrying: the route or the neighbour (ARP) entry may come
#: back; refused / reset mean nobody listens there any more and fail at once
_RETRY_ERRNOS = frozenset((errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT,
                           errno.EAGAIN))
RETRY_FIRST, RETRY_MAX = 0.05, 1.0
_LOST_ERRNOS = (errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
                errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED, errno.ENOTCONN)


# ----------------------------------------------------------------- addresses

def pack_hello(role: int, nonce: int, challenge: bytes) -> bytes:
    """The 32-byte HELLO of ``role`` (see the module docstring)."""
    return _HELLO.pack(HELLO_MAGIC, HELLO_VERSION, role, nonce, 0, challenge)


def handshake_proof(key: bytes, role: int, connector_challenge: bytes,
                    acceptor_challenge: bytes, nonce: int, binding: bytes = b"") -> bytes:
    """The PROOF ``role`` sends: HMAC over both challenges, the acceptor's
    interface nonce and the TLS binding (empty without TLS)."""
    return auth.tag(key, _PROOF_LABEL[role], connector_challenge, acceptor_challenge,
                    _U32.pack(nonce), binding)


def pack_address(ips, port: int, nonce: int) -> bytes:
    return _ADDR.pack(ADDR_VERSION, len(ips), port, nonce) + b"".join(map(socket.inet_aton, ips))


def unpack_address(data) -> tuple:
    """-> (ips, port, nonce); raises TransportUnavailable if malformed."""
    data = bytes(data)
    try:
        ver, n, port, nonce = _ADDR.unpack_from(data)
    except struct.error:
        raise TransportUnavailable("malformed tcp address") from None
    if ver != ADDR_VERSION or n == 0 or len(data) != _ADDR.size + 4 * n:
        raise TransportUnavailable(f"malformed tcp address (version {ver}, {n} IPs, {len(data)} B)")
    ips = [socket.inet_ntoa(data[_ADDR.size + 4 * i:_ADDR.size + 4 * i + 4]) for i in range(n)]
    return ips, port, nonce


# ----------------------------------------------------------------- endpoint

class TcpEndpoint(TransportEndpoint):
    """One TCP connection (created by ``connect`` or by accepting); frames
    go both ways (``duplex``)."""

    duplex = True

    def __init__(self, iface: "TcpInterface", sock=None, candidates=(), port=0, nonce=0):
        self.iface = iface
        self.sock = sock
        self.fd = -1
        self._state = HANDSHAKE
        self._exc: Optional[BaseException] = None
        self._closing = False
        self._open = False            # ESTABLISHED and not closing: send()'s fast path
        self._deadline = 0.0
        self._want_out = False
        self.accepted = sock is not None
        self._candidates = list(candidates)
        self._port = port
        self._nonce = nonce           # connector: the nonce we expect from the listener
        self._tried = []
        self._retry = []              # IPs that failed transiently: tried again later
        self._backoff = RETRY_FIRST
        self._waiting = False         # CONNECTING, no socket, until _deadline (backoff)
        self._connect_by = 0.0        # give up retrying after this (set by connect())
        # send side: entries [buffer, on_complete or None, frames ending in it]
        self._sendq = collections.deque()
        self._qframes = 0
        # receive side: frames are cut by the reader; the handshake reads from its ring
        self._reader = FrameReader(iface.owner, self, iface.attrs.max_frame, iface.max_buffered)
        self._lent = None              # the core's C reader of this socket (lend_stream)
        self._verified = False         # the peer's proof checked out
        self._hs_step = 0              # 0: expecting the peer's hello, 1: its proof
        self._challenge = self._peer_challenge = self._binding = b""
        self._tls_pending = False      # TLS handshake still running
        if iface.tls is not None:      # the data plane writes and reads the socket itself
            self.stream_out = self.stream_in = None

    def __repr__(self):
        peer = "?"
        try:
            peer = "%s:%d" % self.sock.getpeername()
        except (OSError, AttributeError):
            pass
        return f"<TcpEndpoint {peer} state={self._state}>"

    # ---- sending
    @property
    def pending(self) -> int:
        return self._qframes

    def can_send(self) -> bool:
        return self._state < DRAINING and not self._closing

    def send(self, am_id: int, header, payload=b"",
             on_complete: Optional[Callable[[Optional[BaseException]], None]] = None) -> bool:
        # fast path: small bytes frame on an idle, open connection -> one send()
        if (self._open and type(payload) is bytes and type(header) is bytes
                and len(payload) <= SHORT_FAST and len(header) <= MAX_HEADER
                and not self._sendq and 0 <= am_id <= 255):
            data = PREFIX.pack(FRAME_MAGIC, am_id, 0, len(header), len(payload)) + header + payload
            try:
                n = self.sock.send(data, _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                exc = ConnectionLost(f"tcp send failed: {e}")
                self._fail(exc)
                raise exc from None
            if n != len(data):
                self._queue_copy(data[n:], 1)
            return True
        if self._state >= DRAINING or self._closing:
            raise self._exc or ConnectionLost("tcp endpoint is closed")
        if type(header) is not bytes:
            header = bytes(header)
        payload = byte_view(payload)
        plen = len(payload) if type(payload) is not memoryview else payload.nbytes
        hlen = len(header)
        if hlen > MAX_HEADER:
            raise MessageTooLarge(f"header of {hlen} B exceeds {MAX_HEADER} B")
        if not 0 <= am_id <= 255:
            raise ValueError(f"am_id {am_id} is not in 0..255")
        if plen > self.iface.attrs.max_frame:
            raise MessageTooLarge(f"payload of {plen} B exceeds tcp max_frame")
        head = PREFIX.pack(FRAME_MAGIC, am_id, 0, hlen, plen) + header
        q = self._sendq
        if plen <= self.iface.attrs.max_bcopy:
            data = head + payload if plen else head
            if not q and self._state == ESTABLISHED:
                n = self._send_now(data)
                if n == len(data):
                    return True
                data = data[n:]
            self._queue_copy(data, 1)
            return True
        by_ref = type(payload) is not bytes    # bytes cannot change under us
        if not q and self._state == ESTABLISHED:
            n = self._send_now(head, payload)
            if n == len(head) + plen:
                return True
            if n < len(head):
                self._queue_copy(head[n:], 0)
                n = 0
            else:
                n -= len(head)
            payload = memoryview(payload)[n:]
        else:
            self._queue_copy(head, 0)
            payload = memoryview(payload)
        q.append([payload, on_complete if by_ref else None, 1])
        self._qframes += 1
        self._set_out(True)
        return not by_ref

    def _send_now(self, *bufs) -> int:
        try:
            return self.sock.send(bufs[0], _NOSIGNAL) if len(bufs) == 1 \
                else self.sock.sendmsg(bufs, (), _NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            exc = ConnectionLost(f"tcp send failed: {e}")
            self._fail(exc)
            raise exc from None

    def _queue_copy(self, data, nframes: int) -> None:
        q = self._sendq
        if q:
            last = q[-1]
            if type(last[0]) is bytearray and len(last[0]) < COALESCE_LIMIT:
                last[0] += data
                last[2] += nframes
                self._qframes += nframes
                return
        q.append([bytearray(data), None, nframes])
        self._qframes += nframes
        self._set_out(True)

    def _set_out(self, want: bool) -> None:
        lent = self._lent
        if lent is not None:           # (frames of ours queued: the C writer waits)
            lent.out_open = not want and self._open
        if want != self._want_out and self._state == ESTABLISHED:
            self._want_out = want
            self.iface._poller.modify(self.fd, self._interest())

    def _interest(self) -> int:
        """The poller's events for our socket: in (unless lent), out while
        frames are queued."""
        return (0 if self._lent is not None else _IN) | (_OUT if self._want_out else 0)

    def _flush(self) -> int:
        """Write as much of the queue as the socket takes; return frames completed."""
        q = self._sendq
        done = 0
        finished = []    # callbacks run once the queue is consistent (they may send or close)
        while q and self._state == ESTABLISHED:
            try:
                if len(q) == 1:
                    want = len(q[0][0]) if type(q[0][0]) is not memoryview else q[0][0].nbytes
                    n = self.sock.send(q[0][0], _NOSIGNAL)
                else:
                    entries = list(islice(q, MAX_IOV))
                    want = sum(e[0].nbytes if type(e[0]) is memoryview else len(e[0]) for e in entries)
                    n = self.sock.sendmsg([e[0] for e in entries], (), _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._fail(ConnectionLost(f"tcp send failed: {e}"))
                break
            short = n < want
            while n:
                entry = q[0]
                buf = entry[0]
                size = buf.nbytes if type(buf) is memoryview else len(buf)
                if n < size:
                    if type(buf) is bytearray:
                        del buf[:n]
                    else:
                        entry[0] = buf[n:]
                    break
                n -= size
                q.popleft()
                self._qframes -= entry[2]
                done += entry[2]
                if entry[1] is not None:
                    finished.append(entry[1])
            if short:
                break
        for cb in finished:
            cb(None)
        if self._state == ESTABLISHED:
            if q:
                self._set_out(True)
            else:
                self._set_out(False)
                if self._closing:
                    self._shutdown()
        return done

    # ---- the socket lent to the data plane's tcp eager path (the contract's stream_*)
    native_max_frame = EAGER_LIMIT
    stream_spins = TCP_SPINS

    def stream_out(self) -> int:
        """The socket, when a frame written to it now is next in this
        connection's order (open, nothing queued); else -1."""
        return self.fd if self._open and not self._sendq else -1

    def stream_tail(self, data: bytes) -> None:
        """The rest of one frame the socket took only part of: queued first."""
        self._queue_copy(data, 1)

    def stream_in(self) -> int:
        """The socket, when its next bytes are this connection's next frame
        (open, nothing of it buffered here, not inside our own progress);
        else -1."""
        reader = self._reader
        if not self._open or reader.start != reader.end or reader.pending is not None \
                or self.iface._in_progress or self._lent is not None:
            return -1
        return self.fd

    def stream_fail(self, exc: BaseException) -> None:
        """The data plane found the stream out of step: the connection fails."""
        self._fail(ProtocolError(f"tcp eager path: {exc}"))

    def stream_spill(self, data: bytes, parse: bool) -> None:
        """Bytes the data plane read from the socket and did not take: the
        head of the stream (:meth:`_spill`; delivered by our next pass when
        this one is running now)."""
        self._spill(data, parse and not self.iface._in_progress)

    def lend_stream(self, stream) -> None:
        """The core's C reader (a ``ucxpy._dp.Stream`` on :meth:`stream_in`'s
        socket) reads the socket from now on: we read it no more (the poller
        stops asking for it) and keep ``stream.out_open`` (a frame written now
        is next: open, nothing of ours queued) until :meth:`unlend_stream`."""
        self._lent = stream
        stream.out_open = self._open and not self._sendq
        stream.lent = True
        self.iface._poller.modify(self.fd, self._interest())

    def unlend_stream(self) -> None:
        """Read the socket again (the core takes back what its reader read,
        and gives it to :meth:`stream_spill`)."""
        stream, self._lent = self._lent, None
        if stream is None:
            return
        stream.reclaim()
        stream.out_open = False
        if self._state in _READING and self.fd >= 0:
            self.iface._poller.modify(self.fd, self._interest())

    @property
    def stream_lent(self) -> bool:
        return self._lent is not None

    def _spill(self, data: bytes, parse: bool) -> None:
        """Put ``data``, read from the socket by the fast path but not taken
        by it, in front of the (empty) reader.  With no message taken
        (``parse``) its frames are delivered now, as a progress pass would;
        behind a message taken they wait for the interface's next progress
        (``_spilled``): the caller has yet to finish that receive, which a
        frame behind it could otherwise match too."""
        reader = self._reader
        k = len(data)
        reader.buf[:k] = data
        reader.start, reader.end = 0, k
        if not parse:
            self.iface._spilled.add(self)
            return
        self.iface._in_progress = True
        try:
            self._parse_spill()
        finally:
            self.iface._in_progress = False

    def _parse_spill(self) -> int:
        try:
            return self._reader.parse()
        except FrameError as e:
            return self._protocol_error(str(e))

    def hand_over(self, other) -> bool:
        if self._state not in (CONNECTING, HANDSHAKE) or self._closing or other is self \
                or type(other) is not TcpEndpoint or other._sendq or not other.can_send():
            return False
        q, n = self._sendq, self._qframes
        self._sendq, self._qframes = collections.deque(), 0
        self._closing = True            # dropped on purpose: no failure to report
        self._finish(None)
        other._sendq, other._qframes = q, n
        if other._state == ESTABLISHED:
            other._flush()
        return True

    # ---- closing and failure
    def close(self) -> None:
        """Flush what the socket takes now; shut down once the queue is empty."""
        if self._state in _GONE or self._closing:
            return
        self._closing = True
        self._open = False
        if self._lent is not None:
            self._lent.out_open = False
        if self._state == ESTABLISHED:
            self._flush()

    def _shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._finish(ConnectionLost("tcp endpoint closed"))
            return
        self._want_out = False
        # our direction is done; the peer's frames (duplex) are delivered
        # until its end of stream, which it sends once it sees ours (by the
        # core's C reader while it reads the socket)
        self.iface._poller.modify(self.fd, self._interest())
        self._state = DRAINING
        self._deadline = time.monotonic() + self.iface.peer_timeout
        self.iface._timed.add(self)

    def _fail(self, exc: BaseException, notify: bool = True) -> None:
        """Break the connection; owner.conn_failed and callbacks run from progress."""
        if self._state in _GONE:
            return
        if self._closing:
            notify = False   # the owner asked for the close; do not report it as a failure
        self._exc = exc
        cbs = self._finish(exc)
        self._state = FAILED
        self.iface._notify.append((self, exc if notify else None, cbs))

    def _finish(self, exc) -> list:
        """Release the socket and the queues; return the queued callbacks."""
        cbs = [e[1] for e in self._sendq if e[1] is not None]
        self._sendq.clear()
        self._qframes = 0
        if self._lent is not None:     # (before the socket goes)
            self._lent.reclaim()
            self._lent.out_open = False
            self._lent = None
        self._reader.reset()
        self._reader.live = False
        self._state = CLOSED
        self._open = False
        self._exc = self._exc or exc
        self.iface._forget(self)
        return cbs

    # ---- connecting (connector side)
    def _connect_next(self) -> None:
        """Start a non-blocking connect to the next candidate IP (or fail)."""
        iface = self.iface
        if self.sock is not None:
            iface._forget(self)
        if not self._candidates and self._retry:
            now = time.monotonic()
            if now + self._backoff < self._connect_by:
                self._candidates, self._retry = self._retry, []
                self._state = CONNECTING
                self._waiting = True
                self._deadline = now + self._backoff
                self._backoff = min(2 * self._backoff, RETRY_MAX)
                iface._timed.add(self)
                return
        if not self._candidates:
            self._state = HANDSHAKE    # so that _fail goes through
            del self._tried[:-6]       # the last attempts say enough
            self._fail(ConnectionLost("tcp: cannot connect to peer: " + "; ".join(self._tried)))
            return
        ip = self._candidates.pop(0)
        sock = iface._new_socket()
        self.sock, self.fd = sock, sock.fileno()
        self._state = CONNECTING
        self._want_out = False
        self._reader.reset()
        self._verified = False
        self._addr = (ip, self._port)
        self._deadline = time.monotonic() + iface.peer_timeout
        iface._by_fd[self.fd] = self
        iface._poller.register(self.fd, _IN | _OUT)
        iface._timed.add(self)
        err = sock.connect_ex(self._addr)
        if err == 0:
            self._connected()
        elif err not in (errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY):
            self._connect_failed(err)

    def _finish_connect(self) -> None:
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._connect_failed(err)
        else:
            self._connected()

    def _connect_failed(self, err: int) -> None:
        self._tried.append(f"{self._addr[0]}:{self._port}: {os.strerror(err)}")
        if err in _RETRY_ERRNOS:
            self._retry.append(self._addr[0])
        self._connect_next()

    def _connected(self) -> None:
        """TCP is up: start the handshake, which must finish within peer_timeout."""
        self.iface._poller.modify(self.fd, _IN)
        self._state = HANDSHAKE
        self._deadline = time.monotonic() + self.iface.peer_timeout
        self.iface._timed.add(self)
        self._hs_begin()

    # ---- handshake (both roles)
    def _hs_begin(self) -> None:
        """Fresh challenge; then TLS first (UCXPY_TCP_TLS) or the hello at once."""
        self._challenge = auth.new_nonce()
        self._peer_challenge = b""
        self._hs_step = 0
        self._binding = b""
        tls = self.iface.tls
        if tls is None:
            self._send_hello()
            return
        try:
            self.sock = tls.wrap(self.sock, server=self.accepted)
        except OSError as e:
            self._bad_hello(f"cannot start TLS: {e}")
            return
        self._tls_pending = True
        self._tls_step()

    def _tls_step(self) -> None:
        """Advance the non-blocking TLS handshake; send the hello once it is done."""
        import ssl          # (deferred with tcp_tls: only jobs that use TLS load it, 7 ms)
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.iface._poller.modify(self.fd, _IN)
            return
        except ssl.SSLWantWriteError:
            self.iface._poller.modify(self.fd, _IN | _OUT)
            return
        except (ssl.SSLError, OSError) as e:
            self._bad_hello(f"TLS handshake failed: {e}")
            return
        self._tls_pending = False
        self.iface._poller.modify(self.fd, _IN)
        self._binding = self.sock.binding(server=self.accepted)
        self._send_hello()

    def _send_hello(self) -> None:
        role, nonce = ((ROLE_ACCEPTOR, self.iface.nonce) if self.accepted
                       else (ROLE_CONNECTOR, self._nonce))
        self._hs_send(pack_hello(role, nonce, self._challenge))

    def _hs_send(self, data: bytes) -> None:
        """Handshake messages are tiny and go into an empty socket buffer."""
        try:
            n = self.sock.send(data, _NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._bad_hello(f"handshake send failed: {e}")
            return
        if n != len(data):
            self._bad_hello("handshake message did not fit the socket buffer")

    def _proof(self, role: int) -> bytes:
        if self.accepted:
            nc, na, nonce = self._peer_challenge, self._challenge, self.iface.nonce
        else:
            nc, na, nonce = self._challenge, self._peer_challenge, self._nonce
        return handshake_proof(self.iface.key, role, nc, na, nonce, self._binding)

    def _bad_hello(self, why: str) -> None:
        if self.accepted:
            self.iface.rejected += 1
            log.debug("tcp: rejected incoming connection %r: %s", self, why)
            self._fail(ProtocolError(why), notify=False)
        else:
            self._tried.append(f"{self._addr[0]}:{self._port}: {why}")
            self._connect_next()

    def _handshake(self) -> None:
        """Consume the peer's handshake messages buffered in the reader's ring
        (hello, then proof); on a valid proof the connection is ESTABLISHED."""
        reader, sock = self._reader, self.sock
        while not self._verified and self.sock is sock and self._state == HANDSHAKE:
            if self._hs_step == 0:
                head = reader.buf[reader.start:reader.start + 4]
                if len(head) == 4 and head != HELLO_MAGIC:
                    return self._bad_hello(f"not a ucxpy tcp peer (starts with {bytes(head)!r})")
                msg = reader.take(_HELLO.size)
            else:
                msg = reader.take(PROOF_LEN)
            if msg is None:
                return
            self._check_handshake(msg)

    def _check_handshake(self, msg: bytes) -> None:
        """Check the peer's next handshake message (hello, then proof)."""
        mine = ROLE_ACCEPTOR if self.accepted else ROLE_CONNECTOR
        peer = 1 - mine
        if self._hs_step == 0:
            magic, ver, role, nonce, flags, challenge = _HELLO.unpack(msg)
            want_nonce = self.iface.nonce if self.accepted else self._nonce
            if magic != HELLO_MAGIC or role != peer:
                return self._bad_hello(f"not a ucxpy tcp peer (hello {bytes(magic)!r}, "
                                       f"role {role})")
            if ver != HELLO_VERSION:
                return self._bad_hello(f"tcp protocol version {ver}, expected {HELLO_VERSION}")
            if nonce != want_nonce:
                return self._bad_hello("peer is a different ucxpy interface (nonce mismatch)")
            if flags:
                return self._bad_hello(f"unknown hello flags {flags:#x}")
            self._peer_challenge = bytes(challenge)
            self._hs_step = 1
            return self._hs_send(self._proof(mine))
        if not hmac.compare_digest(msg, self._proof(peer)):
            self.iface.auth_failures += 1
            auth.refused("tcp", "proof does not match the job key", repr(self))
            return self._bad_hello("peer failed authentication (wrong or no job key)")
        self._verified = True
        self._state = ESTABLISHED
        self._open = not self._closing
        self.iface._timed.discard(self)
        if self._sendq:
            self._flush()
        elif self._closing:
            self._shutdown()

    # ---- receiving
    def _on_readable(self) -> int:
        """Read everything available; deliver complete frames; return their count."""
        events = 0
        sock, reader = self.sock, self._reader
        while True:
            room = reader.space()
            want = room.nbytes
            try:
                if reader.pending is not None and _QUICKACK:
                    # a payload of many segments: acknowledge each read at
                    # once.  A connection carrying frames both ways (duplex)
                    # is in Linux's interactive "pingpong" mode, whose
                    # delayed ACKs starve the sender of a bulk transfer (4
                    # MiB ping-pong 750 -> 1150 us without this); the mode
                    # comes back by itself.
                    sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
                n = sock.recv_into(room)
            except (BlockingIOError, InterruptedError):
                return events
            except OSError as e:
                return events + self._read_error(e)
            if n == 0:
                return events + self._read_error(None)
            try:
                if self._verified:
                    if reader.pending is None:      # = reader.received(n), one call less
                        reader.end += n
                        events += reader.parse()
                    else:
                        events += reader.received(n)
                else:
                    reader.end += n
                    self._handshake()
                    if self._state == ESTABLISHED and self.sock is sock:
                        events += reader.parse()
            except FrameError as e:
                return events + self._protocol_error(str(e))
            if self._state not in _READING or self.sock is not sock \
                    or n < want and reader.pending is None:
                return events

    def _read_error(self, err: Optional[OSError]) -> int:
        if self._state == DRAINING:
            self._finish(None)
        elif self._state == HANDSHAKE and not self._verified:
            if self.accepted:
                self._fail(ConnectionLost("stray connection closed"), notify=False)
            else:
                self._bad_hello(f"closed during handshake ({err or 'EOF'})")
        elif err is None:
            self._fail(ConnectionLost("tcp peer closed the connection"))
        else:
            self._fail(ConnectionLost(f"tcp connection lost: {err}"))
        return 0

    def _protocol_error(self, why: str) -> int:
        log.warning("tcp: %s from %r; closing the connection", why, self)
        self._fail(ProtocolError(f"tcp: {why}"))
        return 0


# ----------------------------------------------------------------- interface

class TcpInterface(Interface):
    """Frames over TCP sockets; reaches any host with an IPv4 route."""

    name = "tcp"

    def __init__(self, owner, config) -> None:
        super().__init__(owner, config)
        self.attrs = TransportAttrs(
            caps=Caps.AM_SHORT | Caps.AM_BCOPY | Caps.AM_ZCOPY | Caps.RX_ZCOPY | Caps.CONNECT_TO_IFACE,
            max_short=256, max_bcopy=EAGER_LIMIT, max_frame=1 << 40,
            latency=10e-6, bandwidth=2e9, overhead=2e-6, priority=1)
        self.peer_timeout = float(getattr(config, "peer_timeout", 0) or 30.0)
        #: largest non-direct payload buffered in memory; larger is a ProtocolError
        self.max_buffered = int(getattr(config, "tcp_max_buffered", 0) or (1 << 30))
        self._sndbuf = int(getattr(config, "tcp_sndbuf", 0) or 0)
        self._rcvbuf = int(getattr(config, "tcp_rcvbuf", 0) or 0)
        self.nonce = int.from_bytes(os.urandom(4), "little")
        #: incoming connections dropped during the handshake (stray clients,
        #: wrong protocol, failed authentication)
        self.rejected = 0
        #: handshakes whose proof did not match our key (either role)
        self.auth_failures = 0
        job_key = auth.job_key(config)
        self.key = job_key or auth.process_key()
        self.tls = None
        if getattr(config, "tcp_tls", False):
            from .tcp_tls import TlsCredentials     # deferred: TLS (ssl, 7 ms) only when asked for
            self.tls = TlsCredentials.get()
        tcp_iface = getattr(config, "tcp_iface", "") or ""
        ips = advertised_ipv4s(tcp_iface, keyed=job_key is not None)
        self._by_fd: dict = {}
        self._timed: set = set()
        self._notify = collections.deque()
        #: connections whose reader holds bytes the fast path read behind a
        #: message it took (TcpEndpoint._spill): parsed by the next progress
        self._spilled: set = set()
        self._ready_fd = None
        self._in_progress = False
        self._closed = False
        lsock = self._new_socket()
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((ips[0], 0))
            lsock.listen(512)
        except OSError as e:
            lsock.close()
            raise TransportUnavailable(f"tcp: cannot listen: {e}") from None
        self._listener = lsock
        self._lfd = lsock.fileno()
        self._address = pack_address(ips, lsock.getsockname()[1], self.nonce)
        self._local_ips = set(local_ipv4s()) | {"127.0.0.1"}
        self._poller = select.epoll() if hasattr(select, "epoll") else select.poll()
        self._poller.register(self._lfd, _IN)

    @classmethod
    def query(cls, config) -> Availability:
        try:
            ips = advertised_ipv4s(getattr(config, "tcp_iface", "") or "",
                                   keyed=auth.job_key(config) is not None)
            socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
            if getattr(config, "tcp_tls", False):
                from .tcp_tls import TlsCredentials     # deferred: TLS (ssl) only when asked for
                TlsCredentials.get()
        except (OSError, TransportUnavailable, ConfigError) as e:
            return Availability(False, str(e))
        return Availability(True, "TLS" if getattr(config, "tcp_tls", False) else "",
                            devices=ips)

    def address(self) -> bytes:
        return self._address

    def is_reachable(self, address: bytes, host_id: bytes) -> bool:
        try:
            unpack_address(address)
        except TransportUnavailable:
            return False
        return True

    def connect(self, address: bytes) -> TcpEndpoint:
        """Start connecting to the interface at ``address``; returns at once."""
        if self._closed:
            raise ConnectionLost("tcp interface is closed")
        ips, port, nonce = unpack_address(address)
        # same-host IPs first; they always route, and the nonce check rejects impostors
        ips = sorted(ips, key=lambda ip: ip not in self._local_ips)
        ep = TcpEndpoint(self, candidates=ips, port=port, nonce=nonce)
        ep._connect_by = time.monotonic() + self.peer_timeout
        ep._connect_next()
        return ep

    def _new_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tune(sock)
        return sock

    def _tune(self, sock) -> None:
        """Non-blocking, no Nagle; keepalive and a user timeout of about
        ``peer_timeout`` so a vanished host (no FIN, no RST) is noticed too."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        idle = max(1, int(self.peer_timeout / 3))
        for level, opt, val in ((socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
                                (socket.IPPROTO_TCP, "TCP_KEEPIDLE", idle),
                                (socket.IPPROTO_TCP, "TCP_KEEPINTVL", idle),
                                (socket.IPPROTO_TCP, "TCP_KEEPCNT", 2),
                                (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", int(self.peer_timeout * 1000))):
            if hasattr(socket, opt):
                try:
                    sock.setsockopt(level, getattr(socket, opt), val)
                except OSError:
                    pass
        if self._sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._sndbuf)
        if self._rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)

    def _accept(self) -> int:
        n = 0
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return n
            except OSError as e:   # EMFILE and friends: leave it in the backlog
                log.warning("tcp: accept failed: %s", e)
                return n
            self._tune(sock)
            ep = TcpEndpoint(self, sock=sock)
            ep.fd = sock.fileno()
            ep._deadline = time.monotonic() + self.peer_timeout    # for the handshake
            self._timed.add(ep)
            self._by_fd[ep.fd] = ep
            self._poller.register(ep.fd, _IN)
            ep._hs_begin()
            n += 1

    def _forget(self, ep: TcpEndpoint) -> None:
        """Unregister and close ``ep``'s socket."""
        self._timed.discard(ep)
        if self._by_fd.get(ep.fd) is ep:
            del self._by_fd[ep.fd]
            try:
                self._poller.unregister(ep.fd)
            except (OSError, ValueError, KeyError):
                pass
        if ep.sock is not None:
            ep.sock.close()
        ep.fd = -1

    def progress(self) -> int:
        if self._in_progress or self._closed:
            return 0
        ready = self._poller.poll(0)
        if not ready and not self._notify and not self._timed and not self._spilled:
            return 0
        self._in_progress = True
        events = 0
        try:
            while self._spilled:
                ep = self._spilled.pop()
                if ep._state in _READING and not self._closed:
                    events += ep._parse_spill()
            for fd, ev in ready:
                if self._closed:      # an owner callback closed us
                    return events
                if fd == self._lfd:
                    events += self._accept()
                    continue
                ep = self._by_fd.get(fd)
                if ep is None:
                    continue
                if ep._state == CONNECTING:
                    ep._finish_connect()
                    continue
                if ep._tls_pending:
                    ep._tls_step()
                    if ep._tls_pending or ep._state != HANDSHAKE:
                        continue
                    # TLS may hold the peer's hello already: epoll will not say so
                    events += ep._on_readable()
                    continue
                if ev & (_IN | select.POLLERR | select.POLLHUP) and ep._lent is None:
                    events += ep._on_readable()     # (a lent socket is the core's to read)
                if ev & _OUT and ep._state == ESTABLISHED:
                    events += ep._flush()
            if self._timed:
                self._check_deadlines()
            while self._notify:
                ep, exc, cbs = self._notify.popleft()
                events += 1
                if exc is not None:
                    self.owner.conn_failed(ep, exc)
                for cb in cbs:
                    cb(exc or ep._exc or ConnectionLost("tcp endpoint closed"))
        finally:
            self._in_progress = False
        return events

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for ep in [ep for ep in self._timed if ep._deadline < now]:
            if ep._state == CONNECTING and ep._waiting:
                ep._waiting = False
                ep._connect_next()
            elif ep._state == CONNECTING:
                ep._tried.append(f"{ep._addr[0]}:{ep._port}: connect timed out")
                ep._connect_next()
            elif ep._state == DRAINING:
                ep._finish(None)
            elif ep._state == HANDSHAKE and not ep._verified:
                ep._bad_hello("no handshake within peer_timeout")
            else:
                self._timed.discard(ep)

    def c_quiet(self) -> bool:
        """Nothing for our progress but what the core's C readers do: every
        connection's reading lent, nothing queued, no handshake, deadline,
        notice or spilled bytes (a C caller's progress then leaves us to the
        control descriptors: :meth:`control_fds`)."""
        if self._timed or self._notify or self._spilled or self._closed:
            return False
        return all(ep._lent is not None and not ep._sendq for ep in self._by_fd.values())

    def control_fds(self) -> list:
        """The contract's: the epoll descriptor (a connection request, data,
        room for queued sends), or the listening socket without epoll."""
        if self._closed:
            return []
        return [self._poller.fileno()] if isinstance(self._poller, select.epoll) else [self._lfd]

    def wait_fds(self) -> list:
        """The epoll descriptor: readable when any socket of ours has work
        (incoming data, a connect completing, room for queued sends).  While
        a reader holds spilled bytes (``_spilled``), which no socket shows,
        also a descriptor that is always readable: the sleep ends at once."""
        if self._closed:
            return []
        fds = [self._poller.fileno()] if isinstance(self._poller, select.epoll) \
            else [self._lfd] + list(self._by_fd)
        if self._spilled:
            if self._ready_fd is None:
                r, w = os.pipe()
                os.write(w, b"!")
                os.close(w)
                self._ready_fd = r
            fds.append(self._ready_fd)
        return fds

    def close(self) -> None:
        """Close every connection and the listener; queued sends fail."""
        if self._closed:
            return
        self._closed = True
        cbs = []
        for ep in list(self._by_fd.values()):
            if ep._state == ESTABLISHED and ep._sendq:
                ep._flush()
            cbs += ep._finish(ConnectionLost("tcp interface closed"))
        while self._notify:
            cbs += self._notify.popleft()[2]
        for cb in cbs:
            cb(ConnectionLost("tcp interface closed"))
        self._listener.close()
        self._spilled.clear()
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None
        if isinstance(self._poller, select.epoll):
            self._poller.close()
