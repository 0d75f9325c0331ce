"""Remote keys: the packed format and the checks every RMA access passes.

The pure part of :mod:`ucxpy.rma` (which re-exports these names), kept in a
leaf module so it can be tested byte for byte without workers or
transports.  A packed remote key (``MemHandle.pack_rkey()``) is::

    HEADER       "<4sQQQQIIBBH": magic b"URK1", worker uuid, memory id,
                 base address, length, pid, table slot, table name length,
                 segment name length, host id length
    table name   ascii, ``ucxpy-rt-<pid>-<uuid hex>``, or empty
    segment      ascii, ``ucxpy-rm-<pid>-<uuid hex>-<mem id>``, or empty
    host id      bytes
    transport    ``n u8 | n x (name len u8 | ascii name | key len u16 | key)``
    keys         (see :func:`pack_transport_keys`), and nothing after them

Everything is little-endian.  Unpacking (:class:`RegionKey`) refuses a
truncated or padded key, a wrong magic, a table or segment name that is not
a ucxpy segment (they are opened under /dev/shm) and a slot past the
registration table, with :class:`~ucxpy.errors.RemoteAccessError`.

Access checks: :meth:`RegionKey.check` on the initiator (raises) and
:func:`resolve` on the AM target (returns a status for the reply frame).
"""
from __future__ import annotations

import re
import struct

from .errors import RemoteAccessError

try:
    from ._native import ffi, lib
except ImportError:  # pragma: no cover - the module is built at install time
    ffi = lib = None

#: access statuses, as RMA_ACK / RMA_AMO_REP carry them
OK, STALE, RANGE, ALIGN, BADOP = range(5)

#: slots in a worker's registration table (one 64-bit memory id each; slot 0
#: is never handed out, a key without a table slot carries 0)
TABLE_SLOTS = 4096
HEADER = struct.Struct("<4sQQQQIIBBH")
MAGIC = b"URK1"
TABLE_NAME = re.compile(r"\Aucxpy-rt-[0-9]+-[0-9a-f]+\Z")
SEG_NAME = re.compile(r"\Aucxpy-rm-[0-9]+-[0-9a-f]+-[0-9]+\Z")


def pack(uuid: int, mem_id: int, address: int, length: int, pid: int, slot: int,
         table: bytes, segment: bytes, host_id: bytes, transport_keys: bytes) -> bytes:
    """A packed remote key.  ``slot`` is the region's registration-table slot,
    negative when it has none (packed as 0); ``transport_keys`` comes from
    :func:`pack_transport_keys`."""
    return HEADER.pack(MAGIC, uuid, mem_id, address, length, pid, max(slot, 0),
                       len(table), len(segment), len(host_id)) \
        + table + segment + host_id + transport_keys


def pack_transport_keys(keys) -> bytes:
    """``n u8 | n x (name len u8 | name | key len u16 | key)`` for ``keys``, an
    iterable of ``(transport name bytes, key bytes)``: the region's
    registration with each RDMA interface (ofi, verbs)."""
    keys = list(keys)
    return bytes([len(keys)]) + b"".join(
        bytes([len(n)]) + n + len(k).to_bytes(2, "little") + k for n, k in keys)


def unpack_transport_keys(packed: bytes, off: int) -> dict:
    """Inverse of :func:`pack_transport_keys` for the bytes of ``packed`` from
    ``off`` to its end: ``{transport name: key}``."""
    keys = {}
    try:
        count = packed[off]
        off += 1
        for _ in range(count):
            n = packed[off]
            name = packed[off + 1:off + 1 + n].decode("ascii")
            off += 1 + n
            k = int.from_bytes(packed[off:off + 2], "little")
            key = packed[off + 2:off + 2 + k]
            # short name, or key (or its length field) cut off by the end
            if len(name) != n or off + 2 + k > len(packed):
                raise IndexError
            keys[name] = key
            off += 2 + k
    except (IndexError, UnicodeDecodeError):
        raise RemoteAccessError("malformed remote key (transport keys)") from None
    if off != len(packed):
        raise RemoteAccessError("malformed remote key (trailing bytes)")
    return keys


class RegionKey:
    """A peer's registered region as its packed key describes it: ``uuid``
    (of the worker that registered it), ``mem_id``, ``base``, ``length``,
    ``pid``, ``slot``, ``table`` and ``segment`` names (str, "" for none),
    ``host_id`` and ``tl_keys`` ({transport name: key}).  ``ucxpy.rma``'s
    RemoteKey adds the endpoint and the access mode."""

    __slots__ = ("uuid", "mem_id", "base", "length", "pid", "slot", "table", "segment",
                 "host_id", "tl_keys", "_table_addr")

    def __init__(self, packed):
        packed = bytes(packed)
        try:
            (magic, self.uuid, self.mem_id, self.base, self.length, self.pid, self.slot,
             tlen, slen, hlen) = HEADER.unpack_from(packed)
        except struct.error:
            raise RemoteAccessError("malformed remote key (too short)") from None
        off = HEADER.size
        if magic != MAGIC or len(packed) < off + tlen + slen + hlen + 1:
            raise RemoteAccessError("malformed remote key")
        self.table = packed[off:off + tlen].decode("ascii", "replace")
        self.segment = packed[off + tlen:off + tlen + slen].decode("ascii", "replace")
        off += tlen + slen
        self.host_id = packed[off:off + hlen]
        self.tl_keys = unpack_transport_keys(packed, off + hlen)
        # The names are opened under /dev/shm and the slot indexes the peer's
        # table mapping: anything else would map an arbitrary file or read
        # past the table.
        if (self.table and not TABLE_NAME.match(self.table)) or \
                (self.segment and not SEG_NAME.match(self.segment)) or \
                self.slot >= TABLE_SLOTS:
            raise RemoteAccessError("malformed remote key (segment name or slot)")
        #: address of the region's slot in the peer's registration table as
        #: mapped here (0: not mapped, no validity check)
        self._table_addr = 0

    def check(self, address: int, length: int, align: int = 1) -> int:
        """Offset of ``[address, address+length)`` in the region, or raise
        RemoteAccessError: outside the region, ``address`` not a multiple of
        ``align``, or (when the peer's table is mapped) the region unmapped."""
        off = address - self.base
        if off < 0 or length < 0 or off + length > self.length:
            raise RemoteAccessError(
                f"remote access [{address:#x}, +{length}) outside registered region "
                f"[{self.base:#x}, +{self.length})")
        if address % align:
            raise RemoteAccessError(f"misaligned {align}-byte atomic at {address:#x}")
        if self._table_addr and lib.ucxpy_atomic_load64(
                ffi.cast("void *", self._table_addr)) != self.mem_id:
            raise RemoteAccessError(f"stale remote key: memory {self.mem_id} was unmapped")
        return off


def resolve(registry: dict, mem_id: int, address: int, length: int, align: int = 1):
    """The AM target's check of an access to its memory ``mem_id``:
    ``(status, handle, offset)`` with ``registry`` mapping memory ids to
    handles (``.address``, ``.length``); handle None and offset 0 unless the
    status is OK."""
    mh = registry.get(mem_id)
    if mh is None:
        return STALE, None, 0
    off = address - mh.address
    if off < 0 or off + length > mh.length:
        return RANGE, None, 0
    if address % align:
        return ALIGN, None, 0
    return OK, mh, off
