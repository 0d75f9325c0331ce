"""Worker addresses: what one worker gives another to connect to it.

Layout (little-endian)::

    "UXA1" | worker id u64 | uuid u64 | pid u32 | host id len u16 | host id
    | n transports u8 | n x (name len u8 | name | address len u16 | address)

The worker id is the peer's identity for tag matching (its rank under a
launcher); the uuid distinguishes two incarnations with the same id.
"""
from __future__ import annotations

import struct
from .errors import ProtocolError
from .record import field, record

MAGIC = b"UXA1"
_HEAD = struct.Struct("<4sQQIH")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")


@record(frozen=True)
class WorkerAddress:
    worker_id: int
    uuid: int
    pid: int
    host_id: bytes
    transports: tuple = field(default_factory=tuple)   # ((name, address bytes), ...)

    def pack(self) -> bytes:
        parts = [_HEAD.pack(MAGIC, self.worker_id, self.uuid, self.pid, len(self.host_id)),
                 self.host_id, _U8.pack(len(self.transports))]
        for name, addr in self.transports:
            nb = name.encode()
            parts += [_U8.pack(len(nb)), nb, _U16.pack(len(addr)), bytes(addr)]
        return b"".join(parts)

    @classmethod
    def unpack(cls, data) -> "WorkerAddress":
        """Parse; raises :class:`~ucxpy.ProtocolError` on anything malformed."""
        data = bytes(data)
        try:
            magic, wid, uuid, pid, hlen = _HEAD.unpack_from(data, 0)
            if magic != MAGIC:
                raise ProtocolError(f"not a ucxpy worker address (magic {magic!r})")
            off = _HEAD.size
            host_id = data[off:off + hlen]
            if len(host_id) != hlen:
                raise ProtocolError("truncated worker address (host id)")
            off += hlen
            (n,) = _U8.unpack_from(data, off)
            off += 1
            tls = []
            for _ in range(n):
                (ln,) = _U8.unpack_from(data, off)
                off += 1
                name = data[off:off + ln].decode("ascii")
                off += ln
                (la,) = _U16.unpack_from(data, off)
                off += 2
                addr = data[off:off + la]
                if len(addr) != la or len(name) != ln:
                    raise ProtocolError("truncated worker address (transport)")
                off += la
                tls.append((name, addr))
            if off != len(data):
                raise ProtocolError(f"worker address has {len(data) - off} trailing bytes")
        except (struct.error, UnicodeDecodeError) as e:
            raise ProtocolError(f"malformed worker address: {e}") from None
        return cls(wid, uuid, pid, host_id, tuple(tls))

    def transport(self, name: str):
        for n, a in self.transports:
            if n == name:
                return a
        return None
