"""Remote keys: the packed format and the checks every RMA access passes.

The pure part of :mod:`ucxpy.rma` (which re-exports these names), kept in a
leaf module so it can be tested byte for byte without workers or
transports.  A packed remote key (``MemHandle.pack_rkey()``) is::

    HEADER       "<4sQQQQ": magic b"URK2", worker uuid, memory id, base
                 address, length
    md keys      ``n u8 | n x (name len u8 | ascii name | key len u16 | key)``
                 (see :func:`pack_md_keys`), and nothing after them

Everything is little-endian.  The md keys are the region's registration with
each memory domain of the owner's interfaces, named like the interfaces and
packed by them (``MemoryDomain.rkey_pack``): the core reads none of them,
the initiator's lane unpacks its own.  Unpacking (:class:`RegionKey`)
refuses a truncated or padded key and a wrong magic with
:class:`~ucxpy.errors.RemoteAccessError`.

Access checks: :meth:`RegionKey.check` on the initiator (raises) and
:func:`resolve` on the AM target (returns a status for the reply frame).
"""
from __future__ import annotations

import struct

from .errors import RemoteAccessError

#: access statuses, as RMA_ACK / RMA_AMO_REP carry them
OK, STALE, RANGE, ALIGN, BADOP = range(5)

HEADER = struct.Struct("<4sQQQQ")
MAGIC = b"URK2"


def pack(uuid: int, mem_id: int, address: int, length: int, md_keys: bytes) -> bytes:
    """A packed remote key; ``md_keys`` comes from :func:`pack_md_keys`."""
    return HEADER.pack(MAGIC, uuid, mem_id, address, length) + md_keys


def pack_md_keys(keys) -> bytes:
    """``n u8 | n x (name len u8 | name | key len u16 | key)`` for ``keys``, an
    iterable of ``(memory domain name bytes, key bytes)``."""
    keys = list(keys)
    return bytes([len(keys)]) + b"".join(
        bytes([len(n)]) + n + len(k).to_bytes(2, "little") + k for n, k in keys)


def unpack_md_keys(packed: bytes, off: int) -> dict:
    """Inverse of :func:`pack_md_keys` for the bytes of ``packed`` from
    ``off`` to its end: ``{memory domain name: key}``."""
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
        raise RemoteAccessError("malformed remote key (md keys)") from None
    if off != len(packed):
        raise RemoteAccessError("malformed remote key (trailing bytes)")
    return keys


class RegionKey:
    """A peer's registered region as its packed key describes it: ``uuid``
    (of the worker that registered it), ``mem_id``, ``base``, ``length`` and
    ``md_keys`` ({memory domain name: key}).  ``md_key`` is what the lane's
    memory domain unpacked (``MdRemoteKey``, None until then): when set, its
    ``valid()`` is part of every check.  ``ucxpy.rma``'s RemoteKey adds the
    endpoint and the access mode."""

    __slots__ = ("uuid", "mem_id", "base", "length", "md_keys", "md_key")

    def __init__(self, packed):
        packed = bytes(packed)
        try:
            magic, self.uuid, self.mem_id, self.base, self.length = HEADER.unpack_from(packed)
        except struct.error:
            raise RemoteAccessError("malformed remote key (too short)") from None
        if magic != MAGIC:
            raise RemoteAccessError("malformed remote key")
        self.md_keys = unpack_md_keys(packed, HEADER.size)
        self.md_key = None

    def check(self, address: int, length: int, align: int = 1) -> int:
        """Offset of ``[address, address+length)`` in the region, or raise
        RemoteAccessError: outside the region, ``address`` not a multiple of
        ``align``, or (where the lane's memory domain can tell) the region
        unmapped."""
        off = address - self.base
        if off < 0 or length < 0 or off + length > self.length:
            raise RemoteAccessError(
                f"remote access [{address:#x}, +{length}) outside registered region "
                f"[{self.base:#x}, +{self.length})")
        if address % align:
            raise RemoteAccessError(f"misaligned {align}-byte atomic at {address:#x}")
        if self.md_key is not None and not self.md_key.valid():
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
