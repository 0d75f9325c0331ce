"""The rank's side of ``ucxpy-run``'s rendezvous service, spoken over plain
sockets: a minimal ZMTP 3.0 peer (RFC 23, NULL mechanism) for one DEALER
and one SUB connection.

A rank needs two sockets, a request line to the launcher's ROUTER and a
subscription to its PUB, and exchanges a handful of messages in its whole
life.  pyzmq costs every rank 35-40 ms of CPU to import and two threads to
run (a 16-rank job on 2 cores pays it 16 times over), so the rank speaks
the wire protocol itself; the launcher keeps libzmq (``rendezvous.py``).

What is implemented, and all a rank needs:

* the 64-byte greeting (signature, version 3.0, mechanism ``NULL``, client);
* the ``READY`` command with ``Socket-Type`` (``DEALER`` or ``SUB``); the
  peer's ``READY`` is checked (``ROUTER`` or ``PUB``) and an ``ERROR``
  command ends the connection;
* messages as frames (flags: MORE, LONG; sizes 1 or 8 octets);
* a subscription, ZMTP 3.0's way: a message ``\\x01`` + prefix.

Commands the peer may send later (ZMTP 3.1's heartbeats are not offered to a
3.0 peer) are skipped.  There is no reconnection: the service lives as long
as the job, and a lost connection is the launcher gone
(:class:`ConnectionError`).  Messages are length-delimited, so a timeout in
the middle of one keeps what was read for the next call.
"""
from __future__ import annotations

import select
import socket
import struct
import time

__all__ = ["Connection", "parse_endpoint"]

_FLAG_MORE, _FLAG_LONG, _FLAG_COMMAND = 0x01, 0x02, 0x04
#: signature (0xFF, 8 octets of padding, 0x7F), version 3.0, mechanism, as-server, filler
GREETING = (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0"
            + bytes(31))
#: the peer socket types each of ours works with
_PEER = {b"DEALER": (b"ROUTER", b"DEALER", b"REP"), b"SUB": (b"PUB", b"XPUB")}


def parse_endpoint(addr: str):
    """``tcp://host:port`` (``[v6]`` in brackets) -> (family, host, port)."""
    if not addr.startswith("tcp://"):
        raise ValueError(f"{addr!r}: only tcp:// endpoints are supported")
    host, sep, port = addr[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r}: no port")
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, host[1:-1], int(port)
    return socket.AF_INET, host, int(port)


def _command(name: bytes, props: dict) -> bytes:
    body = bytes([len(name)]) + name
    for k, v in props.items():
        body += bytes([len(k)]) + k + struct.pack(">I", len(v)) + v
    if len(body) > 255:
        return bytes([_FLAG_COMMAND | _FLAG_LONG]) + struct.pack(">Q", len(body)) + body
    return bytes([_FLAG_COMMAND, len(body)]) + body


def _properties(data: bytes) -> dict:
    props, i = {}, 0
    while i < len(data):
        n = data[i]
        name = data[i + 1:i + 1 + n]
        i += 1 + n
        (size,) = struct.unpack_from(">I", data, i)
        props[name.lower()] = data[i + 4:i + 4 + size]
        i += 4 + size
    return props


class Connection:
    """One ZMTP connection of socket type ``kind`` (``b"DEALER"`` or
    ``b"SUB"``) to the endpoint ``addr``, ready once the constructor
    returns (greetings and READY exchanged within ``timeout`` seconds);
    :class:`OSError` (``ConnectionError``, ``TimeoutError``) otherwise."""

    def __init__(self, addr: str, kind: bytes, timeout: float = 30.0):
        family, host, port = parse_endpoint(addr)
        if family == socket.AF_INET and ":" in host:
            family = socket.AF_INET6
        self.kind = kind
        self._buf = bytearray()
        self._frames: list = []         # frames of the message being read
        deadline = time.monotonic() + timeout
        self.sock = sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(GREETING + _command(b"READY", {b"Socket-Type": kind}))
            greeting = self._read_exact(64, deadline)
            if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
                raise ConnectionError(f"{addr}: not a ZMTP 3 peer")
            if greeting[12:32].rstrip(b"\0") != b"NULL":
                raise ConnectionError(f"{addr}: the peer wants security mechanism "
                                      f"{greeting[12:32].rstrip(bytes(1))!r}, not NULL")
            name, data = self._read_command(deadline)
            if name == b"ERROR":
                raise ConnectionError(f"{addr}: refused: {data[1:1 + data[0]]!r}")
            if name != b"READY":
                raise ConnectionError(f"{addr}: expected READY, got {name!r}")
            peer = _properties(data).get(b"socket-type", b"")
            if peer not in _PEER[kind]:
                raise ConnectionError(f"{addr}: a {peer.decode(errors='replace')} socket "
                                      f"cannot talk to a {kind.decode()} socket")
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)

    # -- reading -------------------------------------------------------------------
    def _fill(self, deadline) -> bool:
        """Read what the socket has into the buffer, waiting until
        ``deadline`` (None: no wait); False when nothing came in time."""
        sock = self.sock
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except socket.timeout:
                return False
            if data is not None:
                if not data:
                    raise ConnectionError("the rendezvous service closed the connection")
                self._buf += data
                return True
            if deadline is None:
                return False
            wait = deadline - time.monotonic()
            if wait <= 0:
                return False
            select.select([sock], [], [], wait)

    def _read_exact(self, n: int, deadline) -> bytes:
        while len(self._buf) < n:
            if not self._fill(deadline):
                raise TimeoutError("no answer from the rendezvous service")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _read_command(self, deadline):
        frame = self._frame(deadline)
        while frame is None or not frame[0]:
            if frame is None:
                raise TimeoutError("no answer from the rendezvous service")
            frame = self._frame(deadline)
        body = frame[1]
        n = body[0] if body else 0
        return bytes(body[1:1 + n]), bytes(body[1 + n:])

    def _frame(self, deadline):
        """The next frame as ``(is_command, body, more)`` once it is whole in
        the buffer, reading until ``deadline``; None when it is not."""
        buf = self._buf
        while True:
            if len(buf) >= 2:
                flags = buf[0]
                if flags & _FLAG_LONG:
                    head = 9
                    size = struct.unpack_from(">Q", buf, 1)[0] if len(buf) >= 9 else None
                else:
                    head, size = 2, buf[1]
                if size is not None and len(buf) >= head + size:
                    body = bytes(buf[head:head + size])
                    del buf[:head + size]
                    return bool(flags & _FLAG_COMMAND), body, bool(flags & _FLAG_MORE)
            if not self._fill(deadline):
                return None

    def recv_multipart(self, timeout=None):
        """The next message (a list of frames), or None when none is whole
        within ``timeout`` seconds (None or 0: do not wait).  Commands in
        between are skipped."""
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            frame = self._frame(deadline)
            if frame is None:
                return None
            command, body, more = frame
            if command:
                continue
            self._frames.append(body)
            if not more:
                frames, self._frames = self._frames, []
                return frames

    # -- writing -------------------------------------------------------------------
    def send_multipart(self, frames) -> None:
        """Send one message of ``frames`` (bytes-like) whole."""
        out = bytearray()
        last = len(frames) - 1
        for i, f in enumerate(frames):
            f = memoryview(f).cast("B")
            more = _FLAG_MORE if i < last else 0
            if len(f) > 255:
                out += bytes([more | _FLAG_LONG]) + struct.pack(">Q", len(f))
            else:
                out += bytes([more, len(f)])
            out += f
        self.sock.setblocking(True)
        try:
            self.sock.sendall(out)
        finally:
            self.sock.setblocking(False)

    def subscribe(self, prefix: bytes = b"") -> None:
        """Receive the PUB's messages that start with ``prefix`` (SUB)."""
        self.send_multipart([b"\x01" + prefix])

    def close(self) -> None:
        self.sock.close()
