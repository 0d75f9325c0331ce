"""TLS for the tcp transport (``UCXPY_TCP_TLS=y``).

Each process makes one throw-away self-signed certificate (EC P-256, with
the ``openssl`` command: Python's ``ssl`` module cannot make keys) the first
time a tcp interface needs it.  Nothing checks it against a CA; the tcp
handshake pins it instead: both HMAC proofs cover the SHA-256 of the
acceptor's certificate (:meth:`TlsStream.binding`), which only the job's
members can compute, so a man in the middle with a certificate of its own
fails the proof.  TLS 1.3 only.

:class:`TlsStream` puts a non-blocking ``SSLSocket`` behind the few socket
calls :class:`~ucxpy.transports.tcp.TcpEndpoint` makes, with the semantics
it relies on:

* ``recv_into`` reads until the view is full or TLS needs more from the
  kernel, so "fewer bytes than asked" still means "nothing left" (epoll
  cannot see plaintext that OpenSSL already decrypted and buffered);
  ``BlockingIOError`` when nothing was read; ``0`` at end of stream;
* ``send`` / ``sendmsg`` return how many bytes were taken.  OpenSSL wants a
  write it could not finish retried with the same bytes: the endpoint
  always retries from its first unsent byte, and the stream remembers how
  long that pending write was.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading

from ..errors import TransportUnavailable

#: bytes handed to one SSL_write (OpenSSL cuts records of 16 KiB itself)
WRITE_CHUNK = 1 << 18
#: small buffers of a sendmsg() are joined up to this size before one write
JOIN_LIMIT = 1 << 14


class TlsCredentials:
    """This process's certificate and the two TLS contexts built on it."""

    _lock = threading.Lock()
    _mine = None          # (pid, TlsCredentials)

    @classmethod
    def get(cls) -> "TlsCredentials":
        """The process's credentials, made on first use (a forked child makes
        its own).  Raises TransportUnavailable where none can be made."""
        with cls._lock:
            if cls._mine is None or cls._mine[0] != os.getpid():
                cls._mine = (os.getpid(), cls())
            return cls._mine[1]

    def __init__(self):
        openssl = shutil.which("openssl")
        if openssl is None:
            raise TransportUnavailable("tcp: UCXPY_TCP_TLS needs the openssl command to make "
                                       "a certificate (apt-get install openssl)")
        with tempfile.TemporaryDirectory(prefix="ucxpy-tls-") as d:     # mode 700
            key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
            try:
                subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                "ec_paramgen_curve:prime256v1", "-nodes", "-batch",
                                "-subj", "/CN=ucxpy", "-days", "30",
                                "-keyout", key, "-out", cert],
                               check=True, capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                raise TransportUnavailable(f"tcp: cannot make a TLS certificate: {e}") from None
            self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.server.minimum_version = ssl.TLSVersion.TLSv1_3
            self.server.load_cert_chain(cert, key)
            with open(cert) as f:
                der = ssl.PEM_cert_to_DER_cert(f.read())
        self.fingerprint = hashlib.sha256(der).digest()
        self.client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.client.minimum_version = ssl.TLSVersion.TLSv1_3
        self.client.check_hostname = False
        self.client.verify_mode = ssl.CERT_NONE      # pinned by the proofs instead

    def wrap(self, sock: socket.socket, server: bool) -> "TlsStream":
        ctx = self.server if server else self.client
        return TlsStream(ctx.wrap_socket(sock, server_side=server,
                                         do_handshake_on_connect=False), self)


class TlsStream:
    """An ``SSLSocket`` with plain-socket semantics (see the module docstring)."""

    __slots__ = ("_s", "_creds", "_retry", "_eof")

    def __init__(self, ssock: ssl.SSLSocket, creds: TlsCredentials):
        self._s = ssock
        self._creds = creds
        self._retry = 0           # length of the write OpenSSL wants retried
        self._eof = False

    def do_handshake(self) -> None:
        self._s.do_handshake()

    def binding(self, server: bool) -> bytes:
        """SHA-256 of the acceptor's certificate, as this side sees it."""
        if server:
            return self._creds.fingerprint
        der = self._s.getpeercert(binary_form=True)
        return hashlib.sha256(der).digest() if der else b""

    # -- what TcpEndpoint calls -------------------------------------------------
    def fileno(self) -> int:
        return self._s.fileno()

    def getpeername(self):
        return self._s.getpeername()

    def getsockopt(self, *args):
        return self._s.getsockopt(*args)

    def setsockopt(self, *args):
        return self._s.setsockopt(*args)

    def shutdown(self, how) -> None:
        # no close_notify: the stream's own CLOSE frame already said goodbye,
        # and what is read afterwards is discarded
        socket.socket.shutdown(self._s, how)

    def close(self) -> None:
        self._s.close()

    def send(self, data, flags=0) -> int:
        return self.sendmsg((data,))

    def sendmsg(self, bufs, ancdata=(), flags=0) -> int:
        """Write from ``bufs`` in order; small ones are joined into one write,
        big ones written in place.  Returns the bytes taken (BlockingIOError
        if none).  (``ancdata`` and ``flags``, a plain socket's, are not
        used: OpenSSL writes.)"""
        views = []
        for b in bufs:
            mv = b if type(b) is memoryview else memoryview(b)
            views.append(mv if mv.ndim == 1 and mv.format == "B" else mv.cast("B"))
        total, k, off, nv = 0, 0, 0, len(views)
        while k < nv:
            left = views[k].nbytes - off
            if left == 0:
                k, off = k + 1, 0
                continue
            if self._retry:
                n = self._retry
            elif left >= JOIN_LIMIT:
                n = min(left, WRITE_CHUNK)
            else:
                n, j = left, k + 1
                while j < nv and n + views[j].nbytes <= JOIN_LIMIT:
                    n += views[j].nbytes
                    j += 1
            chunk = _gather(views, k, off, n)
            try:
                self._s.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                self._retry = n
                break
            self._retry = 0
            total += n
            while n:                      # advance past what was written
                step = min(n, views[k].nbytes - off)
                n -= step
                off += step
                if off == views[k].nbytes:
                    k, off = k + 1, 0
        if total == 0 and any(v.nbytes for v in views):
            raise BlockingIOError("TLS write would block")
        return total

    def recv_into(self, view) -> int:
        if self._eof:
            return 0
        mv = view if type(view) is memoryview else memoryview(view)
        want, n = mv.nbytes, 0
        while n < want:
            try:
                got = self._s.recv_into(mv[n:])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                got = 0
            if got == 0:
                self._eof = True
                break
            n += got
        if n == 0 and not self._eof:
            raise BlockingIOError("no TLS data")
        return n


def _gather(views, k: int, off: int, n: int):
    """``n`` bytes starting at ``views[k][off]``: a slice where they lie in
    one view, else joined."""
    first = views[k]
    if first.nbytes - off >= n:
        return first[off:off + n]
    parts, need = [], n
    while need and k < len(views):
        piece = views[k][off:off + need]
        parts.append(piece)
        need -= piece.nbytes
        k, off = k + 1, 0
    if need:
        # the pending write was longer than what the caller now offers: the
        # endpoint never shrinks its queue, so this is a bug, not input
        raise OSError("TLS: retried write is shorter than the pending one")
    return b"".join(parts)
